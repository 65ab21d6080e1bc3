"""Closed quanta packed for the charts (``fiomon plot``'s embedded data), down-sampled.

The charts take closed-quantum objects (the quanta file's JSON line, plus an optional ``heat``
of :mod:`fiomon.heat` on cluster rows). Written out one object per row, 16 hosts x 600
quanta x 3 directions would be about 12 MB of HTML, so the offline page embeds them
*columnar*, one series per (scope, host, direction), and ``fiomon.js`` unpacks them back
into objects before drawing (the live page gets plain objects from the API):

``{"version": 1, "t0": ms, "quantum_ms", "relative", "percentiles": [keys], "sla_ns":
[...], "downsampled": f, "series": [{"scope", "host", "direction", "end": [ms - t0],
"start": [...], "samples": [...], "p": {"99": [...]}, "sat": {"99": [point indices]},
"lo": {"99": [...]}, "hi": {"99": [...]}, ... }]}``

Cluster series carry every field; host series only ``samples`` and the percentiles (the
host heatmap and its readout need no more). ``lo``/``hi`` are the low and high sides of
each percentile's confidence interval (``percentiles_ci_ns``, ns; ``null`` for a side the
data cannot bound); only cluster series carry them, and only when the rows have bounds.
Latencies keep 6 significant digits, rates 5.

**Down-sampling.** A chart is at most a few thousand pixels wide, so a series longer than
``max_points`` is cut into groups of ``f`` consecutive quanta, and each group becomes two
points: at the group's first end, the minimum of every field over the group, and at its
last end, the maximum. Spikes and dips therefore survive (the envelope is exact) while
the page stays small; heat counts of a group are summed onto its second point. A group's
confidence band is conservative: both of its points get the group's lowest ``lo`` and
highest ``hi``, and a side that is unbounded (``null``) in any quantum of the group is
unbounded for the group. The page says when it was down-sampled, and by how much.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.heat import heat_counts
from fiomon.histogram import pct_key

DEFAULT_MAX_POINTS = 2000
_CLUSTER_FIELDS = ("min_ns", "mean_ns", "max_ns", "iops", "bytes_per_second")


def _sig(x: float, digits: int) -> float | int | None:
    if not math.isfinite(x):
        return None
    v = float(f"{x:.{digits}g}")
    return int(v) if v.is_integer() and abs(v) < 2**53 else v


class _Series:
    """The rows of one (scope, host, direction), as columns."""

    def __init__(self, scope: str, host: str | None, direction: str, keys: Sequence[str]):
        self.scope, self.host, self.direction = scope, host, direction
        self.keys = list(keys)
        self.start: list[int] = []
        self.end: list[int] = []
        self.samples: list[float] = []
        self.fields: dict[str, list[float]] = {f: [] for f in _CLUSTER_FIELDS}
        self.pcts: dict[str, list[float]] = {k: [] for k in keys}
        self.sat: dict[str, list[int]] = {k: [] for k in keys}
        self.heat: list[dict[str, Any] | None] = []
        # Confidence bounds per percentile key, NaN for an unbounded side; None until a
        # row carries bounds (rows without any: the series has no band).
        self.lo: dict[str, list[float]] | None = None
        self.hi: dict[str, list[float]] | None = None

    def add(self, r: ClosedQuantum, layout: BinLayout | None) -> None:
        s = r.stats
        i = len(self.end)
        self.start.append(r.start_ms)
        self.end.append(r.end_ms)
        self.samples.append(s.samples)
        for k in self.keys:
            self.pcts[k].append(s.percentiles_ns.get(k, math.nan))
            if k in s.saturated:
                self.sat[k].append(i)
        if self.scope == "cluster":
            self.fields["min_ns"].append(s.min_ns)
            self.fields["mean_ns"].append(s.mean_ns)
            self.fields["max_ns"].append(s.max_ns)
            self.fields["iops"].append(math.nan if r.iops is None else r.iops)
            bps = r.bytes_per_second
            self.fields["bytes_per_second"].append(math.nan if bps is None else bps)
            hist = r.hist
            self.heat.append(
                heat_counts(hist, layout) if hist is not None and layout is not None else None
            )
            self._add_bounds(r, i)

    def _add_bounds(self, r: ClosedQuantum, i: int) -> None:
        if r.ci_ns is None and self.lo is None:
            return
        if self.lo is None or self.hi is None:
            # Earlier rows had no bounds: unbounded on both sides.
            self.lo = {k: [math.nan] * i for k in self.keys}
            self.hi = {k: [math.nan] * i for k in self.keys}
        ci = r.ci_ns or {}
        for k in self.keys:
            low, high = ci.get(k, (None, None))
            self.lo[k].append(math.nan if low is None else low)
            self.hi[k].append(math.nan if high is None else high)

    def to_json(self, t0: int, factor: int) -> dict[str, Any]:
        """The packed series, down-sampled by ``factor`` (1: as is)."""
        cols: dict[str, npt.NDArray[np.float64]] = {
            "samples": np.asarray(self.samples, np.float64),
            **{f"p{k}": np.asarray(v, np.float64) for k, v in self.pcts.items()},
        }
        if self.scope == "cluster":
            cols.update({f: np.asarray(v, np.float64) for f, v in self.fields.items()})
        if self.lo is not None and self.hi is not None:
            cols.update({f"cilo{k}": np.asarray(v, np.float64) for k, v in self.lo.items()})
            cols.update({f"cihi{k}": np.asarray(v, np.float64) for k, v in self.hi.items()})
        start = np.asarray(self.start, np.int64)
        end = np.asarray(self.end, np.int64)
        sat = {k: np.asarray(v, np.int64) for k, v in self.sat.items()}
        heat = self.heat
        if factor > 1:
            start, end, cols, sat, heat = _envelope(
                start=start, end=end, cols=cols, sat=sat, heat=heat, factor=factor
            )
        out: dict[str, Any] = {
            "scope": self.scope,
            "host": self.host,
            "direction": self.direction,
            "start": (start - t0).tolist(),
            "end": (end - t0).tolist(),
            "samples": [_sig(x, 6) for x in cols["samples"].tolist()],
            "p": {k: [_sig(x, 6) for x in cols[f"p{k}"].tolist()] for k in self.keys},
            "sat": {k: v.tolist() for k, v in sat.items() if v.size},
        }
        if self.scope == "cluster":
            for f in _CLUSTER_FIELDS:
                out[f] = [_sig(x, 6 if f.endswith("_ns") else 5) for x in cols[f].tolist()]
            out["heat"] = heat
            if self.lo is not None:
                for side in ("lo", "hi"):
                    out[side] = {
                        k: [_sig(x, 6) for x in cols[f"ci{side}{k}"].tolist()] for k in self.keys
                    }
        return out


def _envelope(
    *,
    start: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
    cols: dict[str, npt.NDArray[np.float64]],
    sat: dict[str, npt.NDArray[np.int64]],
    heat: list[dict[str, Any] | None],
    factor: int,
) -> tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    dict[str, npt.NDArray[np.float64]],
    dict[str, npt.NDArray[np.int64]],
    list[dict[str, Any] | None],
]:
    """Two points per group of ``factor`` quanta: the minimum first, the maximum last."""
    n = end.size
    groups = np.arange(n) // factor
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    last = np.r_[starts[1:], n] - 1
    g = starts.size
    out_start = np.empty(2 * g, np.int64)
    out_end = np.empty(2 * g, np.int64)
    out_start[0::2], out_end[0::2] = start[starts], end[starts]
    out_start[1::2], out_end[1::2] = start[last], end[last]
    out_cols: dict[str, npt.NDArray[np.float64]] = {}
    for name, v in cols.items():
        both = np.empty(2 * g, np.float64)
        with np.errstate(invalid="ignore"):
            if name.startswith("ci"):
                # Bands: the group's widest, on both points (NaN, unbounded, wins).
                side = (np.minimum if name.startswith("cilo") else np.maximum).reduceat(v, starts)
                both[0::2] = both[1::2] = side
            else:
                both[0::2] = np.fmin.reduceat(v, starts)
                both[1::2] = np.fmax.reduceat(v, starts)
        out_cols[name] = both
    # A group's samples are summed and split over its two points (totals stay right).
    total = np.add.reduceat(np.nan_to_num(cols["samples"]), starts)
    out_cols["samples"] = np.repeat(total / 2, 2)
    out_sat = {k: np.unique(groups[v]) * 2 + 1 for k, v in sat.items()}
    out_heat: list[dict[str, Any] | None] = []
    if heat:
        for a, b in zip(starts.tolist(), (last + 1).tolist(), strict=True):
            out_heat += [None, _sum_heat(heat[a:b])]
    return out_start, out_end, out_cols, out_sat, out_heat


def _sum_heat(items: Iterable[dict[str, Any] | None]) -> dict[str, Any] | None:
    got = [h for h in items if h is not None]
    if not got:
        return None
    k0 = min(h["k0"] for h in got)
    k1 = max(h["k0"] + len(h["counts"]) for h in got)
    acc = np.zeros(k1 - k0)
    for h in got:
        acc[h["k0"] - k0 : h["k0"] - k0 + len(h["counts"])] += h["counts"]
    return {"k0": k0, "counts": [_sig(float(c), 6) for c in acc]}


class PlotData:
    """Collects closed quanta (a report's :class:`~fiomon.offline.output.RowWriter`) for the charts.

    Args:
        percentiles: the report's percentiles.
        layout: the bin layout of the rows' histograms (for the heatmap; None: no heat).
        relative: times are ms since the earliest record, not epoch ms.
    """

    def __init__(
        self, percentiles: Sequence[float], layout: BinLayout | None, relative: bool
    ) -> None:
        self.keys = [pct_key(q) for q in percentiles]
        self.layout = layout
        self.relative = relative
        self.quantum_ms = 0
        self._series: dict[tuple[str, str, str], _Series] = {}

    def write(self, rows: Sequence[ClosedQuantum]) -> None:
        """Take closed rows (in time order)."""
        for r in rows:
            key = (r.scope, r.host or "", r.direction)
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = _Series(r.scope, r.host, r.direction, self.keys)
            s.add(r, self.layout)
            self.quantum_ms = self.quantum_ms or (r.end_ms - r.start_ms)

    def close(self) -> None:
        """Nothing to finish (the document is built by :meth:`document`)."""

    @property
    def rows(self) -> int:
        """Rows collected."""
        return sum(len(s.end) for s in self._series.values())

    def document(
        self,
        *,
        title: str,
        sla_ns: Sequence[float] = (),
        max_points: int = DEFAULT_MAX_POINTS,
    ) -> dict[str, Any]:
        """The packed document the page embeds (see the module docstring)."""
        longest = max((len(s.end) for s in self._series.values()), default=0)
        factor = max(1, math.ceil(longest / max(1, max_points // 2))) if longest > max_points else 1
        t0 = min((s.end[0] for s in self._series.values() if s.end), default=0)
        order = sorted(
            self._series.values(),
            key=lambda s: (s.scope != "cluster", s.host or "", s.direction),
        )
        return {
            "version": 1,
            "title": title,
            "t0": t0,
            "quantum_ms": self.quantum_ms,
            "relative": self.relative,
            "percentiles": self.keys,
            "sla_ns": list(sla_ns),
            "downsampled": factor,
            "series": [s.to_json(t0, factor) for s in order],
        }
