"""Writers of a :class:`~fiomon.offline.compare.model.CompareResult`: table, jsonl and csv.

* ``jsonl``: one :meth:`Verdict.to_json` object per line, the windows first (in time
  order), then the whole-run lines (``window_start_s: null``).
* ``csv``: the same keys with the pairs flattened (``ratio_ci_low``, ``ratio_ci_high``,
  ``baseline_ci_low_ns``, ..., ``candidate_ci_high_ns``) and ``hosts`` as
  ``h1:0.82;h2:0.1`` (host: share). Numbers are written as the jsonl holds them, so a
  csv cell and its jsonl value parse to the same float; ``None`` is an empty cell;
  ``significant`` is ``true`` or ``false``.
* ``table``: for a person. A header says what was compared (per run: spec, files, I/Os,
  hosts, start, alignment; the window, the level, the method), then the whole-run block,
  then the significant windows worst first (regressions by ratio descending, then
  improvements by ratio ascending; regressions name the candidate hosts that carry them),
  or with ``all_windows`` every window in time order. Latencies take the units of
  ``fiomon report``'s table (``850ns``, ``63.6us``, ``1.07ms``); ``?`` is an interval side
  the data cannot bound. A footer says how many verdicts chance alone would flag.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

from fiomon.histogram import pct_key
from fiomon.offline.compare.model import CompareResult, Interval, RunInfo, Verdict
from fiomon.offline.output import scaled

CSV_COLUMNS = (
    "window_start_s",
    "window_end_s",
    "direction",
    "percentile",
    "baseline_ns",
    "candidate_ns",
    "ratio",
    "ratio_ci_low",
    "ratio_ci_high",
    "significant",
    "scope",
    "host",
    "baseline_ci_low_ns",
    "baseline_ci_high_ns",
    "candidate_ci_low_ns",
    "candidate_ci_high_ns",
    "baseline_ios",
    "candidate_ios",
    "method",
    "hosts",
    "partial",
)
TOP_HOSTS = 3  # hosts named per regression in the table
_PAIRS = ("ratio_ci", "baseline_ci_ns", "candidate_ci_ns")


def ordered(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """Windows in time order (their scope/direction/percentile order kept), then whole-run."""
    return sorted(verdicts, key=lambda v: (v.whole_run, v.window_start_s or 0.0))


def write_jsonl(result: CompareResult, out: TextIO) -> None:
    """One JSON object per verdict (:meth:`Verdict.to_json`), windows first."""
    for v in ordered(result.verdicts):
        out.write(json.dumps(v.to_json(), separators=(",", ":")) + "\n")


def csv_row(obj: dict[str, Any]) -> dict[str, str]:
    """A verdict's jsonl object as the csv's cells (:data:`CSV_COLUMNS`)."""
    flat: dict[str, Any] = {k: v for k, v in obj.items() if k not in _PAIRS}
    for key in _PAIRS:
        low, high = obj[key]
        stem, unit = (key[:-3], "_ns") if key.endswith("_ns") else (key, "")
        flat[f"{stem}_low{unit}"] = low
        flat[f"{stem}_high{unit}"] = high
    flat["hosts"] = ";".join(f"{h['host']}:{h['share']}" for h in obj["hosts"])
    return {k: _cell(flat[k]) for k in CSV_COLUMNS}


def _cell(x: object) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return "true" if x else "false"
    return str(x)


def write_csv(result: CompareResult, out: TextIO) -> None:
    """A header and one line per verdict, in the jsonl's order."""
    w = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    for v in ordered(result.verdicts):
        w.writerow(csv_row(v.to_json()))


# -- table ------------------------------------------------------------------------------------


def write_table(result: CompareResult, out: TextIO, *, all_windows: bool = False) -> None:
    """What was compared, the whole-run lines, the significant windows (all: every window)."""
    level = f"{result.level * 100:g} %"
    verdicts = ordered(result.verdicts)
    windows = [v for v in verdicts if not v.whole_run]
    whole = [v for v in verdicts if v.whole_run]
    show_host = any(v.scope == "host" for v in verdicts)
    for line in _header(result, level, windows, whole):
        out.write(_comment(line))
    out.write("\n")
    # Hosts carrying a regression say something only when the candidate has several.
    table = _Table(level, show_host=show_host, attribute=len(result.candidate.hosts) > 1)
    out.write(f"whole run ({_span(windows)}):\n")
    if whole:
        out.write(table.render(whole, window=False))
    else:
        out.write("  (none: the runs have no window in common)\n")
    out.write("\n")
    worse = sorted(
        (v for v in windows if v.significant and _ratio(v) > 1), key=lambda v: -_ratio(v)
    )
    better = sorted((v for v in windows if v.significant and _ratio(v) < 1), key=_ratio)
    flagged = len(worse) + len(better)
    if all_windows:
        out.write(f"every window ({len(windows)} verdicts, {flagged} significant):\n")
        out.write(table.render(windows, window=True) if windows else "  (none)\n")
    elif flagged:
        out.write(
            f"significant windows ({flagged} of {len(windows)} verdicts), worst first "
            "(--all: every window):\n"
        )
        out.write(table.render([*worse, *better], window=True))
    else:
        out.write(f"significant windows: none of {len(windows)} verdicts (--all: every window)\n")
    out.write("\n")
    for line in _footer(result, windows, table):
        out.write(_comment(line))


def _comment(line: str) -> str:
    """``# line``, wrapped at 100 columns (continuations indented)."""
    return "\n".join(textwrap.wrap(line, 100, initial_indent="# ", subsequent_indent="#   ")) + "\n"


def _ratio(v: Verdict) -> float:
    return 1.0 if v.ratio is None else v.ratio


def _header(
    result: CompareResult, level: str, windows: Sequence[Verdict], whole: Sequence[Verdict]
) -> list[str]:
    opts = result.options
    lines = [x for r in (result.baseline, result.candidate) for x in _run_lines(r)]
    window_s = opts.window_ms / 1000
    lines.append(
        f"windows of {window_s:g} s of aligned time (0 = each run's alignment point); "
        f"ratio = candidate / baseline; intervals at {level}"
    )
    methods = {v.method for v in windows} | {v.method for v in whole}
    how = [
        "windows: MOVER on the log scale from each run's order-statistic interval "
        "(I/Os within a window taken as independent)"
    ]
    if "mover+bootstrap" in methods:
        how.append(
            "whole run: the hull of MOVER on the merged histograms and a paired block "
            f"bootstrap over windows ({opts.resamples} resamples)"
        )
    elif whole:
        how.append("whole run: MOVER on the merged histograms (too few windows to bootstrap)")
    lines.append("method: " + "; ".join(how))
    lines.extend(f"note: {n}" for n in result.notes)
    return lines


def _run_lines(r: RunInfo) -> list[str]:
    """What the run was (spec, files, I/Os, hosts) and where its aligned 0 is."""
    hosts = f"{len(r.hosts)} host{'s' if len(r.hosts) != 1 else ''}"
    if r.hosts and len(r.hosts) <= TOP_HOSTS:
        hosts += f" ({', '.join(r.hosts)})"
    files = f"{len(r.files)} file{'s' if len(r.files) != 1 else ''}"
    offset_s = (r.origin_ms - r.start_ms) / 1000
    if r.relative:
        start = "relative stamps (no wall clock)"
        origin = f"{offset_s:+g} s after its start" if offset_s else "its start"
    else:
        start = f"start {_local(r.start_ms)}"
        origin = f"{_local(r.origin_ms)} ({offset_s:+g} s)" if offset_s else "its start"
    return [f"{r.name}: {r.spec}: {files}, {r.ios:,} I/Os, {hosts}", f"  {start}; 0 = {origin}"]


def _local(epoch_ms: int) -> str:
    """An epoch instant in the local time zone, as ``--align-at`` reads wall-clock times."""
    t = dt.datetime.fromtimestamp(epoch_ms / 1000, tz=dt.UTC).astimezone()
    frac = f".{t.microsecond // 1000:03d}" if t.microsecond // 1000 else ""
    return t.strftime("%Y-%m-%d %H:%M:%S") + frac + t.strftime(" %Z")


def _span(windows: Sequence[Verdict]) -> str:
    # The whole-run lines merge only the windows both runs have I/O in.
    both = [v for v in windows if v.baseline_ios and v.candidate_ios]
    starts = [v.window_start_s for v in both if v.window_start_s is not None]
    ends = [v.window_end_s for v in both if v.window_end_s is not None]
    if not starts or not ends:
        return "the windows both runs have"
    return f"the windows both runs have, within {min(starts):g} .. {max(ends):g} s"


def _footer(result: CompareResult, windows: Sequence[Verdict], table: _Table) -> list[str]:
    n = len(windows)
    chance = n * (1 - result.level)
    lines = [
        "verdict: worse / better = the ratio's interval excludes 1; '-' = no difference "
        "shown at this level",
        f"{n} window verdicts at {result.level * 100:g} %: about {chance:.3g} flagged by "
        "chance alone if nothing changed",
    ]
    if table.unbounded:
        lines.append(
            "'?' in an interval: too few I/Os to bound that side (e.g. p99.9 of fewer "
            "than a few thousand I/Os has no upper bound)"
        )
    if table.partial:
        lines.append(
            "(partial): a run's records cover less than 90 % of the window (fio starting or "
            "stopping): fewer I/Os, and the edge of a run"
        )
    if table.named_hosts:
        lines.append(
            "hosts: the candidate's hosts carrying a regression: their share of the I/Os "
            "above the baseline's value (their share of all the window's I/Os)"
        )
    return lines


class _Table:
    """Aligned verdict lines; remembers what the footer must explain."""

    def __init__(self, level: str, *, show_host: bool, attribute: bool = True) -> None:
        self.level = level
        self.show_host = show_host
        self.attribute = attribute
        self.unbounded = False
        self.named_hosts = False
        self.partial = False

    def render(self, verdicts: Sequence[Verdict], *, window: bool) -> str:
        heads = [
            *(["window (s)"] if window else []),
            *(["host"] if self.show_host else []),
            "dir",
            "pct",
            "baseline",
            "candidate",
            "ratio",
            f"{self.level} CI",
            "verdict",
            *(["hosts"] if window and self.attribute else []),
        ]
        rows = [heads] + [self._cells(v, window=window) for v in verdicts]
        widths = [max(len(r[i]) for r in rows) for i in range(len(heads))]
        numeric = {"baseline", "candidate", "ratio"}
        lines = []
        for r in rows:
            cells = [
                c.rjust(w) if h in numeric else c.ljust(w)
                for c, w, h in zip(r, widths, heads, strict=True)
            ]
            lines.append("  " + "  ".join(cells).rstrip())
        return "\n".join(lines) + "\n"

    def _cells(self, v: Verdict, *, window: bool) -> list[str]:
        verdict = "-"
        if v.significant:
            verdict = "worse" if _ratio(v) > 1 else "better"
        if v.partial:
            self.partial = True
            verdict += " (partial)"
        cells = [
            *([f"{v.window_start_s:g} .. {v.window_end_s:g}"] if window else []),
            *([v.host or "cluster"] if self.show_host else []),
            v.direction,
            f"p{pct_key(v.percentile)}",
            _lat(v.baseline_ns),
            _lat(v.candidate_ns),
            "-" if v.ratio is None else _times(v.ratio),
            self._interval(v.ratio_ci) if v.ratio is not None else "-",
            verdict,
        ]
        if window and self.attribute:
            cells.append(self._hosts(v))
        return cells

    def _interval(self, ci: Interval) -> str:
        low, high = ci
        if low is None or high is None:
            self.unbounded = True
        lo = "?" if low is None else _times(low)
        hi = "?" if high is None else _times(high)
        return f"[{lo}, {hi}]"

    def _hosts(self, v: Verdict) -> str:
        if not v.hosts:
            return ""
        self.named_hosts = True
        return ", ".join(
            f"{h.host} {h.share * 100:.0f}% ({h.io_share * 100:.0f}%)" for h in v.hosts[:TOP_HOSTS]
        )


def _times(x: float) -> str:
    """A ratio: two decimals where that keeps 2-3 significant digits (``1.31``, ``0.92``)."""
    return f"{x:.2f}" if 0.1 <= x < 100 else f"{x:.3g}"


def _lat(ns: float | None) -> str:
    return "-" if ns is None else scaled(ns)
