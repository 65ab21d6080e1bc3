"""The quantum engine: splitting, alignment, late data, scopes, merge order."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fiomon.align import auto_phase
from fiomon.bins import BinLayout
from fiomon.engine import QuantumEngine
from fiomon.errors import LayoutError
from tests.batches import batch

LAY = BinLayout()


def engine(**kw: object) -> QuantumEngine:
    return QuantumEngine(layout=LAY, quantum_ms=1000, **kw)  # type: ignore[arg-type]


def test_record_straddling_two_quanta_is_split_by_overlap() -> None:
    #      quantum 0        quantum 1
    #  |----------------|----------------|
    #  0           750  1000             2000
    #              [======record=====]  (750, 1250]: 1/2 in each
    e = engine(directions=("read",))
    e.add(batch([(750, 1250, 0, {1000: 100})]))
    rows = e.flush()
    assert [(r.end_ms, r.stats.samples) for r in rows] == [(1000, 50), (2000, 50)]
    assert [r.iops for r in rows] == [200, 200]


def test_zero_length_catch_up_record_lands_in_the_quantum_of_its_stamp() -> None:
    e = engine(directions=("read",))
    e.add(batch([(0, 1000, 0, {900: 10}), (1000, 1000, 0, {900: 3})]))
    rows = e.flush()
    assert [(r.end_ms, r.stats.samples) for r in rows] == [(1000, 13)]


def test_phase_moves_the_grid() -> None:
    e = engine(phase_ms=250, directions=("read",))
    e.add(batch([(250, 1250, 0, {900: 10})]))
    rows = e.flush()
    assert [(r.start_ms, r.end_ms, r.stats.samples) for r in rows] == [(250, 1250, 10)]


def test_all_is_the_sum_of_directions_and_cluster_the_sum_of_hosts() -> None:
    e = engine(per_host=True)
    e.add(batch([(0, 1000, 0, {900: 10}), (0, 1000, 1, {950: 5})], host="a"))
    e.add(batch([(0, 1000, 0, {1000: 1})], host="b"))
    rows = {(r.scope, r.host, r.direction): r for r in e.flush()}
    assert rows[("cluster", None, "read")].stats.samples == 11
    assert rows[("cluster", None, "all")].stats.samples == 16
    assert rows[("cluster", None, "all")].streams == 2
    assert rows[("host", "a", "all")].stats.samples == 15
    assert rows[("host", "b", "read")].stats.samples == 1
    assert ("host", "b", "write") not in rows


def test_mixed_is_a_direction_of_its_own_and_part_of_all() -> None:
    # fio's unified_rw_reporting sections (Direction.MIXED = 3) next to a read stream.
    e = engine(per_host=True)
    e.add(batch([(0, 1000, 3, {900: 7})], host="a"))
    e.add(batch([(0, 1000, 0, {900: 2})], host="b"))
    rows = {(r.scope, r.host, r.direction): r.stats.samples for r in e.flush()}
    assert rows[("cluster", None, "mixed")] == 7
    assert rows[("cluster", None, "all")] == 9
    assert rows[("host", "a", "all")] == 7
    assert ("cluster", None, "write") not in rows


def test_late_record_is_counted_and_not_merged() -> None:
    e = engine(directions=("read",))
    e.add(batch([(0, 1000, 0, {900: 10})], host="h"))
    closed = e.close_through(1000)
    assert [r.stats.samples for r in closed] == [10]
    e.add(batch([(0, 1000, 0, {900: 99}), (1000, 2000, 0, {900: 4})], host="h"))
    rows = e.flush()
    assert [(r.end_ms, r.stats.samples, r.late_records) for r in rows] == [(2000, 4, 1)]
    assert e.late_records == {"h": 1}
    assert e.late_samples == 99


def test_host_cap_is_counted_but_cluster_keeps_the_data() -> None:
    e = engine(per_host=True, max_hosts=1, directions=("read",))
    e.add(batch([(0, 1000, 0, {900: 1})], host="a"))
    e.add(batch([(0, 1000, 0, {900: 2})], host="b"))
    rows = e.flush()
    assert [(r.scope, r.host, r.stats.samples) for r in rows] == [
        ("cluster", None, 3),
        ("host", "a", 1),
    ]
    assert e.hosts_over_cap == 1


def test_open_quanta_cap_forces_oldest_to_close() -> None:
    e = engine(max_open_quanta=2, directions=("read",))
    e.add(batch([(k * 1000, (k + 1) * 1000, 0, {900: 1}) for k in range(4)]))
    rows = e.flush()
    assert [r.end_ms for r in rows] == [1000, 2000, 3000, 4000]
    assert e.forced_closes >= 2


def test_coarser_layout_merges_finer_batches_exactly() -> None:
    coarse = BinLayout(29, 2)
    e = QuantumEngine(layout=coarse, quantum_ms=1000, directions=("read",))
    e.add(batch([(0, 1000, 0, {1000: 3, 1001: 4, 1003: 1})]))
    e.add(batch([(0, 1000, 0, {250: 2})], layout=coarse))
    rows = e.flush()
    assert rows[0].stats.samples == 10
    with pytest.raises(LayoutError):
        e.add(batch([(0, 1000, 0, {5: 1})], layout=BinLayout(30, 0)))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5000), st.integers(0, 3000), st.integers(0, 2), st.integers(1, 50)
        ),
        min_size=1,
        max_size=20,
    ),
    st.randoms(use_true_random=False),
)
def test_merge_is_order_independent_and_conserves_samples(
    recs: list[tuple[int, int, int, int]], rnd: random.Random
) -> None:
    items = [(s, s + d, dr, {800 + c % 7: c}) for s, d, dr, c in recs]
    one = engine(directions=("all",))
    one.add(batch(items))
    a = one.flush()
    shuffled = items[:]
    rnd.shuffle(shuffled)
    two = engine(directions=("all",))
    for it in shuffled:
        two.add(batch([it]))
    b = two.flush()
    assert [r.end_ms for r in a] == [r.end_ms for r in b]
    for x, y in zip(a, b, strict=True):
        assert x.stats.samples == pytest.approx(y.stats.samples)
        assert x.stats.percentiles_ns == pytest.approx(y.stats.percentiles_ns)
    assert sum(r.stats.samples for r in a) == pytest.approx(sum(c for *_, c in recs))


def test_auto_phase_finds_the_dominant_phase() -> None:
    ends = np.array([k * 1000 + 337 for k in range(50)] + [k * 1000 + 900 for k in range(50)])
    w = np.array([100.0] * 50 + [10.0] * 50)
    assert auto_phase(ends, w, 1000) == 337
    assert auto_phase(np.array([], np.int64), np.array([]), 1000) == 0


def test_late_records_are_given_once_when_several_quanta_close_together() -> None:
    # Late records counted since the previous close go on the oldest quantum closed now:
    # on each of them, a sum over the quanta file would count them once per quantum.
    e = engine(directions=("read",), per_host=True)
    e.add(batch([(0, 1000, 0, {900: 10})], host="h"))
    e.close_through(1000)
    e.add(batch([(0, 1000, 0, {900: 1}), (0, 1000, 0, {900: 2})], host="h", stream="t"))
    e.add(batch([(1000, 2000, 0, {900: 4}), (2000, 3000, 0, {900: 5})], host="h"))
    rows = e.close_through(3000)
    got = [(r.end_ms, r.scope, r.late_records) for r in rows]
    assert got == [(2000, "cluster", 2), (2000, "host", 2), (3000, "cluster", 0), (3000, "host", 0)]
    assert sum(e.late_records.values()) == 2
