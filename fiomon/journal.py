"""The aggregator's journal: what it received but has not yet published, kept on disk.

MQTT's persistent session covers what arrives while the aggregator is down; the journal
covers what it had already received when it died (``kill -9``, a crash, a reboot): those
records sat in open quanta, in memory. Every accepted message is appended to a segment
file before it is merged; a segment is deleted once every quantum its records touch has
closed. At start the segments are replayed, so the quanta that were open are re-formed
rather than published without what was received before the crash.

``state.json`` holds the grid (quantum, phase, layout) and how far quanta were closed, so
a restart keeps the same windows and does not publish a closed quantum twice. It is
written atomically after the quanta file, and the quanta file's last line is checked
too, so a crash between the two cannot publish a quantum twice either.

Format of a segment: records of ``<u32 length><payload>``; a torn last record (the crash
came mid-write) is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fiomon.spool import write_atomic

SEGMENT_BYTES = 32 * 1024 * 1024
_LEN = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class GridState:
    """What a restart must keep.

    Args:
        quantum_ms: the quantum length.
        phase_ms: the quanta grid's phase.
        layout: ``(group_nr, coarseness, unit)`` of the merged histograms.
        closed_ms: every quantum ending at or before this was published.
    """

    quantum_ms: int
    phase_ms: int
    layout: tuple[int, int, str]
    closed_ms: int | None

    def to_json(self) -> dict[str, object]:
        """The state file's content."""
        return {
            "version": 1,
            "quantum_ms": self.quantum_ms,
            "phase_ms": self.phase_ms,
            "layout": list(self.layout),
            "closed_ms": self.closed_ms,
        }

    @classmethod
    def load(cls, path: Path) -> GridState | None:
        """The saved state, or None if absent or unreadable."""
        try:
            d = json.loads(path.read_text())
            g, c, u = d["layout"]
            closed = d["closed_ms"]
            return cls(
                int(d["quantum_ms"]),
                int(d["phase_ms"]),
                (int(g), int(c), str(u)),
                None if closed is None else int(closed),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, path: Path) -> None:
        """Write atomically."""
        write_atomic(path, json.dumps(self.to_json()).encode())


class Journal:
    """Append-only segments of accepted payloads, deleted once their quanta closed.

    Args:
        folder: where segments live (created).
        segment_bytes: roll to a new segment past this size.
    """

    def __init__(self, folder: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.folder = folder
        self.segment_bytes = segment_bytes
        folder.mkdir(parents=True, exist_ok=True)
        self._segments: list[tuple[int, int]] = []  # (number, max end ms) of closed segments
        numbers = sorted(self._numbers())
        self._number = (numbers[-1] if numbers else 0) + 1
        self._size = 0
        self._max_end = -(2**62)
        self._fd: int | None = None
        self.bytes_written = 0

    def _numbers(self) -> list[int]:
        out = []
        for p in self.folder.glob("segment-*.bin"):
            with contextlib.suppress(ValueError):
                out.append(int(p.stem.split("-", 1)[1]))
        return out

    def _path(self, number: int) -> Path:
        return self.folder / f"segment-{number:08d}.bin"

    def replay(self) -> Iterator[tuple[int, bytes]]:
        """Every payload of the segments left by the previous run: (segment, payload)."""
        for number in sorted(self._numbers()):
            data = self._path(number).read_bytes()
            pos = 0
            while pos + _LEN.size <= len(data):
                (n,) = _LEN.unpack_from(data, pos)
                if pos + _LEN.size + n > len(data):
                    break  # torn by the crash
                yield number, data[pos + _LEN.size : pos + _LEN.size + n]
                pos += _LEN.size + n

    def adopt(self, number: int, max_end_ms: int) -> None:
        """Remember a replayed segment (deleted like the others once its quanta close)."""
        for i, (n, end) in enumerate(self._segments):
            if n == number:
                self._segments[i] = (n, max(end, max_end_ms))
                return
        self._segments.append((number, max_end_ms))

    def append(self, payload: bytes, max_end_ms: int) -> None:
        """Journal one accepted message (before it is merged)."""
        if self._fd is None or self._size + len(payload) > self.segment_bytes:
            self._roll()
        assert self._fd is not None  # noqa: S101 -- _roll opened it
        os.write(self._fd, _LEN.pack(len(payload)) + payload)
        self._size += _LEN.size + len(payload)
        self._max_end = max(self._max_end, max_end_ms)
        self.bytes_written += _LEN.size + len(payload)

    def release(self, closed_ms: int) -> None:
        """Delete segments whose records all lie in quanta ending at or before ``closed_ms``."""
        keep = []
        for number, end in self._segments:
            if end <= closed_ms:
                with contextlib.suppress(FileNotFoundError):
                    self._path(number).unlink()
            else:
                keep.append((number, end))
        self._segments = keep
        if self._fd is not None and self._size and self._max_end <= closed_ms:
            self._roll()  # the current segment is done with too

    def _roll(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            if self._size:
                self._segments.append((self._number, self._max_end))
                self._number += 1
            else:
                with contextlib.suppress(FileNotFoundError):
                    self._path(self._number).unlink()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        self._fd = os.open(self._path(self._number), flags, 0o600)
        self._size = 0
        self._max_end = -(2**62)

    def close(self) -> None:
        """Close the current segment (files stay for the next start)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def last_quanta_end(path: Path) -> int | None:
    """``end_ms`` of the last complete line of a quanta file, or None."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            tail = fh.read()
    except OSError:
        return None
    for line in reversed(tail.split(b"\n")[:-1]):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(line)["end_ms"])
    return None
