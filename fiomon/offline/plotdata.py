"""Closed quanta packed for the charts (``fiomon plot``'s embedded data), down-sampled.

The charts take closed-quantum objects (the quanta file's JSON line, plus an optional ``heat``
of :mod:`fiomon.heat` on cluster rows). Written out one object per row, 16 hosts x 600
quanta x 3 directions would be about 12 MB of HTML, so the offline page embeds them
*columnar*, one series per (scope, host, direction), and ``fiomon.js`` unpacks them back
into objects before drawing (the live page gets plain objects from the API):

``{"version": 1, "t0": ms, "quantum_ms", "relative", "percentiles": [keys], "sla_ns":
[...], "sla": [{"ns", "percentile", "direction", "label"}], "hosts": [names], "runs":
[labels], "surface_percentiles": [keys], "downsampled": f, "series": [{"scope", "host",
"direction", "end": [ms - t0], "start": [...], "samples": [...], "p": {"99": [...]}, "sat":
{"99": [point indices]}, "lo": {"99": [...]}, "hi": {"99": [...]}, "surface": {"99.95":
[...]}, ... }]}``

Cluster series carry every field; host series only ``samples``, ``iops`` and the
percentiles (the host heatmap, the per-host panels and their readout need no more).
``sla_ns`` lists every threshold's latency; ``sla`` says which percentile and direction
each one is for (``null``: any) and its label (``"SLA p99 read 5 ms"``): a chart draws a
threshold only on its direction's panel. ``hosts`` are the run's host labels, ``runs`` the
run labels the rows carry (both may be empty). ``lo``/``hi`` are the low and high sides of
each percentile's confidence interval (``percentiles_ci_ns``, ns; ``null`` for a side the
data cannot bound); only cluster series carry them, and only when the rows have bounds.
Latencies keep 6 significant digits (the surface's 4), rates 5.

**Percentile surface.** Cluster series of rows with histograms also carry ``surface``:
the latency (ns) of each of ``surface_percentiles`` per quantum, computed from the merged
histograms exactly as the rows' percentiles are (:func:`fiomon.histogram.summarize_many`,
one vectorised pass per batch of rows). The default set, :data:`SURFACE_PERCENTILES`, runs
from p50 to p99.99 in 1-1.5-2-3-4-5-6-8 steps of the tail share per decade, so the rows are
evenly spread on a nines axis (``-log10(1 - p/100)``); a surface is drawn time x nines,
coloured by latency. Rows without histograms (quanta files) have no surface.

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
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum, Scope
from fiomon.errors import ConfigError
from fiomon.heat import heat_counts
from fiomon.histogram import pct_key, summarize_many
from fiomon.units import parse_latency_ns

DEFAULT_MAX_POINTS = 2000
_CLUSTER_FIELDS = ("min_ns", "mean_ns", "max_ns", "iops", "bytes_per_second")
_HOST_FIELDS = ("iops",)
_DIRECTIONS = ("read", "write", "trim", "mixed", "all")


def _surface_percentiles() -> tuple[float, ...]:
    tails = [50.0, 40.0, 30.0, 20.0, 15.0, 10.0]
    for decade in (1.0, 0.1, 0.01):
        tails += [m * decade for m in (8.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.5, 1.0)]
    return tuple(round(100.0 - t, 6) for t in tails)


SURFACE_PERCENTILES = _surface_percentiles()
"""p50 .. p99.99, 30 percentiles evenly spread on a nines axis (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class SlaLine:
    """A threshold drawn on the latency charts (``fiomon plot --sla``).

    Args:
        ns: the threshold, ns.
        percentile: the percentile it bounds (``"99"``), or None: any.
        direction: the direction whose panel shows it, or None: every panel.
    """

    ns: float
    percentile: str | None = None
    direction: str | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ns) and self.ns > 0):
            msg = f"SLA threshold {self.ns!r} ns is not a positive latency"
            raise ValueError(msg)
        if self.direction is not None and self.direction not in _DIRECTIONS:
            msg = f"SLA direction {self.direction!r} is not one of {', '.join(_DIRECTIONS)}"
            raise ValueError(msg)

    @property
    def label(self) -> str:
        """``SLA p99 read 5 ms`` (the parts given)."""
        parts = ["SLA"]
        if self.percentile is not None:
            parts.append(f"p{self.percentile}")
        if self.direction is not None:
            parts.append(self.direction)
        parts.append(f"{self.ns / 1e6:.4g} ms")
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The document's entry: ``{"ns", "percentile", "direction", "label"}``."""
        return {
            "ns": self.ns,
            "percentile": self.percentile,
            "direction": self.direction,
            "label": self.label,
        }


def parse_sla(text: str) -> SlaLine:
    """``--sla [pPCT:][DIRECTION:]LATENCY`` (``5ms``, ``read:5ms``, ``p99:read:5ms``).

    Raises:
        ConfigError: a part is neither a percentile, a direction nor a latency.
    """
    *parts, latency = text.strip().split(":")
    ns = parse_latency_ns(latency, what="--sla")
    percentile: str | None = None
    direction: str | None = None
    for part in parts:
        low = part.strip().lower()
        if low in _DIRECTIONS and direction is None:
            direction = low
            continue
        if low.startswith("p") and percentile is None:
            try:
                q = float(low[1:])
            except ValueError:
                q = math.nan
            if 0 < q < 100:
                percentile = pct_key(q)
                continue
        msg = (
            f"--sla {text!r}: expected [pPCT:][DIRECTION:]LATENCY such as p99:read:5ms "
            f"({part!r} is neither a percentile like p99 nor one of {', '.join(_DIRECTIONS)})"
        )
        raise ConfigError([msg])
    return SlaLine(ns, percentile, direction)


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
        fields = _CLUSTER_FIELDS if scope == "cluster" else _HOST_FIELDS
        self.fields: dict[str, list[float]] = {f: [] for f in fields}
        # The percentile surface (cluster rows with histograms): key -> ns per row.
        self.surface: dict[str, list[float]] | None = None
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
        if self.scope != "cluster":
            self.fields["iops"].append(math.nan if r.iops is None else r.iops)
        else:
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

    def add_surface(
        self, hists: list[npt.NDArray[np.float64] | None], layout: BinLayout, keys: Sequence[str]
    ) -> None:
        """The surface of the rows just added (their histograms, None: no histogram)."""
        n_before = len(self.end) - len(hists)
        if self.surface is None:
            self.surface = {k: [math.nan] * n_before for k in keys}
        got = [(i, h) for i, h in enumerate(hists) if h is not None]
        values = np.full((len(hists), len(keys)), np.nan)
        if got:
            stack = np.stack([h for _, h in got]).astype(np.float64, copy=False)
            stats = summarize_many(stack, layout, [float(k) for k in keys])
            for (i, _), st in zip(got, stats, strict=True):
                if st is not None:
                    values[i] = [st.percentiles_ns[k] for k in keys]
        for j, k in enumerate(keys):
            self.surface[k].extend(values[:, j].tolist())

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
        cols.update({f: np.asarray(v, np.float64) for f, v in self.fields.items()})
        if self.surface is not None:
            cols.update({f"s{k}": np.asarray(v, np.float64) for k, v in self.surface.items()})
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
        for f in self.fields:
            out[f] = [_sig(x, 6 if f.endswith("_ns") else 5) for x in cols[f].tolist()]
        if self.surface is not None:
            out["surface"] = {k: [_sig(x, 4) for x in cols[f"s{k}"].tolist()] for k in self.surface}
        if self.scope == "cluster":
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
        surface: the percentiles of the surface (computed from the cluster rows'
            histograms; needs ``layout``).
    """

    def __init__(
        self,
        percentiles: Sequence[float],
        layout: BinLayout | None,
        relative: bool,
        *,
        surface: Sequence[float] = SURFACE_PERCENTILES,
    ) -> None:
        self.keys = [pct_key(q) for q in percentiles]
        self.surface_keys = [pct_key(q) for q in surface]
        self.layout = layout
        self.relative = relative
        self.quantum_ms = 0
        self.runs: set[str] = set()
        self._series: dict[tuple[str, str, str], _Series] = {}

    def write(self, rows: Sequence[ClosedQuantum]) -> None:
        """Take closed rows (in time order)."""
        hists: dict[tuple[Scope, str, str], list[npt.NDArray[np.float64] | None]] = {}
        for r in rows:
            key = (r.scope, r.host or "", r.direction)
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = _Series(r.scope, r.host, r.direction, self.keys)
            s.add(r, self.layout)
            self.quantum_ms = self.quantum_ms or (r.end_ms - r.start_ms)
            runs: Sequence[str] | None = getattr(r, "runs", None)  # rows of run identity
            if runs:
                self.runs.update(runs)
            if r.scope == "cluster":
                hists.setdefault(key, []).append(r.hist)
        if self.layout is None or not self.surface_keys:
            return
        for key, hs in hists.items():
            s = self._series[key]
            if s.surface is not None or any(h is not None for h in hs):
                s.add_surface(hs, self.layout, self.surface_keys)

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
        sla: Sequence[SlaLine | float] = (),
        hosts: Sequence[str] = (),
        max_points: int = DEFAULT_MAX_POINTS,
    ) -> dict[str, Any]:
        """The packed document the page embeds (see the module docstring).

        Args:
            title: the charts' title.
            sla: thresholds (a bare number: ns, any percentile and direction).
            hosts: the run's host labels (with the host series' own, when per host).
            max_points: down-sample series longer than this.
        """
        lines = [x if isinstance(x, SlaLine) else SlaLine(float(x)) for x in sla]
        names = {h for h in hosts if h} | {
            s.host for s in self._series.values() if s.scope == "host" and s.host
        }
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
            "sla_ns": [x.ns for x in lines],
            "sla": [x.to_json() for x in lines],
            "hosts": sorted(names),
            "runs": sorted(self.runs),
            "surface_percentiles": (
                self.surface_keys
                if any(s.surface is not None for s in self._series.values())
                else []
            ),
            "downsampled": factor,
            "series": [s.to_json(t0, factor) for s in order],
        }
