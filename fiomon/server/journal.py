"""The aggregator's state directory: the journal, the grid state and the lock.

MQTT's persistent session covers what arrives while the aggregator is down; the journal
covers what it had already received: records in open quanta, in memory. Each batch of
received messages is appended to a segment file *before* the messages are acknowledged to
the broker (manual PUBACK), so a message is either in the journal or still the broker's
to redeliver; ``kill -9`` and a graceful stop therefore leave the same state. A segment is
deleted once the quanta file confirms every quantum its records touch. At start the
segments are replayed, so the quanta that were open are re-formed, not published
without what was received before.

Segment format (``journal-<n>.jnl``): the magic ``FMJNL002``, then records of
``<u32 length><u32 crc32><u16 host length><host><payload>`` (little-endian; ``length`` is
of host plus payload, the CRC covers both). A torn last record (the process died while
writing it, so the broker never had its acknowledgement and redelivers it) or a corrupt
one (the CRC disagrees: the disk or someone else changed it) is reported with what it
held, counted, and the rest of that segment is skipped. Segments of the first journal
format (``segment-<n>.bin``: ``<u32 length><payload>``) are replayed too.

``state.json`` holds the grid (quantum, phase, layout) and how far the quanta file is
confirmed, written atomically after each write of the quanta file. The quanta file's own
last lines say what was published (:mod:`fiomon.server.quantafile`), so losing or garbling
``state.json`` never publishes a quantum twice.

A lock file (``flock``) keeps a second aggregator (or root) off the same state directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fiomon.errors import StateLockedError
from fiomon.runtime import write_atomic as write_atomic  # noqa: PLC0414 -- re-exported
from fiomon.wire import describe

SEGMENT_BYTES = 32 * 1024 * 1024
MAGIC = b"FMJNL002"
_REC = struct.Struct("<IIH")
_OLD_LEN = struct.Struct("<I")
_FAR = 2**62

ProblemSink = Callable[[str, str], None]  # (kind, text): log and count


class KnownState(Protocol):
    """A merger's own state saved beside the grid, opaque here (JSON in ``state.json``).

    The aggregator saves its watermark's known streams
    (:class:`fiomon.aggregator.watermark.KnownStreams`); the state directory only stores
    and returns it, so persistence does not depend on one merger's internals.
    """

    def to_json(self) -> dict[str, object]:
        """The JSON form that the loader's ``parse_known`` reads back."""
        ...


@dataclass(frozen=True, slots=True)
class GridState:
    """What a restart must keep.

    Args:
        quantum_ms: the quantum length.
        phase_ms: the quanta grid's phase.
        layout: ``(group_nr, coarseness, unit)`` of the merged histograms.
        closed_ms: every quantum ending at or before this is confirmed in the quanta file.
        known: the merger's own state (the aggregator: the streams the watermark knew, so
            a restart waits for hosts whose records all lie in confirmed quanta); None in
            state files of older versions.
        kept_ms: the journal holds every record of the quanta starting at or after this
            (it is released only past the revision horizon), so a restart can revise them;
            None: none (older versions, or no revisions).
        journal_pos: the journal position (:meth:`Journal.position`) before which every
            record had been merged when these rows were published: a restart re-forms
            closed quanta from those and takes later ones as new (a late record journaled
            just before a crash still revises its quantum); None: every record of a
            closed quantum counts as published (older versions).
    """

    quantum_ms: int
    phase_ms: int
    layout: tuple[int, int, str]
    closed_ms: int | None
    known: KnownState | None = None
    kept_ms: int | None = None
    journal_pos: tuple[int, int] | None = None

    def to_json(self) -> dict[str, object]:
        """The state file's content."""
        out = self.to_json_base()
        if self.known is not None:
            out["known"] = self.known.to_json()
        return out

    def to_json_base(self) -> dict[str, object]:
        """The state file's content without the known streams."""
        return {
            "version": 1,
            "quantum_ms": self.quantum_ms,
            "phase_ms": self.phase_ms,
            "layout": list(self.layout),
            "closed_ms": self.closed_ms,
            "kept_ms": self.kept_ms,
            "journal_pos": None if self.journal_pos is None else list(self.journal_pos),
        }

    @classmethod
    def load(
        cls, path: Path, parse_known: Callable[[object], KnownState] | None = None
    ) -> tuple[GridState | None, str | None]:
        """``(state, None)``; ``(None, None)`` if absent; ``(None, why)`` if unreadable.

        ``parse_known`` reads the merger's own state back (raising ``ValueError`` when it
        is garbled); without it that state is not read. Garbled known state alone gives
        ``(state without it, why)``: the grid and what was published are still good.
        """
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f"cannot read {path}: {exc.strerror or exc}"
        try:
            d = json.loads(text)
            g, c, u = d["layout"]
            closed = d["closed_ms"]
            kept = d.get("kept_ms")
            jpos = d.get("journal_pos")
            grid = cls(
                int(d["quantum_ms"]),
                int(d["phase_ms"]),
                (int(g), int(c), str(u)),
                None if closed is None else int(closed),
                kept_ms=None if kept is None else int(kept),
                journal_pos=None if jpos is None else (int(jpos[0]), int(jpos[1])),
            )
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            return None, f"{path} is garbled ({type(exc).__name__}: {exc}; {len(text)} bytes)"
        if "known" not in d or parse_known is None:
            return grid, None
        try:
            known = parse_known(d["known"])
        except ValueError as exc:
            return grid, f"{path}: the known streams are garbled and ignored ({exc})"
        return dataclasses.replace(grid, known=known), None

    def save(self, path: Path) -> None:
        """Write atomically (the folder is created if it vanished).

        The known state is encoded once per object: the merger passes the same one for
        several saves (its encoding is most of the cost).
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_json_base())
        if self.known is not None:
            text = f'{text[:-1]}, "known": {_known_text(self.known)}}}'
        write_atomic(path, text.encode())


_last_known: tuple[KnownState, str] | None = None  # the last encoding (one writer thread)


def _known_text(known: KnownState) -> str:
    """``known`` as JSON, encoded once per object.

    The core passes the same object to every save between two collections of it.
    """
    global _last_known  # noqa: PLW0603 -- a one-entry cache
    if _last_known is None or _last_known[0] is not known:
        _last_known = (known, json.dumps(known.to_json()))
    return _last_known[1]


class StateLock:
    """An exclusive ``flock`` on ``<state_dir>/lock``, so two services never share one.

    Args:
        folder: the state directory (created).
        service: who locks (``aggregator`` or ``root``), for the refusal's message.

    Raises:
        OSError: the folder cannot be created or the lock file opened.
        StateLockedError: another process holds the lock (naming its pid).
    """

    def __init__(self, folder: Path, service: str = "aggregator") -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "lock"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 64, 0).decode(errors="replace").strip()
            os.close(self._fd)
            raise StateLockedError(folder, holder, service) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)
        self.holder = str(os.getpid())

    def release(self) -> None:
        """Unlock (the file stays; the next holder overwrites the pid)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Journal:
    """Append-only segments of received payloads, deleted once their quanta are confirmed.

    Args:
        folder: where segments live (created, and re-created if it vanishes).
        segment_bytes: roll to a new segment past this size.
        problems: called with ``(kind, text)`` for every problem (a write that failed, a
            torn or corrupt record found at replay); the caller logs and counts.
    """

    def __init__(
        self,
        folder: Path,
        segment_bytes: int = SEGMENT_BYTES,
        problems: ProblemSink | None = None,
    ) -> None:
        self.folder = folder
        self.segment_bytes = segment_bytes
        self._problem = problems or (lambda kind, text: None)
        folder.mkdir(parents=True, exist_ok=True)
        self._paths: dict[int, Path] = self._scan()
        self._number = max(self._paths, default=0) + 1
        self._ends: dict[int, int] = {}  # segment -> latest record end noted
        self._size = 0
        self._fd: int | None = None
        # During replay: the byte offset just past the record last yielded (a segment of
        # the first format: 0, so it compares as before any position in it).
        self.replay_offset = 0

    def position(self) -> tuple[int, int]:
        """Where the next append goes: ``(segment, byte offset)``.

        Everything journaled so far lies before it: in a lower segment, or in this one
        below the offset. Positions only grow, also across restarts (:meth:`floor`).
        """
        return (self._number, self._size if self._fd is not None else 0)

    def floor(self, number: int) -> None:
        """Number new segments above ``number`` (a saved position's segment).

        A restart whose segments were all deleted would number from 1 again, and a
        position saved by the previous run would then lie after every new record.
        """
        if self._fd is None and self._number <= number:
            self._number = number + 1

    def _scan(self) -> dict[int, Path]:
        out: dict[int, Path] = {}
        for pattern in ("journal-*.jnl", "segment-*.bin"):
            for p in self.folder.glob(pattern):
                with contextlib.suppress(ValueError):
                    out[int(p.stem.split("-", 1)[1])] = p
        return out

    # -- replay ---------------------------------------------------------------------------

    def replay(self) -> Iterator[tuple[int, str | None, bytes]]:
        """Every payload left by the previous run: ``(segment, topic host, payload)``.

        The host is None for segments of the first format (which kept only payloads
        whose agent matched their topic). Problems go to ``problems``.
        """
        for number in sorted(self._paths):
            path = self._paths[number]
            try:
                data = path.read_bytes()
            except OSError as exc:
                self._problem("journal-unreadable", f"{path}: {exc.strerror or exc}")
                continue
            if path.suffix == ".bin":
                yield from self._replay_old(number, path, data)
            else:
                yield from self._replay_v2(number, path, data)

    def _replay_v2(self, number: int, path: Path, data: bytes) -> Iterator[tuple[int, str, bytes]]:
        if not data.startswith(MAGIC):
            if data:
                self._problem(
                    "journal-corrupt",
                    f"{path}: not a journal segment ({len(data)} bytes skipped)",
                )
            return
        pos = len(MAGIC)
        while pos < len(data):
            if pos + _REC.size > len(data):
                self._lost(
                    "journal-torn",
                    path,
                    pos,
                    tail=len(data) - pos,
                    payload=b"",
                    what="torn (the crash came mid-write)",
                )
                return
            length, crc, hlen = _REC.unpack_from(data, pos)
            body_at = pos + _REC.size
            body = data[body_at : body_at + length]
            if len(body) < length:
                self._lost(
                    "journal-torn",
                    path,
                    pos,
                    tail=len(data) - pos,
                    payload=body[hlen:],
                    what="torn (crash mid-write)",
                )
                return
            if zlib.crc32(body) != crc or hlen > length:
                self._lost(
                    "journal-corrupt",
                    path,
                    pos,
                    tail=len(data) - pos,
                    payload=body[hlen:],
                    what="corrupt (bad CRC)",
                )
                return
            try:
                host = body[:hlen].decode("utf-8")
            except UnicodeDecodeError:
                self._lost(
                    "journal-corrupt",
                    path,
                    pos,
                    tail=len(data) - pos,
                    payload=body[hlen:],
                    what="corrupt (host)",
                )
                return
            self.replay_offset = body_at + length
            yield number, host, body[hlen:]
            pos = body_at + length

    def _replay_old(
        self, number: int, path: Path, data: bytes
    ) -> Iterator[tuple[int, str | None, bytes]]:
        pos = 0
        while pos < len(data):
            if pos + _OLD_LEN.size > len(data):
                self._lost(
                    "journal-torn",
                    path,
                    pos,
                    tail=len(data) - pos,
                    payload=b"",
                    what="torn (the crash came mid-write)",
                )
                return
            (n,) = _OLD_LEN.unpack_from(data, pos)
            payload = data[pos + _OLD_LEN.size : pos + _OLD_LEN.size + n]
            if len(payload) < n:
                self._lost(
                    "journal-torn",
                    path,
                    pos,
                    tail=len(data) - pos,
                    payload=payload,
                    what="torn (crash mid-write)",
                )
                return
            yield number, None, payload
            pos += _OLD_LEN.size + n

    def _lost(
        self, kind: str, path: Path, pos: int, *, tail: int, payload: bytes, what: str
    ) -> None:
        held = describe(payload) if payload else None
        detail = f"it held {held}" if held else "what it held is unreadable"
        fate = (
            "never acknowledged, so the broker redelivers it"
            if kind == "journal-torn"
            else "it was acknowledged: those records are lost"
        )
        self._problem(
            kind,
            f"{path}: record at byte {pos} {what}; {tail} bytes skipped; {detail}; {fate}",
        )

    # -- writing --------------------------------------------------------------------------

    def append(self, items: Sequence[tuple[str, bytes]]) -> int:
        """Journal ``(topic host, payload)`` items with one write; returns the segment.

        Returns -1 if the write failed (reported and counted: the items are then only in
        memory until their quanta close).
        """
        if not items:
            return -1
        parts = []
        for host, payload in items:
            h = host.encode("utf-8")
            body = h + payload
            parts.append(_REC.pack(len(body), zlib.crc32(body), len(h)))
            parts.append(body)
        data = b"".join(parts)
        try:
            if self._fd is None or (self._size and self._size + len(data) > self.segment_bytes):
                self._roll()
            assert self._fd is not None  # noqa: S101 -- _roll opened it
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self._problem(
                "journal-write",
                f"cannot journal {len(items)} messages in {self.folder}: {exc.strerror or exc}"
                " (they are in memory only until their quanta close)",
            )
            self._close_fd()
            return -1
        self._size += len(data)
        return self._number

    def note(self, number: int, max_end_ms: int) -> None:
        """A message of segment ``number`` holds records ending up to ``max_end_ms``."""
        if number >= 0 and max_end_ms > self._ends.get(number, -_FAR):
            self._ends[number] = max_end_ms

    def release(self, closed_ms: int) -> None:
        """Delete segments whose records all lie in quanta confirmed through ``closed_ms``."""
        for number in [n for n in self._paths if n != self._number or self._fd is None]:
            if self._ends.get(number, -_FAR) <= closed_ms:
                with contextlib.suppress(FileNotFoundError):
                    self._paths[number].unlink()
                del self._paths[number]
                self._ends.pop(number, None)
        if self._fd is not None and self._size and self._ends.get(self._number, -_FAR) <= closed_ms:
            self._close_fd()  # the current segment is done with too
            self.release(closed_ms)

    def trim(self, max_bytes: int, closed_ms: int) -> int | None:
        """Delete the oldest segments done with by ``closed_ms`` until at most ``max_bytes`` stay.

        The revision horizon keeps segments after their quanta are confirmed; this bounds
        their disk. Returns the latest record end among the deleted segments (quanta
        ending at or before it are no longer whole in the journal), or None.
        """
        sizes: dict[int, int] = {}
        for number, path in self._paths.items():
            with contextlib.suppress(OSError):
                sizes[number] = path.stat().st_size
        total = sum(sizes.values())
        if total <= max_bytes:
            return None
        cut: int | None = None
        done = [n for n in sorted(self._paths) if n != self._number or self._fd is None]
        for number in sorted(done, key=lambda n: self._ends.get(n, -_FAR)):
            end = self._ends.get(number, -_FAR)
            if total <= max_bytes or end > closed_ms:
                break
            with contextlib.suppress(FileNotFoundError):
                self._paths[number].unlink()
            total -= sizes.get(number, 0)
            del self._paths[number]
            self._ends.pop(number, None)
            cut = end if cut is None else max(cut, end)
        return cut

    def _roll(self) -> None:
        self._close_fd()
        path = self.folder / f"journal-{self._number:08d}.jnl"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:
            self.folder.mkdir(parents=True, exist_ok=True)  # the state directory vanished
            self._problem("journal-write", f"{self.folder} was missing: created it again")
            fd = os.open(path, flags, 0o600)
        os.write(fd, MAGIC)
        self._fd = fd
        self._size = len(MAGIC)
        self._paths[self._number] = path

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._number += 1

    def close(self) -> None:
        """Close the current segment (files stay for the next start)."""
        self._close_fd()
