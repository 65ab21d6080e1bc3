"""Statistics of a merged fio histogram.

Contract (DESIGN.md "Percentiles"), for counts ``h`` over bins with exact edges
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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout

_REL_TOL = 1e-12  # float cumulative sums: a target equal to a bin's total must stay there


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


def percentiles(
    counts: npt.NDArray[np.float64], layout: BinLayout, qs: Sequence[float]
) -> tuple[list[float], list[bool]] | None:
    """Percentile values (ns) and saturation flags, or ``None`` for an empty histogram."""
    cum = np.cumsum(counts, dtype=np.float64)
    total = float(cum[-1]) if len(cum) else 0.0
    if total <= 0:
        return None
    lower, upper = layout.edges_ns()
    last = len(counts) - 1
    targets = np.asarray(qs, dtype=np.float64) / 100.0 * total
    idx = np.searchsorted(cum, targets * (1 - _REL_TOL), side="left")
    idx = np.minimum(idx, last)
    # q = 0 (or a target in leading empty bins) starts at the first non-empty bin.
    first = int(np.flatnonzero(counts > 0)[0])
    idx = np.maximum(idx, first)
    prev = np.where(idx > 0, cum[idx - 1], 0.0)
    frac = np.clip((targets - prev) / counts[idx], 0.0, 1.0)
    values = lower[idx] + frac * (upper[idx] - lower[idx])
    sat = idx == last
    values = np.where(sat, lower[last], values)
    return values.tolist(), sat.tolist()


def summarize(
    counts: npt.NDArray[np.float64], layout: BinLayout, qs: Sequence[float]
) -> HistStats | None:
    """All statistics of ``counts`` (see the module contract), or ``None`` if empty."""
    res = percentiles(counts, layout, qs)
    if res is None:
        return None
    values, sat = res
    nz = np.flatnonzero(counts > 0)
    lower, upper = layout.edges_ns()
    total = float(counts.sum())
    mean = float(np.dot(counts, layout.mids_ns()) / total)
    keys = [pct_key(q) for q in qs]
    return HistStats(
        samples=total,
        min_ns=float(lower[nz[0]]),
        mean_ns=mean,
        max_ns=float(upper[nz[-1]]),
        percentiles_ns=dict(zip(keys, values, strict=True)),
        saturated=tuple(k for k, s in zip(keys, sat, strict=True) if s),
    )
