"""The statistics of ``fiomon compare``: the ratio's interval, the bootstrap, attribution.

Pure numpy over histograms of fio's bin layout; no I/O.

**Window lines: MOVER on the order-statistic bounds.** Each run's percentile in a window
has a distribution-free interval (:mod:`fiomon.confidence`: the order statistics that
bracket the quantile, folded out to their bins' edges). The ratio ``r = c / b`` of the
candidate's value to the baseline's gets its interval by the *method of variance estimates
recovery* (MOVER; Zou and Donner 2008, the construction Price and Bonett 2002 use for a
ratio of medians) on the log scale: with ``(bl, bu)`` and ``(cl, cu)`` the two intervals
at the same level,

    log L = log(c / b) - sqrt(log(c / cl)^2 + log(bu / b)^2)
    log U = log(c / b) + sqrt(log(cu / c)^2 + log(b / bl)^2)

Each side recovers a variance from the interval side that moves the ratio that way, so the
asymmetric, skewed intervals of tail percentiles are kept as they are. Like the intervals
it is built from, it assumes the I/Os of a window are independent draws; it is at least as
wide as theirs. A side the data cannot bound (``NaN`` in the inputs: p99 of 200 I/Os has
no upper bound) leaves the ratio unbounded on the side it feeds, and no verdict is drawn
that would need it. Why not a bootstrap per window: resampling 200 binned I/Os cannot
create a value above the largest, so it would bound p99 from above where nothing does.

**Whole-run lines: also a paired block bootstrap over windows.** Over a whole run the
I/Os are not independent: a stall, a cache warming or a recovery moves thousands of them
together, and an order-statistic interval over 10^6 I/Os is ~0.3 % wide, far narrower than
run-to-run drift. The windows (both runs' window ``k`` drawn together, since aligned windows
share the phase of the workload) are resampled with replacement, the merged histograms'
percentiles recomputed, and the 2.5 % and 97.5 % quantiles of the log ratio taken (the
percentile bootstrap). The whole-run interval is the hull of this and of MOVER on the merged
histograms: never narrower than either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.histogram import bin_of, summarize_many

F64 = npt.NDArray[np.float64]

MIN_BOOTSTRAP_WINDOWS = 5
"""Fewer common windows than this and the whole-run interval is MOVER's alone."""


def mover_ratio(base: tuple[F64, F64, F64], cand: tuple[F64, F64, F64]) -> tuple[F64, F64, F64]:
    """The ratio ``c / b`` and its MOVER interval (see the module docstring).

    Args:
        base: the baseline's ``(values, lower bounds, upper bounds)``, ns (> 0; NaN: no
            value, or a side unbounded).
        cand: the candidate's.

    Returns:
        ``(ratio, low, high)``, arrays of the inputs' shape; NaN where unbounded (or no
        value).
    """
    b, bl, bu = base
    c, cl, cu = cand
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.log(c) - np.log(b)
        # Bounds outside their value (a value interpolated in a bin whose edges bound it)
        # contribute nothing rather than a negative width.
        dcl = np.maximum(np.log(c) - np.log(cl), 0.0)
        dcu = np.maximum(np.log(cu) - np.log(c), 0.0)
        dbl = np.maximum(np.log(b) - np.log(bl), 0.0)
        dbu = np.maximum(np.log(bu) - np.log(b), 0.0)
        low = np.exp(lr - np.sqrt(dcl**2 + dbu**2))
        high = np.exp(lr + np.sqrt(dcu**2 + dbl**2))
        ratio = np.exp(lr)
    return ratio, low, high


def significant(low: F64, high: F64) -> npt.NDArray[np.bool_]:
    """Whether each interval excludes 1 (a NaN side never decides)."""
    with np.errstate(invalid="ignore"):
        return np.asarray((low > 1.0) | (high < 1.0))


Hists = tuple[F64, BinLayout, int]
"""``(windows x width counts, layout, the layout column of the first column)``."""


def bootstrap_ratio(
    base: Hists,
    cand: Hists,
    percentiles: Sequence[float],
    *,
    level: float,
    resamples: int,
    rng: np.random.Generator,
) -> tuple[F64, F64]:
    """Paired block-bootstrap interval of each percentile's ratio (see the module docstring).

    Args:
        base: the baseline's window histograms.
        cand: the candidate's, the same windows in the same order (its own layout).
        percentiles: e.g. ``(50, 99)``.
        level: confidence level.
        resamples: how many resamples.
        rng: the random source (seeded by the caller: the same inputs, the same output).

    Returns:
        ``(low, high)`` per percentile; NaN where a resample had no I/O in a run.
    """
    k = base[0].shape[0]
    idx = rng.integers(0, k, size=(resamples, k))
    weights = np.zeros((resamples, k))
    np.add.at(weights, (np.repeat(np.arange(resamples), k), idx.ravel()), 1.0)
    vals = []
    for h, layout, first in (base, cand):
        # Not ``weights @ h`` through BLAS threads (see fiomon.histogram): einsum.
        merged = np.einsum("rk,kb->rb", weights, h)
        stats = summarize_many(merged, layout, percentiles, first_bin=first)
        v = np.full((resamples, len(percentiles)), np.nan)
        for i, s in enumerate(stats):
            if s is not None:
                v[i] = list(s.percentiles_ns.values())
        vals.append(v)
    with np.errstate(divide="ignore", invalid="ignore"):
        lr = np.log(vals[1]) - np.log(vals[0])
    a = (1.0 - level) / 2.0
    low = np.full(len(percentiles), np.nan)
    high = np.full(len(percentiles), np.nan)
    for j in range(len(percentiles)):
        col = lr[:, j]
        if np.isnan(col).any():
            continue
        lo_q, hi_q = np.quantile(col, [a, 1.0 - a])
        low[j], high[j] = math.exp(lo_q), math.exp(hi_q)
    return low, high


def hull(low_a: F64, high_a: F64, low_b: F64, high_b: F64) -> tuple[F64, F64]:
    """The smallest interval holding both (a NaN side of either: unbounded, NaN)."""
    return np.minimum(low_a, low_b), np.maximum(high_a, high_b)


def above_counts(hists: F64, upper_edges: F64, threshold_ns: float) -> F64:
    """Per row of ``hists``, the I/Os at or above ``threshold_ns``'s bin.

    The bin holding the threshold counts whole (:func:`fiomon.histogram.bin_of`, the rule
    of the live tail shares): fio's bins are 1.6 % wide, so these are the I/Os from that
    much below the threshold up.
    """
    b = int(bin_of(upper_edges, [threshold_ns])[0])
    return np.asarray(hists[:, b:].sum(axis=1), dtype=np.float64)
