"""Which of each cell's partials messages the root has journaled (no I/O).

Every partials message carries its cell's message number (its outbox counts them from 0,
in order). Per cell the root keeps ``next_seq``: every number below it is journaled; the
numbers seen ahead of it (a bounded set); and the first hole, with when it appeared. The
root publishes this as the cell's acknowledgement (:meth:`DeliveryTracker.ack`, on
``<prefix>/v1/_partials_ack/<cell>``): the cell keeps its messages until ``next_seq``
passes them, and resends from ``next_seq`` when the acknowledgement names a ``gap``.

* A number below ``next_seq``, or one already seen ahead, is a resend: fine (the merger
  drops the rows it has).
* A number past the highest seen plus one opens a hole: logged with its numbers (at most
  every :data:`LOG_EVERY_MS` per cell), counted, and asked for in the acknowledgement.
* A hole that stays open :data:`GIVE_UP_MS` (the cell no longer holds those messages: it
  dropped them at its backlog bound, or lost its state), or more than :data:`MAX_AHEAD`
  numbers waiting behind it, is given up: ``next_seq`` moves past it, and its numbers are
  counted as lost and logged as an error.
* A root that does not know a cell's ``next_seq`` (no state, or a new cell) takes the
  first number it sees as the start.

Each message also carries the cell's closed-through mark. A message behind a hole must not
close quanta whose rows are in the missing ones: its mark is held
(:meth:`DeliveryTracker.holds_back`) and released by :meth:`DeliveryTracker.seen` once the
numbers before it are in (or given up).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

log = logging.getLogger("fiomon.root")

MAX_AHEAD = 10_000  # numbers held ahead of a hole; beyond that the hole is given up
GIVE_UP_MS = 300_000  # a hole open this long (root clock) is given up
LOG_EVERY_MS = 10_000  # holes are logged at most this often per cell

Outcome = Literal["first", "next", "resend", "ahead"]


@dataclass(slots=True)
class CellSeq:
    """One cell's numbers at the root.

    Args:
        next_seq: every message numbered below it is journaled (None: not known yet).
        ahead: numbers past ``next_seq`` seen already (behind a hole), with their marks.
        hole_since_ms: root clock when the first hole opened (None: no hole).
        gaps: holes detected.
        lost: numbers given up on (the hole never filled).
        resends: numbers seen again.
        unlogged: holes detected since the last log line.
        logged_ms: root clock of the last log line about holes.
    """

    next_seq: int | None = None
    ahead: dict[int, int] = field(default_factory=dict)
    hole_since_ms: int | None = None
    gaps: int = 0
    lost: int = 0
    resends: int = 0
    unlogged: int = 0
    logged_ms: int = -(2**62)

    @property
    def highest(self) -> int | None:
        """The highest number seen (None: none)."""
        if self.ahead:
            return max(self.ahead)
        return None if self.next_seq is None else self.next_seq - 1

    @property
    def hole(self) -> tuple[int, int] | None:
        """The first hole, ``[lo, hi]`` inclusive (None: none)."""
        if not self.ahead or self.next_seq is None:
            return None
        return self.next_seq, min(self.ahead) - 1


class DeliveryTracker:
    """Per cell: the contiguous journaled ``next_seq``, numbers seen ahead, holes.

    Args:
        known: ``next_seq`` per cell saved by a previous run (the root's state directory).
        max_ahead: numbers held ahead of a hole before it is given up.
        give_up_ms: a hole open this long is given up.
    """

    def __init__(
        self,
        known: Mapping[str, int] | None = None,
        *,
        max_ahead: int = MAX_AHEAD,
        give_up_ms: int = GIVE_UP_MS,
    ) -> None:
        self.cells: dict[str, CellSeq] = {c: CellSeq(n) for c, n in (known or {}).items()}
        self.max_ahead = max_ahead
        self.give_up_ms = give_up_ms
        self.dirty: set[str] = set()  # cells whose acknowledgement changed since taken

    def holds_back(self, cell: str, seq: int) -> bool:
        """Whether message ``seq`` of ``cell`` comes after a hole (its mark must wait)."""
        c = self.cells.get(cell)
        return c is not None and c.next_seq is not None and seq > c.next_seq

    def seen(
        self, cell: str, seq: int, now_ms: int, through_ms: int | None = None
    ) -> tuple[Outcome, int | None]:
        """Message ``seq`` of ``cell`` (closed through ``through_ms``) is journaled.

        Returns what it was, and the highest closed-through mark that is now behind no hole
        (this message's, or those held ahead that it made contiguous; None: none).
        """
        c = self.cells.get(cell)
        if c is None:
            c = self.cells[cell] = CellSeq()
        if c.next_seq is None:
            c.next_seq = seq + 1
            self.dirty.add(cell)
            return "first", through_ms
        if seq < c.next_seq or seq in c.ahead:
            c.resends += 1
            return "resend", None
        if seq == c.next_seq:
            c.next_seq += 1
            held = self._absorb(c, now_ms)
            self.dirty.add(cell)
            return "next", _max(through_ms, held)
        highest = c.highest
        assert highest is not None  # noqa: S101 -- next_seq is known
        if seq > highest + 1:
            self._opened(cell, c, highest + 1, seq - 1, now_ms)
        c.ahead[seq] = through_ms if through_ms is not None else -(2**62)
        if c.hole_since_ms is None:
            c.hole_since_ms = now_ms
        self.dirty.add(cell)
        if len(c.ahead) > self.max_ahead or now_ms - c.hole_since_ms >= self.give_up_ms:
            return "ahead", self._give_up(cell, c, now_ms)
        return "ahead", None

    def _absorb(self, c: CellSeq, now_ms: int) -> int | None:
        """Move ``next_seq`` over the numbers held ahead that are now contiguous.

        Returns the highest mark among them (None: none moved).
        """
        assert c.next_seq is not None  # noqa: S101 -- callers set it
        if not c.ahead:
            return None
        mark = None
        while c.next_seq in c.ahead:
            mark = _max(mark, c.ahead.pop(c.next_seq))
            c.next_seq += 1
        # The first hole filled: a later one (if any) starts its clock now.
        c.hole_since_ms = now_ms if c.ahead else None
        return mark

    def _opened(self, cell: str, c: CellSeq, lo: int, hi: int, now_ms: int) -> None:
        c.gaps += 1
        c.unlogged += 1
        if now_ms - c.logged_ms < LOG_EVERY_MS:
            return
        log.warning(
            "cell %s: partials messages %d..%d missing (%d holes since the last such line, "
            "%d in all): asking the cell to resend them",
            cell,
            lo,
            hi,
            c.unlogged,
            c.gaps,
        )
        c.unlogged = 0
        c.logged_ms = now_ms

    def _give_up(self, cell: str, c: CellSeq, now_ms: int) -> int | None:
        hole = c.hole
        assert hole is not None and c.hole_since_ms is not None  # noqa: S101 -- ahead is set
        lo, hi = hole
        c.lost += hi - lo + 1
        log.error(
            "cell %s: partials messages %d..%d never came (%d ms after the hole opened, %d "
            "numbers waiting behind it): given up; the quanta they held lack this cell's "
            "rows (the cell dropped them at its backlog bound, or lost its state)",
            cell,
            lo,
            hi,
            now_ms - c.hole_since_ms,
            len(c.ahead),
        )
        c.next_seq = hi + 1
        return self._absorb(c, now_ms)

    def ack(self, cell: str, now_ms: int) -> dict[str, object] | None:
        """``cell``'s acknowledgement: ``{"next_seq", "at_ms"}`` (+ ``"gap": [lo, hi]``)."""
        c = self.cells.get(cell)
        if c is None or c.next_seq is None:
            return None
        out: dict[str, object] = {"next_seq": c.next_seq, "at_ms": now_ms}
        hole = c.hole
        if hole is not None:
            out["gap"] = list(hole)
        return out

    def take_dirty(self) -> list[str]:
        """The cells whose acknowledgement changed since the last call (sorted)."""
        out = sorted(self.dirty)
        self.dirty.clear()
        return out

    def positions(self) -> dict[str, int]:
        """``next_seq`` per cell (what a restart continues from)."""
        return {c: s.next_seq for c, s in sorted(self.cells.items()) if s.next_seq is not None}


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)
