"""Latency distributions with known quantiles, drawn as fio histograms (tests only).

The bin counts of ``n`` independent draws are Multinomial(n, mass of each fio bin), so a
quantum of 20,000 I/Os costs one multinomial draw over fio's bins, not 20,000 latencies.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.model import RecordBatch, StreamInfo

US = 1000.0


def _normal_cdf(x: npt.NDArray[np.float64], mean: float, sd: float) -> npt.NDArray[np.float64]:
    z = (x - mean) / (sd * math.sqrt(2.0))
    return np.array([0.5 * (1.0 + math.erf(v)) for v in z.tolist()])


Cdf = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]


def lognormal_cdf(median_ns: float, sigma: float = 0.5) -> Cdf:
    """The CDF of a lognormal latency with this median (ns)."""

    def cdf(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return _normal_cdf(np.log(np.maximum(x, 1e-9)), math.log(median_ns), sigma)

    return cdf


lognormal = lognormal_cdf(400 * US)


def _head_and_tail(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # 97 % normal head around 400 us, 3 % Pareto tail from 500 us with exponent 2.5
    tail = np.where(x >= 500 * US, 1.0 - (500 * US / np.maximum(x, 500 * US)) ** 2.5, 0.0)
    return 0.97 * _normal_cdf(x, 400 * US, 60 * US) + 0.03 * tail


def _bimodal(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # page-cache hits around 200 us and disk reads around 2 ms
    return 0.7 * _normal_cdf(x, 200 * US, 20 * US) + 0.3 * _normal_cdf(x, 2000 * US, 200 * US)


DISTRIBUTIONS: dict[str, Cdf] = {
    "lognormal": lognormal,
    "normal head + Pareto tail": _head_and_tail,
    "bimodal": _bimodal,
}


def true_quantile(cdf: Cdf, q: float) -> float:
    lo, hi = 1.0, 1e11  # ns; bisection in log space
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if cdf(np.array([mid]))[0] < q else (lo, mid)
    return math.sqrt(lo * hi)


def fio_quanta(
    cdf: Cdf,
    n: int,
    rng: np.random.Generator,
    quanta: int,
) -> npt.NDArray[np.float64]:
    """``quanta`` fio histograms of ``n`` independent draws each (fio 3's 1856 bins)."""
    _, upper = BinLayout().edges_ns()
    c = cdf(np.asarray(upper, dtype=np.float64))
    c[-1] = 1.0  # fio's last bin holds everything above it
    mass = np.clip(np.diff(c, prepend=0.0), 0.0, None)
    return rng.multinomial(n, mass / mass.sum(), size=quanta).astype(np.float64)


def batch_of_quanta(
    hists: npt.NDArray[np.float64], *, t0_ms: int = 0, quantum_ms: int = 1000, direction: int = 0
) -> RecordBatch:
    """One record per histogram row, each exactly filling one quantum from ``t0_ms`` on."""
    counts = np.rint(hists).astype(np.int64)
    rows, bins = np.nonzero(counts)
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(counts)), out=indptr[1:])
    ends = t0_ms + quantum_ms * np.arange(1, len(counts) + 1, dtype=np.int64)
    return RecordBatch(
        layout=BinLayout(),
        streams=(StreamInfo("h", "s"),),
        stream_idx=np.zeros(len(counts), np.int32),
        direction=np.full(len(counts), direction, np.int8),
        start_ms=ends - quantum_ms,
        end_ms=ends,
        nbytes=counts.sum(axis=1) * 4096,
        indptr=indptr,
        bins=bins.astype(np.int32),
        counts=counts[rows, bins],
    )
