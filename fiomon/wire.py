"""Wire format v1: many interval records per MQTT message, exact and strictly checked.

The full specification, with a byte table, is ``docs/wire-format.md``. In short, a
message is little-endian and laid out as columns so both ends are vectorised:

1. a fixed header: magic ``FIOM``, version 1, flags (bits 2-3: the latency kind, 0 clat,
   0x04 lat, 0x08 slat; both set is refused), bin layout (GROUP_NR, coarseness, unit),
   record count, total non-zero bins, first sequence number;
2. the agent id, the stream id, the run label when flag bit 1 is set, and a table of job
   labels (length-prefixed UTF-8);
3. one 32-byte row per record: job label index, direction, start and end ms, bytes, and
   its number of non-zero bins;
4. every record's bin indices (uint16, strictly increasing within a record), then every
   record's counts (uint32, or uint64 when flag bit 0 is set).

Record ``i`` has sequence number ``first_seq + i``, so every record carries
``(agent id, stream id, seq)``. :func:`decode` accepts only what :func:`encode` could
have written: any other payload raises :class:`~fiomon.errors.WireFormatError` with a
reason, and nothing else escapes it.

The sizes are this module's alone: :func:`encoded_size` is a message's exact length, and
an agent asks :func:`split` to cut a batch into messages under its size cap.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, get_args

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.errors import WireFormatError, WireReason
from fiomon.model import Direction, LatencyKind, RecordBatch, StreamInfo

MAGIC = b"FIOM"
VERSION = 1
FLAG_WIDE_COUNTS = 0x01
FLAG_RUN = 0x02  # a run label follows the stream id
# Bits 2-3: which latency the records' bins hold; none set is clat (every agent before).
FLAG_LAT = 0x04
FLAG_SLAT = 0x08
FLAG_KIND = FLAG_LAT | FLAG_SLAT
KIND_FLAGS: dict[LatencyKind, int] = {"clat": 0, "lat": FLAG_LAT, "slat": FLAG_SLAT}
_FLAG_KINDS: dict[int, LatencyKind] = {v: k for k, v in KIND_FLAGS.items()}
KNOWN_FLAGS = FLAG_WIDE_COUNTS | FLAG_RUN | FLAG_KIND
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # hard decoder limit; agents use 256 KiB by default
MAX_RECORDS = 1 << 20
MAX_ID_BYTES = 512
MAX_LABELS = 4096
MAX_TIME_MS = 1 << 53  # beyond any epoch ms fio writes; keeps float maths exact
UNITS = ("ns", "us")

# magic, version, flags, group_nr, coarseness, unit, pad, records, nnz, first_seq
_HEAD = struct.Struct("<4sBBBBBxIIQ")
_U16 = struct.Struct("<H")
_BIN_BYTES = 2  # a bin index (uint16); its count follows in a column of its own
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
        batch: the records; ``batch.streams`` are the job labels, with ``agent`` as host
            and ``run`` as their run.
        run: the run label the message carries (flag bit 1), or None.
        latency: the latency kind its bins hold (flag bits 2-3).
    """

    agent: str
    stream: str
    first_seq: int
    batch: RecordBatch
    run: str | None = None
    latency: LatencyKind = "clat"

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


def put_str(out: list[bytes], text: str, what: str) -> None:
    """Append ``text`` as a u16 length and its UTF-8 bytes (the wire's string form).

    Raises:
        ValueError: ``text`` is empty or over ``MAX_ID_BYTES`` bytes (a programming error).
    """
    raw = text.encode("utf-8")
    if not raw or len(raw) > MAX_ID_BYTES:
        msg = f"{what} must be 1..{MAX_ID_BYTES} UTF-8 bytes, got {len(raw)}"
        raise ValueError(msg)
    out.append(struct.pack("<H", len(raw)))
    out.append(raw)


def encode(
    agent: str,
    stream: str,
    first_seq: int,
    batch: RecordBatch,
    run: str | None = None,
    *,
    latency: LatencyKind = "clat",
) -> bytes:
    """One message holding every record of ``batch`` (seqs ``first_seq`` onwards).

    With ``run`` (1..512 UTF-8 bytes) the message carries that run label (flag bit 1);
    without, it is byte for byte what fiomon wrote before run labels existed. ``latency``
    says which latency the bins hold (flag bits 2-3; ``clat`` sets neither, the bytes of
    every fiomon before latency kinds).

    Raises:
        ValueError: the batch cannot be represented (bad ids, too many records or labels,
            times out of range); a programming error, not bad input.
    """
    n = len(batch)
    if not 0 < n <= MAX_RECORDS:
        msg = f"a message holds 1..{MAX_RECORDS} records, got {n}"
        raise ValueError(msg)
    if latency not in KIND_FLAGS:
        msg = f"latency must be one of {', '.join(KIND_FLAGS)}, got {latency!r}"
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
            (FLAG_WIDE_COUNTS if wide else 0)
            | (FLAG_RUN if run is not None else 0)
            | KIND_FLAGS[latency],
            lay.group_nr,
            lay.coarseness,
            UNITS.index(lay.unit),
            n,
            nnz,
            first_seq,
        )
    ]
    put_str(parts, agent, "agent id")
    put_str(parts, stream, "stream id")
    if run is not None:
        put_str(parts, run, "run label")
    parts.append(struct.pack("<H", len(batch.streams)))
    for s in batch.streams:
        put_str(parts, wire_id(s.stream), "job label")  # job names come from the files
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


class Part(NamedTuple):
    """One message of a batch :func:`split` into several.

    Args:
        first_seq: sequence number of its first record.
        records: number of records (seqs ``first_seq`` .. ``first_seq + records - 1``).
        payload: the message, as :func:`encode` writes it.
    """

    first_seq: int
    records: int
    payload: bytes


def encoded_size(agent: str, stream: str, batch: RecordBatch, run: str | None = None) -> int:
    """``len(encode(agent, stream, first_seq, batch, run))``, in bytes, without encoding.

    Exact for every batch :func:`encode` accepts (whatever ``first_seq``): the header, the
    ids and job labels (as :func:`wire_id` makes them), 32 bytes per record and 6 bytes
    per non-zero bin (10 when a count needs 64 bits).
    """
    wide = bool(len(batch.counts)) and int(batch.counts.max()) >= 2**32
    return (
        _fixed_size(agent, stream, batch.streams, run)
        + len(batch) * _RECORD.itemsize
        + len(batch.counts) * (_BIN_BYTES + (8 if wide else 4))
    )


def split(
    agent: str,
    stream: str,
    first_seq: int,
    batch: RecordBatch,
    max_bytes: int,
    *,
    run: str | None = None,
    latency: LatencyKind = "clat",
) -> Iterator[Part]:
    """``batch`` as messages of at most ``max_bytes`` bytes each, records in order.

    Every message is as :func:`encode` writes it, holds as many of the next records as
    fit (sized exactly, as :func:`encoded_size`) and carries the batch's whole job-label
    table; together they hold every record once, message ``k`` numbered on from where
    message ``k - 1`` ended. The one exception to the cap: a record that does not fit
    even alone (with the ids and labels every message repeats) goes alone, over it --
    records are never cut, and never dropped. An empty batch gives no message.

    Raises:
        ValueError: as :func:`encode` (a batch it cannot represent).
    """
    n = len(batch)
    if not n:
        return
    budget = max_bytes - _fixed_size(agent, stream, batch.streams, run)
    nnz = np.diff(batch.indptr)
    # Cumulative sizes of records 0..i, with 4-byte counts and with 8-byte ones; a
    # message takes 8-byte counts from its first record with a count of 2**32 or more.
    narrow = np.cumsum(_RECORD.itemsize + (_BIN_BYTES + 4) * nnz)
    big = np.flatnonzero(batch.counts >= 2**32)
    wide_recs = np.unique(np.searchsorted(batch.indptr, big, side="right") - 1)
    wide = np.cumsum(_RECORD.itemsize + (_BIN_BYTES + 8) * nnz) if len(wide_recs) else narrow
    start = 0
    while start < n:
        take = _fitting(narrow, start, budget)
        k = int(np.searchsorted(wide_recs, start))  # the first wide record from start on
        first_wide = int(wide_recs[k]) if k < len(wide_recs) else n
        if first_wide < start + take:  # with it, every count of the message is 8 bytes
            take = max(first_wide - start, _fitting(wide, start, budget))
        end = start + max(1, take)
        part = batch
        if start or end < n:
            mask = np.zeros(n, dtype=np.bool_)
            mask[start:end] = True
            part = batch.select(mask)
        payload = encode(agent, stream, first_seq + start, part, run, latency=latency)
        yield Part(first_seq + start, end - start, payload)
        start = end


def _fixed_size(
    agent: str, stream: str, labels: Sequence[StreamInfo], run: str | None = None
) -> int:
    """Bytes of a message before its record table: header, ids, run, job-label table."""
    strings = [
        agent,
        stream,
        *([run] if run is not None else []),
        *(wire_id(s.stream) for s in labels),
    ]
    return _HEAD.size + _U16.size + sum(_U16.size + len(t.encode("utf-8")) for t in strings)


def _fitting(cum: npt.NDArray[np.int64], start: int, budget: int) -> int:
    """How many records from ``start`` fit ``budget`` bytes (``cum``: cumulative sizes)."""
    base = int(cum[start - 1]) if start else 0
    return int(np.searchsorted(cum, base + budget, side="right")) - start


class Cursor:
    """Reads a payload front to back, refusing what it cannot hold.

    A read past the end, or of a negative size (a length field read as signed), raises
    :class:`~fiomon.errors.WireFormatError` with reason ``truncated``: never a slice that
    silently comes back short. Shared by the record and the partials decoders.
    """

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        """The next ``n`` bytes (``what`` names them in the refusal)."""
        if n < 0 or self.pos + n > len(self.data):
            left = len(self.data) - self.pos
            msg = f"truncated: {what} needs {n} bytes at offset {self.pos}, {left} left"
            raise WireFormatError(msg, "truncated")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def skip(self, n: int, what: str) -> int:
        """Like :meth:`take` without copying; returns the offset skipped from."""
        if n < 0 or self.pos + n > len(self.data):
            left = len(self.data) - self.pos
            msg = f"truncated: {what} needs {n} bytes at offset {self.pos}, {left} left"
            raise WireFormatError(msg, "truncated")
        at = self.pos
        self.pos += n
        return at

    def text(self, what: str) -> str:
        """A u16-length-prefixed UTF-8 string of 1..``MAX_ID_BYTES`` bytes."""
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


# Why a payload was refused, for the metric label (WireFormatError.reason), in label order.
REASONS: tuple[WireReason, ...] = get_args(WireReason)


@dataclass(frozen=True, slots=True)
class _Head:
    """What the per-message (Python) pass learns: ids, labels and where the columns are."""

    index: int
    agent: str
    stream: str
    first_seq: int
    n: int
    nnz: int
    wide: bool
    layout: BinLayout
    labels: tuple[StreamInfo, ...]
    table_at: int
    bins_at: int
    counts_at: int
    run: str | None = None
    latency: LatencyKind = "clat"


@dataclass(frozen=True, slots=True)
class DecodedGroup:
    """Valid messages of one bin layout, decoded together into one batch.

    Args:
        batch: every record of the messages, message after message in input order; its
            stream table is the messages' job-label tables one after the other.
        index: per message, its position in the input.
        agents: per message, the agent id.
        streams: per message, the stream id.
        first_seq: per message, the sequence number of its first record.
        offsets: message ``k`` holds records ``offsets[k]:offsets[k+1]`` of ``batch``
            (``len(index) + 1`` entries).
        label_offsets: message ``k``'s job labels are ``batch.streams[lo:hi]`` with
            ``lo, hi = label_offsets[k], label_offsets[k+1]``.
        labels: per message, its job-label table (the decoder's cached tuple: the same
            object whenever an agent sends the same table, so callers may cache by it).
        runs: per message, its run label or None (empty: no message has one).
        latencies: per message, its latency kind (empty: every message is ``clat``).
    """

    batch: RecordBatch
    index: npt.NDArray[np.int64]
    agents: tuple[str, ...]
    streams: tuple[str, ...]
    first_seq: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    label_offsets: npt.NDArray[np.int64]
    labels: tuple[tuple[StreamInfo, ...], ...]
    runs: tuple[str | None, ...] = ()
    latencies: tuple[LatencyKind, ...] = ()

    def __len__(self) -> int:
        return len(self.index)

    def message(self, k: int) -> Message:
        """Message ``k`` on its own, with its own job-label table (as :func:`decode` gives)."""
        b = self.batch
        if len(self.index) > 1:
            lo, hi = int(self.offsets[k]), int(self.offsets[k + 1])
            llo, lhi = int(self.label_offsets[k]), int(self.label_offsets[k + 1])
            e0, e1 = int(b.indptr[lo]), int(b.indptr[hi])
            b = RecordBatch(
                layout=b.layout,
                streams=b.streams[llo:lhi],
                stream_idx=(b.stream_idx[lo:hi] - llo).astype(np.int32),
                direction=b.direction[lo:hi],
                start_ms=b.start_ms[lo:hi],
                end_ms=b.end_ms[lo:hi],
                nbytes=b.nbytes[lo:hi],
                indptr=b.indptr[lo : hi + 1] - e0,
                bins=b.bins[e0:e1],
                counts=b.counts[e0:e1],
            )
        run = self.runs[k] if self.runs else None
        return Message(
            self.agents[k], self.streams[k], int(self.first_seq[k]), b, run, self.latency(k)
        )

    def latency(self, k: int) -> LatencyKind:
        """Message ``k``'s latency kind."""
        return self.latencies[k] if self.latencies else "clat"


@dataclass(frozen=True, slots=True)
class Decoded:
    """The result of :meth:`Decoder.decode_many`.

    Args:
        groups: the valid messages, one group per bin layout (almost always one).
        errors: ``(input position, why)`` of every refused payload.
    """

    groups: tuple[DecodedGroup, ...]
    errors: tuple[tuple[int, WireFormatError], ...]


class Decoder:
    """Decodes wire-format messages one by one or many at once, with one set of rules.

    Decoding many at once is what the aggregator does: the per-message work is the header
    and the ids (a few microseconds of Python); the record tables, bins and counts of all
    messages are joined and checked with a fixed number of numpy operations, so the cost
    is per record, not per message. A payload that fails a check is refused alone, with
    exactly the reason :meth:`decode` would give, and the rest decode normally.

    An agent sends the same job-label table every second, so the decoder remembers the
    tables it has decoded (at most ``max_tables``; then it starts over).

    Args:
        max_bytes: larger payloads are refused (``oversized``) before anything is parsed.
        max_tables: label tables remembered.
    """

    def __init__(self, max_bytes: int = MAX_MESSAGE_BYTES, max_tables: int = 8192) -> None:
        self.max_bytes = max_bytes
        self.max_tables = max_tables
        self._tables: dict[tuple[str, str | None, bytes], tuple[StreamInfo, ...]] = {}
        self._last: dict[tuple[str, str | None], tuple[bytes, tuple[StreamInfo, ...]]] = {}
        self._layouts = {
            (g, c, u): BinLayout.from_codes(g, c, name)
            for g in range(19, 59)
            for c in range(7)
            for u, name in enumerate(UNITS)
        }

    def decode(self, payload: bytes) -> Message:
        """Decode and validate one message.

        Raises:
            WireFormatError: the payload is oversized, truncated, of another version, out
                of range or inconsistent (the message says which); never anything else.
        """
        out = self.decode_many([payload])
        if out.errors:
            raise out.errors[0][1]
        return out.groups[0].message(0)

    def decode_many(self, payloads: Sequence[bytes]) -> Decoded:
        """Decode ``payloads`` together; bad ones are refused one by one, never raised."""
        errors: list[tuple[int, WireFormatError]] = []
        by_layout: dict[BinLayout, list[_Head]] = {}
        for i, p in enumerate(payloads):
            try:
                h = self._head(i, p)
            except WireFormatError as exc:
                errors.append((i, exc))
                continue
            except Exception as exc:  # any slip in validation is a refusal
                errors.append((i, _malformed(exc)))
                continue
            by_layout.setdefault(h.layout, []).append(h)
        groups = []
        for heads in by_layout.values():
            try:
                group, bad = _assemble(payloads, heads)
            except Exception as exc:  # never expected; refuse the group, not the process
                errors.extend((h.index, _malformed(exc)) for h in heads)
                continue
            errors.extend(bad)
            if group is not None:
                groups.append(group)
        errors.sort(key=lambda e: e[0])
        return Decoded(tuple(groups), tuple(errors))

    def _head(self, index: int, payload: bytes) -> _Head:
        data = bytes(payload)
        quick = self._quick_head(index, data)
        if quick is not None:
            return quick
        if len(data) > self.max_bytes:
            msg = f"oversized: {len(data)} bytes, limit {self.max_bytes}"
            raise WireFormatError(msg, "oversized")
        cur = Cursor(data)
        magic, version, flags, group_nr, coarse, unit, n, nnz, first_seq = _HEAD.unpack(
            cur.take(_HEAD.size, "header")
        )
        if magic != MAGIC:
            msg = f"not a fiomon message (magic {magic!r})"
            raise WireFormatError(msg, "not-fiomon")
        if version != VERSION:
            msg = f"unsupported wire format version {version} (this fiomon speaks {VERSION})"
            raise WireFormatError(msg, "version")
        if flags & ~KNOWN_FLAGS:
            msg = f"unknown flags 0x{flags:02x}"
            raise WireFormatError(msg)
        if flags & FLAG_KIND == FLAG_KIND:
            msg = f"flags 0x{flags:02x} set both latency kind bits (lat 0x04 and slat 0x08)"
            raise WireFormatError(msg)
        if not 19 <= group_nr <= 58 or not 0 <= coarse <= 6 or unit >= len(UNITS):
            msg = f"invalid bin layout (group_nr {group_nr}, coarseness {coarse}, unit {unit})"
            raise WireFormatError(msg, "layout")
        layout = BinLayout.from_codes(group_nr, coarse, UNITS[unit])
        if not 0 < n <= MAX_RECORDS:
            msg = f"record count {n} outside 1..{MAX_RECORDS}"
            raise WireFormatError(msg)
        if first_seq >= 2**63 - n:
            msg = f"sequence number out of range: {first_seq}"
            raise WireFormatError(msg)
        agent = cur.text("agent id")
        stream = cur.text("stream id")
        run = cur.text("run label") if flags & FLAG_RUN else None
        (nlabels,) = struct.unpack("<H", cur.take(2, "label count"))
        if not 0 < nlabels <= MAX_LABELS:
            msg = f"label count {nlabels} outside 1..{MAX_LABELS}"
            raise WireFormatError(msg)
        labels = self._labels(cur, agent, nlabels, run)
        table_at = cur.skip(n * _RECORD.itemsize, "record table")
        width = 8 if flags & FLAG_WIDE_COUNTS else 4
        rest = len(data) - cur.pos
        if rest != nnz * (2 + width):
            msg = (
                f"inconsistent: {nnz} bins need {nnz * (2 + width)} bytes after the table, "
                f"got {rest}"
            )
            raise WireFormatError(msg, "inconsistent")
        bins_at = cur.pos
        return _Head(
            index,
            agent,
            stream,
            int(first_seq),
            int(n),
            int(nnz),
            width == 8,
            layout,
            labels,
            table_at,
            bins_at,
            bins_at + 2 * nnz,
            run,
            _FLAG_KINDS[flags & FLAG_KIND],
        )

    def _quick_head(self, index: int, data: bytes) -> _Head | None:
        """The header of an ordinary message, or None to take the careful path.

        Most messages come from an agent whose label table was seen a second ago: this
        reads them with a handful of ``unpack_from`` calls. Anything unusual (a new table,
        a bad field, a size that does not add up) returns None, and :meth:`_head` walks the
        message field by field and says exactly what is wrong.
        """
        size = len(data)
        if size > self.max_bytes or size < _HEAD.size + 6:
            return None
        magic, version, flags, group_nr, coarse, unit, n, nnz, first_seq = _HEAD.unpack_from(data)
        if (
            magic != MAGIC
            or version != VERSION
            or flags & ~KNOWN_FLAGS
            or flags & FLAG_KIND == FLAG_KIND
            or not 0 < n <= MAX_RECORDS
            or first_seq >= 2**63 - n
        ):
            return None
        layout = self._layouts.get((group_nr, coarse, unit))
        if layout is None:
            return None
        pos = _HEAD.size
        (la,) = _U16.unpack_from(data, pos)
        ls_at = pos + 2 + la
        if not 0 < la <= MAX_ID_BYTES or ls_at + 2 > size:
            return None
        (ls,) = _U16.unpack_from(data, ls_at)
        nl_at = ls_at + 2 + ls
        if not 0 < ls <= MAX_ID_BYTES or nl_at + 2 > size:
            return None
        run: str | None = None
        try:
            agent = data[pos + 2 : ls_at].decode("utf-8")
            stream = data[ls_at + 2 : nl_at].decode("utf-8")
            if flags & FLAG_RUN:
                (lr,) = _U16.unpack_from(data, nl_at)
                run_at, nl_at = nl_at + 2, nl_at + 2 + lr
                if not 0 < lr <= MAX_ID_BYTES or nl_at + 2 > size:
                    return None
                run = data[run_at:nl_at].decode("utf-8")
        except UnicodeDecodeError:
            return None
        (nlabels,) = _U16.unpack_from(data, nl_at)
        last = self._last.get((agent, run))
        table_at = nl_at + 2 + (len(last[0]) if last is not None else 0)
        if last is None or len(last[1]) != nlabels or not data.startswith(last[0], nl_at + 2):
            return None
        wide = bool(flags & FLAG_WIDE_COUNTS)
        bins_at = table_at + n * _RECORD.itemsize
        if bins_at + nnz * (10 if wide else 6) != size:
            return None
        return _Head(
            index,
            agent,
            stream,
            first_seq,
            n,
            nnz,
            wide,
            layout,
            last[1],
            table_at,
            bins_at,
            bins_at + 2 * nnz,
            run,
            _FLAG_KINDS[flags & FLAG_KIND],
        )

    def _labels(
        self, cur: Cursor, agent: str, nlabels: int, run: str | None = None
    ) -> tuple[StreamInfo, ...]:
        """The job label table; an agent sends the same table every second, so it is kept."""
        start = cur.pos
        last = self._last.get((agent, run))
        if last is not None and len(last[1]) == nlabels and cur.data.startswith(last[0], start):
            # The lengths are inside the bytes: the same count of labels in the same bytes
            # is the same, valid table.
            cur.pos += len(last[0])
            return last[1]
        for i in range(nlabels):  # walk the lengths (bounds-checked), decode only on a miss
            (length,) = struct.unpack("<H", cur.take(2, f"job label {i} length"))
            if not 0 < length <= MAX_ID_BYTES:
                msg = f"job label {i} length {length} outside 1..{MAX_ID_BYTES}"
                raise WireFormatError(msg)
            cur.skip(length, f"job label {i}")
        raw = cur.data[start : cur.pos]
        key = (agent, run, raw)
        hit = self._tables.get(key)
        if hit is not None:
            self._last[agent, run] = (raw, hit)
            return hit
        sub = Cursor(raw)
        labels = tuple(StreamInfo(agent, sub.text(f"job label {i}"), run) for i in range(nlabels))
        if len(set(labels)) != nlabels:
            msg = "duplicate job labels"
            raise WireFormatError(msg)
        if len(self._tables) >= self.max_tables:
            self._tables.clear()
            self._last.clear()
        self._tables[key] = labels
        self._last[agent, run] = (raw, labels)
        return labels


def _malformed(exc: Exception) -> WireFormatError:
    msg = f"malformed message ({type(exc).__name__}: {exc})"
    err = WireFormatError(msg)
    err.__cause__ = exc
    return err


_ROW_PROBLEMS = (
    "a record's job label index is out of range",
    "a record's direction is not 0, 1, 2 or 3",
    "a record's reserved byte is not zero",
    "record times must satisfy 0 <= start_ms <= end_ms < 2**53",
    "a record's byte count is out of range",
)


def _assemble(
    payloads: Sequence[bytes], heads: list[_Head]
) -> tuple[DecodedGroup | None, list[tuple[int, WireFormatError]]]:
    """Join and check the columns of ``heads`` (one layout); refuse the bad ones.

    Checks run in the order :func:`decode` reports them (record table, counts, bins), and
    a message is refused with the problems of the first stage it fails, so decoding a bad
    message with others gives the same reason as decoding it alone.
    """
    m = len(heads)
    layout = heads[0].layout
    views = [memoryview(payloads[h.index]) for h in heads]
    n_arr = np.fromiter((h.n for h in heads), dtype=np.int64, count=m)
    nnz_arr = np.fromiter((h.nnz for h in heads), dtype=np.int64, count=m)
    nlab = np.fromiter((len(h.labels) for h in heads), dtype=np.int64, count=m)
    rows = np.frombuffer(
        b"".join(v[h.table_at : h.bins_at] for v, h in zip(views, heads, strict=True)),
        dtype=_RECORD,
    )
    bins_u = np.frombuffer(
        b"".join(v[h.bins_at : h.counts_at] for v, h in zip(views, heads, strict=True)),
        dtype="<u2",
    )
    if any(h.wide for h in heads):
        counts_u = np.concatenate(
            [
                np.frombuffer(v[h.counts_at :], dtype="<u8" if h.wide else "<u4").astype(np.uint64)
                for v, h in zip(views, heads, strict=True)
            ]
        )
    else:
        counts_u = np.frombuffer(
            b"".join(v[h.counts_at :] for v, h in zip(views, heads, strict=True)), dtype="<u4"
        )
    row_off = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(n_arr, out=row_off[1:])
    entry_off = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(nnz_arr, out=entry_off[1:])
    row_msg = np.repeat(np.arange(m, dtype=np.int64), n_arr)
    start, end = rows["start_ms"], rows["end_ms"]
    row_bad = (
        rows["label"].astype(np.int64) >= nlab[row_msg],
        rows["direction"] > max(Direction),
        rows["pad"] != 0,
        (start < 0) | (end >= MAX_TIME_MS) | (end < start),
        rows["nbytes"] >= np.uint64(2**63),
    )
    rnnz = rows["nnz"].astype(np.int64)
    nnz_sum = np.add.reduceat(rnnz, row_off[:-1])
    stage1 = [np.bincount(row_msg[b], minlength=m) > 0 for b in row_bad]
    nnz_wrong = nnz_sum != nnz_arr
    bad1 = np.logical_or.reduce([*stage1, nnz_wrong])
    # Counts and bins, attributed to messages by the header's bin counts.
    entry_msg = np.repeat(np.arange(m, dtype=np.int64), nnz_arr)
    counts_bad = (counts_u == 0) | (counts_u >= np.uint64(2**63))
    bad2 = (np.bincount(entry_msg[counts_bad], minlength=m) > 0) & ~bad1
    too_big = bins_u >= layout.nbins
    cs = np.zeros(len(rnnz) + 1, dtype=np.int64)
    np.cumsum(rnnz, out=cs[1:])
    rec_start = entry_off[row_msg] + cs[:-1] - cs[row_off[:-1]][row_msg]
    is_start = np.zeros(len(bins_u) + 1, dtype=np.bool_)
    ok_rows = ~bad1[row_msg] & (rec_start < len(bins_u))
    is_start[rec_start[ok_rows]] = True
    steps = np.flatnonzero((np.diff(bins_u.astype(np.int64)) <= 0) & ~is_start[1:-1]) + 1
    not_increasing = np.bincount(entry_msg[steps], minlength=m) > 0
    too_big_msg = np.bincount(entry_msg[too_big], minlength=m) > 0
    bad3 = (too_big_msg | not_increasing) & ~bad1 & ~bad2
    bad = bad1 | bad2 | bad3
    errors: list[tuple[int, WireFormatError]] = []
    for k in np.flatnonzero(bad).tolist():
        if bad1[k]:
            problems = [text for text, b in zip(_ROW_PROBLEMS, stage1, strict=True) if b[k]]
            if nnz_wrong[k]:
                problems.append(f"records' bin counts do not add up to the header's {heads[k].nnz}")
            text = "; ".join(problems)
        elif bad2[k]:
            text = "counts must be positive (zero bins are not sent) and below 2**63"
        elif too_big_msg[k]:
            text = f"a bin index is >= {layout.nbins}, the layout's bin count"
        else:
            text = "bin indices within a record must be strictly increasing"
        errors.append((heads[k].index, WireFormatError(text)))
    if errors:
        good = [h for h, b in zip(heads, bad.tolist(), strict=True) if not b]
        if not good:
            return None, errors
        group, more = _assemble(payloads, good)
        return group, errors + more
    label_off = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(nlab, out=label_off[1:])
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(rnnz, out=indptr[1:])
    streams = tuple(itertools.chain.from_iterable(h.labels for h in heads))
    batch = RecordBatch(
        layout=layout,
        streams=streams,
        stream_idx=(rows["label"].astype(np.int64) + label_off[row_msg]).astype(np.int32),
        direction=rows["direction"].astype(np.int8),
        start_ms=start.astype(np.int64),
        end_ms=end.astype(np.int64),
        nbytes=rows["nbytes"].astype(np.int64),
        indptr=indptr,
        bins=bins_u.astype(np.int32),
        counts=counts_u.astype(np.int64),
    )
    group = DecodedGroup(
        batch=batch,
        index=np.fromiter((h.index for h in heads), dtype=np.int64, count=m),
        agents=tuple(h.agent for h in heads),
        streams=tuple(h.stream for h in heads),
        first_seq=np.fromiter((h.first_seq for h in heads), dtype=np.int64, count=m),
        offsets=row_off,
        label_offsets=label_off,
        labels=tuple(h.labels for h in heads),
        runs=tuple(h.run for h in heads) if any(h.run is not None for h in heads) else (),
        latencies=tuple(h.latency for h in heads)
        if any(h.latency != "clat" for h in heads)
        else (),
    )
    return group, []


_DEFAULT = Decoder()


def decode(payload: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Decode and validate one message (see :meth:`Decoder.decode`).

    Raises:
        WireFormatError: the payload is oversized, truncated, of another version, out of
            range or inconsistent (the message says which); never any other exception.
    """
    if len(payload) > max_bytes:
        msg = f"oversized: {len(payload)} bytes, limit {max_bytes}"
        raise WireFormatError(msg, "oversized")
    return _DEFAULT.decode(payload)


def describe(payload: bytes) -> str | None:
    """Who sent a possibly damaged message and which records it held, if that is readable.

    For reports about lost data: ``"client-07 stream run.json@1, seqs 100..149 (50
    records)"``, or None when not even the header and ids can be read.
    """
    try:
        cur = Cursor(bytes(payload))
        magic, _, _, _, _, _, n, _, first_seq = _HEAD.unpack(cur.take(_HEAD.size, "header"))
        if magic != MAGIC or not 0 < n <= MAX_RECORDS:
            return None
        agent = cur.text("agent id")
        stream = cur.text("stream id")
        run = cur.text("run label") if payload[5] & FLAG_RUN else None
    except (WireFormatError, struct.error, IndexError):
        return None
    if run is not None:
        stream = f"{stream} (run {run})"
    return f"{agent} stream {stream}, seqs {first_seq}..{first_seq + n - 1} ({n} records)"
