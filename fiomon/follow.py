"""Following fio's output files while they grow: generations, identity, sequence numbers.

A :class:`Follower` watches glob patterns. Each matching path is followed through an open
file descriptor, one *generation* at a time. A generation ends, and the next starts from
byte 0 with a new stream id ``<path>@<generation>``, when the path

* names another file (device and inode differ, or ours was unlinked: inode numbers are
  reused, so the inode alone never decides),
* shrank below what was read (truncated), or
* no longer holds the bytes already read (rewritten to the same or a larger size: the
  first and the last 64 bytes read are compared on every poll).

A file that disappears, or is replaced, is read to its end first through the descriptor
still open (a deleted file still open is drained). Only complete lines and complete JSON
documents become records (the parsers keep partial ones).

Records get consecutive sequence numbers per stream. Parsing is deterministic, so after a
restart a generation whose file is unchanged is read again from byte 0 and records below
the acknowledged sequence number are skipped, not resent: no parser state needs saving.

A relative-time hist log (``log_unix_epoch=0``) is placed on the wall clock by one
estimate per generation, logged once: fio writes hist logs when the job exits, so the
file's modification time is taken as the wall-clock time of its last record.
"""

from __future__ import annotations

import glob
import hashlib
import io
import logging
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fiomon.fiojson import JsonStatusParser, looks_like_json
from fiomon.fiolog import EPOCH_MS_MIN, HistLogOptions, HistLogParser
from fiomon.model import RecordBatch
from fiomon.problems import Problem, ProblemLog
from fiomon.wire import encode

log = logging.getLogger("fiomon.agent")

CHECK_BYTES = 64
READ_BYTES = 4 * 1024 * 1024  # per file per poll: one busy file cannot starve the others


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One encoded message ready to publish.

    Args:
        stream: stream id (``<path>@<generation>``).
        first_seq: sequence number of its first record.
        records: number of records (seqs ``first_seq`` .. ``first_seq + records - 1``).
        payload: the wire-format message.
    """

    stream: str
    first_seq: int
    records: int
    payload: bytes


@dataclass(slots=True)
class Resume:
    """What the positions file says about one path (see :class:`Follower`).

    Args:
        generation: the generation being followed.
        dev: device of its file.
        ino: inode of its file.
        head: digest of its first bytes (up to 64).
        acked_seq: records below this sequence number were acknowledged by the broker.
        time_offset_ms: wall-clock offset of a relative-time log, or None.
    """

    generation: int
    dev: int
    ino: int
    head: str
    acked_seq: int = 0
    time_offset_ms: int | None = None

    def to_json(self) -> dict[str, object]:
        """A JSON-able dict (the positions file's entry)."""
        return {
            "generation": self.generation,
            "dev": self.dev,
            "ino": self.ino,
            "head": self.head,
            "acked_seq": self.acked_seq,
            "time_offset_ms": self.time_offset_ms,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Resume:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: a field is missing or has the wrong type.
        """

        def num(key: str) -> int:
            v = data.get(key)
            if not isinstance(v, int) or isinstance(v, bool):
                msg = f"positions entry: {key} is not an integer"
                raise ValueError(msg)
            return v

        head = data.get("head")
        off = data.get("time_offset_ms")
        if not isinstance(head, str) or not (off is None or isinstance(off, int)):
            msg = "positions entry: head or time_offset_ms has the wrong type"
            raise ValueError(msg)
        return cls(num("generation"), num("dev"), num("ino"), head, num("acked_seq"), off)


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass(slots=True)
class _Generation:
    path: str
    generation: int
    fh: io.BufferedReader
    dev: int
    ino: int
    offset: int = 0
    head: bytes = b""
    last: bytes = b""
    next_seq: int = 0
    skip_below: int = 0
    time_offset_ms: int | None = None
    parser: HistLogParser | JsonStatusParser | None = None
    problems: ProblemLog = field(default_factory=ProblemLog)
    counted: Counter[str] = field(default_factory=Counter)

    @property
    def stream(self) -> str:
        return f"{self.path}@{self.generation}"

    def resume(self, acked_seq: int) -> Resume:
        return Resume(
            self.generation, self.dev, self.ino, _digest(self.head), acked_seq, self.time_offset_ms
        )


@dataclass(slots=True)
class FollowStats:
    """Counters of a :class:`Follower` (published in the agent's heartbeat)."""

    files_followed: int = 0
    generations: int = 0
    bytes_read: int = 0
    records_read: int = 0
    records_skipped_replay: int = 0
    problems: dict[str, int] = field(default_factory=dict)


class Follower:
    """Follows every file matching ``patterns`` and turns new data into messages.

    Args:
        patterns: glob patterns (json+ status files and hist logs, told apart by content).
        agent: agent id written into every message.
        max_message_bytes: cap on one encoded message.
        resume: positions read at start (path -> :class:`Resume`).
        log_hist_msec: hist logs' interval, or None to infer it.
    """

    def __init__(
        self,
        patterns: tuple[str, ...],
        *,
        agent: str,
        max_message_bytes: int,
        resume: dict[str, Resume] | None = None,
        log_hist_msec: int | None = None,
    ) -> None:
        self.patterns = patterns
        self.agent = agent
        self.max_message_bytes = max_message_bytes
        self.log_hist_msec = log_hist_msec
        self._resume = dict(resume or {})
        self._gens: dict[str, _Generation] = {}
        self._last_gen: dict[str, int] = {p: r.generation for p, r in self._resume.items()}
        self.stats = FollowStats()

    # -- discovery and identity ----------------------------------------------------------

    def paths(self) -> list[str]:
        """Paths currently matching the patterns (regular files only), sorted."""
        found: set[str] = set()
        for pattern in self.patterns:
            found.update(p for p in glob.glob(pattern) if os.path.isfile(p))
        return sorted(found)

    def poll(self, *, discover: bool = True, final: bool = False) -> Iterator[Outgoing]:
        """Read what is new in every followed file.

        Args:
            discover: also expand the patterns and start following new files.
            final: also finish the parsers (at shutdown nothing more will come).
        """
        known = {p for p in self._gens if os.path.isfile(p)}
        current = set(self.paths()) if discover else known
        for path in sorted(current | set(self._gens)):
            yield from self._poll_path(path, present=path in current)
        if final:
            for gen in list(self._gens.values()):
                yield from self._finish(gen)

    def _poll_path(self, path: str, *, present: bool) -> Iterator[Outgoing]:
        gen = self._gens.get(path)
        try:
            st = os.stat(path) if present else None
        except OSError:
            st = None
        if gen is not None:
            reason = self._changed(gen, st)
            if reason is None:
                yield from self._read(gen)
                return
            # Drain what the old file still holds through our descriptor, then move on.
            yield from self._read(gen, limit=None)
            yield from self._finish(gen)
            log.info("%s: %s; following it as a new stream", path, reason)
        if st is not None:
            try:
                gen = self._open(path)
            except OSError as exc:
                log.warning("%s: cannot open (%s); will retry", path, exc.strerror or exc)
                return
            yield from self._read(gen)

    def _changed(self, gen: _Generation, st: os.stat_result | None) -> str | None:
        """Why ``gen`` no longer matches its path, or None if it still does."""
        if st is None:
            return "file removed"
        fst = os.fstat(gen.fh.fileno())
        if (st.st_dev, st.st_ino) != (gen.dev, gen.ino) or fst.st_nlink == 0:
            return "file replaced"
        if st.st_size < gen.offset:
            return "file truncated"
        if gen.offset and not self._intact(gen):
            return "file rewritten"
        return None

    def _intact(self, gen: _Generation) -> bool:
        fd = gen.fh.fileno()
        head = os.pread(fd, len(gen.head), 0)
        last = os.pread(fd, len(gen.last), gen.offset - len(gen.last))
        return head == gen.head and last == gen.last

    def _open(self, path: str) -> _Generation:
        fh = open(path, "rb")  # noqa: SIM115 -- kept open across polls to drain deletions
        try:
            st = os.fstat(fh.fileno())
            head = os.pread(fh.fileno(), CHECK_BYTES, 0)
            prior = self._resume.pop(path, None)
            same = (
                prior is not None
                and (prior.dev, prior.ino) == (st.st_dev, st.st_ino)
                and prior.head == _digest(head)
            )
            if same and prior is not None:
                number, skip, offset = prior.generation, prior.acked_seq, prior.time_offset_ms
            else:
                number, skip, offset = self._last_gen.get(path, 0) + 1, 0, None
        except BaseException:
            fh.close()
            raise
        self._last_gen[path] = number
        gen = _Generation(path, number, fh, st.st_dev, st.st_ino, skip_below=skip)
        gen.time_offset_ms = offset
        gen.problems = ProblemLog(keep_per_kind=5)
        self._gens[path] = gen
        self.stats.files_followed = len(self._gens)
        self.stats.generations += 1
        if same:
            log.info("%s: resuming stream %s after seq %d", path, gen.stream, skip - 1)
        return gen

    # -- reading and parsing ---------------------------------------------------------------

    def _read(self, gen: _Generation, limit: int | None = READ_BYTES) -> Iterator[Outgoing]:
        while True:
            want = READ_BYTES if limit is None else min(READ_BYTES, limit)
            chunk = os.pread(gen.fh.fileno(), want, gen.offset)
            if not chunk:
                return
            if gen.offset < CHECK_BYTES:
                gen.head = (gen.head + chunk)[:CHECK_BYTES]
            gen.offset += len(chunk)
            gen.last = (gen.last + chunk)[-CHECK_BYTES:]
            self.stats.bytes_read += len(chunk)
            if gen.parser is None:
                gen.parser = self._parser(gen, chunk)
            yield from self._emit(gen, gen.parser.feed(chunk))
            self._collect_problems(gen)
            if limit is not None:
                limit -= len(chunk)
                if limit <= 0:
                    return

    def _finish(self, gen: _Generation) -> Iterator[Outgoing]:
        if gen.parser is not None:
            yield from self._emit(gen, gen.parser.finish())
            self._collect_problems(gen)
        gen.fh.close()
        self._gens.pop(gen.path, None)
        self.stats.files_followed = len(self._gens)

    def _parser(self, gen: _Generation, first: bytes) -> HistLogParser | JsonStatusParser:
        if looks_like_json(first):
            return JsonStatusParser(gen.path, host=self.agent, problems=gen.problems)
        if gen.time_offset_ms is None:
            gen.time_offset_ms = self._relative_offset(gen)
        return HistLogParser(
            gen.path,
            host=self.agent,
            options=HistLogOptions(
                interval_ms=self.log_hist_msec, time_offset_ms=gen.time_offset_ms or 0
            ),
            problems=gen.problems,
        )

    def _relative_offset(self, gen: _Generation) -> int:
        """Wall-clock offset for a relative-time log (0 for an epoch-stamped one)."""
        fd = gen.fh.fileno()
        st = os.fstat(fd)
        tail = os.pread(fd, 65536, max(0, st.st_size - 65536))
        lines = [ln for ln in tail.split(b"\n") if ln.strip()]
        try:
            stamp = int(lines[-1].split(b",", 1)[0]) if lines else EPOCH_MS_MIN
        except ValueError:
            return 0
        if stamp >= EPOCH_MS_MIN:
            return 0
        offset = int(st.st_mtime * 1000) - stamp
        log.warning(
            "%s: relative timestamps (log_unix_epoch=0); placed on the wall clock by taking the "
            "file's modification time as the time of its last record (offset %d ms); hosts "
            "cannot be aligned exactly",
            gen.path,
            offset,
        )
        return offset

    def _collect_problems(self, gen: _Generation) -> None:
        for p in gen.problems.kept:
            _log_problem(p)
        gen.problems.kept.clear()  # counts stay: past keep_per_kind a kind is only counted
        for kind, n in gen.problems.counts.items():
            new = n - gen.counted[kind]
            if new:
                self.stats.problems[kind] = self.stats.problems.get(kind, 0) + new
                gen.counted[kind] = n

    def _emit(self, gen: _Generation, batch: RecordBatch | None) -> Iterator[Outgoing]:
        if batch is None or not len(batch):
            return
        n = len(batch)
        first = gen.next_seq
        gen.next_seq += n
        self.stats.records_read += n
        if gen.next_seq <= gen.skip_below:
            self.stats.records_skipped_replay += n
            return
        if first < gen.skip_below:
            keep = np.arange(first, first + n) >= gen.skip_below
            self.stats.records_skipped_replay += int((~keep).sum())
            batch = batch.select(keep)
            first = gen.skip_below
        yield from self._messages(gen.stream, first, batch)

    def _messages(self, stream: str, first: int, batch: RecordBatch) -> Iterator[Outgoing]:
        """Split ``batch`` into messages under the size cap (by record, in order)."""
        per_record = 32 + 10 * np.diff(batch.indptr)
        fixed = 64 + len(stream) + len(self.agent) + sum(len(s.stream) + 2 for s in batch.streams)
        budget = self.max_message_bytes - fixed
        start = 0
        n = len(batch)
        while start < n:
            sizes = np.cumsum(per_record[start:])
            take = max(1, int(np.searchsorted(sizes, budget, side="right")))
            end = min(n, start + take)
            part = batch.select(_range_mask(n, start, end))
            yield Outgoing(
                stream, first + start, end - start, encode(self.agent, stream, first + start, part)
            )
            start = end

    # -- positions -------------------------------------------------------------------------

    def positions(self, acked: dict[str, int]) -> dict[str, Resume]:
        """The positions to save, given the acknowledged sequence number of each stream.

        Paths not opened yet in this run keep what was loaded for them.
        """
        out = dict(self._resume)
        for path, gen in self._gens.items():
            if gen.parser is None and gen.offset == 0:
                continue
            out[path] = gen.resume(max(acked.get(gen.stream, 0), gen.skip_below))
        return out

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every file descriptor."""
        for gen in self._gens.values():
            gen.fh.close()
        self._gens.clear()


def _range_mask(n: int, start: int, end: int) -> npt.NDArray[np.bool_]:
    mask = np.zeros(n, dtype=np.bool_)
    mask[start:end] = True
    return mask


def _log_problem(p: Problem) -> None:
    if p.warning:
        log.warning("%s", p)
    else:
        log.warning("skipped: %s", p)
