"""Coarse latency buckets for heatmaps: a fio histogram folded onto half-octaves.

A heatmap row per fio bin (1856 of them) would be unreadable and large, so the charts use
fixed, layout-independent buckets whose edges are ``2**n`` and ``1.5 * 2**n`` ns: bucket
``k`` is ``[edge(k), edge(k + 1))`` with ``edge(2m) = 2**m`` and ``edge(2m + 1) = 1.5 *
2**m``. From 64 ns up these are exact fio bin edges for every layout up to coarseness 5 (a group
of 64 fine bins starts at ``2**m`` and its 33rd bin at ``1.5 * 2**m``), so a bin's count
falls wholly in one bucket; below 64 ns (coarse bins of a few ns, where no storage I/O
completes) and at coarseness 6, a bin can straddle a half-octave edge and is assigned by
its lower edge (its bucket then reads up to half an octave low).
fio 3's 1856 bins give 69 buckets, from 1 ns to the cap (about 17 s).

The counts are the (overlap-weighted) I/O counts of a quantum, so the heatmap's colour is
"I/Os in this latency band during this quantum".
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout


def bucket_edge_ns(k: int) -> float:
    """Lower edge of bucket ``k`` in ns (``2**(k/2)`` for even ``k``, else ``1.5 * 2**...``)."""
    m, odd = divmod(k, 2)
    return float(2**m) * (1.5 if odd else 1.0)


@functools.cache
def _bucket_of_bin(layout: BinLayout) -> npt.NDArray[np.int64]:
    """The bucket of every bin of ``layout`` (by the bin's lower edge)."""
    lower, _ = layout.edges_ns()
    lo = np.maximum(lower, 1.0)
    m = np.floor(np.log2(lo)).astype(np.int64)
    frac = lo / np.exp2(m.astype(np.float64))
    out = 2 * m + (frac >= 1.5)
    out.flags.writeable = False
    return out


def heat_counts(hist: npt.NDArray[np.float64], layout: BinLayout) -> dict[str, Any] | None:
    """Fold one histogram onto buckets: ``{"k0": first bucket, "counts": [...]}``.

    Only the span from the first to the last non-empty bucket is kept (counts rounded to
    3 decimals: fractions come from records split over quanta). None for an empty
    histogram.
    """
    idx = _bucket_of_bin(layout)
    folded = np.bincount(idx, weights=hist, minlength=int(idx[-1]) + 1)
    nz = np.flatnonzero(folded > 0)
    if nz.size == 0:
        return None
    k0, k1 = int(nz[0]), int(nz[-1])
    counts = [round(float(c), 3) for c in folded[k0 : k1 + 1]]
    return {"k0": k0, "counts": [int(c) if c.is_integer() else c for c in counts]}
