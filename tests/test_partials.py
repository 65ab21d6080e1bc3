"""Partials v1: exact round trips, hostile payloads refused with a reason, splitting."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fiomon.bins import BinLayout
from fiomon.errors import WireFormatError
from fiomon.model import DIRECTIONS
from fiomon.partials import (
    MAX_REVISION,
    PartialRow,
    PartialsMessage,
    RawPartial,
    decode,
    encode,
    peek,
    rows_of,
    split,
)
from fiomon.wire import MAX_TIME_MS, REASONS, Cursor

LAYOUTS = [BinLayout(), BinLayout(29, 4), BinLayout(19, 0, "us")]
names = st.text(min_size=1, max_size=12).filter(lambda s: len(s.encode()) <= 512)


@st.composite
def rows(draw: st.DrawFn, layout: BinLayout) -> PartialRow:
    start = draw(st.integers(-(10**12), MAX_TIME_MS - 10**7))
    end = start + draw(st.integers(1, 10**6))
    host = draw(st.one_of(st.none(), names))
    hist = np.zeros(layout.nbins)
    for b in draw(st.sets(st.integers(0, layout.nbins - 1), max_size=10)):
        hist[b] = draw(
            st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False)
        )
    lo = draw(st.integers(start - 10**6, end))
    part = RawPartial(
        start_ms=start,
        end_ms=end,
        scope="cluster" if host is None else "host",
        host=host,
        direction=draw(st.sampled_from(DIRECTIONS)),
        hist=hist,
        lo_ms=lo,
        hi_ms=draw(st.integers(lo, end)),
        nbytes=draw(st.floats(min_value=0, max_value=1e18)),
        streams=draw(st.integers(0, 2**32 - 1)),
        revision=draw(st.one_of(st.just(0), st.integers(0, MAX_REVISION))),
    )
    return PartialRow(part, draw(st.integers(0, 2**63)), complete=draw(st.booleans()))


@st.composite
def messages(draw: st.DrawFn) -> PartialsMessage:
    layout = draw(st.sampled_from(LAYOUTS))
    return PartialsMessage(
        cell=draw(names),
        seq=draw(st.integers(0, 2**64 - 1)),
        layout=layout,
        closed_through_ms=draw(st.integers(-MAX_TIME_MS, MAX_TIME_MS)),
        rows=tuple(draw(st.lists(rows(layout), max_size=6))),
        latency=draw(st.sampled_from(("clat", "lat", "slat"))),
    )


def same(a: PartialsMessage, b: PartialsMessage) -> None:
    assert (a.cell, a.seq, a.layout, a.closed_through_ms, a.latency) == (
        b.cell,
        b.seq,
        b.layout,
        b.closed_through_ms,
        b.latency,
    )
    assert len(a.rows) == len(b.rows)
    for x, y in zip(a.rows, b.rows, strict=True):
        px, py = x.part, y.part
        assert (x.late_records, x.complete) == (y.late_records, y.complete)
        assert x.key() == y.key()
        assert (px.end_ms, px.lo_ms, px.hi_ms, px.nbytes, px.streams, px.revision) == (
            py.end_ms,
            py.lo_ms,
            py.hi_ms,
            py.nbytes,
            py.streams,
            py.revision,
        )
        assert np.array_equal(px.hist, py.hist)  # bit-exact float counts


@settings(max_examples=200, deadline=None)
@given(messages())
def test_round_trip_is_exact(msg: PartialsMessage) -> None:
    same(decode(encode(msg)), msg)
    assert peek(encode(msg)) == (msg.cell, msg.seq, msg.closed_through_ms)  # (issue 24)


@settings(max_examples=400, deadline=None)
@given(messages(), st.data())
def test_every_corruption_is_refused_with_a_reason_or_decodes(
    msg: PartialsMessage, data: st.DataObject
) -> None:
    """Flipped bytes and cuts never escape as anything but WireFormatError."""
    raw = bytearray(encode(msg))
    cut = data.draw(st.integers(0, len(raw)))
    for _ in range(data.draw(st.integers(1, 4))):
        if raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    for payload in (bytes(raw), bytes(raw[:cut])):
        try:
            decode(payload)
        except WireFormatError as exc:
            assert exc.reason in REASONS


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_are_refused(payload: bytes) -> None:
    try:
        decode(b"FIOP\x01" + payload)
    except WireFormatError as exc:
        assert exc.reason in REASONS
    peek(b"FIOP\x01" + payload)  # None or a pair; never an exception


def test_the_latency_kind_is_byte_8_and_an_unknown_one_is_refused() -> None:
    # Issue 27: 0 clat (the bytes of cells before kinds: the byte was reserved, 0), 1 lat,
    # 2 slat; anything else is refused, never read as a kind.
    for code, kind in enumerate(("clat", "lat", "slat")):
        raw = encode(PartialsMessage("cell-a", 7, BinLayout(), 1000, (), kind))  # type: ignore[arg-type]
        assert raw[8] == code and raw[9:12] == b"\0\0\0"
        assert decode(raw).latency == kind
    bad = bytearray(raw)
    bad[8] = 3
    with pytest.raises(WireFormatError, match="latency kind 3") as caught:
        decode(bytes(bad))
    assert caught.value.reason == "invalid"


def test_refusals_name_their_reason() -> None:
    msg = PartialsMessage("cell-a", 7, BinLayout(), 1000, ())
    raw = encode(msg)
    cases = {
        "oversized": (raw, 10),
        "not-fiomon": (b"FIOM" + raw[4:], None),
        "version": (raw[:4] + b"\x02" + raw[5:], None),
        "truncated": (raw[:20], None),
        "inconsistent": (raw + b"\x00", None),
    }
    for reason, (payload, limit) in cases.items():
        with pytest.raises(WireFormatError) as caught:
            decode(payload, max_bytes=limit or 1 << 24)
        assert caught.value.reason == reason
    # A hostile string count is refused before any loop of that size.
    head = bytearray(raw)
    struct.pack_into("<I", head, 28, 2**20)
    with pytest.raises(WireFormatError) as caught:
        decode(bytes(head))
    assert caught.value.reason == "truncated"


def test_negative_lengths_are_refused_not_crashed() -> None:
    """A length written as a negative number is refused as truncated, never sliced short.

    The partials decoder reads with :class:`fiomon.wire.Cursor` (one reader for both wire
    formats), whose guard refuses a negative size outright.
    """
    hist = np.zeros(BinLayout().nbins)
    hist[100] = 3.0
    part = RawPartial(0, 1000, "cluster", None, "read", hist, 0, 1000, 4096.0, 1)
    raw = bytearray(encode(PartialsMessage("cell-a", 1, BinLayout(), 1000, (PartialRow(part),))))
    # The one row's table entry sits before its 2-byte bin index and 8-byte count; its
    # nnz (u32) is at offset 56 of the 64-byte row (docs/wire-format.md, "Partials").
    row_at = len(raw) - 64 - 2 - 8
    struct.pack_into("<i", raw, row_at + 56, -1)
    with pytest.raises(WireFormatError) as caught:
        decode(bytes(raw))
    assert caught.value.reason == "truncated"
    for n in (-1, -(2**40)):
        with pytest.raises(WireFormatError) as caught:
            Cursor(b"abcd").take(n, "a length")
        assert caught.value.reason == "truncated"
    cur = Cursor(b"abcd")
    assert cur.take(2, "two") == b"ab"  # the guard refuses nothing it can hold
    assert cur.pos == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(rows(BinLayout()), min_size=1, max_size=12), st.integers(0, 3000))
def test_split_keeps_every_row_and_closes_only_at_the_end(
    parts: list[PartialRow], budget: int
) -> None:
    ordered = sorted(parts, key=lambda r: r.part.start_ms)
    through = max(r.part.end_ms for r in ordered)
    out = split(
        cell="c",
        first_seq=5,
        layout=BinLayout(),
        closed_through_ms=through,
        rows=ordered,
        max_bytes=budget,
    )
    assert [m.seq for m in out] == list(range(5, 5 + len(out)))
    assert [r for m in out for r in m.rows] == ordered
    assert out[-1].closed_through_ms == through
    for m in out[:-1]:
        # An early message closes none of its own quanta.
        assert all(m.closed_through_ms < r.part.end_ms for r in m.rows)
    for m in out:
        same(decode(encode(m)), m)


def _one_row(revision: int, *, complete: bool = True) -> PartialsMessage:
    hist = np.zeros(BinLayout().nbins)
    hist[7] = 2.5
    part = RawPartial(0, 1000, "host", "h1", "write", hist, 10, 900, 512.0, 1, revision)
    return PartialsMessage("c1", 3, BinLayout(), 1000, (PartialRow(part, 4, complete),))


@pytest.mark.parametrize("revision", [0, 1, 2, 255, MAX_REVISION])
@pytest.mark.parametrize("complete", [True, False])
def test_a_rows_revision_rides_in_its_flags_beside_the_incomplete_bit(
    revision: int, complete: bool
) -> None:
    """Bits 1..15 of a row's flags carry the revision; bit 0 stays the incomplete flag."""
    raw = encode(_one_row(revision, complete=complete))
    flags = struct.unpack_from("<H", raw, len(raw) - 2 - 8 - 2)[0]  # last 2 bytes of the row
    assert flags == (revision << 1) | (0 if complete else 1)
    (row,) = decode(raw).rows
    assert (row.part.revision, row.complete, row.late_records) == (revision, complete, 4)


def test_a_revision_beyond_the_flag_bits_is_refused_at_encode() -> None:
    """Neither wrapped nor saturated: either would give two deltas one identity."""
    with pytest.raises(ValueError, match="revision 32768"):
        encode(_one_row(MAX_REVISION + 1))
    with pytest.raises(ValueError, match="revision -1"):
        encode(_one_row(-1))


def test_rows_of_keeps_each_parts_revision() -> None:
    hist = np.zeros(BinLayout().nbins)
    first = RawPartial(0, 1000, "cluster", None, "all", hist, 0, 1000, 0.0, 0)
    again = RawPartial(0, 1000, "cluster", None, "all", hist, 5, 7, 0.0, 0, revision=3)
    key = (0, "cluster", None, "all")
    out = rows_of([first, again], {key: 2}, {key})
    assert [(r.part.revision, r.late_records, r.complete) for r in out] == [
        (0, 2, False),
        (3, 2, False),
    ]
