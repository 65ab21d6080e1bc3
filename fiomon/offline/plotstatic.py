"""``fiomon plot -o FILE.png|.svg``: the main panels as a static figure (matplotlib).

matplotlib is an optional extra (``pip install 'fiomon[plot]'``): the interactive page
needs nothing beyond fiomon itself. The figure draws the packed document of
:mod:`fiomon.offline.plotdata` (the same numbers as the page): percentile lines, each with its
confidence band (translucent, left out where a side is unbounded), and the mean per
direction on a log latency axis with the SLA lines and saturated points marked, IOPS and
throughput on the shared time axis, and the host x time heatmap of p99 (or the highest
percentile below it) when the document has host series.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from fiomon.errors import PlotError

_EXTRA = "pip install 'fiomon[plot]'"
_DIRS = ("read", "write", "trim", "mixed", "all")


def require_matplotlib() -> None:
    """Raise PlotError naming the extra when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError as exc:
        msg = f"PNG and SVG output needs matplotlib, the plot extra: {_EXTRA} (or write .html)"
        raise PlotError(msg) from exc


def _ms(values: list[float | None]) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Latencies in ns (None: unknown) as ms, NaN where unknown."""
    return np.asarray([np.nan if v is None else v for v in values], np.float64) / 1e6


def figure_bytes(doc: dict[str, Any], kind: str) -> bytes:
    """The figure of ``doc`` as PNG or SVG bytes."""
    require_matplotlib()
    import matplotlib as mpl  # noqa: PLC0415

    mpl.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt  # noqa: PLC0415

    t0 = doc["t0"]
    scale = 1000.0
    cluster = {s["direction"]: s for s in doc["series"] if s["scope"] == "cluster"}
    dirs = [d for d in _DIRS if d in cluster]
    hosts = [s for s in doc["series"] if s["scope"] == "host"]
    pick = "read" if "read" in dirs else (dirs[0] if dirs else "all")
    host_rows = [s for s in hosts if s["direction"] == pick]
    panels = len(dirs) + 1 + (1 if host_rows else 0)
    fig, axes = plt.subplots(
        panels, 1, figsize=(11, 2.6 * panels), sharex=True, squeeze=False, layout="constrained"
    )
    ax_list = list(axes[:, 0])

    def xs(s: dict[str, Any]) -> np.ndarray[Any, np.dtype[np.float64]]:
        return np.asarray(s["end"], np.float64) / scale

    for ax, d in zip(ax_list, dirs, strict=False):
        s = cluster[d]
        x = xs(s)
        for k in doc["percentiles"]:
            y = _ms(s["p"][k])
            (line,) = ax.plot(x, y, lw=1.2, label=f"p{k}")
            if "lo" in s and "hi" in s:
                # NaN (an unbounded side) leaves a gap rather than an invented bound.
                lo, hi = _ms(s["lo"][k]), _ms(s["hi"][k])
                label = "confidence bands" if k == doc["percentiles"][0] else None
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.18, lw=0, label=label)
            sat = s["sat"].get(k, [])
            if sat:
                ax.plot(x[sat], y[sat], "v", color="#b00020", ms=6)
        mean = np.asarray([np.nan if v is None else v for v in s["mean_ns"]], np.float64) / 1e6
        ax.plot(x, mean, "--", lw=1, color="black", label="mean")
        for ns in doc["sla_ns"]:
            ax.axhline(ns / 1e6, color="#b00020", lw=1)
        ax.set_yscale("log")
        ax.set_ylabel(f"{d} latency (ms)")
        ax.legend(loc="upper left", fontsize=7, ncol=len(doc["percentiles"]) + 1)
        ax.grid(True, which="both", alpha=0.3)
    ax = ax_list[len(dirs)]
    ax2 = ax.twinx()
    for d in dirs:
        s = cluster[d]
        x = xs(s)
        ax.plot(x, [np.nan if v is None else v for v in s["iops"]], lw=1, label=f"IOPS {d}")
        mbs = [np.nan if v is None else v / 1e6 for v in s["bytes_per_second"]]
        ax2.plot(x, mbs, ":", lw=1, label=f"MB/s {d}")
    ax.set_ylabel("IOPS")
    ax2.set_ylabel("MB/s")
    ax.legend(loc="upper left", fontsize=7)
    if host_rows:
        ax = ax_list[-1]
        keys = doc["percentiles"]
        key = "99" if "99" in keys else keys[-1]
        cols = sorted({e for s in host_rows for e in s["end"]})
        index = {e: i for i, e in enumerate(cols)}
        grid = np.full((len(host_rows), len(cols)), np.nan)
        for j, s in enumerate(sorted(host_rows, key=lambda s: s["host"] or "")):
            for e, v in zip(s["end"], s["p"][key], strict=True):
                if v is not None:
                    grid[j, index[e]] = v / 1e6
        x = np.asarray(cols, np.float64) / scale
        mesh = ax.pcolormesh(
            x, np.arange(len(host_rows)), np.log10(grid), shading="nearest", cmap="viridis"
        )
        ax.set_yticks(np.arange(len(host_rows)), [s["host"] or "" for s in host_rows], fontsize=6)
        fig.colorbar(mesh, ax=ax, label=f"log10 p{key} (ms)")
        ax.set_title(f"p{key} per host ({pick})", fontsize=9)
    ax_list[-1].set_xlabel(
        "s since the earliest record" if doc["relative"] else f"s since {t0 / 1000:.0f} (epoch s)"
    )
    fig.suptitle(f"fiomon: {doc['title']}", fontsize=11)
    buf = io.BytesIO()
    fig.savefig(buf, format=kind, dpi=110)
    plt.close(fig)
    return buf.getvalue()
