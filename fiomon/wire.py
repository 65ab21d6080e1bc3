"""Wire format v1: many interval records per MQTT message, exact and strictly checked.

The full specification, with a byte table, is ``docs/wire-format.md``. In short, a
message is little-endian and laid out as columns so both ends are vectorised:

1. a fixed header: magic ``FIOM``, version 1, flags, bin layout (GROUP_NR, coarseness,
   unit), record count, total non-zero bins, first sequence number;
2. the agent id, the stream id and a table of job labels (length-prefixed UTF-8);
3. one 32-byte row per record: job label index, direction, start and end ms, bytes, and
   its number of non-zero bins;
4. every record's bin indices (uint16, strictly increasing within a record), then every
   record's counts (uint32, or uint64 when flag bit 0 is set).

Record ``i`` has sequence number ``first_seq + i``, so every record carries
``(agent id, stream id, seq)``. :func:`decode` accepts only what :func:`encode` could
have written: any other payload raises :class:`~fiomon.errors.WireFormatError` with a
reason, and nothing else escapes it.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.errors import WireFormatError
from fiomon.model import RecordBatch, StreamInfo

MAGIC = b"FIOM"
VERSION = 1
FLAG_WIDE_COUNTS = 0x01
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # hard decoder limit; agents use 256 KiB by default
MAX_RECORDS = 1 << 20
MAX_ID_BYTES = 512
MAX_LABELS = 4096
MAX_TIME_MS = 1 << 53  # beyond any epoch ms fio writes; keeps float maths exact
UNITS = ("ns", "us")

# magic, version, flags, group_nr, coarseness, unit, pad, records, nnz, first_seq
_HEAD = struct.Struct("<4sBBBBBxIIQ")
_RECORD = np.dtype(
    [
        ("label", "<u2"),
        ("direction", "u1"),
        ("pad", "u1"),
        ("start_ms", "<i8"),
        ("end_ms", "<i8"),
        ("nbytes", "<u8"),
        ("nnz", "<u4"),
    ]
)
assert _RECORD.itemsize == 32  # noqa: S101 -- the documented row size


@dataclass(frozen=True, slots=True)
class Message:
    """A decoded message: who sent it, the first sequence number, the records.

    Args:
        agent: agent id (the client host's name).
        stream: stream id (one followed file generation) that ``seq`` counts within.
        first_seq: sequence number of the first record; record ``i`` has ``first_seq + i``.
        batch: the records; ``batch.streams`` are the job labels, with ``agent`` as host.
    """

    agent: str
    stream: str
    first_seq: int
    batch: RecordBatch

    @property
    def seqs(self) -> npt.NDArray[np.int64]:
        """Sequence number of every record."""
        return self.first_seq + np.arange(len(self.batch), dtype=np.int64)


def wire_id(text: str, limit: int = MAX_ID_BYTES) -> str:
    r"""``text`` made into an id the wire format accepts (never raises).

    File names need not be UTF-8 (Python holds their odd bytes as surrogates): those bytes
    are written as ``\\xNN``. An id over ``limit`` bytes keeps its end (the file name
    says most) behind a hash of the whole, so distinct long ids stay distinct.
    """
    safe = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace") or "?"
    raw = safe.encode("utf-8")
    if len(raw) <= limit:
        return safe
    digest = hashlib.blake2b(raw, digest_size=8).hexdigest()
    tail = raw[-(limit - len(digest) - 2) :].decode("utf-8", "ignore")
    return f"{digest}~{tail}"


def _put_str(out: list[bytes], text: str, what: str) -> None:
    raw = text.encode("utf-8")
    if not raw or len(raw) > MAX_ID_BYTES:
        msg = f"{what} must be 1..{MAX_ID_BYTES} UTF-8 bytes, got {len(raw)}"
        raise ValueError(msg)
    out.append(struct.pack("<H", len(raw)))
    out.append(raw)


def encode(agent: str, stream: str, first_seq: int, batch: RecordBatch) -> bytes:
    """One message holding every record of ``batch`` (seqs ``first_seq`` onwards).

    Raises:
        ValueError: the batch cannot be represented (bad ids, too many records or labels,
            times out of range); a programming error, not bad input.
    """
    n = len(batch)
    if not 0 < n <= MAX_RECORDS:
        msg = f"a message holds 1..{MAX_RECORDS} records, got {n}"
        raise ValueError(msg)
    if not 0 <= first_seq < 2**63 - n:
        msg = f"first_seq out of range: {first_seq}"
        raise ValueError(msg)
    if len(batch.streams) > MAX_LABELS:
        msg = f"at most {MAX_LABELS} job labels per message, got {len(batch.streams)}"
        raise ValueError(msg)
    if n and (
        int(batch.start_ms.min()) < 0
        or int(batch.end_ms.max()) >= MAX_TIME_MS
        or bool((batch.end_ms < batch.start_ms).any())
    ):
        msg = "record times must satisfy 0 <= start_ms <= end_ms < 2**53"
        raise ValueError(msg)
    lay = batch.layout
    wide = bool(len(batch.counts)) and int(batch.counts.max()) >= 2**32
    nnz = len(batch.counts)
    parts = [
        _HEAD.pack(
            MAGIC,
            VERSION,
            FLAG_WIDE_COUNTS if wide else 0,
            lay.group_nr,
            lay.coarseness,
            UNITS.index(lay.unit),
            n,
            nnz,
            first_seq,
        )
    ]
    _put_str(parts, agent, "agent id")
    _put_str(parts, stream, "stream id")
    parts.append(struct.pack("<H", len(batch.streams)))
    for s in batch.streams:
        _put_str(parts, wire_id(s.stream), "job label")  # job names come from the files
    rows = np.zeros(n, dtype=_RECORD)
    rows["label"] = batch.stream_idx
    rows["direction"] = batch.direction
    rows["start_ms"] = batch.start_ms
    rows["end_ms"] = batch.end_ms
    rows["nbytes"] = np.maximum(batch.nbytes, 0)
    rows["nnz"] = np.diff(batch.indptr)
    parts.append(rows.tobytes())
    parts.append(batch.bins.astype("<u2").tobytes())
    parts.append(batch.counts.astype("<u8" if wide else "<u4").tobytes())
    return b"".join(parts)


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            left = len(self.data) - self.pos
            msg = f"truncated: {what} needs {n} bytes at offset {self.pos}, {left} left"
            raise WireFormatError(msg)
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def text(self, what: str) -> str:
        (length,) = struct.unpack("<H", self.take(2, f"{what} length"))
        if not 0 < length <= MAX_ID_BYTES:
            msg = f"{what} length {length} outside 1..{MAX_ID_BYTES}"
            raise WireFormatError(msg)
        raw = self.take(length, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            msg = f"{what} is not UTF-8"
            raise WireFormatError(msg) from None


def decode(payload: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Decode and validate one message.

    Raises:
        WireFormatError: the payload is oversized, truncated, of another version, out of
            range or inconsistent (the message says which); never any other exception.
    """
    try:
        return _decode(bytes(payload), max_bytes)
    except WireFormatError:
        raise
    except Exception as exc:  # any slip in validation still ends as a refusal
        msg = f"malformed message ({type(exc).__name__}: {exc})"
        raise WireFormatError(msg) from exc


def _decode(data: bytes, max_bytes: int) -> Message:
    if len(data) > max_bytes:
        msg = f"oversized: {len(data)} bytes, limit {max_bytes}"
        raise WireFormatError(msg)
    cur = _Cursor(data)
    magic, version, flags, group_nr, coarse, unit, n, nnz, first_seq = _HEAD.unpack(
        cur.take(_HEAD.size, "header")
    )
    if magic != MAGIC:
        msg = f"not a fiomon message (magic {magic!r})"
        raise WireFormatError(msg)
    if version != VERSION:
        msg = f"unsupported wire format version {version} (this fiomon speaks {VERSION})"
        raise WireFormatError(msg)
    if flags & ~FLAG_WIDE_COUNTS:
        msg = f"unknown flags 0x{flags:02x}"
        raise WireFormatError(msg)
    if not 19 <= group_nr <= 58 or not 0 <= coarse <= 6 or unit >= len(UNITS):
        msg = f"invalid bin layout (group_nr {group_nr}, coarseness {coarse}, unit {unit})"
        raise WireFormatError(msg)
    layout = BinLayout(group_nr, coarse, UNITS[unit])  # type: ignore[arg-type]
    if not 0 < n <= MAX_RECORDS:
        msg = f"record count {n} outside 1..{MAX_RECORDS}"
        raise WireFormatError(msg)
    if first_seq >= 2**63 - n:
        msg = f"sequence number out of range: {first_seq}"
        raise WireFormatError(msg)
    agent = cur.text("agent id")
    stream = cur.text("stream id")
    (nlabels,) = struct.unpack("<H", cur.take(2, "label count"))
    if not 0 < nlabels <= MAX_LABELS:
        msg = f"label count {nlabels} outside 1..{MAX_LABELS}"
        raise WireFormatError(msg)
    labels = _labels(cur, agent, nlabels)
    rows = np.frombuffer(cur.take(n * _RECORD.itemsize, "record table"), dtype=_RECORD)
    width = 8 if flags & FLAG_WIDE_COUNTS else 4
    rest = len(data) - cur.pos
    if rest != nnz * (2 + width):
        msg = f"inconsistent: {nnz} bins need {nnz * (2 + width)} bytes after the table, got {rest}"
        raise WireFormatError(msg)
    bins = np.frombuffer(cur.take(2 * nnz, "bins"), dtype="<u2").astype(np.int32)
    counts_raw = np.frombuffer(
        cur.take(width * nnz, "counts"), dtype="<u8" if width == 8 else "<u4"
    )
    _check_rows(rows, nlabels, nnz)
    if (counts_raw == 0).any() or (width == 8 and (counts_raw >= 2**63).any()):
        msg = "counts must be positive (zero bins are not sent) and below 2**63"
        raise WireFormatError(msg)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(rows["nnz"], out=indptr[1:])
    _check_bins(bins, indptr, layout.nbins)
    batch = RecordBatch(
        layout=layout,
        streams=labels,
        stream_idx=rows["label"].astype(np.int32),
        direction=rows["direction"].astype(np.int8),
        start_ms=rows["start_ms"].astype(np.int64),
        end_ms=rows["end_ms"].astype(np.int64),
        nbytes=rows["nbytes"].astype(np.int64),
        indptr=indptr,
        bins=bins,
        counts=counts_raw.astype(np.int64),
    )
    return Message(agent, stream, int(first_seq), batch)


_LABEL_CACHE: dict[tuple[str, bytes], tuple[StreamInfo, ...]] = {}
_LABEL_CACHE_MAX = 4096
_LAST_TABLE: dict[str, tuple[bytes, tuple[StreamInfo, ...]]] = {}


def _labels(cur: _Cursor, agent: str, nlabels: int) -> tuple[StreamInfo, ...]:
    """The job label table; an agent sends the same table every second, so it is cached."""
    start = cur.pos
    last = _LAST_TABLE.get(agent)
    if last is not None and len(last[1]) == nlabels and cur.data.startswith(last[0], start):
        # The lengths are inside the bytes: the same count of labels in the same bytes is
        # the same, valid table.
        cur.pos += len(last[0])
        return last[1]
    for i in range(nlabels):  # walk the lengths (bounds-checked), decode only on a miss
        (length,) = struct.unpack("<H", cur.take(2, f"job label {i} length"))
        if not 0 < length <= MAX_ID_BYTES:
            msg = f"job label {i} length {length} outside 1..{MAX_ID_BYTES}"
            raise WireFormatError(msg)
        cur.take(length, f"job label {i}")
    raw = cur.data[start : cur.pos]
    key = (agent, raw)
    hit = _LABEL_CACHE.get(key)
    if hit is not None:
        _LAST_TABLE[agent] = (raw, hit)
        return hit
    sub = _Cursor(raw)
    labels = tuple(StreamInfo(agent, sub.text(f"job label {i}")) for i in range(nlabels))
    if len(set(labels)) != nlabels:
        msg = "duplicate job labels"
        raise WireFormatError(msg)
    if len(_LABEL_CACHE) >= _LABEL_CACHE_MAX:
        _LABEL_CACHE.clear()
        _LAST_TABLE.clear()
    _LABEL_CACHE[key] = labels
    _LAST_TABLE[agent] = (raw, labels)
    return labels


def _check_rows(rows: npt.NDArray[np.void], nlabels: int, nnz: int) -> None:
    problems = []
    if (rows["label"] >= nlabels).any():
        problems.append("a record's job label index is out of range")
    if (rows["direction"] > 2).any():
        problems.append("a record's direction is not 0, 1 or 2")
    if (rows["pad"] != 0).any():
        problems.append("a record's reserved byte is not zero")
    start, end = rows["start_ms"], rows["end_ms"]
    if (start < 0).any() or (end >= MAX_TIME_MS).any() or (end < start).any():
        problems.append("record times must satisfy 0 <= start_ms <= end_ms < 2**53")
    if (rows["nbytes"] >= 2**63).any():
        problems.append("a record's byte count is out of range")
    if int(rows["nnz"].astype(np.int64).sum()) != nnz:
        problems.append(f"records' bin counts do not add up to the header's {nnz}")
    if problems:
        raise WireFormatError("; ".join(problems))


def _check_bins(bins: npt.NDArray[np.int32], indptr: npt.NDArray[np.int64], nbins: int) -> None:
    if len(bins) and int(bins.max()) >= nbins:
        msg = f"a bin index is >= {nbins}, the layout's bin count"
        raise WireFormatError(msg)
    # Strictly increasing within each record: a step down or repeat is allowed only where
    # a new record starts.
    steps = np.diff(bins) <= 0
    starts = np.zeros(len(bins), dtype=np.bool_)
    starts[indptr[1:-1][indptr[1:-1] < len(bins)]] = True
    if (steps & ~starts[1:]).any():
        msg = "bin indices within a record must be strictly increasing"
        raise WireFormatError(msg)
