"""Percentiles, bounds and saturation against exact values."""

from __future__ import annotations

import numpy as np
import pytest

from fiomon.bins import BinLayout, plat_val_to_idx
from fiomon.histogram import pct_key, percentiles, summarize, summarize_many

LAY = BinLayout()


def hist_of(values: np.ndarray) -> np.ndarray:
    return np.bincount(plat_val_to_idx(values), minlength=LAY.nbins).astype(np.float64)


def test_empty_histogram_is_none() -> None:
    assert summarize(np.zeros(LAY.nbins), LAY, [50]) is None


@pytest.mark.parametrize("q", [1, 50, 90, 99, 99.9])
def test_percentile_within_bin_width_of_exact(q: float) -> None:
    rng = np.random.default_rng(3)
    vals = rng.lognormal(np.log(200_000), 0.6, 50_000).astype(np.int64)
    got = percentiles(hist_of(vals), LAY, [q])
    assert got is not None
    exact = float(np.percentile(vals, q, method="inverted_cdf"))
    assert abs(got[0][0] - exact) / exact < 1 / 64, "never off by more than one bin width"


def test_percentile_interpolates_inside_the_bin() -> None:
    h = np.zeros(LAY.nbins)
    h[1000] = 4  # bin [lower, upper)
    lo, hi = LAY.edges_ns()
    res = percentiles(h, LAY, [25, 50, 100])
    assert res is not None
    assert res[0] == [
        lo[1000] + 0.25 * (hi[1000] - lo[1000]),
        lo[1000] + 0.5 * (hi[1000] - lo[1000]),
        hi[1000],
    ]


def test_boundary_target_stays_in_its_bin_across_a_gap() -> None:
    h = np.zeros(LAY.nbins)
    h[500], h[900] = 99, 1
    res = percentiles(h, LAY, [99])
    assert res is not None
    assert res[0][0] == LAY.edges_ns()[1][500], "p99 is the upper edge of bin 500, not bin 900"


def test_saturated_percentile_is_flagged_as_lower_bound() -> None:
    h = np.zeros(LAY.nbins)
    h[1000], h[-1] = 95, 5
    s = summarize(h, LAY, [50, 99])
    assert s is not None
    assert s.saturated == ("99",)
    assert s.percentiles_ns["99"] == LAY.cap_ns
    assert s.max_ns == LAY.edges_ns()[1][-1]


def test_bounds_mean_and_samples() -> None:
    vals = np.array([1000, 2000, 3000, 1_000_000])
    s = summarize(hist_of(vals), LAY, [50])
    assert s is not None
    assert s.samples == 4
    assert s.min_ns <= 1000 < s.max_ns
    assert s.max_ns >= 1_000_000
    assert abs(s.mean_ns - vals.mean()) / vals.mean() < 1 / 128


def test_pct_keys() -> None:
    assert [pct_key(q) for q in (50, 99.0, 99.9, 99.99)] == ["50", "99", "99.9", "99.99"]


def test_statistics_of_the_occupied_columns_equal_those_of_the_whole_histogram() -> None:
    # The engine hands summarize_many only the columns that ever held a count; every
    # statistic (saturation in fio's last bin included) must be what the full width gives.
    rng = np.random.default_rng(7)
    layout = BinLayout()
    hists = np.zeros((40, layout.nbins))
    for i, row in enumerate(hists):
        lo = int(rng.integers(0, layout.nbins - 50))
        span = int(rng.integers(1, 50))
        row[lo : lo + span] = rng.random(span) * (i % 3)  # some rows stay empty
    hists[5, -1] = 7.0  # saturated
    nz = np.flatnonzero(hists.any(axis=0))
    lo, hi = int(nz[0]), int(nz[-1]) + 1
    qs = (50, 90, 99, 99.9)
    full = summarize_many(hists, layout, qs)
    part = summarize_many(hists[:, lo:hi], layout, qs, first_bin=lo)
    assert [a is None for a in full] == [b is None for b in part]
    for a, b in zip(full, part, strict=True):
        if a is None or b is None:
            continue
        # Equal up to the summation order of the mean (the last bits).
        assert (a.samples, a.min_ns, a.max_ns, a.saturated) == (
            b.samples,
            b.min_ns,
            b.max_ns,
            b.saturated,
        )
        assert a.percentiles_ns == b.percentiles_ns
        assert a.mean_ns == pytest.approx(b.mean_ns, rel=1e-12)
    assert full[5] is not None and full[5].saturated
