"""The agent's spool: a bounded FIFO of encoded messages waiting for the broker.

Every encoded message goes through it, in order, so a broker outage costs no memory:
messages wait in segment files on disk (``spool/``) and are published oldest first.

* **Bounded**: past ``max_bytes`` the oldest messages are dropped and counted (their
  records are lost to the aggregator, which counts the gap too).
* **Never torn**: a message is queued only once all its bytes are written; a failed or
  short write (a full disk) is cut back off the segment, so a truncated message is never
  published.
* **Disk faults are a state**: when the disk refuses a write (ENOSPC, EIO, EDQUOT),
  messages wait in memory instead, up to ``memory_bytes``; past that :attr:`Spool.full`
  says so and the agent stops reading files until there is room again (nothing is lost:
  the files and the acknowledged positions are the durable truth). The disk is retried
  with backoff; each episode is logged once.
* Emptied at start: the positions say what the broker has, and the followed files are
  read again from there, so nothing waiting in it at a crash is lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fiomon.runtime import write_atomic

__all__ = ["Outgoing", "Spool", "write_atomic"]

log = logging.getLogger("fiomon.agent")

SEGMENT_BYTES = 4 * 1024 * 1024
MEMORY_BYTES = 16 * 1024 * 1024
RETRY_S = (5.0, 60.0)  # first and largest wait before the disk is tried again


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One encoded message ready to publish.

    Args:
        stream: stream id (see :mod:`fiomon.agent.follow`).
        first_seq: sequence number of its first record.
        records: number of records (seqs ``first_seq`` .. ``first_seq + records - 1``).
        payload: the wire-format message.
    """

    stream: str
    first_seq: int
    records: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class _Entry:
    segment: int  # 0: held in memory (``payload``)
    offset: int
    size: int
    stream: str
    first_seq: int
    records: int
    payload: bytes | None = None


class Spool:
    """Bounded FIFO of messages in segment files under ``folder`` (memory if the disk fails).

    Args:
        folder: where segment files live (emptied on creation).
        max_bytes: total payload bytes kept; older messages are dropped beyond it.
        memory_bytes: bytes held in memory while the disk refuses writes.
        clock: monotonic seconds (injected for tests).
    """

    def __init__(
        self,
        folder: Path,
        max_bytes: int,
        *,
        memory_bytes: int = MEMORY_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.memory_bytes = memory_bytes
        self._clock = clock
        self._queue: deque[_Entry] = deque()
        self._bytes = 0
        self._memory = 0
        self._segment = 0
        self._segment_size = 0
        self._writer: int | None = None
        self._readers: dict[int, int] = {}
        self._live: Counter[int] = Counter()  # queued messages per segment
        self.dropped_messages = 0
        self.dropped_records = 0
        self.disk_errors = 0
        self.disk_error: str | None = None  # the current episode's reason, if any
        self._retry_at = 0.0
        self._retry_s = RETRY_S[0]
        try:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._fail(exc)

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

    @property
    def full(self) -> bool:
        """The memory fallback is at its cap: stop producing until messages are sent."""
        return self._memory >= self.memory_bytes

    def push(self, msg: Outgoing) -> list[Outgoing]:
        """Append ``msg``; returns descriptions of messages dropped to make room.

        Never raises for disk faults: the message is then held in memory.
        """
        entry = self._write(msg)
        if entry is None:
            size = len(msg.payload)
            entry = _Entry(0, 0, size, msg.stream, msg.first_seq, msg.records, msg.payload)
            self._memory += entry.size
        self._queue.append(entry)
        self._bytes += entry.size
        dropped: list[Outgoing] = []
        while self._bytes > self.max_bytes and len(self._queue) > 1:
            old = self._queue.popleft()
            self._forget(old)
            self.dropped_messages += 1
            self.dropped_records += old.records
            dropped.append(Outgoing(old.stream, old.first_seq, old.records, b""))
        return dropped

    def _write(self, msg: Outgoing) -> _Entry | None:
        """Write ``msg`` to the current segment, or None if the disk refused it."""
        if self.disk_error is not None and self._clock() < self._retry_at:
            return None
        try:
            if self._writer is None or self._segment_size + len(msg.payload) > SEGMENT_BYTES:
                self._roll()
            assert self._writer is not None  # noqa: S101 -- _roll opened it
            view = memoryview(msg.payload)
            offset = self._segment_size
            try:
                while view:  # a short write means the disk is filling up: keep going
                    view = view[os.write(self._writer, view) :]
            except OSError:
                with contextlib.suppress(OSError):  # never leave half a message behind
                    os.ftruncate(self._writer, offset)
                raise
        except OSError as exc:
            self._fail(exc)
            return None
        self._segment_size += len(msg.payload)
        self._live[self._segment] += 1
        if self.disk_error is not None:
            log.warning(
                "spool: %s is writable again after %d failed writes", self.folder, self.disk_errors
            )
            self.disk_error = None
            self._retry_s = RETRY_S[0]
        return _Entry(
            self._segment, offset, len(msg.payload), msg.stream, msg.first_seq, msg.records
        )

    def _fail(self, exc: OSError) -> None:
        self.disk_errors += 1
        if self.disk_error is None:
            log.warning(
                "spool: cannot write to %s (%s): messages wait in memory (up to %d bytes), "
                "then reading pauses; retrying the disk with backoff",
                self.folder,
                exc.strerror or exc,
                self.memory_bytes,
            )
        else:
            self._retry_s = min(RETRY_S[1], self._retry_s * 2)
        self.disk_error = exc.strerror or str(exc)
        self._retry_at = self._clock() + self._retry_s
        if self._writer is not None:  # start a fresh segment when the disk is back
            with contextlib.suppress(OSError):
                os.close(self._writer)
            self._writer = None

    def peek(self) -> Outgoing | None:
        """The oldest message (still queued), or None.

        A message that cannot be read back whole is dropped and counted (it never goes
        out torn).
        """
        while self._queue:
            e = self._queue[0]
            if e.payload is not None:
                return Outgoing(e.stream, e.first_seq, e.records, e.payload)
            try:
                fd = self._readers.get(e.segment)
                if fd is None:
                    fd = self._readers[e.segment] = os.open(self._path(e.segment), os.O_RDONLY)
                payload = os.pread(fd, e.size, e.offset)
            except OSError as exc:
                payload, why = b"", exc.strerror or str(exc)
            else:
                why = "short read"
            if len(payload) == e.size:
                return Outgoing(e.stream, e.first_seq, e.records, payload)
            log.error(
                "spool: cannot read back %d records of %s (%s): dropped",
                e.records,
                e.stream,
                why,
            )
            self._queue.popleft()
            self._forget(e)
            self.dropped_messages += 1
            self.dropped_records += e.records
        return None

    def pop(self) -> None:
        """Forget the oldest message (it was acknowledged)."""
        self._forget(self._queue.popleft())

    def close(self) -> None:
        """Close every descriptor (the files stay until the next start empties them)."""
        for fd in self._readers.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._readers.clear()
        if self._writer is not None:
            with contextlib.suppress(OSError):
                os.close(self._writer)
            self._writer = None

    def _forget(self, e: _Entry) -> None:
        self._bytes -= e.size
        if e.segment == 0:
            self._memory -= e.size
        else:
            self._release(e.segment)

    def _path(self, segment: int) -> Path:
        return self.folder / f"segment-{segment:08d}.bin"

    def _roll(self) -> None:
        if self._writer is not None:
            os.close(self._writer)
            self._writer = None
        if self._segment and self._live[self._segment] <= 0:  # all sent already
            self._live.pop(self._segment, None)
            with contextlib.suppress(OSError):
                self._path(self._segment).unlink()
        self._segment += 1
        self._segment_size = 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        self._writer = os.open(self._path(self._segment), flags, 0o600)

    def _release(self, segment: int) -> None:
        """Delete a finished segment once no queued message lives in it."""
        self._live[segment] -= 1
        if self._live[segment] > 0 or (segment == self._segment and self._writer is not None):
            return
        del self._live[segment]
        fd = self._readers.pop(segment, None)
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(OSError):
            self._path(segment).unlink()
