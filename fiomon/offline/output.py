"""Writers for closed quanta: ``table`` (for a person), ``csv``, ``jsonl``, ``fiologparser``.

Every writer takes rows as they close (the report streams them) and never holds the whole
run in memory.

* ``jsonl``: the closed-quantum JSON line (README.md), one object per row.
* ``csv``: the same fields flattened for spreadsheets and pandas: times as ISO-8601 UTC
  with milliseconds (``start``, ``end``: ``2026-11-22T11:34:51.833Z``; ``start_s``,
  ``end_s``, seconds since the job started, for logs without ``log_unix_epoch``), latencies
  in ms with ns resolution (``min_ms``, ``mean_ms``, ``p99_ms``, ..., ``max_ms``).
  Saturated percentiles hold their lower bound and are listed in the ``saturated`` column.
  ``runs`` holds the row's run labels, ``;``-separated (empty: none).
  The confidence bounds come last (``p99_low_ms``, ``p99_high_ms``, ...; empty where the
  data bound no side), so the columns before them keep their places. ``jsonl`` keeps the
  exact integers (epoch ms, ns). A run of another latency than ``clat`` (``--latency``)
  prefixes its latency columns with the kind (``lat_min_ms``, ``lat_p99_ms``, ...).
* ``fiologparser``: the layout of fio's ``fiologparser_hist.py`` so scripts keep working:
  ``end-time, [dir,] samples, min, avg, median, <p>%..., max`` with times in ms, latencies
  in the log's own unit (ns; µs for fio 2 logs), ``--percentiles`` other than 50 as the
  ``<p>%`` columns, and ``samples`` the (overlap-weighted) I/O count of the quantum.
* ``table``: aligned columns; each latency carries its own unit, chosen for its size with
  3 significant digits (``850ns``, ``63.6us``, ``1.07ms``, ``2.41s``, as ``fiomon summary``
  writes them), so a run whose p99 goes from µs to seconds stays readable;
  a saturated percentile is shown as ``>`` its lower bound. A ``# run: NAME`` line comes
  before the first row and whenever the rows' runs change. With ``ci_level``, each
  percentile is followed by its confidence interval ``[low, high]`` at that level (``?``:
  the data bound no side). With ``spans`` (``--target-error``), a ``span`` column gives each
  row's length, ``*`` marking one that did not reach the target. A run of another latency
  than ``clat`` heads its latency columns with the kind (``lat p99``) and names it above.
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Literal, Protocol, TextIO

from fiomon.closed import ClosedQuantum
from fiomon.histogram import pct_key
from fiomon.model import LatencyKind

Format = Literal["table", "csv", "jsonl", "fiologparser"]
FORMATS: tuple[Format, ...] = ("table", "csv", "jsonl", "fiologparser")
# fiologparser_hist.py's letters; its "m" is every direction together (our "all"), so
# fio's unified_rw_reporting "mixed" sections take "u" (for unified), a letter it never uses.
_FIOLOG_DIR = {"read": "r", "write": "w", "trim": "t", "all": "m", "mixed": "u"}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_LATENCY_NAMES = {
    "lat": "total latency (submission + completion), fio's lat",
    "slat": "submission latency, fio's slat",
    "clat": "completion latency, fio's clat",
}
_TABLE_UNITS = (("s", 1e9), ("ms", 1e6), ("us", 1e3))


class RowWriter(Protocol):
    """Consumes closed quanta in time order."""

    def write(self, rows: Sequence[ClosedQuantum]) -> None:
        """Write ``rows``."""

    def close(self) -> None:
        """Write any footer."""


class JsonlWriter:
    """Closed-quantum JSON lines."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, rows: Sequence[ClosedQuantum]) -> None:
        """Write one JSON object per row (:meth:`ClosedQuantum.to_json_line`)."""
        self.out.write("".join(r.to_json_line() for r in rows))

    def close(self) -> None:
        """Nothing to finish."""


def iso_ms(epoch_ms: int) -> str:
    """``2026-11-22T11:34:51.833Z``: an epoch time in ms as ISO-8601 UTC."""
    t = _EPOCH + dt.timedelta(milliseconds=epoch_ms)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def ms(ns: float | None) -> str:
    """A latency in ns as ms with ns resolution, no exponent (``0.063616``); None: empty."""
    if ns is None:
        return ""
    text = f"{ns / 1e6:.6f}".rstrip("0")
    return text[:-1] if text.endswith(".") else text


def scaled(ns: float) -> str:
    """A table cell: 3 significant digits in the largest unit the value reaches (``6.50us``).

    Units ``ns`` (whole), ``us``, ``ms``, ``s``; a value that rounds up to the next unit
    takes it (999.7 µs is ``1.00ms``).
    """
    for unit, scale in _TABLE_UNITS:
        value = float(f"{ns / scale:.3g}")
        if value >= 1:
            whole = len(str(int(value)))
            return f"{value:.{max(0, 3 - whole)}f}{unit}"
    return f"{ns:.0f}ns"


class CsvWriter:
    """Flat CSV with a header; ISO times, latencies in ms; ``target_met`` last with spans.

    Args:
        out: where the lines go.
        percentiles: the percentile columns, in order.
        spans: add the ``target_met`` column (``--target-error``).
        relative: times are ms since the job started (no ``log_unix_epoch``): the time
            columns are ``start_s``, ``end_s`` in seconds instead of ISO ``start``, ``end``.
        latency: the latency the rows hold; other than ``clat``, it prefixes the latency
            columns (``lat_p99_ms``).
    """

    def __init__(
        self,
        out: TextIO,
        percentiles: Sequence[float],
        *,
        spans: bool = False,
        relative: bool = False,
        latency: LatencyKind = "clat",
    ) -> None:
        self.keys = [pct_key(q) for q in percentiles]
        k = "" if latency == "clat" else f"{latency}_"
        self.spans = spans
        self.relative = relative
        self.w = csv.writer(out, lineterminator="\n")
        self.w.writerow(
            [
                "start_s" if relative else "start",
                "end_s" if relative else "end",
                "scope",
                "host",
                "direction",
                "samples",
                "iops",
                "bytes_per_second",
                f"{k}min_ms",
                f"{k}mean_ms",
                *[f"{k}p{q}_ms" for q in self.keys],
                f"{k}max_ms",
                "saturated",
                "streams",
                "late_records",
                "runs",
                *[f"{k}p{q}_{side}_ms" for q in self.keys for side in ("low", "high")],
                *(["target_met"] if spans else []),
            ]
        )

    def write(self, rows: Sequence[ClosedQuantum]) -> None:
        """Write one CSV line per row."""
        for r in rows:
            j = r.to_json()
            ci = j.get("percentiles_ci_ns", {})
            self.w.writerow(
                [
                    self._time(r.start_ms),
                    self._time(r.end_ms),
                    j["scope"],
                    j["host"] or "",
                    j["direction"],
                    j["samples"],
                    _blank(j["iops"]),
                    _blank(j["bytes_per_second"]),
                    ms(j["min_ns"]),
                    ms(j["mean_ns"]),
                    *[ms(j["percentiles_ns"][k]) for k in self.keys],
                    ms(j["max_ns"]),
                    ";".join(j["saturated"]),
                    j["streams"],
                    j["late_records"],
                    ";".join(r.runs),
                    *[ms(x) for k in self.keys for x in ci.get(k, (None, None))],
                    *([int(bool(r.target_met))] if self.spans else []),
                ]
            )

    def _time(self, t_ms: int) -> str:
        return f"{t_ms / 1000:.3f}" if self.relative else iso_ms(t_ms)

    def close(self) -> None:
        """Nothing to finish."""


def _blank(x: object) -> object:
    return "" if x is None else x


class FiologparserWriter:
    """The column layout of fio's fiologparser_hist.py."""

    def __init__(
        self, out: TextIO, percentiles: Sequence[float], *, with_dir: bool, unit_ns: int
    ) -> None:
        self.out = out
        self.keys = [pct_key(q) for q in percentiles if q != 50]
        self.with_dir = with_dir
        self.unit_ns = unit_ns
        cols = [
            "end-time",
            *(["dir"] if with_dir else []),
            "samples",
            "min",
            "avg",
            "median",
            *[f"{k}%" for k in self.keys],
            "max",
        ]
        out.write(", ".join(cols) + "\n")

    def write(self, rows: Sequence[ClosedQuantum]) -> None:
        """Write one line per row (cluster scope only, as fiologparser has no hosts)."""
        for r in rows:
            if r.scope != "cluster":
                continue
            s, u = r.stats, self.unit_ns
            pcts = s.percentiles_ns
            head = [f"{r.end_ms:d}"]
            if self.with_dir:
                head.append(_FIOLOG_DIR[r.direction])
            vals = [pcts.get("50", float("nan"))] + [pcts[k] for k in self.keys]
            fields = [
                *head,
                f"{round(s.samples):d}",
                f"{s.min_ns / u:.0f}",
                f"{s.mean_ns / u:.3f}",
                *[f"{v / u:.3f}" for v in vals],
                f"{s.max_ns / u:.0f}",
            ]
            self.out.write(", ".join(fields) + "\n")

    def close(self) -> None:
        """Nothing to finish."""


class TableWriter:
    """Aligned, human-readable columns."""

    def __init__(
        self,
        out: TextIO,
        percentiles: Sequence[float],
        *,
        relative: bool,
        show_host: bool,
        ci_level: float | None = None,
        spans: bool = False,
        latency: LatencyKind = "clat",
    ) -> None:
        self.out = out
        self.latency = latency
        self._kind = "" if latency == "clat" else f"{latency} "
        self.keys = [pct_key(q) for q in percentiles]
        self.relative = relative
        self.show_host = show_host
        self.ci_level = ci_level
        self.ci = ci_level is not None
        self.unbounded_seen = False
        self.spans = spans
        self.unmet_seen = False
        self.started = False
        self.saturated_seen = False
        self._last_date = ""
        self._last_runs: tuple[str, ...] = ()

    def _header(self) -> None:
        cols = [
            "end",
            *(["span"] if self.spans else []),
            *(["host"] if self.show_host else []),
            "dir",
            "samples",
            "IOPS",
            "MB/s",
            f"{self._kind}min",
            f"{self._kind}mean",
            *[c for k in self.keys for c in self._pct_heads(k)],
            f"{self._kind}max",
        ]
        ci = (
            f"; CI = {self.ci_level * 100:g}% confidence interval [low, high]"
            if self.ci_level is not None
            else ""
        )
        if self.latency != "clat":
            self.out.write(f"# {self.latency} = {_LATENCY_NAMES[self.latency]}\n")
        self.out.write(
            "# latencies with their units (ns, us, ms, s); end = end of each "
            f"{'span, span = its length' if self.spans else 'quantum'}"
            f"{' (s since job start)' if self.relative else ' (UTC)'}{ci}\n"
        )
        self.out.write(self._fmt(cols) + "\n")

    def _pct_heads(self, key: str) -> list[str]:
        head = f"{self._kind}p{key}"
        if self.ci_level is None:
            return [head]
        return [head, f"{head} CI"]

    def _fmt(self, cells: list[str]) -> str:
        head = [12, *([8] if self.spans else []), *([14] if self.show_host else []), 5]
        head += [9, 9, 8, 10, 10]
        pct = [10, 18] if self.ci else [10]
        widths = [*head, *pct * len(self.keys), 10]
        out = []
        for i, c in enumerate(cells):
            w = widths[i] if i < len(widths) else 10
            left = i < 2 + self.show_host + self.spans and not (self.spans and i == 1)
            out.append(c.ljust(w) if left else c.rjust(w))
        return " ".join(out)

    def write(self, rows: Sequence[ClosedQuantum]) -> None:
        """Write one line per row, with a header before the first."""
        for r in rows:
            if not self.started:
                self.started = True
                self._header()
            if r.runs != self._last_runs:
                self._last_runs = r.runs
                self.out.write(f"# run: {', '.join(r.runs) or '(none)'}\n")
            self.out.write(self._line(r) + "\n")

    def _line(self, r: ClosedQuantum) -> str:
        s = r.stats

        def lat(v: float, key: str | None = None) -> str:
            mark = ""
            if key is not None and key in s.saturated:
                mark = ">"
                self.saturated_seen = True
            return mark + scaled(v)

        if self.relative:
            when = f"{r.end_ms / 1000:.3f}"
        else:
            t = dt.datetime.fromtimestamp(r.end_ms / 1000, tz=dt.UTC)
            date = t.strftime("%Y-%m-%d")
            if date != self._last_date:
                self._last_date = date
                self.out.write(f"# {date}\n")
            when = t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d}"
        cells = [
            when,
            *([self._span(r)] if self.spans else []),
            *([r.host or "cluster"] if self.show_host else []),
            r.direction,
            f"{s.samples:.0f}",
            "-" if r.iops is None else f"{r.iops:.0f}",
            "-" if r.bytes_per_second is None else f"{r.bytes_per_second / 1e6:.1f}",
            lat(s.min_ns),
            lat(s.mean_ns),
            *[c for k in self.keys for c in self._pct_cells(r, k, lat)],
            lat(s.max_ns),
        ]
        return self._fmt(cells)

    def _span(self, r: ClosedQuantum) -> str:
        """The span's length in s, ``*`` when it reached the longest span before the target."""
        mark = "" if r.target_met is not False else "*"
        if mark:
            self.unmet_seen = True
        return f"{mark}{(r.end_ms - r.start_ms) / 1000:g}s"

    def _pct_cells(self, r: ClosedQuantum, key: str, lat: Callable[..., str]) -> list[str]:
        value = lat(r.stats.percentiles_ns[key], key)
        if not self.ci:
            return [value]
        lo, hi = (r.ci_ns or {}).get(key, (None, None))
        if lo is None or hi is None:
            self.unbounded_seen = True
        return [value, f"[{'?' if lo is None else lat(lo)}, {'?' if hi is None else lat(hi)}]"]

    def close(self) -> None:
        """Explain the saturation marker if it was used."""
        if not self.started:
            self.out.write("# no quanta: no I/O in the directions shown (--directions)\n")
        if self.unmet_seen:
            self.out.write(
                "# '*' marks a span that reached --max-span (or the end of the input) before "
                "its percentile reached --target-error\n"
            )
        if self.unbounded_seen:
            self.out.write(
                "# '?' in an interval: the quantum holds too few I/Os to bound that side "
                "(e.g. p99.9 of fewer than a few thousand I/Os has no upper bound)\n"
            )
        if self.saturated_seen:
            self.out.write(
                "# '>' marks a lower bound: that percentile is in fio's last bin "
                "(latencies at or above its cap, about 17 s, are clamped there)\n"
            )
