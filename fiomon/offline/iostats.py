"""IOstats-style per-operation statistics from fio's per-I/O latency logs (pure, streaming).

fio's ``write_lat_log=P`` with ``log_avg_msec=0`` writes one line per I/O: its stamp in ms,
its latency, direction and size. Per direction (and over all I/Os) this module keeps, with
memory that does not grow with the number of lines:

* **latency**: count, total time (sum of the latencies, exact integer ns), mean, population
  variance and standard deviation (chunk moments merged with Chan's parallel update), min
  and max (exact), and fio's fine-bin counts (bin width < 1/64 of the value);
* **percentiles, exact**, nearest rank as fio and the rest of fiomon define it: the p-th
  percentile of n values is the value of rank ``ceil(p * n / 100)`` (at least 1), computed
  in exact rational arithmetic (``np.quantile(..., method="inverted_cdf")`` gives the same).
  They take more passes over the files (:class:`RankFinder`): the fine bins name the bin
  holding each rank; the next pass keeps the values inside that bin when there are at most
  :data:`COLLECT_CAP` of them, or counts every integer in it when it is at most that wide,
  or else splits it into :data:`SPLIT` equal parts and counts those (then again); so memory
  is at most :data:`COLLECT_CAP` values per percentile and the answer is exact;
* **inter-arrival** (the time between operations of the same type), see
  :class:`GapCounts`: per file and direction, the differences of consecutive stamps in the
  file's order (fio writes a job's samples in the order it took them). fio stamps in whole
  ms, so the gaps are whole ms (a gap of 0: same stamp) and are counted exactly per value:
  mean, variance, min, max and percentiles are exact for those ms values; nothing below a
  ms can be told apart. A stamp earlier than the previous one of its direction in that file
  starts a new sequence (``per_job_logs=0`` files hold one job after another) and is counted
  in ``restarts``, not as a gap. Several files are **pooled**: each file's gaps are its own
  and the counts add up (a file is one fio job, with its own clock origin for relative stamps
  and, across hosts, its own clock; merging the streams of N jobs would measure how fio's
  jobs interleave, not how one issues I/O, and is what the summary's IOPS already say);
* **bytes per request** (``bs``): count, total, mean, variance, min, max;
* **bytes per second per request**: ``bs * 1e9 / latency_ns`` of each I/O (mean, variance,
  min, max; I/Os of latency 0 are left out and counted in ``zero_latency``), and bytes per
  second of total time (total bytes / total latency).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from fiomon.bins import MAX_GROUP_NR, PLAT_VAL, fine_lower_upper, plat_val_to_idx
from fiomon.histogram import pct_key

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

FINE_BINS = MAX_GROUP_NR * PLAT_VAL  # fio's fine bins up to 2**63 ns: no value is clamped
COLLECT_CAP = 1 << 18  # values kept per percentile in a pass (2 MiB)
SPLIT = 1 << 16  # parts an interval too wide and too full is split into
GAP_DENSE_MS = 1 << 16  # gaps below this (65.5 s) are counted in an array, above in a dict
ALL = -1  # the direction key of every I/O together
DDIR_LABELS = {0: "read", 1: "write", 2: "trim", ALL: "all"}


def nearest_rank(q: float, n: int) -> int:
    """The 1-based rank of the ``q``-th percentile of ``n`` values: ``ceil(q * n / 100)``, >= 1.

    Exact for the decimal ``q`` as written (99.9 is 999/10, not the nearest double).
    """
    return max(1, math.ceil(Fraction(repr(float(q))) * n / 100))


@dataclass(slots=True)
class Moments:
    """Count, sum, mean, variance, min and max of a stream, merged chunk by chunk.

    ``total`` is an exact Python int when every chunk is integer.
    """

    n: int = 0
    total: int | float = 0
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean
    min: float | None = None
    max: float | None = None

    def add(self, x: I64 | F64) -> None:
        """Fold the values ``x`` in."""
        if not x.size:
            return
        n = int(x.size)
        total: int | float = int(x.sum()) if x.dtype.kind in "iu" else float(x.sum())
        mean = float(total) / n
        m2 = float(np.square(x.astype(np.float64) - mean).sum())
        self.merge(Moments(n, total, mean, m2, float(x.min()), float(x.max())))

    def merge(self, other: Moments) -> None:
        """Fold another stream's moments in (Chan et al.)."""
        if other.n == 0:
            return
        if self.n == 0:
            self.n, self.total, self.mean, self.m2 = other.n, other.total, other.mean, other.m2
            self.min, self.max = other.min, other.max
            return
        n = self.n + other.n
        delta = other.mean - self.mean
        self.m2 += other.m2 + delta * delta * self.n * other.n / n
        self.total += other.total
        self.mean = float(self.total) / n
        self.n = n
        assert self.min is not None and self.max is not None and other.min is not None  # noqa: S101
        assert other.max is not None  # noqa: S101
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    @property
    def variance(self) -> float | None:
        """Population variance (divided by n), or None when empty."""
        return self.m2 / self.n if self.n else None

    def to_json(self, unit: str) -> dict[str, Any]:
        """``{count, total_UNIT, mean_UNIT, stddev_UNIT, variance_UNIT2, min_UNIT, max_UNIT}``."""
        var = self.variance
        return {
            "count": self.n,
            f"total_{unit}": self.total,
            f"mean_{unit}": self.mean if self.n else None,
            f"stddev_{unit}": math.sqrt(var) if var is not None else None,
            f"variance_{unit}2": var,
            f"min_{unit}": self.min,
            f"max_{unit}": self.max,
        }


@dataclass(slots=True)
class GapCounts:
    """Exact counts of whole-ms values: an array below :data:`GAP_DENSE_MS`, a dict above.

    The dict holds at most one entry per 65.5 s of the summed spans of the files, so memory
    stays bounded however long the run.
    """

    dense: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    sparse: dict[int, int] = field(default_factory=dict)

    def add(self, gaps: I64) -> None:
        """Count the gaps (non-negative whole ms)."""
        if not gaps.size:
            return
        small = gaps < GAP_DENSE_MS
        few = gaps[small]
        if few.size:
            counts = np.bincount(few)
            if counts.size > self.dense.size:
                self.dense = np.pad(self.dense, (0, counts.size - self.dense.size))
            self.dense[: counts.size] += counts
        for v, c in zip(*np.unique(gaps[~small], return_counts=True), strict=True):
            self.sparse[int(v)] = self.sparse.get(int(v), 0) + int(c)

    def merge(self, other: GapCounts) -> None:
        """Add another's counts."""
        if other.dense.size > self.dense.size:
            self.dense = np.pad(self.dense, (0, other.dense.size - self.dense.size))
        self.dense[: other.dense.size] += other.dense
        for v, c in other.sparse.items():
            self.sparse[v] = self.sparse.get(v, 0) + c

    def values_counts(self) -> tuple[I64, I64]:
        """The distinct values in increasing order and their counts."""
        nz = np.flatnonzero(self.dense)
        keys = sorted(self.sparse)
        values = np.concatenate([nz, np.array(keys, dtype=np.int64)]).astype(np.int64)
        counts = np.concatenate(
            [self.dense[nz], np.array([self.sparse[k] for k in keys], dtype=np.int64)]
        ).astype(np.int64)
        return values, counts


@dataclass(frozen=True, slots=True)
class GapStats:
    """Inter-arrival statistics of one direction, in ms.

    Args:
        count: gaps (I/Os less one per file and sequence).
        mean_ms: mean gap.
        stddev_ms: population standard deviation.
        variance_ms2: population variance.
        min_ms: smallest gap.
        max_ms: largest gap.
        percentiles_ms: nearest-rank percentiles, keyed as ``fiomon report`` keys them.
        same_stamp: gaps of 0 ms (two I/Os with one stamp).
        histogram: ``(from_ms, to_ms, count)`` rows, ``[from, to)``, on log bins rounded
            to whole ms, from the decade below the smallest gap of 1 ms up to the decade
            above the largest.
        restarts: times a stamp went back in a file (a new sequence, not a gap).
    """

    count: int
    mean_ms: float
    stddev_ms: float
    variance_ms2: float
    min_ms: int
    max_ms: int
    percentiles_ms: dict[str, int]
    same_stamp: int
    histogram: list[tuple[float, float, int]]
    restarts: int

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {
            "count": self.count,
            "mean_ms": self.mean_ms,
            "stddev_ms": self.stddev_ms,
            "variance_ms2": self.variance_ms2,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "percentiles_ms": self.percentiles_ms,
            "same_stamp": self.same_stamp,
            "histogram": [{"from_ms": a, "to_ms": b, "gaps": c} for a, b, c in self.histogram],
            "restarts": self.restarts,
        }


def gap_stats(gaps: GapCounts, qs: Sequence[float], restarts: int, nbins: int) -> GapStats | None:
    """The statistics of counted gaps (None without any)."""
    values, counts = gaps.values_counts()
    n = int(counts.sum())
    if n == 0:
        return None
    total = int(np.dot(values, counts))
    mean = total / n
    var = float(np.dot(np.square(values.astype(np.float64) - mean), counts)) / n
    cum = np.cumsum(counts)
    pct = {pct_key(q): int(values[np.searchsorted(cum, nearest_rank(q, n))]) for q in qs}
    hist: list[tuple[float, float, int]] = []
    same = int(counts[0]) if values[0] == 0 else 0
    if int(values[-1]) >= 1:
        lo = 10.0 ** math.floor(math.log10(max(int(values[values > 0][0]), 1)))
        hi = 10.0 ** math.ceil(math.log10(max(int(values[-1]) + 1, lo * 10)))
        # whole-ms edges: a log bin holding no whole ms would always be empty
        edges = np.unique(np.ceil(np.geomspace(lo, hi, nbins + 1)))
        at = np.searchsorted(values, edges, side="left")
        below = np.concatenate([[0], cum])[at]
        hist = [
            (float(a), float(b), int(c))
            for a, b, c in zip(edges[:-1], edges[1:], np.diff(below), strict=True)
        ]
    return GapStats(
        count=n,
        mean_ms=mean,
        stddev_ms=math.sqrt(var),
        variance_ms2=var,
        min_ms=int(values[0]),
        max_ms=int(values[-1]),
        percentiles_ms=pct,
        same_stamp=same,
        histogram=hist,
        restarts=restarts,
    )


@dataclass(slots=True)
class DirAcc:
    """Everything kept for one direction (or all) on the first pass."""

    latency: Moments = field(default_factory=Moments)
    fine: I64 = field(default_factory=lambda: np.zeros(FINE_BINS, dtype=np.int64))
    request_bytes: Moments = field(default_factory=Moments)
    rate: Moments = field(default_factory=Moments)  # bytes/s of each request
    zero_latency: int = 0
    gaps: GapCounts = field(default_factory=GapCounts)
    restarts: int = 0
    first_ms: int | None = None
    last_ms: int | None = None

    def add(self, time_ms: I64, value_ns: I64, bs: I64) -> None:
        """Fold in the I/Os of this direction of one chunk (gaps are added separately)."""
        if not value_ns.size:
            return
        self.latency.add(value_ns)
        self.fine += np.bincount(plat_val_to_idx(value_ns, MAX_GROUP_NR), minlength=FINE_BINS)
        self.request_bytes.add(bs)
        pos = value_ns > 0
        self.zero_latency += int(value_ns.size - np.count_nonzero(pos))
        self.rate.add(bs[pos].astype(np.float64) * 1e9 / value_ns[pos])
        lo, hi = int(time_ms.min()), int(time_ms.max())
        self.first_ms = lo if self.first_ms is None else min(self.first_ms, lo)
        self.last_ms = hi if self.last_ms is None else max(self.last_ms, hi)


class IoStatsAccumulator:
    """The first pass: per direction and over all I/Os, what :class:`DirAcc` keeps.

    Feed the chunks of each file with :meth:`add`, naming the file (``stream``) so that the
    inter-arrival gaps carry over chunk boundaries but never across files.
    """

    def __init__(self) -> None:
        self.dirs: dict[int, DirAcc] = {}
        self._last: dict[tuple[str, int], int] = {}

    def _acc(self, d: int) -> DirAcc:
        a = self.dirs.get(d)
        if a is None:
            a = self.dirs[d] = DirAcc()
        return a

    def add(self, stream: str, time_ms: I64, value_ns: I64, ddir: I64, bs: I64) -> None:
        """Fold in one chunk of ``stream``'s I/Os (arrays of one length, in file order)."""
        if not time_ms.size:
            return
        self._gaps(stream, ALL, time_ms)
        self._acc(ALL).add(time_ms, value_ns, bs)
        for d in np.unique(ddir).tolist():
            sel = ddir == d
            t = time_ms[sel]
            self._gaps(stream, d, t)
            self._acc(d).add(t, value_ns[sel], bs[sel])

    def _gaps(self, stream: str, d: int, t: I64) -> None:
        prev = self._last.get((stream, d))
        diffs = np.diff(t if prev is None else np.concatenate([[prev], t]))
        back = diffs < 0
        acc = self._acc(d)
        acc.restarts += int(np.count_nonzero(back))
        acc.gaps.add(diffs[~back])
        self._last[stream, d] = int(t[-1])


@dataclass(slots=True)
class _Interval:
    lo: int
    hi: int  # exclusive
    count: int
    mode: str  # collect | dense | split
    step: int = 1
    kept: list[I64] = field(default_factory=list)
    counts: I64 | None = None


class RankFinder:
    """Exact nearest-rank percentiles of one direction's values, over as many passes as needed.

    Args:
        fine: fio fine-bin counts of the values (:attr:`DirAcc.fine`).
        qs: the percentiles.
    """

    def __init__(self, fine: I64, qs: Sequence[float]) -> None:
        self.n = int(fine.sum())
        self.results: dict[str, int] = {}
        cum = np.cumsum(fine)
        # per percentile key: (interval lo, hi, count inside, rank inside)
        self._targets: dict[str, tuple[int, int, int, int]] = {}
        if self.n == 0:
            return
        for q in qs:
            k = nearest_rank(q, self.n)
            j = int(np.searchsorted(cum, k))
            before = int(cum[j - 1]) if j else 0
            lo, hi = fine_lower_upper(np.array([j], dtype=np.int64))
            self._targets[pct_key(q)] = (int(lo[0]), int(hi[0]), int(fine[j]), k - before)
        self._start_pass()

    @property
    def pending(self) -> bool:
        """Whether another pass over the values is needed."""
        return bool(self._targets)

    def _start_pass(self) -> None:
        self._intervals: dict[tuple[int, int], _Interval] = {}
        for lo, hi, count, _ in self._targets.values():
            if (lo, hi) in self._intervals:
                continue
            if count <= COLLECT_CAP:
                iv = _Interval(lo, hi, count, "collect")
            elif hi - lo <= COLLECT_CAP:
                iv = _Interval(lo, hi, count, "dense", counts=np.zeros(hi - lo, np.int64))
            else:
                step = -(-(hi - lo) // SPLIT)
                nparts = -(-(hi - lo) // step)
                iv = _Interval(lo, hi, count, "split", step, counts=np.zeros(nparts, np.int64))
            self._intervals[lo, hi] = iv

    def feed(self, values: I64) -> None:
        """The next values of this pass (every value of the direction, once per pass)."""
        for iv in self._intervals.values():
            v = values[(values >= iv.lo) & (values < iv.hi)]
            if not v.size:
                continue
            if iv.mode == "collect":
                iv.kept.append(v)
            else:
                assert iv.counts is not None  # noqa: S101
                iv.counts += np.bincount((v - iv.lo) // iv.step, minlength=iv.counts.size)

    def finish_pass(self) -> None:
        """Resolve what this pass settles; narrow the rest for the next pass."""
        targets: dict[str, tuple[int, int, int, int]] = {}
        for key, (lo, hi, _, r) in self._targets.items():
            iv = self._intervals[lo, hi]
            if iv.mode == "collect":
                v = np.concatenate(iv.kept) if iv.kept else np.zeros(0, np.int64)
                if v.size != iv.count:
                    msg = f"the input changed between passes ({v.size} values, {iv.count} before)"
                    raise RuntimeError(msg)
                self.results[key] = int(np.partition(v, r - 1)[r - 1])
                continue
            assert iv.counts is not None  # noqa: S101
            cum = np.cumsum(iv.counts)
            i = int(np.searchsorted(cum, r))
            before = int(cum[i - 1]) if i else 0
            if iv.mode == "dense":
                self.results[key] = iv.lo + i
            else:
                sub_lo = iv.lo + i * iv.step
                targets[key] = (sub_lo, min(sub_lo + iv.step, iv.hi), int(iv.counts[i]), r - before)
        self._targets = targets
        if targets:
            self._start_pass()


@dataclass(frozen=True, slots=True)
class PerIoStats:
    """What per-I/O logs add to a direction's summary.

    Args:
        total_latency_ns: the sum of the latencies (IOstats' total time).
        latency: latency moments (exact), ns.
        request_bytes: bytes per request.
        rate: bytes per second of each request (``bs * 1e9 / latency_ns``).
        zero_latency: I/Os of latency 0, left out of ``rate``.
        bytes_per_second_of_total_time: total bytes / total latency.
        interarrival: the gaps between I/Os of this direction, or None with fewer than two.
    """

    total_latency_ns: int
    latency: Moments
    request_bytes: Moments
    rate: Moments
    zero_latency: int
    bytes_per_second_of_total_time: float | None
    interarrival: GapStats | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return {
            "total_latency_ns": self.total_latency_ns,
            "request_bytes": self.request_bytes.to_json("bytes"),
            "request_bytes_per_second": self.rate.to_json("bytes_per_second"),
            "zero_latency": self.zero_latency,
            "bytes_per_second_of_total_time": self.bytes_per_second_of_total_time,
            "interarrival": None if self.interarrival is None else self.interarrival.to_json(),
        }


def per_io_stats(acc: DirAcc, qs: Sequence[float], hist_bins: int) -> PerIoStats:
    """The per-I/O extras of one direction's first-pass accumulator."""
    total = int(acc.latency.total)
    return PerIoStats(
        total_latency_ns=total,
        latency=acc.latency,
        request_bytes=acc.request_bytes,
        rate=acc.rate,
        zero_latency=acc.zero_latency,
        bytes_per_second_of_total_time=(
            float(acc.request_bytes.total) * 1e9 / total if total > 0 else None
        ),
        interarrival=gap_stats(acc.gaps, qs, acc.restarts, hist_bins),
    )


def bin_counts(values: I64, edges: F64) -> I64:
    """Exact counts of ``values``: below ``edges[0]``, per ``[edges[i], edges[i+1])``, above."""
    return np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1)
