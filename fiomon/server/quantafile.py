"""The aggregator's quanta file: every closed quantum as a closed-quantum JSON line.

The lines are exactly what ``fiomon report --format jsonl`` prints for the same input, so
a run can be audited and plotted later with the same tools. The file is rotated by size
(``quanta.jsonl`` -> ``quanta.jsonl.1`` -> ... -> ``quanta.jsonl.<keep>``, the oldest
deleted) and flushed after every close, so ``kill -9`` loses no closed quantum.

The file is also the record of what was published. At start :meth:`QuantaFile.tail`
reads its last quantum (its end and which rows of it are there); the aggregator never
writes a quantum at or before it again, and writes only the missing rows of that last
quantum when a crash cut its write short. A torn last line (the crash came mid-line) is
cut off, reported and counted.

:class:`QuantaWriter` does the writing on its own thread, in order, followed by the grid
state, so a slow or stuck disk never delays closing; it says how far the file is
confirmed (``confirmed_ms``), which is when the journal may let go of those records.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fiomon.closed import ClosedQuantum
from fiomon.server.journal import GridState

log = logging.getLogger("fiomon.aggregator")

RowKey = tuple[str, str, str]  # (scope, host or "", direction)
Skip = tuple[int, frozenset[RowKey]]  # a quantum's end and the rows of it already written
ProblemSink = Callable[[str, str], None]


def row_key(r: ClosedQuantum) -> RowKey:
    """Which row of its quantum a row is."""
    return (r.scope, r.host or "", r.direction)


@dataclass(frozen=True, slots=True)
class Tail:
    """The last quantum in a quanta file.

    Args:
        end_ms: its end.
        start_ms: its start (``end_ms - start_ms`` is the quantum).
        keys: the rows of it that are in the file.
    """

    end_ms: int
    start_ms: int
    keys: frozenset[RowKey]


class QuantaFile:
    """Appends closed quanta to ``path``, rotating past ``max_bytes``.

    Args:
        path: the file (its folder is created).
        max_bytes: rotate once the file is larger than this.
        keep: rotated files kept.
        problems: called with ``(kind, text)`` for a torn line found at open.
    """

    def __init__(
        self,
        path: Path,
        max_bytes: int = 64 * 1024**2,
        keep: int = 5,
        problems: ProblemSink | None = None,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        path.parent.mkdir(parents=True, exist_ok=True)
        self._repair(problems or (lambda kind, text: None))
        self._fh = path.open("a", encoding="utf-8")
        self.rows = 0

    def _repair(self, problems: ProblemSink) -> None:
        """Cut a torn last line (no newline: the writer died mid-line)."""
        try:
            with self.path.open("rb+") as fh:
                size = fh.seek(0, os.SEEK_END)
                if size == 0:
                    return
                fh.seek(max(0, size - 1))
                if fh.read(1) == b"\n":
                    return
                chunk = min(size, 4 * 1024 * 1024)
                fh.seek(size - chunk)
                tail = fh.read(chunk)
                cut = size - chunk + tail.rfind(b"\n") + 1 if b"\n" in tail else 0
                fh.truncate(cut)
        except FileNotFoundError:
            return
        problems(
            "quanta-file-torn",
            f"{self.path}: removed a torn last line ({size - cut} bytes): the previous run "
            "died while writing it; its rows are written again from the journal",
        )

    def tail(self) -> Tail | None:
        """The last quantum first published in the file or its rotated ones, or None.

        Newest first, through every rotated file: revisions of older quanta follow later
        first publications, and a file right after a rotation may hold nothing else.
        """
        for p in self.files():
            t = _read_tail(p)
            if t is not None:
                return t
        return None

    def files(self) -> list[Path]:
        """The file and its rotated ones, newest first (``f``, ``f.1``, ... ``f.<keep>``)."""
        rotated = [self.path.with_name(f"{self.path.name}.{i}") for i in range(1, self.keep + 1)]
        return [self.path, *rotated]

    def write(self, rows: Sequence[ClosedQuantum], skip: Skip | None = None) -> int:
        """Append ``rows`` and flush; ``skip`` = (end, keys): rows of that quantum already in.

        Returns the rows written. Raises OSError (the caller reports and counts it).
        """
        # The report's own line (one serializer: the report == aggregator contract).
        # Only first publications are skipped: a revision of that quantum is another
        # line of the same key, never written before (its revision number is new).
        text = "".join(
            r.to_json_line()
            for r in rows
            if skip is None
            or r.end_ms != skip[0]
            or r.revised_at is not None
            or row_key(r) not in skip[1]
        )
        if not text:
            return 0
        self._fh.write(text)
        self._fh.flush()
        n = text.count("\n")
        self.rows += n
        if self._fh.tell() > self.max_bytes:
            self._rotate()
        return n

    def _rotate(self) -> None:
        self._fh.close()
        for i in range(self.keep, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def reopen(self) -> None:
        """Open the file again (after a failed write, or when it was deleted)."""
        with contextlib.suppress(OSError):
            self._fh.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def close(self) -> None:
        """Flush and close."""
        self._fh.close()


def _read_tail(path: Path) -> Tail | None:
    """The rows of the last quantum first published in ``path`` (read backwards)."""
    end: int | None = None
    start = 0
    keys: set[RowKey] = set()
    for d in _lines_backwards(path):
        try:
            e = int(d["end_ms"])
            key = (str(d["scope"]), str(d["host"] or ""), str(d["direction"]))
            s = int(d["start_ms"])
        except (ValueError, KeyError, TypeError):
            continue  # not a row (a hand edit): it says nothing about publication
        if d.get("revised_at") is not None:
            continue  # a revision of an older quantum, written after later ones
        if end is None:
            end, start = e, s
        if e != end:
            return Tail(end, start, frozenset(keys))
        keys.add(key)
    return None if end is None else Tail(end, start, frozenset(keys))


def recent_revisions(
    paths: Sequence[Path], since_ms: int
) -> list[tuple[int, str | None, str, str, int]]:
    """``(end_ms, host, direction, scope, revision)`` of rows of quanta ending after ``since_ms``.

    Read backwards from the end of ``paths`` (newest first: the file, then ``.1``), until a
    first publication of a quantum ending at or before ``since_ms``: every revision of a
    quantum is written after its first publication, so nothing older can revise a
    quantum after ``since_ms``. A restart within the revision horizon numbers its next
    revisions from these.
    """
    out: list[tuple[int, str | None, str, str, int]] = []
    for path in paths:
        for d in _lines_backwards(path):
            try:
                e = int(d["end_ms"])
                rev = int(d.get("revision", 0))
                host, direction, scope = d["host"], str(d["direction"]), str(d["scope"])
            except (ValueError, KeyError, TypeError):
                continue
            if e <= since_ms:
                if d.get("revised_at") is None:
                    return out
                continue
            out.append((e, None if host is None else str(host), direction, scope, rev))
    return out


def _lines_backwards(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``path``'s lines, last first (unreadable lines skipped)."""
    for line in raw_lines_backwards(path):
        try:
            d = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(d, dict):
            yield d


def raw_lines_backwards(path: Path) -> Iterator[bytes]:
    """``path``'s non-blank lines as bytes (no newline), last first; none if unreadable."""
    try:
        fh = path.open("rb")
    except OSError:
        return
    with fh:
        pos = fh.seek(0, os.SEEK_END)
        rest = b""
        while pos > 0:
            step = min(pos, 1 << 20)
            pos -= step
            fh.seek(pos)
            lines = (fh.read(step) + rest).split(b"\n")
            rest = lines[0] if pos > 0 else b""
            for line in reversed(lines[1:] if pos > 0 else lines):
                if line.strip():
                    yield line


@dataclass(frozen=True, slots=True)
class _Job:
    rows: Sequence[ClosedQuantum]
    closed_ms: int
    grid: GridState | None
    skip: Skip | None


class QuantaWriter:
    """Writes closed quanta, then the grid state, on its own thread, in order.

    Args:
        quanta: the quanta file, or None.
        state_path: where the grid state goes, or None.
        problems: called with ``(kind, text)`` from the writer thread for a failed write
            or a dropped job (the caller logs and counts; it must be thread-safe).
        max_pending_rows: rows waiting at most; a close beyond it (the disk has been
            stuck for a long time) is dropped from the file, reported and counted.
    """

    def __init__(
        self,
        quanta: QuantaFile | None,
        state_path: Path | None,
        problems: ProblemSink,
        max_pending_rows: int = 200_000,
    ) -> None:
        self.quanta = quanta
        self.state_path = state_path
        self.problems = problems
        self.max_pending_rows = max_pending_rows
        self.confirmed_ms: int | None = None  # every quantum ending by then is written
        self._pending_rows = 0
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="fiomon.quanta", daemon=True)
        self._thread.start()

    def submit(
        self,
        rows: Sequence[ClosedQuantum],
        closed_ms: int,
        grid: GridState | None,
        skip: Skip | None = None,
    ) -> None:
        """Queue one close (never blocks)."""
        with self._lock:
            if self._pending_rows + len(rows) > self.max_pending_rows:
                self.problems(
                    "quanta-file-dropped",
                    f"{len(rows)} rows through {closed_ms} not written: "
                    f"{self._pending_rows} rows still wait for the disk",
                )
                rows = ()
            self._pending_rows += len(rows)
        self._jobs.put(_Job(rows, closed_ms, grid, skip))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self._write(job)
            with self._lock:
                self._pending_rows -= len(job.rows)

    def _write(self, job: _Job) -> None:
        # The journal is released up to confirmed_ms: only once every write of the job
        # succeeded (a root keeps its closed-through mark in the grid state alone; released
        # past a mark that was never saved, a restart would close quanta again from part
        # of their rows). A later job that succeeds confirms the earlier ones too.
        ok = True
        if self.quanta is not None and job.rows:
            try:
                self.quanta.write(job.rows, job.skip)
            except OSError as exc:
                ok = False
                self.problems(
                    "quanta-file-write",
                    f"{self.quanta.path}: {exc.strerror or exc} ({len(job.rows)} rows through "
                    f"{job.closed_ms} not written)",
                )
                with contextlib.suppress(OSError):
                    self.quanta.reopen()
        if self.state_path is not None and job.grid is not None:
            try:
                job.grid.save(self.state_path)
            except OSError as exc:
                ok = False
                self.problems("state-write", f"cannot save {self.state_path}: {exc}")
        if ok and (self.confirmed_ms is None or job.closed_ms > self.confirmed_ms):
            self.confirmed_ms = job.closed_ms

    def close(self, timeout_s: float = 10.0) -> bool:
        """Write what is queued and stop; False if the disk did not finish in time."""
        self._jobs.put(None)
        self._thread.join(timeout_s)
        if self.quanta is not None and not self._thread.is_alive():
            self.quanta.close()
        return not self._thread.is_alive()
