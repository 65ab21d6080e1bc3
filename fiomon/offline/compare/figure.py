"""``fiomon compare -o FILE.png|.svg``: the page's three panels as a static figure (matplotlib).

Needs the ``plot`` extra (:func:`fiomon.offline.plotstatic.require_matplotlib`). Draws the
document of :func:`fiomon.offline.compare.page.document` for the cluster, one group of
three panels per direction with I/O, on one aligned time axis (s):

* both runs' percentiles on a log latency axis (ms) with their confidence bands: one
  colour per percentile (:mod:`fiomon.palette`), the candidate solid, the baseline dashed
  and its band lighter;
* the ratio candidate/baseline of every percentile with its interval on a log axis, a line
  at 1, and the windows where a percentile's ratio is significant shaded (red: the
  candidate is slower, green: faster) with that percentile's segment drawn thick;
* both runs' IOPS.

Every window is a step over its own span; windows a run lacks are gaps. An interval side
that is unbounded (``null``) is drawn open: its band runs past the axis' edge and is
clipped there, never to 0 or to an invented number.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from fiomon.offline.plotstatic import DPI, fmt_ms, log_ticks, require_matplotlib
from fiomon.palette import percentile_colour

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Floats = npt.NDArray[np.float64]
_HEIGHTS = (2.6, 2.0, 1.3)
_OPEN = 1e3  # an open side is drawn this factor beyond the axis' edge (then clipped)


def _steps(
    start: Sequence[float], end: Sequence[float], values: Sequence[float | None], scale: float
) -> tuple[Floats, Floats]:
    """Step points: each window flat over [start, end]; NaN for unknown values.

    A NaN point goes between windows that are not contiguous (the line breaks there).
    """
    xs: list[float] = []
    ys: list[float] = []
    for i, (s, e, v) in enumerate(zip(start, end, values, strict=True)):
        if i > 0 and s > end[i - 1]:
            xs.append((end[i - 1] + s) / 2)
            ys.append(np.nan)
        y = np.nan if v is None or v <= 0 else v / scale
        xs += [s, e]
        ys += [y, y]
    return np.asarray(xs, np.float64), np.asarray(ys, np.float64)


def _extent(arrays: Sequence[Floats], extra: Sequence[float] = ()) -> tuple[float, float]:
    """The finite positive range of ``arrays`` (and ``extra``), padded for a log axis."""
    vals = np.concatenate([a[np.isfinite(a) & (a > 0)] for a in arrays] + [np.asarray(extra)])
    if vals.size == 0:
        return 0.1, 10.0
    lo, hi = float(vals.min()), float(vals.max())
    pad = max(1.08, (hi / lo) ** 0.08)
    return lo / pad, hi * pad


def _band(
    ax: Axes,
    s: dict[str, Any],
    sides: tuple[Sequence[float | None], Sequence[float | None]],
    values: Sequence[float | None],
    *,
    scale: float,
    limits: tuple[float, float],
    **style: Any,
) -> None:
    """One band over each window with a value; an unbounded side runs past ``limits``."""
    below, above = limits[0] / _OPEN, limits[1] * _OPEN  # axis units
    lo, hi = sides
    low = [
        None if v is None else (below if x is None else x / scale)
        for x, v in zip(lo, values, strict=True)
    ]
    high = [
        None if v is None else (above if x is None else x / scale)
        for x, v in zip(hi, values, strict=True)
    ]
    x, y0 = _steps(s["start"], s["end"], low, 1.0)
    _, y1 = _steps(s["start"], s["end"], high, 1.0)
    ax.fill_between(x, y0, y1, where=np.isfinite(y0) & np.isfinite(y1), lw=0, **style)


def _log_axis(ax: Axes, limits: tuple[float, float], fmt: Any) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter  # noqa: PLC0415

    ax.set_yscale("log")
    ax.set_ylim(*limits)
    ax.yaxis.set_major_locator(FixedLocator(log_ticks(*limits)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _latency(ax: Axes, doc: dict[str, Any], runs: dict[str, dict[str, Any]], d: str) -> None:
    keys: list[str] = doc["percentiles"]
    arrays = []
    for s in runs.values():
        for k in keys:
            for field in ("p", "lo", "hi"):
                arrays.append(_steps(s["start"], s["end"], s[field][k], 1e6)[1])
    limits = _extent(arrays)
    for run, s in runs.items():
        base = run == "baseline"
        for k in keys:
            colour = percentile_colour(float(k))
            x, y = _steps(s["start"], s["end"], s["p"][k], 1e6)
            ax.plot(
                x, y, color=colour, lw=1.2 if base else 1.6, ls="--" if base else "-",
                alpha=0.8 if base else 1.0, label=f"p{k} {run}", gid=f"{run}-p{k}",
            )  # fmt: skip
            _band(
                ax, s, (s["lo"][k], s["hi"][k]), s["p"][k], scale=1e6, limits=limits,
                color=colour, alpha=0.08 if base else 0.2,
                label=f"{run} bands" if k == keys[0] else None,
            )  # fmt: skip
    _log_axis(ax, limits, fmt_ms)
    ax.set_ylabel(f"{d} latency (ms)")
    level = round(doc["level"] * 100)
    ax.set_title(
        f"{d} latency percentiles: candidate solid, baseline dashed; bands: {level} % "
        "confidence intervals (open where unbounded)",
        fontsize=9,
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, borderaxespad=0)
    ax.set_label(f"lat-{d}")


def _ratio(ax: Axes, doc: dict[str, Any], ratios: dict[str, dict[str, Any]], d: str) -> None:
    arrays = []
    for r in ratios.values():
        for field in ("ratio", "lo", "hi"):
            arrays.append(_steps(r["start"], r["end"], r[field], 1.0)[1])
    limits = _extent(arrays, (1.0,))
    shaded: set[tuple[float, bool]] = set()
    for k, r in ratios.items():
        colour = percentile_colour(float(k))
        x, y = _steps(r["start"], r["end"], r["ratio"], 1.0)
        ax.plot(x, y, color=colour, lw=1.4, label=f"p{k}", gid=f"ratio-p{k}")
        _band(
            ax, r, (r["lo"], r["hi"]), r["ratio"], scale=1.0, limits=limits,
            color=colour, alpha=0.18,
        )  # fmt: skip
        for i, sig in enumerate(r["significant"]):
            v = r["ratio"][i]
            if not sig or v is None:
                continue
            worse = v > 1
            if (r["start"][i], worse) not in shaded:
                shaded.add((r["start"][i], worse))
                shade = doc["colours"]["regression" if worse else "improvement"]
                ax.axvspan(
                    r["start"][i], r["end"][i], color=shade, alpha=0.13, lw=0,
                    gid="slower" if worse else "faster",
                )  # fmt: skip
            ax.plot([r["start"][i], r["end"][i]], [v, v], color=colour, lw=3.5)
    ax.axhline(1.0, color="#000000", lw=0.9)
    _log_axis(ax, limits, lambda v: f"{v:.3g}")
    ax.set_ylabel("candidate / baseline")
    level = round(doc["level"] * 100)
    ax.set_title(
        f"{d} ratio with its {level} % interval; shaded: significant "
        "(red: candidate slower, green: faster)",
        fontsize=9,
    )
    if ratios:
        ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, borderaxespad=0)
    ax.set_label(f"ratio-{d}")


def _iops(ax: Axes, doc: dict[str, Any], runs: dict[str, dict[str, Any]], d: str) -> None:
    top = 0.0
    for run, s in runs.items():
        base = run == "baseline"
        x, y = _steps(s["start"], s["end"], s["iops"], 1.0)
        ax.plot(
            x, y, color=doc["colours"]["baseline_iops" if base else "candidate_iops"],
            ls="--" if base else "-", lw=1.2, label=f"IOPS {run}",
        )  # fmt: skip
        top = max(top, float(np.nanmax(y, initial=0.0)))
    ax.set_ylim(0, top * 1.12 if top > 0 else 1.0)
    ax.set_ylabel("IOPS")
    ax.set_title(f"{d} IOPS: candidate solid, baseline dashed", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7, borderaxespad=0)
    ax.set_label(f"iops-{d}")


def _title(doc: dict[str, Any]) -> str:
    lines = [f"fiomon compare: {doc['title']}"]
    for r in doc["runs"]:
        lines.append(
            f"{r['name']}: {r['spec']} ({r['files']} files, {r['ios']:,} I/Os, "
            f"{len(r['hosts'])} hosts; {r['start']}; {r['alignment']})"
        )
    lines.append(
        f"window {doc['window_s']:g} s · level {doc['level'] * 100:g} % · method: {doc['method']}"
    )
    return "\n".join(lines)


def build_figure(doc: dict[str, Any]) -> Figure:
    """The figure of the page's document ``doc`` (Agg canvas, :data:`DPI`)."""
    require_matplotlib()
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")  # no display: files only
    from matplotlib.figure import Figure  # noqa: PLC0415

    cluster = [s for s in doc["series"] if s["scope"] == "cluster"]
    dirs = [
        d for d in doc["directions"] if any(s["direction"] == d and any(s["ios"]) for s in cluster)
    ]
    fig = Figure(figsize=(12, sum(_HEIGHTS) * len(dirs) + 1.4), dpi=DPI, layout="constrained")
    axes = fig.subplots(
        3 * len(dirs), 1, sharex=True, squeeze=False,
        gridspec_kw={"height_ratios": list(_HEIGHTS) * len(dirs)},
    )[:, 0]  # fmt: skip
    for i, d in enumerate(dirs):
        runs = {s["run"]: s for s in cluster if s["direction"] == d}
        ratios = {
            r["percentile"]: r
            for r in doc["ratios"]
            if r["scope"] == "cluster" and r["direction"] == d
        }
        _latency(axes[3 * i], doc, runs, d)
        _ratio(axes[3 * i + 1], doc, ratios, d)
        _iops(axes[3 * i + 2], doc, runs, d)
    for ax in axes:
        ax.grid(True, which="major", alpha=0.3)
    axes[-1].set_xlabel("aligned time (s)")
    fig.suptitle(_title(doc), fontsize=9)
    return fig


def figure_bytes(doc: dict[str, Any], kind: str) -> bytes:
    """The figure of ``doc`` as PNG or SVG bytes."""
    fig = build_figure(doc)
    buf = io.BytesIO()
    fig.savefig(buf, format=kind, dpi=DPI)
    return buf.getvalue()
