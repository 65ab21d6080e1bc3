"""fiomon.offline.iostats: exact percentiles over narrowing passes, exact gap counts, moments."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from fiomon.bins import MAX_GROUP_NR, plat_val_to_idx
from fiomon.histogram import pct_key
from fiomon.offline import iostats
from fiomon.offline.iostats import (
    ALL,
    FINE_BINS,
    GapCounts,
    IoStatsAccumulator,
    Moments,
    RankFinder,
    gap_stats,
    nearest_rank,
)

I64 = npt.NDArray[np.int64]
QS = (0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0)


def exact(values: I64, q: float) -> int:
    return int(np.sort(values)[nearest_rank(q, values.size) - 1])


def percentiles(values: I64, chunk: int = 9_973) -> tuple[dict[str, int], int]:
    finder = RankFinder(np.bincount(plat_val_to_idx(values, MAX_GROUP_NR), minlength=FINE_BINS), QS)
    passes = 0
    while finder.pending:
        for i in range(0, values.size, chunk):
            finder.feed(values[i : i + chunk])
        finder.finish_pass()
        passes += 1
    return finder.results, passes


def test_nearest_rank_is_exact_for_decimal_percentiles() -> None:
    # 99.9 % of 300 000 is rank 299 700 exactly; 99.9 / 100 * 300 000 in doubles is above it.
    assert nearest_rank(99.9, 300_000) == 299_700
    assert nearest_rank(50, 3) == 2
    assert nearest_rank(0, 10) == 1
    assert nearest_rank(100, 10) == 10


@pytest.mark.parametrize(
    ("cap", "kind", "passes"),
    [(1 << 20, "lognormal", 1), (50, "small", 1), (50, "hours", 2)],
    ids=["collect", "dense", "split"],
)
def test_percentiles_are_the_order_statistics_whatever_the_passes(
    cap: int, kind: str, passes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small cap makes the pass count every integer of a bin (bins of ns values below
    # 3 us are at most 32 wide) or, for values of hours, split the bin and narrow it.
    monkeypatch.setattr(iostats, "COLLECT_CAP", cap)
    monkeypatch.setattr(iostats, "SPLIT", 64)
    rng = np.random.default_rng(7)
    if kind == "small":
        values = rng.integers(0, 3_000, 200_000)
    else:
        values = rng.lognormal(11.0 if kind == "lognormal" else 35.0, 1.5, 200_000).astype(np.int64)
    values[:3] = 0
    got, n_passes = percentiles(values)
    assert got == {pct_key(q): exact(values, q) for q in QS}
    assert n_passes >= passes if kind == "hours" else n_passes == passes


def test_gap_counts_are_exact_below_and_above_the_dense_range() -> None:
    rng = np.random.default_rng(3)
    gaps = np.concatenate([rng.integers(0, 50, 10_000), rng.integers(60_000, 10**9, 100)])
    a, b = GapCounts(), GapCounts()
    a.add(gaps[:5_000])
    b.add(gaps[5_000:])
    a.merge(b)
    st = gap_stats(a, QS, restarts=0, nbins=12)
    assert st is not None
    assert st.count == gaps.size
    assert (st.min_ms, st.max_ms) == (gaps.min(), gaps.max())
    assert st.mean_ms == pytest.approx(gaps.mean(), rel=1e-12)
    assert st.variance_ms2 == pytest.approx(gaps.var(), rel=1e-9)
    assert st.percentiles_ms == {pct_key(q): exact(gaps, q) for q in QS}
    assert st.same_stamp + sum(c for _, _, c in st.histogram) == gaps.size
    assert len(a.sparse) <= 100  # one entry per distinct long gap


def test_gaps_never_span_two_files_and_a_stamp_going_back_restarts() -> None:
    acc = IoStatsAccumulator()
    one = np.array([0, 0, 1])
    acc.add("a", np.array([10, 12, 15]), np.array([5, 6, 7]), one, np.full(3, 4096))
    acc.add("b", np.array([100, 101]), np.array([5, 6]), np.array([0, 0]), np.full(2, 4096))
    acc.add("a", np.array([3, 9]), np.array([5, 6]), np.array([0, 0]), np.full(2, 4096))
    reads = gap_stats(acc.dirs[0].gaps, (50.0,), acc.dirs[0].restarts, 12)
    assert reads is not None
    # file a: 10, 12 | back to 3 (restart), 9; file b: 100, 101
    assert (reads.count, reads.restarts) == (3, 1)
    assert sorted(np.repeat(*acc.dirs[0].gaps.values_counts()).tolist()) == [1, 2, 6]
    assert acc.dirs[ALL].restarts == 1
    assert acc.dirs[1].gaps.values_counts()[1].sum() == 0


def test_merged_moments_equal_the_whole() -> None:
    x = np.random.default_rng(1).integers(0, 10**9, 100_001)
    m = Moments()
    for part in np.array_split(x, 7):
        m.add(part)
    assert m.n == x.size
    assert m.total == int(x.sum())
    assert m.variance == pytest.approx(x.var(), rel=1e-12)
    assert (m.min, m.max) == (x.min(), x.max())
    assert math.isclose(m.mean, x.mean(), rel_tol=1e-15)
