"""Statistics of a merged fio histogram.

Contract (README.md "What the numbers mean"), for counts ``h`` over bins with exact edges
``[lower_i, upper_i)`` (:mod:`fiomon.bins`) and ``N = sum(h)``:

* percentile ``q``: the first bin ``i`` whose cumulative count reaches ``q/100 * N``,
  interpolated linearly inside it: ``lower_i + (q N/100 - C_{i-1}) / h_i * (upper_i - lower_i)``.
  The true value lies in the same bin, so the error is at most the bin width (2**-6 of
  the value for fine bins >= 128, 2**(c-6) at coarseness ``c``) and usually far less;
* a percentile landing in fio's last bin is *saturated*: fio clamps everything above its
  cap there, so only the bin's lower edge is known. It is returned as that lower bound and
  flagged, never as a plain number;
* min and max are bounds: the lower edge of the first and the upper edge of the last
  non-empty bin (the last bin's upper edge is the cap);
* the mean uses bin midpoints (error below the half-width of the widest bin used).

Counts may be fractional (records split across quanta); empty histograms give ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout

_REL_TOL = 1e-12  # float cumulative sums: a target equal to a bin's total must stay there
_RANK_TOL = 1e-6  # order statistic k of fractional counts: reached at k less this


@dataclass(frozen=True, slots=True)
class HistStats:
    """Summary of one histogram; latencies in ns.

    Args:
        samples: number of I/Os (possibly fractional after splitting records).
        min_ns: lower bound of the smallest latency.
        mean_ns: mean from bin midpoints.
        max_ns: upper bound of the largest latency (fio's cap if it is in the last bin).
        percentiles_ns: percentile key (``"99"``, ``"99.9"``) to value.
        saturated: keys whose value is only a lower bound (fio's last bin).
    """

    samples: float
    min_ns: float
    mean_ns: float
    max_ns: float
    percentiles_ns: dict[str, float]
    saturated: tuple[str, ...]


def pct_key(q: float) -> str:
    """The canonical key of a percentile: ``50``, ``99``, ``99.9`` (no trailing zeros)."""
    text = f"{q:.6f}".rstrip("0").rstrip(".")
    return text or "0"


def bin_of(
    upper_edges: npt.NDArray[np.float64], values_ns: Sequence[float]
) -> npt.NDArray[np.intp]:
    """The bin holding each value: the first whose upper edge is at or above it.

    Clamped to the last bin. A percentile interpolated in bin ``b`` lies in ``[lower_b,
    upper_b]``, so the I/Os of bins ``b`` and above are the ones at or above it, to a bin's
    width (the tail shares of :mod:`fiomon.server.tailshare` and ``fiomon compare``'s
    attribution).
    """
    found = np.searchsorted(upper_edges, np.asarray(values_ns, dtype=np.float64), side="left")
    return np.minimum(found, len(upper_edges) - 1)


def nearest_rank(p: float, n: int) -> int:
    """The 1-based rank of the ``p``-th percentile of ``n`` values: ``ceil(p n / 100)``, >= 1.

    fio's own rule (the smallest value with at least ``p`` % of the values at or below it),
    used wherever fiomon has the values themselves (per-I/O logs). Exact for percentiles
    written in decimal (``99.9`` is 999/10, not its binary float: numpy's ``inverted_cdf``
    takes the next value when ``p n / 100`` is whole, e.g. 99.9 % of 300 000).
    """
    f = Fraction(str(p)) * n / 100
    return max(1, -(-f.numerator // f.denominator))


def percentiles(
    counts: npt.NDArray[np.float64], layout: BinLayout, qs: Sequence[float]
) -> tuple[list[float], list[bool]] | None:
    """Percentile values (ns) and saturation flags, or ``None`` for an empty histogram."""
    stats = summarize(counts, layout, qs)
    if stats is None:
        return None
    keys = [pct_key(q) for q in qs]
    return [stats.percentiles_ns[k] for k in keys], [k in stats.saturated for k in keys]


def summarize(
    counts: npt.NDArray[np.float64], layout: BinLayout, qs: Sequence[float]
) -> HistStats | None:
    """All statistics of ``counts`` (see the module contract), or ``None`` if empty."""
    return summarize_many(np.asarray(counts, dtype=np.float64)[None, :], layout, qs)[0]


RankFn = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]


def summarize_many(
    hists: npt.NDArray[np.float64],
    layout: BinLayout,
    qs: Sequence[float],
    *,
    first_bin: int = 0,
) -> list[HistStats | None]:
    """:func:`summarize` of every row of ``hists`` at once (vectorised over rows).

    ``hists`` may hold only the columns ``first_bin .. first_bin + width - 1`` of the
    layout (every count outside them being zero): the results are the same, for less work.
    """
    return summarize_and_locate(hists, layout, qs, first_bin=first_bin)[0]


def summarize_and_locate(
    hists: npt.NDArray[np.float64],
    layout: BinLayout,
    qs: Sequence[float],
    *,
    first_bin: int = 0,
    ranks: RankFn | None = None,
) -> tuple[list[HistStats | None], npt.NDArray[np.int64]]:
    """:func:`summarize_many`, and the bin of chosen order statistics in the same pass.

    Args:
        hists: ``(rows, width)`` counts, the layout's columns from ``first_bin`` on.
        layout: the bin layout.
        qs: percentiles.
        first_bin: the layout column of ``hists``' first column.
        ranks: maps the rows' totals to ``(rows, m)`` 1-based ranks ``k`` (NaN: none);
            order statistic ``k`` lies in the first bin whose running total reaches it
            (less a tolerance for fractional counts). The confidence bounds use it, so
            that they cost no second pass over the bins.

    Returns:
        The statistics, and per row and rank the column (in ``hists``) of its bin, or -1
        for a NaN rank (``(rows, 0)`` without ``ranks``).
    """
    n, nbins = hists.shape
    if n == 0:
        return [], np.zeros((0, 0), dtype=np.int64)
    lower_all, upper_all = layout.edges_ns()
    lower = lower_all[first_bin : first_bin + nbins]
    upper = upper_all[first_bin : first_bin + nbins]
    last_bin = layout.nbins - 1 - first_bin  # fio's last bin (saturation), as a column
    last_nz = nbins - 1 - np.argmax(hists[:, ::-1] > 0, axis=1)
    # Not ``hists @ mids``: a BLAS call wakes OpenBLAS's thread pool, whose spinning threads
    # then compete with the parser threads for the two cores.
    mean = np.einsum("ij,j->i", hists, layout.mids_ns()[first_bin : first_bin + nbins])
    keys = [pct_key(q) for q in qs]
    npct = len(qs)
    fracs = np.asarray(qs, dtype=np.float64) / 100.0
    m = 0 if ranks is None else ranks(np.ones(1)).shape[1]  # how many ranks it gives
    found = np.empty((n, npct + 1 + m), dtype=np.int64)
    located = np.full((n, m), -1, dtype=np.int64)
    prev = np.zeros((n, npct))
    targets = np.empty((n, npct))
    total = np.empty(n)
    # Running totals in blocks of rows, in one reused cache-sized buffer (a full-size
    # cumsum spends most of its time faulting in fresh pages). Per row, one binary search
    # finds the first bin whose running total reaches each target, and (with the smallest
    # positive probe) the first non-empty bin. The relative tolerance keeps a target equal
    # to a bin's running total in that bin, not past an empty gap.
    block = max(1, min(n, (1 << 17) // nbins))
    cum_buf = np.empty((block, nbins))
    probes = np.empty((block, npct + 1 + m))
    probes[:, 0] = np.nextafter(0.0, 1.0)
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        cum = np.cumsum(hists[lo:hi], axis=1, out=cum_buf[: hi - lo])
        total[lo:hi] = cum[:, -1]
        t = cum[:, -1:] * fracs
        targets[lo:hi] = t
        probes[: hi - lo, 1 : npct + 1] = t * (1 - _REL_TOL)
        if ranks is not None:
            k = ranks(cum[:, -1])
            probes[: hi - lo, npct + 1 :] = np.where(np.isnan(k), np.inf, k - _RANK_TOL)
        for i in range(hi - lo):
            found[lo + i] = cum[i].searchsorted(probes[i])
        if ranks is not None:
            # A rank a hair above a fractional total (n is the rounded total) still lies
            # in the row's last non-empty bin: not in the last column, which depends on
            # which rows were summarized together (the aggregator and the report would
            # then disagree on the same histogram).
            located[lo:hi] = np.where(
                np.isinf(probes[: hi - lo, npct + 1 :]),
                -1,
                np.minimum(found[lo:hi, npct + 1 :], last_nz[lo:hi, None]),
            )
        at = np.maximum(found[lo:hi, 1 : npct + 1], found[lo:hi, :1])
        got = cum[np.arange(hi - lo)[:, None], np.clip(at, 1, nbins) - 1]
        prev[lo:hi] = np.where(at > 0, got, 0.0)
    nonempty = total > 0
    mean = mean / np.where(nonempty, total, 1.0)
    first = np.minimum(found[:, 0], nbins - 1)
    idx = np.clip(np.maximum(found[:, 1 : npct + 1], first[:, None]), 0, nbins - 1)
    here = hists[np.arange(n)[:, None], idx]
    frac = np.clip((targets - prev) / np.where(here > 0, here, 1.0), 0.0, 1.0)
    sat = idx == last_bin
    values = np.where(
        sat, lower[min(last_bin, nbins - 1)], lower[idx] + frac * (upper[idx] - lower[idx])
    )
    out: list[HistStats | None] = []
    for i in range(n):
        if not nonempty[i]:
            out.append(None)
            continue
        out.append(
            HistStats(
                samples=float(total[i]),
                min_ns=float(lower[first[i]]),
                mean_ns=float(mean[i]),
                max_ns=float(upper[last_nz[i]]),
                percentiles_ns=dict(zip(keys, values[i].tolist(), strict=True)),
                saturated=tuple(k for k, s in zip(keys, sat[i].tolist(), strict=True) if s),
            )
        )
    return out, located


def cumulative_at(
    hist: npt.NDArray[np.float64], layout: BinLayout, edges_s: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Counts at or below each edge, splitting straddling bins linearly."""
    lower, upper = layout.edges_ns()
    edges_ns = edges_s * 1e9
    cum = np.concatenate([[0.0], np.cumsum(hist)])
    k = np.searchsorted(upper, edges_ns, side="right")  # bins [0, k) are wholly below
    partial = np.zeros(len(edges_ns))
    inside = k < len(hist)
    kk = k[inside]
    frac = np.clip((edges_ns[inside] - lower[kk]) / (upper[kk] - lower[kk]), 0.0, 1.0)
    partial[inside] = hist[kk] * frac
    out: npt.NDArray[np.float64] = cum[k] + partial
    return out
