"""Partials v1: a cell's closed quanta as merged histograms, for the root (exact, checked).

The specification, with a byte table, is in ``docs/wire-format.md`` ("Partials"). A cell
publishes, for every quantum it closes, one *partial row* per scope, host and direction
(``all`` included, empty groups too): the float counts per bin, the covered time span,
bytes, streams and late records -- everything the root needs to form the same
:class:`~fiomon.closed.ClosedQuantum` rows one aggregator fed every record would have
formed. Every message also carries ``closed_through_ms``: the cell has closed every
quantum ending at or before it, so a quantum it closed *with nothing in it* is closed too
(a message with no rows is the cell's heartbeat and closed marker).

Layout (little-endian): a fixed header (magic ``FIOP``, version, bin layout, sequence
number, ``closed_through_ms``, string and row counts), a string table (the cell's name,
then host names; u16 length + UTF-8), one 64-byte row each, then every row's bin indices
(u16, strictly increasing within a row) and counts (float64). :func:`decode` accepts only
what :func:`encode` could have written: anything else raises
:class:`~fiomon.errors.WireFormatError` with a reason (:data:`fiomon.wire.REASONS`).
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.closed import Scope
from fiomon.errors import WireFormatError, WireReason
from fiomon.model import DIRECTIONS, LATENCY_KINDS, LatencyKind
from fiomon.wire import MAX_TIME_MS, UNITS, Cursor, put_str

MAGIC = b"FIOP"
VERSION = 1
MAX_PARTIALS_BYTES = 16 * 1024 * 1024  # hard decoder limit; cells split bigger batches
MAX_ROWS = 1 << 20
MAX_STRINGS = 1 << 20
SCOPES: tuple[Scope, ...] = ("cluster", "host")
FLAG_INCOMPLETE = 1  # a row's flags: the cell's own row of this group said complete: false
# A row's flags above bit 0 carry RawPartial.revision (bits 1..15): a cell revising one
# group more often than this is refused at encode rather than wrapped or saturated (either
# would give two different deltas one identity, and the root would drop the second as a
# resend).
REVISION_SHIFT = 1
MAX_REVISION = (1 << 15) - 1

# magic, version, group_nr, coarseness, unit, latency kind, seq, closed_through_ms, strings,
# rows. The kind (issue 27) is the byte after the unit: 0 clat, 1 lat, 2 slat (LATENCY_KINDS).
_HEAD = struct.Struct("<4sBBBBBxxxQqII")
_ROW = np.dtype(
    [
        ("start_ms", "<i8"),
        ("end_ms", "<i8"),
        ("lo_ms", "<i8"),
        ("hi_ms", "<i8"),
        ("nbytes", "<f8"),
        ("late", "<u8"),
        ("host", "<i4"),  # index into the string table (>= 1), -1 for cluster scope
        ("streams", "<u4"),
        ("nnz", "<u4"),
        ("scope", "u1"),
        ("direction", "u1"),  # index into DIRECTIONS
        ("flags", "<u2"),  # bit 0: the cell's row was incomplete; bits 1..15: revision
    ]
)
assert _ROW.itemsize == 64  # noqa: S101 -- the documented row size


@dataclass(frozen=True, slots=True)
class RawPartial:
    """One closed (quantum, scope, host, direction) group before statistics (a cell's partial).

    Made by a :class:`~fiomon.engine.QuantumEngine` only when asked to (``keep_partials``),
    for every group a close forms, empty ones included, so a root merging groups of
    several engines reproduces the :class:`~fiomon.closed.ClosedQuantum` rows one engine
    fed every record would have closed.

    Args:
        start_ms: quantum start (exclusive), ms.
        end_ms: quantum end (inclusive), ms.
        scope: ``cluster`` or ``host``.
        host: the host for host scope, else ``None``.
        direction: ``read``, ``write``, ``trim``, ``mixed`` or ``all``.
        hist: float counts per bin of the engine's layout.
        lo_ms: earliest covered time of the group's records, ms.
        hi_ms: latest covered time, ms (``hi_ms - lo_ms`` is the covered span).
        nbytes: bytes (overlap-weighted).
        streams: number of streams that contributed.
        revision: 0: the group as its quantum first closed. ``n >= 1``: the engine's
            ``n``-th revision of the group (late records merged after the close), and
            then the group holds only what that revision *added*: the late records' counts,
            bytes and span, and ``streams`` the streams new to the group. Added to what
            the earlier revisions sent, it gives the revised group (``lo_ms``/``hi_ms``
            combine by min/max, the rest by sum).
    """

    start_ms: int
    end_ms: int
    scope: Scope
    host: str | None
    direction: str
    hist: npt.NDArray[np.float64]
    lo_ms: int
    hi_ms: int
    nbytes: float
    streams: int
    revision: int = 0


@dataclass(frozen=True, slots=True)
class PartialRow:
    """One group of one closed quantum of one cell, as the root merges it.

    Args:
        part: the group (histogram, span, bytes, streams) as the cell's engine closed it.
        late_records: late records the cell counted on this group's closed-quantum row
            (0 for groups that formed no row).
        complete: the cell's closed-quantum row of this group said ``complete`` (a host
            it expected was silent: false); groups that formed no row are complete.
    """

    part: RawPartial
    late_records: int = 0
    complete: bool = True

    def key(self) -> tuple[int, str, str | None, str]:
        """``(start_ms, scope, host, direction)``, the group.

        With the cell and ``part.revision`` it is the row's identity: a resend repeats all
        three; a revision of the group is a new row.
        """
        p = self.part
        return (p.start_ms, p.scope, p.host, p.direction)


@dataclass(frozen=True, slots=True)
class PartialsMessage:
    """A decoded partials message.

    Args:
        cell: the cell's name (unique among the root's cells).
        seq: the cell's message number (its outbox counts them; for logs and gaps).
        layout: the bin layout of every row's histogram.
        closed_through_ms: every quantum ending at or before this is closed by the cell.
        rows: the groups of the quanta closed since the previous message.
        latency: the latency kind of every row's histogram (the cell's ``latency``).
    """

    cell: str
    seq: int
    layout: BinLayout
    closed_through_ms: int
    rows: tuple[PartialRow, ...]
    latency: LatencyKind = "clat"


def encode(msg: PartialsMessage) -> bytes:
    """The bytes of ``msg`` (counts are written as they are: exact float64).

    A row's ``part.revision`` goes into bits 1..15 of its ``flags`` (0 on a first close).

    Raises:
        ValueError: a name out of bounds, a histogram of the wrong width, a revision
            outside ``0..MAX_REVISION`` (32767), or a row that :func:`decode` would refuse.
    """
    lay = msg.layout
    hosts: dict[str, int] = {}
    for r in msg.rows:
        if r.part.host is not None and r.part.host not in hosts:
            hosts[r.part.host] = len(hosts) + 1
    if len(msg.rows) > MAX_ROWS or len(hosts) + 1 > MAX_STRINGS:
        text = f"{len(msg.rows)} rows / {len(hosts)} hosts exceed one message"
        raise ValueError(text)
    parts = [
        _HEAD.pack(
            MAGIC,
            VERSION,
            lay.group_nr,
            lay.coarseness,
            UNITS.index(lay.unit),
            LATENCY_KINDS.index(msg.latency),
            msg.seq,
            msg.closed_through_ms,
            len(hosts) + 1,
            len(msg.rows),
        )
    ]
    put_str(parts, msg.cell, "cell name")
    for h in hosts:
        put_str(parts, h, "host name")
    table = np.zeros(len(msg.rows), dtype=_ROW)
    bins: list[npt.NDArray[np.int64]] = []
    counts: list[npt.NDArray[np.float64]] = []
    for i, r in enumerate(msg.rows):
        p = r.part
        if len(p.hist) != lay.nbins:
            text = f"histogram of {len(p.hist)} bins, the layout has {lay.nbins}"
            raise ValueError(text)
        if not 0 <= p.revision <= MAX_REVISION:
            text = (
                f"revision {p.revision} of group ({p.end_ms}, {p.scope}, {p.host}, "
                f"{p.direction}) outside 0..{MAX_REVISION} (the row's 15 flag bits)"
            )
            raise ValueError(text)
        nz = np.flatnonzero(p.hist)
        bins.append(nz)
        counts.append(p.hist[nz])
        table[i] = (
            p.start_ms,
            p.end_ms,
            p.lo_ms,
            p.hi_ms,
            p.nbytes,
            r.late_records,
            -1 if p.host is None else hosts[p.host],
            p.streams,
            len(nz),
            SCOPES.index(p.scope),
            DIRECTIONS.index(p.direction),
            (p.revision << REVISION_SHIFT) | (0 if r.complete else FLAG_INCOMPLETE),
        )
    parts.append(table.tobytes())
    if bins:
        parts.append(np.concatenate(bins).astype("<u2").tobytes())
        parts.append(np.concatenate(counts).astype("<f8").tobytes())
    return b"".join(parts)


def _refuse(text: str, reason: WireReason = "invalid") -> NoReturn:
    raise WireFormatError(text, reason)


def peek(payload: bytes) -> tuple[str, int, int] | None:
    """``(cell, seq, closed_through_ms)`` from a message's header and first string, or None.

    Cheap (no rows are read) and not a validation: the root's delivery bookkeeping and a
    cell's outbox use it on messages :func:`decode` reads in full elsewhere.
    """
    if len(payload) < _HEAD.size + 3:
        return None
    magic, version, _, _, _, _, seq, through, nstr, _ = _HEAD.unpack_from(payload)
    if magic != MAGIC or version != VERSION or nstr < 1:
        return None
    cur = Cursor(payload)
    cur.pos = _HEAD.size
    try:
        cell = cur.text("cell name")
    except WireFormatError:
        return None
    return cell, int(seq), int(through)


def decode(payload: bytes, *, max_bytes: int = MAX_PARTIALS_BYTES) -> PartialsMessage:
    """The message in ``payload``; anything :func:`encode` could not have written is refused.

    Raises:
        WireFormatError: with ``reason`` oversized, truncated, not-fiomon, version, layout,
            inconsistent or invalid. Nothing else escapes.
    """
    if len(payload) > max_bytes:
        _refuse(f"oversized: {len(payload)} bytes > {max_bytes}", "oversized")
    if len(payload) < _HEAD.size:
        _refuse(f"truncated: {len(payload)} bytes, no header", "truncated")
    magic, version, group_nr, coarseness, unit, kind, seq, through, nstr, nrows = _HEAD.unpack_from(
        payload
    )
    if magic != MAGIC:
        _refuse(f"not a partials message (magic {magic!r})", "not-fiomon")
    if version != VERSION:
        _refuse(f"partials version {version}, this root reads {VERSION}", "version")
    try:
        layout = BinLayout.from_codes(group_nr, coarseness, UNITS[unit])
    except (ValueError, IndexError) as exc:
        _refuse(f"bad bin layout: {exc}", "layout")
    if kind >= len(LATENCY_KINDS):
        _refuse(f"latency kind {kind} (0 clat, 1 lat, 2 slat)")
    if not 1 <= nstr <= MAX_STRINGS or nrows > MAX_ROWS:
        _refuse(f"{nstr} strings / {nrows} rows out of bounds")
    if abs(through) > MAX_TIME_MS:
        _refuse(f"closed_through_ms {through} out of range")
    cur = Cursor(payload)
    cur.pos = _HEAD.size
    # Each string takes at least 3 bytes: a count the payload cannot hold is refused
    # before a loop the size of a hostile count.
    if 3 * nstr > len(payload) - cur.pos:
        _refuse(f"truncated: {nstr} strings in {len(payload)} bytes", "truncated")
    strings = [cur.text("cell name")]
    strings.extend(cur.text("host name") for _ in range(nstr - 1))
    table = np.frombuffer(cur.take(nrows * _ROW.itemsize, "row table"), dtype=_ROW)
    nnz = table["nnz"].astype(np.int64)
    total = int(nnz.sum())
    bins = np.frombuffer(cur.take(2 * total, "bin indices"), dtype="<u2").astype(np.int64)
    vals = np.frombuffer(cur.take(8 * total, "counts"), dtype="<f8")
    if cur.pos != len(payload):
        _refuse(f"{len(payload) - cur.pos} bytes after the last count", "inconsistent")
    _check_rows(table=table, nstr=nstr, nbins=layout.nbins, bins=bins, vals=vals, nnz=nnz)
    rows: list[PartialRow] = []
    at = 0
    nbins = layout.nbins
    for t, n in zip(table.tolist(), nnz.tolist(), strict=True):
        start, end, lo, hi, nbytes, late, host, streams, _, scope, direction, flags = t
        hist = np.zeros(nbins)
        hist[bins[at : at + n]] = vals[at : at + n]
        at += n
        part = RawPartial(
            start_ms=start,
            end_ms=end,
            scope=SCOPES[scope],
            host=None if host < 0 else strings[host],
            direction=DIRECTIONS[direction],
            hist=hist,
            lo_ms=lo,
            hi_ms=hi,
            nbytes=nbytes,
            streams=streams,
            revision=flags >> REVISION_SHIFT,
        )
        rows.append(PartialRow(part, late, complete=not flags & FLAG_INCOMPLETE))
    return PartialsMessage(strings[0], seq, layout, through, tuple(rows), LATENCY_KINDS[kind])


def _check_rows(
    *,
    table: npt.NDArray[np.void],
    nstr: int,
    nbins: int,
    bins: npt.NDArray[np.int64],
    vals: npt.NDArray[np.float64],
    nnz: npt.NDArray[np.int64],
) -> None:
    """Refuse rows :func:`encode` could not have written (vectorised over rows)."""
    if not len(table):
        return
    start, end = table["start_ms"], table["end_ms"]
    if np.any(start >= end) or np.any(np.abs(start) > MAX_TIME_MS) or np.any(end > MAX_TIME_MS):
        _refuse("a quantum with start >= end or out of range")
    lo, hi = table["lo_ms"], table["hi_ms"]
    if np.any(lo > hi) or np.any(np.abs(lo) > MAX_TIME_MS) or np.any(np.abs(hi) > MAX_TIME_MS):
        _refuse("a covered span with lo > hi or out of range")
    nb = table["nbytes"]
    if not np.all(np.isfinite(nb)) or np.any(nb < 0):
        _refuse("bytes not finite or negative")
    if np.any(table["scope"] > 1) or np.any(table["direction"] >= len(DIRECTIONS)):
        _refuse("unknown scope or direction")
    host = table["host"]
    is_host = table["scope"] == 1
    if np.any(is_host & ((host < 1) | (host >= nstr))) or np.any(~is_host & (host != -1)):
        _refuse("a host index that does not match the scope or the string table")
    if np.any(nnz > nbins):
        _refuse("more counts than bins in a row", "inconsistent")
    if len(bins):
        if np.any(bins >= nbins):
            _refuse("a bin index beyond the layout", "layout")
        if not np.all(np.isfinite(vals)) or np.any(vals <= 0):
            _refuse("a count not finite and positive")
        # Strictly increasing within each row: a drop is allowed only where a row starts.
        ends = np.cumsum(nnz)
        starts = ends - nnz
        step = np.diff(bins) > 0
        row_start = np.zeros(len(bins), dtype=np.bool_)
        row_start[starts[nnz > 0]] = True
        if not np.all(step | row_start[1:]):
            _refuse("bin indices not strictly increasing within a row", "inconsistent")


def rows_of(
    parts: Sequence[RawPartial],
    late: dict[tuple[int, str, str | None, str], int],
    incomplete: Collection[tuple[int, str, str | None, str]] = (),
) -> list[PartialRow]:
    """Partial rows of ``parts``, each with the late count and completeness of its row.

    ``late`` and ``incomplete`` are keyed ``(start_ms, scope, host, direction)``, from the
    closed-quantum rows of the same close (for a revision's group, the revision's row:
    its ``late_records`` are the late records that revision merged). Each part keeps its
    ``revision``.
    """
    out = []
    for p in parts:
        key = (p.start_ms, p.scope, p.host, p.direction)
        out.append(PartialRow(p, late.get(key, 0), complete=key not in incomplete))
    return out


def split(
    *,
    cell: str,
    first_seq: int,
    layout: BinLayout,
    closed_through_ms: int,
    rows: Sequence[PartialRow],
    max_bytes: int,
    latency: LatencyKind = "clat",
) -> list[PartialsMessage]:
    """``rows`` as messages of at most about ``max_bytes`` each, numbered from ``first_seq``.

    A quantum's rows may span messages; only the last message carries
    ``closed_through_ms`` (the others carry the previous quantum's start, which closes
    nothing new), so the root never closes a quantum before it has all of its rows.
    """
    out: list[PartialsMessage] = []
    chunk: list[PartialRow] = []
    size = _HEAD.size + 2 + len(cell.encode())
    budget = max(max_bytes, 4096)
    for r in rows:
        host = 0 if r.part.host is None else 2 + len(r.part.host.encode())
        need = _ROW.itemsize + 10 * int(np.count_nonzero(r.part.hist)) + host
        if chunk and size + need > budget:
            held = min(x.part.start_ms for x in chunk)
            out.append(
                PartialsMessage(
                    cell,
                    first_seq + len(out),
                    layout,
                    min(held, closed_through_ms),
                    tuple(chunk),
                    latency,
                )
            )
            chunk, size = [], _HEAD.size + 2 + len(cell.encode())
        chunk.append(r)
        size += need
    out.append(
        PartialsMessage(
            cell, first_seq + len(out), layout, closed_through_ms, tuple(chunk), latency
        )
    )
    return out
