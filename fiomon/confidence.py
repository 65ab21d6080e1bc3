"""How sure is a percentile: distribution-free confidence bounds from binned latencies.

**Assumption.** The ``n`` I/Os of a quantum are independent draws from the latency
distribution of that quantum. Then, for the ``q`` quantile ``xi`` and the order statistics
``X(1) <= ... <= X(n)``, with ``B ~ Binomial(n, q)`` counting the draws below ``xi``::

    P(X(l) <= xi <= X(u)) >= 1 - alpha,   for l, u with P(B < l) <= alpha/2 and P(B >= u) <= alpha/2

(the classical order-statistic interval; it needs no model of the distribution). We take
the largest such ``l`` and the smallest such ``u``. When latencies are correlated within a
quantum (a stall slows a burst of I/Os together), the effective number of independent draws
is smaller than ``n`` and the true interval is wider than stated: read the bounds as a
floor on the uncertainty, not a guarantee.

**Bins.** fio keeps only a histogram, so ``X(k)`` is known to lie in the bin where the
cumulative count reaches ``k``: the lower bound is that bin's lower edge for ``l``, the
upper bound that bin's upper edge for ``u``. Folding the bin width in this way keeps the
interval conservative (never narrower than the data allow).

**No bound.** If ``l < 1`` the data cannot bound the quantile from below, and if ``u > n``
not from above (p99.9 of 200 I/Os has no upper bound): such sides are NaN, never an
invented number. A bound in fio's last bin (latencies of about 17 s and more are clamped
there) has no finite upper edge either.

**Binomial quantiles** are exact (a window of the probability mass function summed in log
space, vectorised with numpy) wherever ``sigma = sqrt(n q (1 - q)) < 40``, and from the
Cornish-Fisher expansion (normal plus skewness and kurtosis terms, continuity-corrected;
rank error well under one at that size) beyond.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.histogram import HistStats, summarize_and_locate

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

DEFAULT_LEVEL = 0.95
_EXACT_SIGMA = 40.0  # below this, exact binomial quantiles (a window of at most ~700 terms)
_WINDOW_SIGMAS = 9.0  # the window spans the mean +- this many sigma (tails < 1e-18)
_LOG_FACT = np.array([math.lgamma(k + 1.0) for k in range(4096)])


def _log_factorial(m: F64) -> F64:
    """log(m!) for non-negative integers ``m`` (a table, then Stirling's series)."""
    out = np.empty_like(m)
    small = m < len(_LOG_FACT)
    out[small] = _LOG_FACT[m[small].astype(np.int64)]
    x = m[~small] + 1.0
    inv = 1.0 / x
    out[~small] = (x - 0.5) * np.log(x) - x + 0.5 * math.log(2 * math.pi) + inv / 12 - inv**3 / 360
    return out


def rank_bounds(n: I64, q: float, level: float = DEFAULT_LEVEL) -> tuple[I64, I64]:
    """Order-statistic ranks ``(l, u)`` bracketing the ``q`` quantile of ``n`` draws.

    Args:
        n: sample sizes (>= 0), one per row.
        q: the quantile, in (0, 1).
        level: the confidence level, in (0, 1).

    Returns:
        1-based ranks: ``l`` (0 when no lower bound) and ``u`` (``n + 1`` when no upper
        bound), with ``P(X(l) <= xi_q <= X(u)) >= level`` for independent draws.
    """
    if not 0.0 < q < 1.0 or not 0.0 < level < 1.0:
        msg = f"need 0 < q < 1 and 0 < level < 1, got q={q}, level={level}"
        raise ValueError(msg)
    n = np.asarray(n, dtype=np.int64)
    a = (1.0 - level) / 2.0
    lo = np.zeros(n.shape, dtype=np.int64)
    hi = n + 1
    sigma = np.sqrt(n * q * (1.0 - q))
    exact = (sigma < _EXACT_SIGMA) & (n > 0)
    if exact.any():
        lo[exact], hi[exact] = _RANKS.exact(n[exact], q, a)
    approx = (~exact) & (n > 0)
    if approx.any():
        lo[approx], hi[approx] = _cornish_fisher(n[approx], q, a)
    return lo, hi


class _RankTable:
    """Exact ranks remembered per sample size, for each ``(q, a)`` asked.

    The exact method costs a window of about ``18 sigma`` terms per row, and an aggregator
    asks for thousands of rows a second (one per host and direction) whose sample sizes
    recur. A table indexed by ``n`` answers those with one gather. Only sizes below
    :data:`_TABLE_MAX` are kept (the exact region ends at ``sigma = 40``, i.e. ``n <
    1600 / (q (1 - q))``: 6,400 for p50, 161,600 for p99), so a table holds at most two
    int64 arrays of that length per percentile and level.
    """

    def __init__(self) -> None:
        self._tables: dict[tuple[float, float], tuple[I64, I64]] = {}

    def exact(self, n: I64, q: float, a: float) -> tuple[I64, I64]:
        """:func:`_exact` of every ``n``, computing only the sizes not seen before."""
        small = n < _TABLE_MAX
        if not small.all():
            lo, hi = np.empty_like(n), np.empty_like(n)
            lo[~small], hi[~small] = _exact(np.unique(n[~small]), q, a, want=n[~small])
            if small.any():
                lo[small], hi[small] = self.exact(n[small], q, a)
            return lo, hi
        lo_t, hi_t = self._tables.get((q, a), (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        top = int(n.max()) + 1
        if top > len(lo_t):
            size = min(_TABLE_MAX, max(top, 2 * len(lo_t), 1024))
            lo_t = np.concatenate([lo_t, np.full(size - len(lo_t), -1, np.int64)])
            hi_t = np.concatenate([hi_t, np.full(size - len(hi_t), -1, np.int64)])
        missing = np.unique(n[lo_t[n] < 0])
        if len(missing):
            lo_t[missing], hi_t[missing] = _exact(missing, q, a)
        self._tables[(q, a)] = (lo_t, hi_t)
        return lo_t[n], hi_t[n]


_TABLE_MAX = 1 << 20
_RANKS = _RankTable()


def _exact(n: I64, q: float, a: float, *, want: I64 | None = None) -> tuple[I64, I64]:
    """:func:`_exact_window` of the distinct sizes ``n``, gathered for ``want`` if given."""
    lo, hi = _exact_window(n, q, a)
    if want is None:
        return lo, hi
    at = np.searchsorted(n, want)
    return lo[at], hi[at]


def _exact_window(n: I64, q: float, a: float) -> tuple[I64, I64]:
    """``l = max{k: P(B <= k-1) <= a}``, ``u = min{k: P(B >= k) <= a}``, exactly."""
    mean = n * q
    half = np.ceil(_WINDOW_SIGMAS * np.sqrt(n * q * (1.0 - q)) + 12.0).astype(np.int64)
    k0 = np.maximum(0, np.floor(mean).astype(np.int64) - half)
    width = int((2 * half).max()) + 2
    ks = k0[:, None] + np.arange(width, dtype=np.int64)[None, :]
    valid = ks <= n[:, None]
    kf = np.minimum(ks, n[:, None]).astype(np.float64)
    nf = n[:, None].astype(np.float64)
    logpmf = (
        _log_factorial(n.astype(np.float64))[:, None]
        - _log_factorial(kf)
        - _log_factorial(nf - kf)
        + kf * math.log(q)
        + (nf - kf) * math.log1p(-q)
    )
    pmf = np.where(valid, np.exp(logpmf), 0.0)
    # The window starts so far below the mean that the mass before it is negligible
    # (or it starts at 0): its running sum is the cdf.
    cdf = np.cumsum(pmf, axis=1)
    # l - 1 = largest k with cdf(k) <= a  ->  l = number of window entries with cdf <= a
    lo = k0 + np.count_nonzero(cdf <= a, axis=1)
    # u - 1 = smallest k with cdf(k) >= 1 - a
    reach = (cdf >= 1.0 - a) & valid
    first = np.where(reach.any(axis=1), reach.argmax(axis=1), width)
    hi = k0 + first + 1
    return lo, np.minimum(hi, n + 1)


def _cornish_fisher(n: I64, q: float, a: float) -> tuple[I64, I64]:
    """The same ranks for large ``n`` from the Cornish-Fisher expansion of the binomial."""
    z = _norm_ppf(1.0 - a)
    nf = n.astype(np.float64)
    mu = nf * q
    sd = np.sqrt(nf * q * (1.0 - q))
    g1 = (1.0 - 2.0 * q) / sd  # skewness
    g2 = (1.0 - 6.0 * q * (1.0 - q)) / (sd * sd)  # excess kurtosis

    def quantile(zz: float) -> F64:
        w = (
            zz
            + (zz * zz - 1.0) * g1 / 6.0
            + (zz**3 - 3.0 * zz) * g2 / 24.0
            - (2.0 * zz**3 - 5.0 * zz) * g1 * g1 / 36.0
        )
        return mu + sd * w - 0.5

    # cdf(k) <= a  <=>  k <= x_a, so l = floor(x_a) + 1 and u = ceil(x_{1-a}) + 1; one
    # rank more on each side absorbs the expansion's error (negligible at sigma >= 40).
    lo = np.floor(quantile(-z)).astype(np.int64)
    hi = np.ceil(quantile(z)).astype(np.int64) + 2
    return np.clip(lo, 0, n), np.clip(hi, 1, n + 1)


def _norm_ppf(p: float) -> float:
    """The standard normal quantile (Acklam's rational approximation, |error| < 1.2e-9)."""
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)  # fmt: skip
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
         3.754408661907416e00)  # fmt: skip
    a_ = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
          1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)  # fmt: skip
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)  # fmt: skip
    if p < 0.02425:
        t = math.sqrt(-2 * math.log(p))
        num = ((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]
        return num / ((((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1)
    if p > 1 - 0.02425:
        return -_norm_ppf(1 - p)
    r = p - 0.5
    s = r * r
    num = (((((a_[0] * s + a_[1]) * s + a_[2]) * s + a_[3]) * s + a_[4]) * s + a_[5]) * r
    return num / (((((b[0] * s + b[1]) * s + b[2]) * s + b[3]) * s + b[4]) * s + 1)


def bounds(
    hists: F64,
    lower_edges: F64,
    upper_edges: F64,
    quantiles: Sequence[float],
    *,
    level: float = DEFAULT_LEVEL,
    last_bin_open: bool = True,
) -> tuple[F64, F64]:
    """Confidence bounds (latency units of the edges) for percentiles of histogram rows.

    Args:
        hists: ``(rows, bins)`` counts (fractional counts from records split over quanta
            are rounded to whole I/Os for the sample size).
        lower_edges: each bin's lower edge.
        upper_edges: each bin's upper edge.
        quantiles: in (0, 1), e.g. ``(0.5, 0.99)``.
        level: confidence level.
        last_bin_open: the last bin holds everything above it (fio's clamp), so an upper
            bound that lands there is unknown.

    Returns:
        ``(low, high)``, each ``(rows, len(quantiles))``; NaN where the data bound no side.
    """
    h = np.asarray(hists, dtype=np.float64)
    rows, nb = h.shape
    low = np.full((rows, len(quantiles)), np.nan)
    high = np.full((rows, len(quantiles)), np.nan)
    if not rows or not nb:
        return low, high
    cum = np.cumsum(h, axis=1)
    n = np.rint(cum[:, -1]).astype(np.int64)
    last_nz = nb - 1 - np.argmax(h[:, ::-1] > 0, axis=1)
    # One searchsorted for all rows: shift each row's cumulative counts above the last.
    span = float(cum[:, -1].max()) + 2.0
    flat = (cum + (np.arange(rows) * span)[:, None]).ravel()
    lo_e = np.asarray(lower_edges, dtype=np.float64)
    hi_e = np.asarray(upper_edges, dtype=np.float64)
    for j, q in enumerate(quantiles):
        lo_rank, hi_rank = rank_bounds(n, q, level)
        for ranks, has, edges, out, upper in (
            (lo_rank, lo_rank >= 1, lo_e, low, False),
            (hi_rank, hi_rank <= n, hi_e, high, True),
        ):
            idx = np.flatnonzero(has)
            if not len(idx):
                continue
            # Order statistic k lies in the first bin whose cumulative count reaches k
            # (counts may be fractional: a small tolerance below k).
            target = ranks[idx] - 1e-6 + idx * span
            b = np.searchsorted(flat, target, side="left") - idx * nb
            # a rank a hair above a fractional total: the row's last non-empty bin
            b = np.clip(b, 0, last_nz[idx])
            vals = edges[b]
            if upper and last_bin_open:
                vals = np.where(b == nb - 1, np.nan, vals)
            out[idx, j] = vals
    return low, high


def percentile_bounds(
    hists: F64,
    layout: BinLayout,
    percentiles: Sequence[float],
    *,
    level: float = DEFAULT_LEVEL,
    first_bin: int = 0,
) -> tuple[F64, F64]:
    """:func:`bounds` for percentiles (``99``, ``99.9``) of rows over ``layout``'s bins, in ns.

    ``hists`` may hold only the columns ``first_bin .. first_bin + width - 1`` of the layout
    (every count outside them being zero), as :func:`fiomon.histogram.summarize_many` takes
    them. fio's last bin is open above (its clamp) only if the columns reach it. A
    percentile of 100 (the maximum) has no distribution-free bound: NaN on both sides.
    """
    _, low, high = summarize_with_bounds(
        hists, layout, percentiles, level=level, first_bin=first_bin
    )
    return low, high


def summarize_with_bounds(
    hists: F64,
    layout: BinLayout,
    percentiles: Sequence[float],
    *,
    level: float = DEFAULT_LEVEL,
    first_bin: int = 0,
) -> tuple[list[HistStats | None], F64, F64]:
    """:func:`fiomon.histogram.summarize_many` and :func:`percentile_bounds` in one pass.

    The order statistics that bound each percentile are found in the same binary search
    per row that finds the percentiles, so the bounds cost no second pass over the bins
    (an aggregator closes thousands of rows a second).

    Returns:
        The statistics, and ``(low, high)`` in ns, each ``(rows, len(percentiles))``;
        NaN where the data bound no side.
    """
    h = np.asarray(hists, dtype=np.float64)
    width = h.shape[1]
    qs = [q / 100.0 for q in percentiles]
    inside = [j for j, q in enumerate(qs) if 0.0 < q < 1.0]

    def ranks(totals: F64) -> F64:
        n = np.rint(totals).astype(np.int64)
        out = np.full((len(n), 2 * len(inside)), np.nan)
        for c, j in enumerate(inside):
            lo, hi = rank_bounds(n, qs[j], level)
            out[:, c] = np.where(lo >= 1, lo, np.nan)
            out[:, len(inside) + c] = np.where(hi <= n, hi, np.nan)
        return out

    stats, at = summarize_and_locate(h, layout, percentiles, first_bin=first_bin, ranks=ranks)
    lower, upper = layout.edges_ns()
    lower = lower[first_bin : first_bin + width]
    upper = upper[first_bin : first_bin + width]
    low = np.full((h.shape[0], len(qs)), np.nan)
    high = np.full((h.shape[0], len(qs)), np.nan)
    if inside and h.shape[0]:
        lo_at, hi_at = at[:, : len(inside)], at[:, len(inside) :]
        low[:, inside] = np.where(lo_at >= 0, lower[np.maximum(lo_at, 0)], np.nan)
        high[:, inside] = np.where(hi_at >= 0, upper[np.maximum(hi_at, 0)], np.nan)
        if first_bin + width >= layout.nbins:
            # fio's last bin holds everything above it: no finite upper edge.
            high[:, inside] = np.where(hi_at == width - 1, np.nan, high[:, inside])
    return stats, low, high
