"""``fiomon plot -o FILE.png|.svg``: the main panels as a static figure (matplotlib).

matplotlib is an optional extra (``pip install 'fiomon[plot]'``): the interactive page
needs nothing beyond fiomon itself. The figure draws the packed document of
:mod:`fiomon.offline.plotdata` (the same numbers as the page):

* per direction, the percentile lines on a log latency axis (ms), each with its confidence
  band (translucent, left out where a side is unbounded), the mean, the saturated points
  and the SLA lines meant for that direction (black, dashed, labelled "SLA p99 read 5 ms");
* IOPS and throughput;
* the latency distribution: I/Os per quantum in each half-octave latency band
  (:mod:`fiomon.heat`), when the rows had histograms;
* with host series (``--per-host``), the host x time heatmap of p99 (or the highest
  percentile below it);
* the percentile surface: time x percentile on a nines axis (p50 .. p99.99 at 30 steps
  when the rows had histograms), coloured by latency;
* with host series of two or more hosts, per-host small multiples: one small panel per
  host with its percentile lines over its IOPS, all on shared axes.

Every percentile has one colour whatever else is drawn (:mod:`fiomon.palette`); colour
maps are sequential (viridis) on a log scale with colour bars ticked in ms (at least three
ticks). Times are wall-clock UTC (the axis labels say so, the title gives the start date
and the time range), or seconds since the earliest record for relative inputs. Quanta
without I/O have no rows, and lines, bands and heatmap cells leave them empty: an idle
minute is a gap, never a straight line.
"""

from __future__ import annotations

import datetime as dt
import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from fiomon.errors import PlotError
from fiomon.heat import bucket_edge_ns
from fiomon.palette import MEAN_COLOUR, SATURATED_COLOUR, SLA_COLOUR, nines, percentile_colour

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure, SubFigure

_EXTRA = "pip install 'fiomon[plot]'"
_DIRS = ("read", "write", "trim", "mixed", "all")
_DIR_COLOURS = {
    "read": "#1b4f8a",
    "write": "#8a1b4f",
    "trim": "#6b6b6b",
    "mixed": "#4f8a1b",
    "all": "#333333",
}
CMAP = "viridis"
"""The sequential colour map of every heatmap (perceptually uniform, no muddy middle)."""
DPI = 110
_NINES_TICKS = (50.0, 90.0, 99.0, 99.9, 99.99, 99.999)
_MAX_NAMES = 6  # hosts or runs named in the title before "and N more"

Floats = npt.NDArray[np.float64]


def require_matplotlib() -> None:
    """Raise PlotError naming the extra when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError as exc:
        msg = f"PNG and SVG output needs matplotlib, the plot extra: {_EXTRA} (or write .html)"
        raise PlotError(msg) from exc


def _arr(values: Sequence[float | None], scale: float = 1.0) -> Floats:
    """Values (None: unknown) divided by ``scale``, NaN where unknown."""
    return np.asarray([np.nan if v is None else v for v in values], np.float64) / scale


def fmt_ms(v: float) -> str:
    """A colour bar or axis tick in ms: ``0.2``, ``1``, ``15``, ``1200``."""
    return f"{v:.3g}" if v < 1000 else f"{v:.0f}"


def log_ticks(vmin: float, vmax: float) -> list[float]:
    """At least three readable ticks (1-2-5 per decade, else every digit, else even steps)."""
    lo, hi = math.floor(math.log10(vmin)), math.ceil(math.log10(vmax))
    for subs in ((1.0, 2.0, 5.0), tuple(float(m) for m in range(1, 10))):
        ticks = [m * 10.0**e for e in range(lo, hi + 1) for m in subs]
        inside = [t for t in ticks if vmin * (1 - 1e-9) <= t <= vmax * (1 + 1e-9)]
        if len(inside) >= 3:
            return inside
    return [float(f"{t:.2g}") for t in np.geomspace(vmin, vmax, 4)]


def _names(names: Sequence[str], what: str) -> str:
    """``3 hosts: a, b, c`` or ``40 hosts: a, b, c, d, e, f and 34 more``."""
    n = len(names)
    shown = ", ".join(names[:_MAX_NAMES])
    more = f" and {n - _MAX_NAMES} more" if n > _MAX_NAMES else ""
    return f"{n} {what if n != 1 else what.rstrip('s')}: {shown}{more}"


class _Time:
    """The time axis: wall-clock UTC (matplotlib dates) or seconds since the first record."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.t0: int = doc["t0"]
        self.relative: bool = doc["relative"]
        ends = [e for s in doc["series"] for e in s["end"]]
        starts = [e for s in doc["series"] for e in s["start"]]
        self.first_ms = self.t0 + (min(starts) if starts else 0)
        self.last_ms = self.t0 + (max(ends) if ends else 0)
        # A down-sampled group's two points are (f - 1) quanta apart at most.
        self.slack_ms = (max(1, doc.get("downsampled", 1)) - 1) * doc.get("quantum_ms", 0)

    def x(self, rel_ms: Sequence[float] | Floats) -> Floats:
        """Document times (ms since t0) as axis values."""
        ms = np.asarray(rel_ms, np.float64) + self.t0
        if self.relative:
            return ms / 1000.0
        import matplotlib.dates as mdates  # noqa: PLC0415

        days = mdates.date2num(ms.astype("datetime64[ms]"))  # type: ignore[no-untyped-call]
        out: Floats = np.asarray(days, np.float64)
        return out

    def gaps_before(self, s: dict[str, Any]) -> npt.NDArray[np.intp]:
        """Indices of points that follow quanta without rows (a line must break there)."""
        start = np.asarray(s["start"], np.int64)
        end = np.asarray(s["end"], np.int64)
        return np.flatnonzero(start[1:] - end[:-1] > self.slack_ms) + 1

    def label(self) -> str:
        """The time axis label."""
        return "s since the earliest record" if self.relative else "time (UTC)"

    def span(self) -> str:
        """The title's time range: the start date, times and duration."""
        secs = (self.last_ms - self.first_ms) / 1000.0
        dur = f"{secs:.0f} s" if secs < 120 else f"{secs / 60:.1f} min"
        if self.relative:
            return f"relative times, {dur}"
        a = dt.datetime.fromtimestamp(self.first_ms / 1000, dt.UTC)
        b = dt.datetime.fromtimestamp(self.last_ms / 1000, dt.UTC)
        end = b.strftime("%H:%M:%S") if a.date() == b.date() else b.strftime("%Y-%m-%d %H:%M:%S")
        return f"{a:%Y-%m-%d %H:%M:%S} - {end} UTC ({dur})"

    def style(self, ax: Axes, maxticks: int = 9) -> None:
        """Clock-time ticks (UTC) on a time axis."""
        if self.relative:
            return
        import matplotlib.dates as mdates  # noqa: PLC0415

        utc = dt.UTC
        locator = mdates.AutoDateLocator(tz=utc, minticks=3, maxticks=maxticks)  # type: ignore[no-untyped-call]
        ax.xaxis.set_major_locator(locator)
        day = 86_400_000
        fmt = "%H:%M:%S" if self.last_ms - self.first_ms < day else "%m-%d %H:%M"
        ax.xaxis.set_major_formatter(mdates.DateFormatter(fmt, tz=utc))  # type: ignore[no-untyped-call]


def _broken(
    x: Floats, ys: Sequence[Floats], at: npt.NDArray[np.intp]
) -> tuple[Floats, list[Floats]]:
    """``x`` and ``ys`` with a NaN point inserted before each index of ``at``."""
    if at.size == 0:
        return x, list(ys)
    return np.insert(x, at, x[at]), [np.insert(y, at, np.nan) for y in ys]


class _Columns:
    """The time columns of a heatmap over some series' quanta.

    Quanta without rows become empty columns of their own, so a gap stays a gap. A point
    fills every column from the previous point's end (or its own start, after a gap) to its
    end: down-sampled series of different lengths group different quanta, and each still
    covers its own time.
    """

    def __init__(self, time: _Time, series: Sequence[dict[str, Any]]) -> None:
        self.time = time
        spans: dict[int, int] = {}
        for s in series:
            for st, en in zip(s["start"], s["end"], strict=True):
                spans[en] = min(st, spans.get(en, st))
        edges: list[int] = []
        ends: list[int] = []  # the end of each column (gap columns too)
        prev: int | None = None
        for en in sorted(spans):
            st = spans[en]
            if prev is None:
                edges.append(st)
            elif st - prev > time.slack_ms:
                edges.append(st)  # the gap's column: [prev, st], left empty
                ends.append(st)
            edges.append(en)
            ends.append(en)
            prev = en
        self.edges = time.x(edges)
        self.ends = np.asarray(ends, np.int64)

    def cover(self, s: dict[str, Any]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
        """Per point of ``s``, the first column it fills and the one after its last."""
        start = np.asarray(s["start"], np.int64)
        end = np.asarray(s["end"], np.int64)
        left = start.copy()
        joined = np.ones(end.size, bool)
        joined[:1] = False
        joined[self.time.gaps_before(s)] = False
        left[joined] = end[np.flatnonzero(joined) - 1]
        return (
            np.searchsorted(self.ends, left, side="right"),
            np.searchsorted(self.ends, end, side="right"),
        )

    def row(self, s: dict[str, Any], values: Sequence[float | None]) -> Floats:
        """One heatmap row (ms) of a series' values (ns), NaN where it has none."""
        out = np.full(self.ends.size, np.nan)
        a, b = self.cover(s)
        for i, v in enumerate(values):
            if v is not None and v > 0:
                out[a[i] : b[i]] = v / 1e6
        return out


def _colourbar(
    fig: Figure | SubFigure, mesh: Any, ax: Axes, label: str, name: str, *, ms: bool = True
) -> None:
    """A colour bar (in ms, or counts) with several labelled ticks on its log scale."""
    norm = mesh.norm
    cbar = fig.colorbar(mesh, ax=ax, pad=0.01, fraction=0.04)
    ticks = log_ticks(norm.vmin, norm.vmax)
    cbar.set_ticks(ticks, labels=[fmt_ms(t) if ms else f"{t:g}" for t in ticks])
    cbar.ax.minorticks_off()
    cbar.set_label(label, fontsize=8)
    cbar.ax.tick_params(labelsize=7)
    cbar.ax.set_label(name)


def _log_norm(values: Floats) -> Any:
    from matplotlib.colors import LogNorm  # noqa: PLC0415

    finite = values[np.isfinite(values) & (values > 0)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.1, 1.0)
    if hi <= lo * 1.5:
        lo, hi = lo / 1.5, hi * 1.5
    return LogNorm(vmin=lo, vmax=hi)


def _ms_axis(ax: Axes) -> None:
    """A log latency axis ticked in plain ms."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: PLC0415

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_ms(v)))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _sla_lines(doc: dict[str, Any]) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] | None = doc.get("sla")
    if got is not None:
        return got
    # A document of before the labelled lines: bare thresholds, every panel.
    return [
        {"ns": ns, "percentile": None, "direction": None, "label": f"SLA {ns / 1e6:.4g} ms"}
        for ns in doc.get("sla_ns", [])
    ]


def _latency_panel(ax: Axes, doc: dict[str, Any], time: _Time, d: str, s: dict[str, Any]) -> None:
    at = time.gaps_before(s)
    x0 = time.x(s["end"])
    for k in doc["percentiles"]:
        colour = percentile_colour(float(k))
        y0 = _arr(s["p"][k], 1e6)
        x, (y,) = _broken(x0, [y0], at)
        ax.plot(x, y, lw=1.3, color=colour, label=f"p{k}", gid=f"p{k}")
        if "lo" in s and "hi" in s:
            x, (lo, hi) = _broken(x0, [_arr(s["lo"][k], 1e6), _arr(s["hi"][k], 1e6)], at)
            label = "confidence bands" if k == doc["percentiles"][0] else None
            ax.fill_between(
                x, lo, hi, where=np.isfinite(lo) & np.isfinite(hi), color=colour,
                alpha=0.18, lw=0, label=label, interpolate=False,
            )  # fmt: skip
        sat = s["sat"].get(k, [])
        if sat:
            ax.plot(x0[sat], y0[sat], "v", color=SATURATED_COLOUR, ms=6)
    x, (mean,) = _broken(x0, [_arr(s["mean_ns"], 1e6)], at)
    ax.plot(x, mean, "--", lw=1, color=MEAN_COLOUR, label="mean")
    for line in _sla_lines(doc):
        if line["direction"] not in (None, d):
            continue  # another direction's threshold
        ms = line["ns"] / 1e6
        ax.axhline(ms, color=SLA_COLOUR, lw=1.2, ls="--", label=line["label"])
        ax.annotate(
            line["label"], xy=(0.995, ms), xycoords=("axes fraction", "data"),
            ha="right", va="bottom", fontsize=7, color=SLA_COLOUR,
        )  # fmt: skip
    _ms_axis(ax)
    ax.set_ylabel(f"{d} latency (ms)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, borderaxespad=0)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_label(f"lat-{d}")


def _throughput_panel(
    ax: Axes, time: _Time, dirs: Sequence[str], cluster: dict[str, dict[str, Any]]
) -> None:
    ax2 = ax.twinx()
    for d in dirs:
        s = cluster[d]
        at = time.gaps_before(s)
        x, (iops, mbs) = _broken(
            time.x(s["end"]), [_arr(s["iops"]), _arr(s["bytes_per_second"], 1e6)], at
        )
        ax.plot(x, iops, lw=1, color=_DIR_COLOURS[d], label=f"IOPS {d}")
        ax2.plot(x, mbs, ":", lw=1, color=_DIR_COLOURS[d], label=f"MB/s {d}")
    ax.set_ylabel("IOPS")
    ax2.set_ylabel("MB/s (dotted)")
    ax.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    more = ax2.get_legend_handles_labels()
    ax.legend(
        lines[0] + more[0], lines[1] + more[1], loc="upper left", bbox_to_anchor=(1.1, 1.0),
        fontsize=7, borderaxespad=0,
    )  # fmt: skip
    ax.grid(True, alpha=0.3)
    ax.set_label("throughput")


def _pick_key(doc: dict[str, Any]) -> str:
    keys: list[str] = doc["percentiles"]
    below = [k for k in keys if float(k) <= 99.0]
    return "99" if "99" in keys else (below[-1] if below else keys[-1])


def _host_heat(
    fig: SubFigure, ax: Axes, time: _Time, host_rows: list[dict[str, Any]], *, key: str, d: str
) -> None:
    cols = _Columns(time, host_rows)
    edges = cols.edges
    grid = np.stack([cols.row(s, s["p"][key]) for s in host_rows])
    mesh = ax.pcolormesh(
        edges, np.arange(len(host_rows) + 1) - 0.5, np.ma.masked_invalid(grid),
        cmap=CMAP, norm=_log_norm(grid),
    )  # fmt: skip
    fontsize = 7 if len(host_rows) <= 24 else 5
    ax.set_yticks(
        np.arange(len(host_rows)), [s["host"] or "" for s in host_rows], fontsize=fontsize
    )
    ax.invert_yaxis()
    _colourbar(fig, mesh, ax, f"p{key} (ms)", "cbar-hosts")
    ax.set_title(f"p{key} {d} latency per host (ms, log colour)", fontsize=9)
    ax.set_label("hosts")


def _latency_heat(fig: SubFigure, ax: Axes, time: _Time, *, s: dict[str, Any], d: str) -> None:
    """I/Os per quantum per half-octave latency band (:mod:`fiomon.heat`), log colour."""
    heat: list[dict[str, Any] | None] = s["heat"]
    got = [h for h in heat if h]
    k0 = min(h["k0"] for h in got)
    k1 = max(h["k0"] + len(h["counts"]) for h in got)
    cols = _Columns(time, [s])
    a, b = cols.cover(s)
    gaps = set(time.gaps_before(s).tolist())
    grid = np.full((k1 - k0, cols.ends.size), np.nan)
    carry: int | None = None  # a down-sampled group's counts sit on its second point
    for i, h in enumerate(heat):
        first = int(a[i]) if carry is None else carry
        if not h:
            carry = first if i + 1 < len(heat) and i + 1 not in gaps else None
            continue
        carry = None
        width = int(b[i]) - first
        if width <= 0:
            continue
        counts = np.asarray(h["counts"], np.float64) / width  # per quantum (column)
        counts[counts <= 0] = np.nan
        grid[h["k0"] - k0 : h["k0"] - k0 + counts.size, first : int(b[i])] = counts[:, None]
    yedges = np.asarray([bucket_edge_ns(k) for k in range(k0, k1 + 1)]) / 1e6
    mesh = ax.pcolormesh(
        cols.edges, yedges, np.ma.masked_invalid(grid), cmap=CMAP, norm=_log_norm(grid)
    )
    _ms_axis(ax)
    ax.set_ylabel(f"{d} latency (ms)")
    _colourbar(fig, mesh, ax, "I/Os per quantum", "cbar-heat", ms=False)
    ax.set_title(
        f"{d} latency distribution: I/Os per quantum per half-octave band (log colour)",
        fontsize=9,
    )
    ax.set_label("heat")


def _surface(
    fig: SubFigure, ax: Axes, doc: dict[str, Any], time: _Time, *, s: dict[str, Any], d: str
) -> None:
    keys: list[str] = doc.get("surface_percentiles") or []
    values = s.get("surface")
    if not keys or values is None:  # rows without histograms: the report's percentiles
        keys, values = doc["percentiles"], s["p"]
    keys = sorted(keys, key=float)
    ys = np.asarray([nines(float(k)) for k in keys])
    mids = (ys[1:] + ys[:-1]) / 2 if ys.size > 1 else np.empty(0)
    first = ys[0] - (mids[0] - ys[0] if mids.size else 0.25)
    last = ys[-1] + (ys[-1] - mids[-1] if mids.size else 0.25)
    yedges = np.r_[first, mids, last]
    cols = _Columns(time, [s])
    edges = cols.edges
    grid = np.stack([cols.row(s, values[k]) for k in keys])
    mesh = ax.pcolormesh(edges, yedges, np.ma.masked_invalid(grid), cmap=CMAP, norm=_log_norm(grid))
    ticks = [q for q in _NINES_TICKS if first <= nines(q) <= last]
    ax.set_yticks([nines(q) for q in ticks], [f"p{q:g}" for q in ticks], fontsize=7)
    ax.set_ylabel("percentile (nines)")
    _colourbar(fig, mesh, ax, f"{d} latency (ms)", "cbar-surface")
    ax.set_title(
        f"{d} latency by percentile over time: {len(keys)} percentiles, p{keys[0]} .. "
        f"p{keys[-1]} (ms, log colour)",
        fontsize=9,
    )
    ax.set_label("surface")


def _host_panels(
    sub: SubFigure,
    doc: dict[str, Any],
    time: _Time,
    host_rows: list[dict[str, Any]],
    *,
    d: str,
    share: Axes,
) -> list[Axes]:
    """Per-host small multiples: percentile lines over IOPS, shared axes (time: ``share``'s)."""
    n = len(host_rows)
    ncols = min(4, n) if n <= 16 else math.ceil(math.sqrt(n))
    nrows = math.ceil(n / ncols)
    axes = sub.subplots(
        2 * nrows, ncols, sharex=True, squeeze=False,
        gridspec_kw={"height_ratios": [3, 1] * nrows},
    )  # fmt: skip
    lat0, iops0 = axes[0, 0], axes[1, 0]
    used: list[Axes] = []
    for i in range(nrows * ncols):
        r, c = divmod(i, ncols)
        lat, iops = axes[2 * r, c], axes[2 * r + 1, c]
        if i >= n:
            lat.set_axis_off()
            iops.set_axis_off()
            continue
        s = host_rows[i]
        if lat is not lat0:
            lat.sharey(lat0)
        if iops is not iops0:
            iops.sharey(iops0)
        at = time.gaps_before(s)
        x0 = time.x(s["end"])
        for k in doc["percentiles"]:
            x, (y,) = _broken(x0, [_arr(s["p"][k], 1e6)], at)
            lat.plot(x, y, lw=0.9, color=percentile_colour(float(k)), label=f"p{k}")
        for line in _sla_lines(doc):
            if line["direction"] in (None, d):
                lat.axhline(line["ns"] / 1e6, color=SLA_COLOUR, lw=0.8, ls="--")
        x, (y,) = _broken(x0, [_arr(s.get("iops", [None] * len(x0)))], at)
        iops.plot(x, y, lw=0.8, color=_DIR_COLOURS[d])
        iops.set_ylim(bottom=0)
        lat.set_title(s["host"] or "", fontsize=8, pad=2)
        lat.set_label(f"host-lat-{s['host']}")
        iops.set_label(f"host-iops-{s['host']}")
        for a in (lat, iops):
            a.tick_params(labelsize=6)
            a.grid(True, alpha=0.3)
            time.style(a, maxticks=4)
        if c == 0:
            lat.set_ylabel("ms", fontsize=7)
            iops.set_ylabel("IOPS", fontsize=7)
        used += [lat, iops]
    _ms_axis(lat0)
    lat0.set_xlim(share.get_xlim())  # the main panels' time span (own ticks: narrower panels)
    handles, labels = lat0.get_legend_handles_labels()
    sub.legend(handles, labels, loc="outside upper right", fontsize=7, ncol=len(labels))
    sub.suptitle(
        f"per host: {d} percentiles (ms, log; dashed: SLA) and IOPS, shared axes", fontsize=10
    )
    for a in axes[-1, :]:
        a.set_xlabel(time.label(), fontsize=7)
    return used


def build_figure(doc: dict[str, Any]) -> Figure:
    """The figure of ``doc`` (Agg canvas, :data:`DPI`)."""
    require_matplotlib()
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")  # no display: files only
    from matplotlib.figure import Figure  # noqa: PLC0415

    time = _Time(doc)
    cluster = {s["direction"]: s for s in doc["series"] if s["scope"] == "cluster"}
    dirs = [d for d in _DIRS if d in cluster]
    pick = "read" if "read" in dirs else (dirs[0] if dirs else "all")
    host_rows = sorted(
        (s for s in doc["series"] if s["scope"] == "host" and s["direction"] == pick),
        key=lambda s: s["host"] or "",
    )
    heights = [2.5] * len(dirs) + [1.9]
    has_heat = pick in cluster and any(cluster[pick].get("heat") or [])
    if has_heat:
        heights.append(2.6)
    if host_rows:
        heights.append(max(1.6, 0.16 * len(host_rows) + 0.6))
    if pick in cluster:
        heights.append(2.8)
    multiples = len(host_rows) >= 2
    n = len(host_rows)
    ncols = (min(4, n) if n <= 16 else math.ceil(math.sqrt(n))) if multiples else 1
    low = math.ceil(n / ncols) * 2.1 + 0.6 if multiples else 0.0
    fig = Figure(figsize=(12, sum(heights) + low + 0.8), dpi=DPI, layout="constrained")
    bottom: SubFigure | None = None
    if multiples:
        gs = fig.add_gridspec(2, 1, height_ratios=[sum(heights) + 0.8, low])
        top, bottom = fig.add_subfigure(gs[0]), fig.add_subfigure(gs[1])
    else:
        top = fig.add_subfigure(fig.add_gridspec(1, 1)[0])
    axes = top.subplots(
        len(heights), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    ax_list: list[Axes] = list(axes[:, 0])
    for ax, d in zip(ax_list, dirs, strict=False):
        _latency_panel(ax, doc, time, d, cluster[d])
    _throughput_panel(ax_list[len(dirs)], time, dirs, cluster)
    i = len(dirs) + 1
    if has_heat:
        _latency_heat(top, ax_list[i], time, s=cluster[pick], d=pick)
        i += 1
    if host_rows:
        _host_heat(top, ax_list[i], time, host_rows, key=_pick_key(doc), d=pick)
        i += 1
    if pick in cluster:
        _surface(top, ax_list[i], doc, time, s=cluster[pick], d=pick)
    for ax in ax_list:
        time.style(ax)
    ax_list[-1].set_xlabel(time.label())
    if bottom is not None:
        _host_panels(bottom, doc, time, host_rows, d=pick, share=ax_list[0])
    fig.suptitle(_title(doc, time), fontsize=11)
    return fig


def _title(doc: dict[str, Any], time: _Time) -> str:
    parts = [time.span()]
    hosts: list[str] = doc.get("hosts") or []
    if hosts:
        parts.insert(0, _names(hosts, "hosts"))
    runs: list[str] = doc.get("runs") or []
    if runs:
        parts.append(_names(runs, "runs"))
    return f"fiomon: {doc['title']}\n" + " · ".join(parts)


def figure_bytes(doc: dict[str, Any], kind: str) -> bytes:
    """The figure of ``doc`` as PNG or SVG bytes."""
    fig = build_figure(doc)
    buf = io.BytesIO()
    fig.savefig(buf, format=kind, dpi=DPI)
    return buf.getvalue()
