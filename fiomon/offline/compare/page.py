"""``fiomon compare -o FILE``: the comparison drawn as a page (HTML) or a figure (PNG/SVG).

The page (``fiomon/web/compare.html`` + ``compare.js``, ECharts inlined as ``fiomon plot``'s
page is: it needs no network) shows, per direction and per scope (the cluster, and each
host with ``--per-host``):

1. both runs' percentiles over aligned time on one log latency axis, each with its
   confidence band; a percentile has one colour (:mod:`fiomon.palette`), the candidate's
   line is solid, the baseline's dashed and its band lighter;
2. per percentile, the ratio candidate/baseline with its interval on a log axis, a line
   at 1, and the significant windows shaded (red: the candidate is slower, green: faster);
3. both runs' IOPS;

under a header with both runs (spec, files, I/Os, hosts, start, alignment), the window,
level and method, the whole-run verdicts as a table, and the notes. The PNG/SVG figure
(:mod:`.figure`, the ``plot`` extra) draws the same three panels for the cluster, one row
of them per direction with I/O.

A window is drawn over its whole span (a step, a band as wide as the window), never as an
interpolation between windows; windows one run lacks leave a gap. An interval side that
the data cannot bound (``None``) is drawn open: the band runs to the axis' edge, never to
0 or to a made-up number.

The embedded document (``{"version": 1, ...}``, see :func:`document`) holds the result's
numbers at the jsonl's precision (latencies 6 significant digits, ratios 5, IOPS 5),
``null`` for unknown values. Nothing is down-sampled: an hour of 10 s windows of 16 hosts
in three directions makes a page of about 9.5 MB (1.1 MB of it ECharts).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from fiomon.errors import PlotError
from fiomon.histogram import pct_key
from fiomon.offline.compare.model import (
    CompareResult,
    RunInfo,
    SeriesKey,
    Verdict,
    WindowPoint,
)
from fiomon.runtime import write_atomic
from fiomon.webpage import asset, colours

FigureKind = Literal["html", "png", "svg"]
KINDS: dict[str, FigureKind] = {".html": "html", ".htm": "html", ".png": "png", ".svg": "svg"}
DIRECTION_ORDER = ("read", "write", "trim", "mixed", "all")
REGRESSION_COLOUR = "#d62728"
"""Shading of windows where the candidate is significantly slower (ratio > 1)."""
IMPROVEMENT_COLOUR = "#2ca02c"
"""Shading of windows where it is significantly faster (ratio < 1)."""
LATENCY_DIGITS = 6
"""Significant digits of latencies in the page's data (as ``Verdict.to_json``)."""
RATIO_DIGITS = 5
"""Of ratios and their intervals (as ``Verdict.to_json``)."""
RATE_DIGITS = 5
"""Of IOPS."""
BASELINE_IOPS_COLOUR = "#666666"
CANDIDATE_IOPS_COLOUR = "#1b4f8a"


def figure_kind(path: Path) -> FigureKind:
    """The output kind from the file's extension.

    Raises:
        PlotError: not .html, .htm, .png or .svg.
    """
    kind = KINDS.get(path.suffix.lower())
    if kind is None:
        msg = f"-o {path}: the extension must be .html, .png or .svg"
        raise PlotError(msg)
    return kind


def write_figure(result: CompareResult, path: Path, kind: FigureKind, title: str) -> None:
    """Draw ``result`` into ``path`` (written whole to a temporary name, then renamed).

    Args:
        result: what :func:`fiomon.offline.compare.run.run_compare` returned.
        path: the output file; its extension must say ``kind``.
        kind: ``html`` (the interactive page), ``png`` or ``svg`` (the static figure).
        title: the page's or figure's title.

    Raises:
        PlotError: an extension that is not ``kind``'s, PNG/SVG without matplotlib (the
            ``plot`` extra), or nothing to draw (no run has a window with I/O).
    """
    if figure_kind(path) != kind:
        msg = f"-o {path}: a {kind} file must end in " + " or ".join(
            ext for ext, k in KINDS.items() if k == kind
        )
        raise PlotError(msg)
    if kind != "html":
        from fiomon.offline.plotstatic import require_matplotlib  # noqa: PLC0415

        require_matplotlib()  # before the work, not after it
    doc = document(result, title)
    if not any(any(n > 0 for n in s["ios"]) for s in doc["series"]):
        msg = "nothing to draw: neither run has a window with I/O in the directions shown"
        raise PlotError(msg)
    if kind == "html":
        body = compare_html(doc).encode()
    else:
        from fiomon.offline.compare.figure import figure_bytes  # noqa: PLC0415

        body = figure_bytes(doc, kind)
    write_atomic(path, body)


# -- the document ---------------------------------------------------------------------


def document(result: CompareResult, title: str) -> dict[str, Any]:
    """The page's data: ``result`` as JSON-ready columns (the figure draws it too).

    ``{"version": 1, "title", "level", "window_s", "quantum_s", "latency", "percentiles":
    [keys], "directions": [...], "hosts": [host-scope hosts], "runs": [{"name", "spec",
    "files", "ios", "hosts", "start", "alignment", "late_records"}], "method", "notes",
    "series": [{"run", "scope", "host", "direction", "start": [s], "end": [s], "ios",
    "iops", "p": {key: [ns]}, "lo": {key: [ns]}, "hi": {key: [ns]}}], "ratios": [{"scope",
    "host", "direction", "percentile", "start", "end", "ratio", "lo", "hi", "significant"}],
    "whole": [Verdict.to_json() of the whole-run lines]}``; ``null`` where a value is
    unknown or an interval side is unbounded.
    """
    opts = result.options
    keys = [pct_key(p) for p in opts.quanta.percentiles]
    for points in result.series.values():
        for w in points:
            keys += [k for k in w.values_ns if k not in keys]
    keys.sort(key=float)
    series = [
        _series_json(key, points, keys)
        for key, points in sorted(
            result.series.items(), key=lambda kv: _order(kv[0][1], kv[0][2], kv[0][3], kv[0][0])
        )
    ]
    windows = [v for v in result.verdicts if not v.whole_run]
    whole = [v for v in result.verdicts if v.whole_run]
    present = {s["direction"] for s in series} | {v.direction for v in result.verdicts}
    directions = [d for d in DIRECTION_ORDER if d in present]
    directions += sorted(present - set(directions))
    hosts = sorted(
        {s["host"] for s in series if s["scope"] == "host" and s["host"] is not None}
        | {v.host for v in result.verdicts if v.scope == "host" and v.host is not None}
    )
    return {
        "version": 1,
        "title": title,
        "level": result.level,
        "window_s": opts.window_ms / 1000.0,
        "quantum_s": opts.quanta.quantum_ms / 1000.0,
        "latency": opts.quanta.latency,
        "percentiles": keys,
        "directions": directions,
        "hosts": hosts,
        "runs": [_run_json(result.baseline), _run_json(result.candidate)],
        "method": method_text(result),
        "notes": list(result.notes),
        "series": series,
        "ratios": _ratios_json(windows),
        "whole": [
            v.to_json()
            for v in sorted(
                whole, key=lambda v: (*_order(v.scope, v.host, v.direction), v.percentile)
            )
        ],
        "colours": {
            **colours(keys),
            "regression": REGRESSION_COLOUR,
            "improvement": IMPROVEMENT_COLOUR,
            "baseline_iops": BASELINE_IOPS_COLOUR,
            "candidate_iops": CANDIDATE_IOPS_COLOUR,
        },
    }


def _order(scope: str, host: str | None, direction: str, run: str = "") -> tuple[Any, ...]:
    d = DIRECTION_ORDER.index(direction) if direction in DIRECTION_ORDER else len(DIRECTION_ORDER)
    return (scope != "cluster", host or "", d, direction, run != "baseline")


def _num(x: float | None, digits: int = LATENCY_DIGITS) -> float | None:
    """A JSON number with ``digits`` significant digits (the jsonl's); ``None`` stays.

    A non-finite value becomes ``None`` too: the page never gets a NaN.
    """
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def _series_json(key: SeriesKey, points: list[WindowPoint], keys: list[str]) -> dict[str, Any]:
    run, scope, host, direction = key
    ordered = sorted(points, key=lambda w: w.start_s)
    ci = {k: [w.ci_ns.get(k, (None, None)) for w in ordered] for k in keys}
    return {
        "run": run,
        "scope": scope,
        "host": host,
        "direction": direction,
        "start": [w.start_s for w in ordered],
        "end": [w.end_s for w in ordered],
        "ios": [w.ios for w in ordered],
        "iops": [_num(w.iops, RATE_DIGITS) for w in ordered],
        "p": {k: [_num(w.values_ns.get(k)) for w in ordered] for k in keys},
        "lo": {k: [_num(lo) for lo, _ in ci[k]] for k in keys},
        "hi": {k: [_num(hi) for _, hi in ci[k]] for k in keys},
    }


def _ratios_json(windows: Iterable[Verdict]) -> list[dict[str, Any]]:
    """Window verdicts as one column set per (scope, host, direction, percentile)."""
    groups: dict[tuple[str, str | None, str, str], list[Verdict]] = {}
    for v in windows:
        groups.setdefault((v.scope, v.host, v.direction, pct_key(v.percentile)), []).append(v)
    out = []
    for (scope, host, direction, key), vs in sorted(
        groups.items(), key=lambda kv: (*_order(kv[0][0], kv[0][1], kv[0][2]), float(kv[0][3]))
    ):
        vs.sort(key=lambda v: v.window_start_s or 0.0)
        out.append(
            {
                "scope": scope,
                "host": host,
                "direction": direction,
                "percentile": key,
                "start": [v.window_start_s for v in vs],
                "end": [v.window_end_s for v in vs],
                "ratio": [_num(v.ratio, RATIO_DIGITS) for v in vs],
                "lo": [_num(v.ratio_ci[0], RATIO_DIGITS) for v in vs],
                "hi": [_num(v.ratio_ci[1], RATIO_DIGITS) for v in vs],
                "significant": [v.significant for v in vs],
            }
        )
    return out


def _clock(ms: int) -> str:
    t = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return f"{t:%Y-%m-%d %H:%M:%S}.{t.microsecond // 1000:03d} UTC".replace(".000 UTC", " UTC")


def _run_json(run: RunInfo) -> dict[str, Any]:
    secs = (run.end_ms - run.start_ms) / 1000.0
    start = "relative stamps" if run.relative else _clock(run.start_ms)
    offset_s = (run.origin_ms - run.start_ms) / 1000.0
    if offset_s == 0:
        alignment = "0 = its start"
    else:
        alignment = f"0 = its start {offset_s:+g} s"
        if not run.relative:
            alignment += f" ({_clock(run.origin_ms)})"
    return {
        "name": run.name,
        "spec": run.spec,
        "files": len(run.files),
        "ios": run.ios,
        "hosts": list(run.hosts),
        "start": f"{start}, {secs:g} s",
        "alignment": alignment,
        "late_records": run.late_records,
    }


def method_text(result: CompareResult) -> str:
    """How the intervals were built, as the header says it."""
    window = sorted({v.method for v in result.verdicts if not v.whole_run})
    whole = sorted({v.method for v in result.verdicts if v.whole_run})
    parts = []
    if window:
        parts.append("windows: " + ", ".join(window))
    if whole:
        text = "whole run: " + ", ".join(whole)
        if any("bootstrap" in m for m in whole):
            text += f" ({result.options.resamples} resamples, seed {result.options.seed})"
        parts.append(text)
    return "; ".join(parts) or "-"


# -- the page -------------------------------------------------------------------------


def compare_html(doc: dict[str, Any]) -> str:
    r"""The whole page: ``compare.html`` with ECharts, ``compare.js`` and ``doc`` inlined.

    As :func:`fiomon.webpage.page_html`: the scripts hold no ``</script`` (checked) and the
    JSON has every ``</`` written ``<\/`` (the same string to JSON).
    """
    payload = json.dumps(doc, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    parts = {
        "{{TITLE}}": _escape(doc["title"]),
        "/*{{ECHARTS}}*/": asset("vendor/echarts.min.js"),
        "/*{{COMPARE_JS}}*/": asset("compare.js"),
        "{{DATA}}": payload,
    }
    # One pass: inserted text (the library, the data) is never searched for markers.
    pattern = re.compile("|".join(re.escape(k) for k in parts))
    return pattern.sub(lambda m: parts[m.group(0)], asset("compare.html"))


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
