"""Wire format v1: exact round trips, and every malformed payload refused with a reason."""

from __future__ import annotations

import contextlib
import itertools
import struct

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fiomon.bins import BinLayout
from fiomon.errors import WireFormatError
from fiomon.model import LATENCY_KINDS, LatencyKind, RecordBatch, StreamInfo
from fiomon.wire import (
    KIND_FLAGS,
    MAX_TIME_MS,
    REASONS,
    VERSION,
    Decoder,
    Message,
    decode,
    encode,
    encoded_size,
    split,
)

LAYOUTS = [BinLayout(), BinLayout(29, 4), BinLayout(19, 0, "us"), BinLayout(30, 6)]


@st.composite
def batches(draw: st.DrawFn) -> RecordBatch:
    layout = draw(st.sampled_from(LAYOUTS))
    labels = draw(st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=4, unique=True))
    n = draw(st.integers(1, 6))
    recs = []
    for _ in range(n):
        start = draw(st.integers(0, MAX_TIME_MS - 1))
        end = draw(st.integers(start, min(MAX_TIME_MS - 1, start + 10**6)))
        bins = sorted(draw(st.sets(st.integers(0, layout.nbins - 1), max_size=12)))
        big = draw(st.booleans())
        counts = [draw(st.integers(1, 2**62 if big else 2**32 - 1)) for _ in bins]
        recs.append(
            (
                draw(st.integers(0, len(labels) - 1)),
                draw(st.integers(0, 2)),
                start,
                end,
                draw(st.integers(0, 2**62)),
                bins,
                counts,
            )
        )
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(r[5]) for r in recs], out=indptr[1:])
    return RecordBatch(
        layout=layout,
        streams=tuple(StreamInfo("h", lab) for lab in labels),
        stream_idx=np.array([r[0] for r in recs], np.int32),
        direction=np.array([r[1] for r in recs], np.int8),
        start_ms=np.array([r[2] for r in recs], np.int64),
        end_ms=np.array([r[3] for r in recs], np.int64),
        nbytes=np.array([r[4] for r in recs], np.int64),
        indptr=indptr,
        bins=np.array([b for r in recs for b in r[5]], np.int32),
        counts=np.array([c for r in recs for c in r[6]], np.int64),
    )


def assert_same(a: RecordBatch, b: RecordBatch) -> None:
    assert a.layout == b.layout
    assert [s.stream for s in a.streams] == [s.stream for s in b.streams]
    for name in ("stream_idx", "direction", "start_ms", "end_ms", "nbytes", "indptr", "bins"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert np.array_equal(a.counts, b.counts)


@settings(max_examples=150, deadline=None)
@given(batches(), st.integers(0, 2**40), st.text(min_size=1, max_size=30))
def test_decode_of_encode_is_the_identity(batch: RecordBatch, seq: int, stream: str) -> None:
    msg = decode(encode("client-07", stream, seq, batch))
    assert isinstance(msg, Message)
    assert (msg.agent, msg.stream, msg.first_seq) == ("client-07", stream, seq)
    assert list(msg.seqs) == list(range(seq, seq + len(batch)))
    assert all(s.host == "client-07" for s in msg.batch.streams)
    assert_same(batch, msg.batch)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(LATENCY_KINDS), st.one_of(st.none(), st.text(min_size=1)))
def test_each_latency_kind_round_trips_in_flag_bits_2_and_3(
    batch: RecordBatch, kind: LatencyKind, run: str | None
) -> None:
    data = encode("client-07", "s@1", 5, batch, run, latency=kind)
    assert data[5] & 0x0C == {"clat": 0, "lat": 0x04, "slat": 0x08}[kind] == KIND_FLAGS[kind]
    decoder = Decoder()
    for _ in range(2):  # the second decode takes the cached-label-table path
        msg = decoder.decode(data)
        assert (msg.latency, msg.run) == (kind, run)
        assert_same(batch, msg.batch)
    if kind == "clat":  # what every agent before latency kinds sent, byte for byte
        assert data == encode("client-07", "s@1", 5, batch, run)


def test_messages_of_each_kind_decoded_together_keep_their_kind() -> None:
    payloads = [_valid(kind) for kind in ("lat", "clat", "slat", "lat")]
    out = Decoder().decode_many(payloads)
    assert not out.errors
    (group,) = out.groups
    assert [group.message(k).latency for k in range(len(group))] == ["lat", "clat", "slat", "lat"]
    clat_only = Decoder().decode_many([_valid(), _valid()]).groups[0]
    assert clat_only.latencies == () and clat_only.latency(1) == "clat"


def test_both_latency_kind_bits_are_refused() -> None:
    data = _patch(_valid(), 5, "<B", 0x0C)
    for decoder in (Decoder(), Decoder()):
        decoder.decode(_valid())  # a known label table: the quick path must refuse it too
        with pytest.raises(WireFormatError, match="both latency kind bits") as info:
            decoder.decode(data)
        assert info.value.reason == "invalid"
    with pytest.raises(ValueError, match="latency must be one of"):
        encode("a", "s", 0, decode(_valid()).batch, latency="total")  # type: ignore[arg-type]


def _valid(latency: LatencyKind = "clat") -> bytes:
    b = RecordBatch(
        layout=BinLayout(),
        streams=(StreamInfo("h", "job.json:0:randrw"),),
        stream_idx=np.array([0, 0], np.int32),
        direction=np.array([0, 1], np.int8),
        start_ms=np.array([1_795_000_000_000, 1_795_000_000_000], np.int64),
        end_ms=np.array([1_795_000_001_000, 1_795_000_001_000], np.int64),
        nbytes=np.array([4096 * 7, 4096 * 2], np.int64),
        indptr=np.array([0, 2, 3], np.int64),
        bins=np.array([700, 701, 900], np.int32),
        counts=np.array([4, 3, 2], np.int64),
    )
    return encode("client-07", "job.json@1", 10, b, latency=latency)


def _patch(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    raw = bytearray(data)
    struct.pack_into(fmt, raw, offset, value)
    return bytes(raw)


# Offsets from docs/wire-format.md: records at 10, bins at 14; the record table is the
# 2 x 32 bytes before the 3 bins (2 bytes each) and 3 counts (4 bytes each).
TABLE = len(_valid()) - 3 * 6 - 2 * 32


@pytest.mark.parametrize(
    ("mutate", "reason", "label"),
    [
        (lambda d: d[:-1], "inconsistent", "inconsistent"),
        (lambda d: d[:20], "truncated", "truncated"),
        (lambda d: b"", "truncated", "truncated"),
        (lambda d: b"XXXX" + d[4:], "not a fiomon message", "not-fiomon"),
        (lambda d: _patch(d, 4, "<B", VERSION + 1), "unsupported wire format version 2", "version"),
        (lambda d: _patch(d, 5, "<B", 0x80), "unknown flags", "invalid"),
        (lambda d: _patch(d, 5, "<B", 0x10), "unknown flags", "invalid"),
        (lambda d: _patch(d, 5, "<B", 0x0C), "both latency kind bits", "invalid"),
        (lambda d: _patch(d, 6, "<B", 7), "invalid bin layout", "layout"),
        (lambda d: _patch(d, 10, "<I", 0), "record count 0", "invalid"),
        (lambda d: _patch(d, 14, "<I", 4), "inconsistent", "inconsistent"),
        (lambda d: _patch(d, TABLE + 2, "<B", 4), "direction", "invalid"),
        (lambda d: _patch(d, TABLE, "<H", 5), "label index", "invalid"),
        (lambda d: _patch(d, TABLE + 12, "<q", 1_795_000_000_000 - 5000), "times", "invalid"),
        (lambda d: d + b"\0" * 6, "inconsistent", "inconsistent"),
        (lambda d: d + b"\0" * (1 << 20), "oversized", "oversized"),
    ],
)
def test_malformed_payloads_are_refused_with_a_reason(
    mutate: object, reason: str, label: str
) -> None:
    data = mutate(_valid())  # type: ignore[operator]
    with pytest.raises(WireFormatError, match=reason) as info:
        decode(data, max_bytes=1 << 20)
    # the metric label comes from the error itself, not from matching its text
    assert info.value.reason == label
    assert label in REASONS


def test_bins_must_increase_and_fit_the_layout() -> None:
    data = _valid()
    bins_at = len(data) - 3 * 4 - 3 * 2
    with pytest.raises(WireFormatError, match="strictly increasing"):
        decode(_patch(data, bins_at + 2, "<H", 700))
    with pytest.raises(WireFormatError, match="bin index"):
        decode(_patch(data, bins_at + 4, "<H", 5000))
    with pytest.raises(WireFormatError, match="positive"):
        decode(_patch(data, len(data) - 4, "<I", 0))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_raise_anything_but_wire_format_error(data: bytes) -> None:
    with contextlib.suppress(WireFormatError):
        decode(data)


@settings(max_examples=600, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), min_size=1, max_size=6),
    st.integers(0, 200),
    st.binary(max_size=8),
)
def test_mutated_payloads_decode_or_are_refused(
    flips: list[tuple[int, int]], cut: int, tail: bytes
) -> None:
    raw = bytearray(_valid())
    for pos, val in flips:
        raw[pos % len(raw)] = val
    data = bytes(raw[: len(raw) - cut % 8]) + tail
    try:
        msg = decode(data)
    except WireFormatError:
        return
    # Whatever still decodes is internally consistent.
    b = msg.batch
    assert int(b.indptr[-1]) == len(b.counts) == len(b.bins)
    assert (b.direction <= 3).all() and (b.end_ms >= b.start_ms).all()
    assert (b.counts > 0).all() and (b.bins < b.layout.nbins).all()


def test_mixed_direction_round_trips() -> None:
    # fio's unified_rw_reporting sections (Direction.MIXED = 3) go on the wire as such.
    batch = RecordBatch(
        layout=BinLayout(),
        streams=(StreamInfo("h", "s"),),
        stream_idx=np.zeros(1, np.int32),
        direction=np.array([3], np.int8),
        start_ms=np.zeros(1, np.int64),
        end_ms=np.full(1, 1000, np.int64),
        nbytes=np.zeros(1, np.int64),
        indptr=np.array([0, 1], np.int64),
        bins=np.array([5], np.int32),
        counts=np.array([7], np.int64),
    )
    assert decode(encode("agent-x", "s@1", 0, batch)).batch.direction.tolist() == [3]


def test_label_tables_sharing_a_prefix_decode_apart() -> None:
    # The decoder caches each agent's last label table; a longer table that starts with
    # the same bytes must not be taken for it.
    def one(labels: tuple[str, ...]) -> RecordBatch:
        n = len(labels)
        return RecordBatch(
            layout=BinLayout(),
            streams=tuple(StreamInfo("h", s) for s in labels),
            stream_idx=np.arange(n, dtype=np.int32),
            direction=np.zeros(n, np.int8),
            start_ms=np.zeros(n, np.int64),
            end_ms=np.full(n, 1000, np.int64),
            nbytes=np.zeros(n, np.int64),
            indptr=np.zeros(n + 1, np.int64),
        )

    for labels in [("a",), ("a", "b"), ("a",), ("a", "c"), ("a", "b")]:
        msg = decode(encode("agent-x", "s@1", 0, one(labels)))
        assert [s.stream for s in msg.batch.streams] == list(labels)


def _outcome(data: bytes) -> Message | str:
    try:
        return decode(data, max_bytes=1 << 20)
    except WireFormatError as exc:
        return str(exc)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3),
            st.integers(0, 3),
            st.sampled_from(["h1", "h2", "client-07"]),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_decoding_many_at_once_gives_each_message_what_decoding_it_alone_gives(
    specs: list[tuple[list[tuple[int, int]], int, str]],
) -> None:
    # A mix of valid and damaged payloads, decoded together: each valid one comes back
    # exactly as decode() gives it, and each bad one is refused with decode()'s reason,
    # whatever its neighbours are.
    payloads = []
    for flips, cut, agent in specs:
        b = decode(_valid()).batch
        raw = bytearray(encode(agent, f"{agent}.json@1", 7, b))
        for pos, val in flips:
            raw[pos % len(raw)] = val
        payloads.append(bytes(raw[: len(raw) - cut]))
    out = Decoder(max_bytes=1 << 20).decode_many(payloads)
    refused = {i: str(e) for i, e in out.errors}
    accepted: dict[int, Message] = {}
    for g in out.groups:
        assert int(g.offsets[-1]) == len(g.batch)
        for k in range(len(g)):
            accepted[int(g.index[k])] = g.message(k)
    assert sorted([*refused, *accepted]) == list(range(len(payloads)))
    for i, p in enumerate(payloads):
        alone = _outcome(p)
        if isinstance(alone, str):
            assert refused.get(i) == alone
        else:
            got = accepted[i]
            assert (got.agent, got.stream, got.first_seq) == (
                alone.agent,
                alone.stream,
                alone.first_seq,
            )
            assert_same(alone.batch, got.batch)
            assert [s.host for s in got.batch.streams] == [alone.agent] * len(got.batch.streams)


def test_a_group_joins_the_messages_records_and_label_tables_in_order() -> None:
    def one(label: str, end: int) -> RecordBatch:
        return RecordBatch(
            layout=BinLayout(),
            streams=(StreamInfo("", label),),
            stream_idx=np.zeros(1, np.int32),
            direction=np.zeros(1, np.int8),
            start_ms=np.array([end - 1000], np.int64),
            end_ms=np.array([end], np.int64),
            nbytes=np.zeros(1, np.int64),
            indptr=np.array([0, 1], np.int64),
            bins=np.array([700], np.int32),
            counts=np.array([3], np.int64),
        )

    payloads = [encode(f"h{i}", "s@1", i, one(f"job{i}", 10_000 + i)) for i in range(3)]
    payloads.insert(1, b"junk")
    out = Decoder().decode_many(payloads)
    assert [i for i, _ in out.errors] == [1]
    (g,) = out.groups
    assert g.index.tolist() == [0, 2, 3]
    assert g.agents == ("h0", "h1", "h2") and g.first_seq.tolist() == [0, 1, 2]
    assert g.batch.end_ms.tolist() == [10_000, 10_001, 10_002]
    assert [(s.host, s.stream) for s in g.batch.streams] == [
        ("h0", "job0"),
        ("h1", "job1"),
        ("h2", "job2"),
    ]
    assert g.batch.stream_idx.tolist() == [0, 1, 2]


# -- sizes and splitting ------------------------------------------------------------------

# Ids and labels at the limits: 512 UTF-8 bytes of 1-, 2-, 3- and 4-byte characters, and
# file-name bytes that are not UTF-8 (wire_id writes each as 4 characters, then hashes).
LONG_NAMES = ["a" * 512, "é" * 256, "€" * 170, "\U0001f600" * 128, "\udcff" * 300, "x"]


@st.composite
def big_batches(draw: st.DrawFn) -> RecordBatch:
    """Batches an agent may have to split: dense records, long labels, 64-bit counts."""
    layout = draw(st.sampled_from(LAYOUTS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    n = draw(st.integers(1, 60))
    density = draw(st.sampled_from([0.0, 0.01, 0.2, 1.0]))  # 1.0: every bin non-zero
    wide_share = draw(st.sampled_from([0.0, 0.0, 0.05, 1.0]))  # records with counts >= 2**32
    labels = draw(st.lists(st.sampled_from(LONG_NAMES), min_size=1, max_size=3, unique=True))
    nnz = rng.binomial(layout.nbins, density, n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(nnz, out=indptr[1:])
    bins = np.concatenate(
        [np.sort(rng.choice(layout.nbins, k, replace=False)) for k in nnz.tolist()]
    ).astype(np.int32)
    wide = rng.random(n) < wide_share
    top = np.where(np.repeat(wide, nnz), 2**62, 2**32 - 1)
    start = np.sort(rng.integers(1_700_000_000_000, 1_700_000_100_000, n))
    return RecordBatch(
        layout=layout,
        streams=tuple(StreamInfo("h", lab) for lab in labels),
        stream_idx=rng.integers(0, len(labels), n).astype(np.int32),
        direction=rng.integers(0, 3, n).astype(np.int8),
        start_ms=start,
        end_ms=start + 1000,
        nbytes=rng.integers(0, 2**40, n),
        indptr=indptr,
        bins=bins,
        counts=(rng.random(len(bins)) * (top - 1)).astype(np.int64) + 1,
    )


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from(LONG_NAMES[:4]), st.sampled_from(LONG_NAMES[:4]))
def test_encoded_size_is_the_length_of_the_encoding(
    batch: RecordBatch, agent: str, stream: str
) -> None:
    assert encoded_size(agent, stream, batch) == len(encode(agent, stream, 7, batch))


@settings(max_examples=200, deadline=None)
@given(
    big_batches(),
    st.sampled_from(LONG_NAMES[:4]),
    st.sampled_from(LONG_NAMES[:4]),
    st.integers(0, 2**40),
    st.sampled_from([16 * 1024, 20_000, 64 * 1024, 256 * 1024]),
)
def test_split_messages_stay_under_the_cap_and_lose_nothing(
    batch: RecordBatch, agent: str, stream: str, first: int, cap: int
) -> None:
    parts = list(split(agent, stream, first, batch, cap))
    decoder = Decoder()
    msgs = [decoder.decode(p.payload) for p in parts]
    for p, m in zip(parts, msgs, strict=True):
        assert (m.agent, m.stream, m.first_seq, len(m.batch)) == (
            agent,
            stream,
            p.first_seq,
            p.records,
        )
        # Over the cap only a record that does not fit even alone, and then alone.
        assert len(p.payload) <= cap or p.records == 1
    # Every record once, in order, numbered on: the batch and its samples, whole.
    starts = itertools.accumulate([p.records for p in parts[:-1]], initial=first)
    assert [p.first_seq for p in parts] == list(starts)
    assert sum(p.records for p in parts) == len(batch)
    # Python ints: 64-bit counts overflow a numpy sum.
    assert sum(sum(m.batch.counts.tolist()) for m in msgs) == sum(batch.counts.tolist())
    joined = np.concatenate([m.batch.bins for m in msgs])
    assert np.array_equal(joined, batch.bins)
    assert np.array_equal(np.concatenate([m.batch.counts for m in msgs]), batch.counts)
    for name in ("stream_idx", "direction", "start_ms", "end_ms", "nbytes"):
        joined = np.concatenate([getattr(m.batch, name) for m in msgs])
        assert np.array_equal(joined, getattr(batch, name)), name
    # Greedy: no message could have taken its successor's first record too.
    for p in parts[:-1]:
        lo = p.first_seq - first
        longer = batch.select(_between(len(batch), lo, lo + p.records + 1))
        assert encoded_size(agent, stream, longer) > cap


def test_a_dense_batch_with_ids_at_their_limits_splits_under_a_small_cap() -> None:
    # Every bin non-zero (11,168 bytes a record), 512-byte multi-byte ids and labels:
    # a size estimate that counts characters, or guesses the fixed part, overshoots here.
    lay = BinLayout()
    n = 40
    batch = RecordBatch(
        layout=lay,
        streams=tuple(StreamInfo("h", lab) for lab in LONG_NAMES),
        stream_idx=(np.arange(n) % len(LONG_NAMES)).astype(np.int32),
        direction=np.zeros(n, np.int8),
        start_ms=np.arange(n, dtype=np.int64) * 1000,
        end_ms=np.arange(1, n + 1, dtype=np.int64) * 1000,
        nbytes=np.full(n, 4096, np.int64),
        indptr=np.arange(n + 1, dtype=np.int64) * lay.nbins,
        bins=np.tile(np.arange(lay.nbins, dtype=np.int32), n),
        counts=np.tile(np.arange(1, lay.nbins + 1, dtype=np.int64), n),
    )
    agent, stream = "€" * 170, "\U0001f600" * 128
    parts = list(split(agent, stream, 100, batch, 16 * 1024))
    assert [p.records for p in parts] == [1] * n  # one dense record per message fits
    assert all(len(p.payload) <= 16 * 1024 for p in parts)
    assert sum(int(decode(p.payload).batch.counts.sum()) for p in parts) == int(batch.counts.sum())
    whole = list(split(agent, stream, 100, batch, 1 << 20))
    assert len(whole) == 1
    assert whole[0].payload == encode(agent, stream, 100, batch)  # unsplit: as encode writes


def test_split_of_an_empty_batch_gives_no_message() -> None:
    lay = BinLayout()
    empty = RecordBatch(
        layout=lay,
        streams=(StreamInfo("h", "j"),),
        stream_idx=np.zeros(0, np.int32),
        direction=np.zeros(0, np.int8),
        start_ms=np.zeros(0, np.int64),
        end_ms=np.zeros(0, np.int64),
        nbytes=np.zeros(0, np.int64),
        indptr=np.zeros(1, np.int64),
        bins=np.zeros(0, np.int32),
        counts=np.zeros(0, np.int64),
    )
    assert list(split("a", "s", 0, empty, 1 << 16)) == []


def _between(n: int, lo: int, hi: int) -> npt.NDArray[np.bool_]:
    mask = np.zeros(n, dtype=np.bool_)
    mask[lo:hi] = True
    return mask
