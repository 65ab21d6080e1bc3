"""Confidence bounds for percentiles: exact binomial ranks, and calibration on fio bins."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fiomon.bins import BinLayout
from fiomon.confidence import bounds, rank_bounds


def exact_ranks(n: int, q: float, level: float) -> tuple[int, int]:
    """l = max{k: P(B <= k-1) <= a}, u = min{k: P(B >= k) <= a}, by summing math.comb."""
    a = (1 - level) / 2
    pmf = [math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(n + 1)]
    cdf = np.cumsum(pmf)
    lo = max(k for k in range(n + 1) if (cdf[k - 1] if k else 0.0) <= a)
    hi = next((k for k in range(n + 2) if 1 - (cdf[k - 1] if k else 0.0) <= a), n + 1)
    return lo, hi


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, 0.999])
def test_small_samples_use_the_exact_binomial_ranks(q: float) -> None:
    ns = np.arange(0, 300)
    lo, hi = rank_bounds(ns, q, 0.95)
    for n in range(1, 300):
        assert (int(lo[n]), int(hi[n])) == exact_ranks(n, q, 0.95), n


def test_large_samples_are_never_narrower_than_exact() -> None:
    # Where the expansion takes over, compare with the exact window method (sigma < 40
    # is exact; 45 is just past it) and with the normal approximation around it.
    n = np.array([7000, 20_000, 10**6, 10**8])
    for q in (0.5, 0.99, 0.999):
        lo, hi = rank_bounds(n, q, 0.95)
        mu = n * q
        sd = np.sqrt(n * q * (1 - q))
        assert (lo <= np.floor(mu - 1.95 * sd)).all()
        assert (hi >= np.ceil(mu + 1.95 * sd)).all()
        assert (lo >= np.floor(mu - 2.05 * sd) - 2).all()
        assert (hi <= np.ceil(mu + 2.05 * sd) + 3).all()


def test_sides_the_data_cannot_bound_are_nan() -> None:
    lay = BinLayout()
    lo_e, hi_e = lay.edges_ns()
    h = np.zeros((1, lay.nbins))
    h[0, 900] = 200  # 200 I/Os in one bin
    low, high = bounds(h, lo_e, hi_e, (0.5, 0.999))
    assert low[0, 0] == lo_e[900] and high[0, 0] == hi_e[900]  # within one bin
    assert not np.isnan(low[0, 1])
    assert np.isnan(high[0, 1])  # p99.9 of 200 I/Os: no upper bound


@pytest.mark.parametrize("n", [200, 2000, 20_000])
def test_intervals_cover_the_true_quantile_at_the_stated_level(n: int) -> None:
    rng = np.random.default_rng(n)
    lay = BinLayout()
    lo_e, hi_e = lay.edges_ns()
    quantiles = (0.5, 0.9, 0.99, 0.999)
    # lognormal latencies around 400 us; the true quantiles of the distribution
    mu, sigma = math.log(400_000.0), 0.5
    from statistics import NormalDist  # noqa: PLC0415 -- test-only helper

    truth = [math.exp(mu + sigma * NormalDist().inv_cdf(q)) for q in quantiles]
    reps = 500
    lat = rng.lognormal(mu, sigma, size=(reps, n))
    from fiomon.bins import plat_val_to_idx  # noqa: PLC0415

    idx = plat_val_to_idx(lat.astype(np.int64).ravel()).reshape(reps, n)
    h = np.zeros((reps, lay.nbins))
    np.add.at(h, (np.repeat(np.arange(reps), n), idx.ravel()), 1)
    low, high = bounds(h, lo_e, hi_e, quantiles)
    for j, t in enumerate(truth):
        bounded = ~np.isnan(low[:, j]) & ~np.isnan(high[:, j])
        if not bounded.any():
            continue
        cover = np.mean((low[bounded, j] <= t) & (t <= high[bounded, j]))
        assert cover >= 0.93, (n, quantiles[j], cover)
