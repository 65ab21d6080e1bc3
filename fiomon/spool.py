"""The agent's durable state: atomic read positions, and the bounded on-disk spool.

**Positions** (``positions.json`` in the state directory) say, per followed path, which
file generation is followed and up to which sequence number the broker acknowledged it.
They are written atomically (temporary file, fsync, rename), so a crash leaves the old
or the new file, never a torn one.

**Spool**: every encoded message goes through it, in order, so a broker outage costs no
memory: messages wait in segment files on disk (``spool/``) and are published oldest
first. It is bounded: past ``max_bytes`` the oldest messages are dropped and counted.
It is emptied at start: the positions say what the broker has, and the followed files
are read again from there, so nothing waiting in it at a crash is lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from fiomon.follow import Outgoing, Resume

SEGMENT_BYTES = 4 * 1024 * 1024
POSITIONS_VERSION = 1


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new content."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    with contextlib.suppress(OSError):  # make the rename itself durable where supported
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def save_positions(path: Path, positions: dict[str, Resume]) -> None:
    """Write the positions file atomically."""
    doc = {
        "version": POSITIONS_VERSION,
        "files": {p: r.to_json() for p, r in sorted(positions.items())},
    }
    write_atomic(path, json.dumps(doc, indent=1).encode())


def load_positions(path: Path) -> tuple[dict[str, Resume], list[str]]:
    """Positions saved by :func:`save_positions`, and problems met (a missing file is none).

    A damaged file, or a damaged entry, is reported and ignored: its files are then read
    from their start as new streams, which the aggregator sees as new stream ids rather
    than as duplicates.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, []
    except OSError as exc:
        return {}, [f"{path}: cannot read ({exc.strerror or exc}); starting afresh"]
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return {}, [f"{path}: not valid JSON ({exc}); starting afresh"]
    if not isinstance(doc, dict) or doc.get("version") != POSITIONS_VERSION:
        return {}, [f"{path}: unknown format; starting afresh"]
    files = doc.get("files")
    out: dict[str, Resume] = {}
    problems: list[str] = []
    for p, entry in (files if isinstance(files, dict) else {}).items():
        try:
            if not isinstance(entry, dict):
                msg = "positions entry is not an object"
                raise ValueError(msg)
            out[str(p)] = Resume.from_json(entry)
        except ValueError as exc:
            problems.append(f"{path}: entry {p!r}: {exc}; that file starts afresh")
    return out, problems


@dataclass(frozen=True, slots=True)
class _Entry:
    segment: int
    offset: int
    size: int
    stream: str
    first_seq: int
    records: int


class Spool:
    """Bounded FIFO of messages in segment files under ``folder``.

    Args:
        folder: where segment files live (emptied on creation).
        max_bytes: total payload bytes kept; older messages are dropped beyond it.
    """

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        self._queue: deque[_Entry] = deque()
        self._bytes = 0
        self._segment = 0
        self._segment_size = 0
        self._writer: int | None = None
        self._readers: dict[int, int] = {}
        self.dropped_messages = 0
        self.dropped_records = 0

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def bytes(self) -> int:
        """Payload bytes waiting."""
        return self._bytes

    @property
    def records(self) -> int:
        """Records waiting."""
        return sum(e.records for e in self._queue)

    def push(self, msg: Outgoing) -> list[Outgoing]:
        """Append ``msg``; returns descriptions of messages dropped to make room."""
        if self._writer is None or self._segment_size + len(msg.payload) > SEGMENT_BYTES:
            self._roll()
        assert self._writer is not None  # noqa: S101 -- _roll opened it
        offset = self._segment_size
        os.write(self._writer, msg.payload)
        self._segment_size += len(msg.payload)
        self._queue.append(
            _Entry(self._segment, offset, len(msg.payload), msg.stream, msg.first_seq, msg.records)
        )
        self._bytes += len(msg.payload)
        dropped: list[Outgoing] = []
        while self._bytes > self.max_bytes and len(self._queue) > 1:
            old = self._queue.popleft()
            self._bytes -= old.size
            self.dropped_messages += 1
            self.dropped_records += old.records
            dropped.append(Outgoing(old.stream, old.first_seq, old.records, b""))
            self._release(old.segment)
        return dropped

    def peek(self) -> Outgoing | None:
        """The oldest message (still queued), or None."""
        if not self._queue:
            return None
        e = self._queue[0]
        fd = self._readers.get(e.segment)
        if fd is None:
            fd = self._readers[e.segment] = os.open(self._path(e.segment), os.O_RDONLY)
        payload = os.pread(fd, e.size, e.offset)
        return Outgoing(e.stream, e.first_seq, e.records, payload)

    def pop(self) -> None:
        """Forget the oldest message (it was acknowledged)."""
        e = self._queue.popleft()
        self._bytes -= e.size
        self._release(e.segment)

    def close(self) -> None:
        """Close every descriptor (the files stay until the next start empties them)."""
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()
        if self._writer is not None:
            os.close(self._writer)
            self._writer = None

    def _path(self, segment: int) -> Path:
        return self.folder / f"segment-{segment:08d}.bin"

    def _roll(self) -> None:
        if self._writer is not None:
            os.close(self._writer)
        self._segment += 1
        self._segment_size = 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        self._writer = os.open(self._path(self._segment), flags, 0o600)

    def _release(self, segment: int) -> None:
        """Delete a finished segment once no queued message lives in it."""
        if segment == self._segment or (self._queue and self._queue[0].segment <= segment):
            return
        fd = self._readers.pop(segment, None)
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            self._path(segment).unlink()
