"""Bad-input bookkeeping: every skipped line or payload is counted and named.

Parsers never raise on bad input (unless strict): they report a :class:`Problem` to a
:class:`ProblemLog`, which counts it by kind and keeps the first few messages of each kind
so that a file of binary garbage cannot flood the terminal or the memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TextIO

from fiomon.errors import ParseError


@dataclass(frozen=True, slots=True)
class Problem:
    """One piece of bad input.

    Args:
        source: the file or stream it came from.
        line_no: 1-based line number, 0 when not tied to a line.
        kind: short counter key (``non-numeric``, ``columns``, ``negative``, ...).
        reason: what is wrong, for a person.
        warning: true for notices that do not drop data (e.g. relative timestamps).
    """

    source: str
    line_no: int
    kind: str
    reason: str
    warning: bool = False

    def __str__(self) -> str:
        where = f"{self.source}:{self.line_no}" if self.line_no else self.source
        return f"{where}: {self.reason}"


@dataclass(slots=True)
class ProblemLog:
    """Counts problems by kind and keeps the first ``keep_per_kind`` of each.

    Args:
        strict: raise :class:`ParseError` on the first problem that drops data.
        keep_per_kind: messages kept per kind (the rest are only counted).
    """

    strict: bool = False
    keep_per_kind: int = 5
    counts: Counter[str] = field(default_factory=Counter)
    kept: list[Problem] = field(default_factory=list)

    def add(self, problem: Problem) -> None:
        """Record ``problem``; raise it instead when strict and it drops data.

        Raises:
            ParseError: ``strict`` is set and ``problem`` is not a warning.
        """
        if self.strict and not problem.warning:
            raise ParseError(problem.source, problem.line_no, problem.reason)
        self.counts[problem.kind] += 1
        if self.counts[problem.kind] <= self.keep_per_kind:
            self.kept.append(problem)

    def report(self, source: str, line_no: int, kind: str, reason: str) -> None:
        """Shorthand for ``add(Problem(...))`` of a data-dropping problem."""
        self.add(Problem(source, line_no, kind, reason))

    def warn(self, source: str, line_no: int, kind: str, reason: str) -> None:
        """Shorthand for ``add(Problem(..., warning=True))``."""
        self.add(Problem(source, line_no, kind, reason, warning=True))

    def merge(self, other: ProblemLog, exclude: frozenset[str] = frozenset()) -> None:
        """Fold ``other``'s counts and kept messages into this log, but the ``exclude`` kinds.

        (The offline readers exclude ``refused``: an error says it instead.)
        """
        for kind, n in other.counts.items():
            if kind in exclude:
                continue
            room = max(0, self.keep_per_kind - self.counts[kind])
            self.kept.extend([p for p in other.kept if p.kind == kind][:room])
            self.counts[kind] += n

    @property
    def dropped(self) -> int:
        """Number of problems that dropped data (warnings excluded)."""
        warn_kinds = {p.kind for p in self.kept if p.warning}
        return sum(n for k, n in self.counts.items() if k not in warn_kinds)

    def write_to(self, err: TextIO) -> None:
        """Write :meth:`summary_lines` to ``err``, one per line."""
        for line in self.summary_lines():
            err.write(line + "\n")

    def summary_lines(self) -> list[str]:
        """Kept messages, then one line per kind whose messages were cut."""
        lines = [("warning: " if p.warning else "skipped: ") + str(p) for p in self.kept]
        for kind, n in sorted(self.counts.items()):
            if n > self.keep_per_kind:
                lines.append(f"... {n - self.keep_per_kind} more '{kind}' problems not shown")
        return lines
