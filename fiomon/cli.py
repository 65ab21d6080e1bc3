"""The ``fiomon`` command line: one entry point, subcommands (README.md has each one).

Each subcommand is an adder (its flags) and a handler (what it runs), both named in
:data:`COMMANDS`. Flags are checked where argparse reads them, so a handler gets valid
values: durations carry units and are converted by one function, levels and fractions by
another. ``report``, ``plot``, ``compare``, ``summary`` and ``fit`` read fio's outputs
through the same input flags (:func:`_add_input_options`).

Exit codes: 0 success; 1 the input held nothing usable or a strict parse failed; 2 a usage
or configuration error. A handler that finds a bad call raises :class:`UsageError`, which
:func:`main` prints and turns into 2, as argparse does for what it checks itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

from fiomon import __version__
from fiomon.align import parse_align
from fiomon.bins import MAX_GROUP_NR, MIN_GROUP_NR
from fiomon.confidence import DEFAULT_LEVEL
from fiomon.errors import (
    ConfigError,
    FiomonError,
    OverlapError,
    ParseError,
    PlotError,
    StateLockedError,
    UsageError,
)
from fiomon.fio.fiolog import interval_from_job_file
from fiomon.logs import LEVELS, LOG_FORMATS
from fiomon.model import DEFAULT_PERCENTILES, DIRECTIONS, LATENCY_KINDS
from fiomon.offline.iosources import choose_iologs
from fiomon.offline.kinds import LATENCY_HELP, LATENCY_NAMES, hist_logs, resolve_latency
from fiomon.offline.output import FORMATS, Format
from fiomon.offline.quanta import QuantaOptions
from fiomon.offline.quantafiles import Selection, all_quanta_files, first_row, is_quanta_file
from fiomon.offline.report import ReportOptions, ReportSummary, run_report
from fiomon.offline.sources import (
    HOST_FROM_HELP,
    SOURCE_HELP,
    SourceOptions,
    check_host_from,
    choose_sources,
)
from fiomon.tools import baselinecmd, comparecmd, completion, manpage
from fiomon.topics import Topics
from fiomon.units import parse_duration_ms

if TYPE_CHECKING:  # the services' modules load only when a service runs
    from fiomon.config import AgentConfig, AggregatorConfig, Overrides
    from fiomon.offline.summary import HistBins

    # argparse's own type (subscriptable only for type checkers)
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_OK = 0
EXIT_FAILED = 1  # the input held nothing usable, a strict parse failed, a service failed
EXIT_USAGE = 2  # a bad flag or configuration
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away

# Defaults of the flags, named where a handler or a help text needs them too.
QUANTUM = "1s"  # report, plot, fit --per-quantum
MAX_SPAN = "60s"  # --target-error's longest span
SUMMARY_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9, 99.99)
HIST_BINS = 12  # summary's text histogram
HIST_SCALE: Literal["log", "linear"] = "log"
MAX_TARGET_ERROR = 10.0  # a relative error of 1000 %: anything larger is a typo
MAX_POINTS = 2000  # plot: longest series before down-sampling
MIN_POINTS = 10
DEMO_HOSTS = 8
DEMO_JOBS = 4
DEMO_MIN_DURATION = "3s"  # the demo needs a few quanta to show anything
FIO_QUANTUM = "1s"

REPORT_EPILOG = """\
inputs:
  fio histogram logs (write_hist_log=PREFIX, log_hist_msec=N: PREFIX_clat_hist.N.log) and
  fio json+ status streams (fio --output-format=json+ --status-interval=1 --output=F),
  recognised by content. Use log_unix_epoch=1 so hosts share one clock. Also read: json+
  after fio's text (note: lines, --output-format=json+,normal), gzip/bzip2/xz files,
  UTF-8 with a BOM or UTF-16, and unified_rw_reporting's mixed sections (direction
  mixed). fio --client hist logs hold running sums, undone whether fio's .<server>
  suffix is on the name or pbench-fio filed them as clients/<server>/ (by content).
  Refused, naming the file and the fio option that fixes it: plain json (no bins; not
  read, with a note, when its jobs' hist logs are given beside it), lat/bw/iops logs,
  fio's log_store_compressed .fz files, text-only output.

  quanta files: an aggregator's or root's quanta.jsonl with its rotated quanta.jsonl.1,
  .2 ... (or report --format jsonl output), recognised by content. Their rows are
  printed again with revisions resolved: per key (end_ms, scope, host, direction) the
  highest revision, on equal revisions the later line (rotated files read oldest
  first). --directions, --per-host, --percentiles (among those the rows hold) and
  --format apply; what needs histograms (another --quantum, --align, --target-error,
  --confidence-level) does not. A torn last line is skipped with a warning; quanta
  files and fio output cannot be mixed in one run.

semantics:
  a hist-log line is stamped at the END of its interval; records that straddle a quantum
  are split in proportion to overlap; --align auto puts quantum boundaries where the
  records' own boundaries are, which is what keeps the split exact.

examples:
  fiomon report results/*/job_clat_hist.*.log
  fiomon report --quantum 10s --percentiles 50,99,99.99 --format csv *.log > p.csv
  fiomon report --format fiologparser --percentiles 90,95,99 h_clat_hist.1.log
  fiomon report --per-host --format csv /var/lib/fiomon-aggregator/quanta.jsonl*
"""

PLOT_EPILOG = """\
inputs and options: as fiomon report (fiomon report --help), quanta files included
(their rows drawn with revisions resolved: per key the highest revision; no latency
heatmap, as the rows hold no histograms).

examples:
  fiomon plot --per-host --sla 5ms results/*_clat_hist.*.log -o run.html
  fiomon plot --percentiles 50,99,99.9 --directions read results/*.log -o run.png
  fiomon plot --per-host /var/lib/fiomon-aggregator/quanta.jsonl* -o live-run.html
"""

# -- converters: each turns a flag's text into its value or names the flag in the error ----


def _duration(flag: str, *, minimum: str = "1ms") -> Callable[[str], int]:
    """A duration flag (``1s``, ``250ms``, ``2m``; a bare number is seconds) in ms."""
    least = parse_duration_ms(minimum, what=flag)

    def parse(text: str) -> int:
        try:
            ms = parse_duration_ms(text, what=flag)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if ms < least:
            msg = f"{flag}: must be at least {minimum}, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return ms

    return parse


def _ratio(flag: str, *, below: float, expected: str) -> Callable[[str], float]:
    """A number in ``(0, below)``, written ``0.95`` or ``95%``."""

    def parse(text: str) -> float:
        t = text.strip()
        try:
            v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
        except ValueError:
            v = float("nan")
        if not 0.0 < v < below:
            msg = f"{flag}: expected {expected}, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return v

    return parse


_level = _ratio("--confidence-level", below=1.0, expected="a level such as 0.95 or 95%")
_fraction = _ratio(
    "--target-error", below=MAX_TARGET_ERROR, expected="a relative error such as 5% or 0.05"
)


def _int_in(flag: str, lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An integer flag in ``[lo, hi]`` (no upper bound if ``hi`` is None)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = lo - 1
        if v < lo or (hi is not None and v > hi):
            bounds = f"at least {lo}" if hi is None else f"in {lo}..{hi}"
            msg = f"{flag}: expected an integer {bounds}, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return v

    return parse


def _percentiles(text: str) -> tuple[float, ...]:
    try:
        qs = tuple(float(x) for x in text.replace(":", ",").split(",") if x.strip())
    except ValueError:
        msg = f"--percentiles: {text!r} is not a comma-separated list of numbers"
        raise argparse.ArgumentTypeError(msg) from None
    if not qs or any(not 0 < q <= 100 for q in qs):
        msg = f"--percentiles: values must be in (0, 100], got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return tuple(sorted(set(qs)))


def _directions(text: str) -> tuple[str, ...]:
    ds = tuple(d.strip().lower() for d in text.split(",") if d.strip())
    bad = [d for d in ds if d not in DIRECTIONS]
    if bad or not ds:
        msg = f"--directions: unknown {bad or text!r}; choose from {','.join(DIRECTIONS)}"
        raise argparse.ArgumentTypeError(msg)
    return ds


def _host_from(text: str) -> str:
    try:
        return check_host_from(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _when_ms(text: str) -> int:
    """ISO 8601 time, epoch seconds, or seconds since the job start, to ms."""
    from datetime import UTC, datetime  # noqa: PLC0415

    try:
        value = float(text)
    except ValueError:
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            msg = f"{text!r} is no time (ISO 8601, epoch seconds, or seconds since start)"
            raise argparse.ArgumentTypeError(msg) from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        return round(dt.timestamp() * 1000)
    return round(value * 1000)


def _csv(values: Sequence[float]) -> str:
    return ",".join(f"{v:g}" for v in values)


# -- flags shared between subcommands ------------------------------------------------------


def _add_input_options(p: argparse.ArgumentParser, *, logs: bool = True) -> None:
    """The inputs of ``report``, ``plot``, ``summary`` and ``fit``: fio's files, how to read.

    :func:`_read_inputs` turns them into the files and the parsing options. ``logs=False``:
    only the options (``compare`` names its runs by its own positional arguments and sets
    ``logs`` on a copy of the namespace per run).
    """
    if logs:
        p.add_argument("logs", nargs="+", type=Path, metavar="LOG", help="input files")
    g = p.add_argument_group("input options")
    choices = "; ".join(f"{k}: {v}" for k, v in SOURCE_HELP.items())
    g.add_argument(
        "--source",
        choices=list(SOURCE_HELP),
        default=None,
        help="when a json+ status stream and the hist logs of the same jobs are both given "
        f"(fio wrote both views), which to count: {choices}. Without it such inputs are "
        "an error, since each I/O would be counted twice. A hist log is the same jobs' "
        "only when it is in the stream's folder (or one inside it; or a sibling folder, "
        "client-01/hist/ for client-01/json/), is named after a write_hist_log prefix the "
        "stream declares (thread N = job N; also as collected: client-01-run_clat_hist.1.log "
        "beside client-01-out.json, node1_clat_hist.1.log beside node1.json), overlaps its time, "
        "and its counts fit in that job's json+ bins, less fio's last partial interval: "
        "client-01/ and client-02/ with one prefix never pair, nor do two runs whose "
        "counts differ, and plain json (no bins) pairs with nothing (see agents/README.md "
        "'One truth per I/O')",
    )
    g.add_argument("--latency", choices=LATENCY_KINDS, default=None, help=LATENCY_HELP)
    g.add_argument(
        "--directions",
        type=_directions,
        default=None,
        metavar="D[,D]",
        help=f"operations to show, from {','.join(DIRECTIONS)} (default: all of them; "
        "report --format fiologparser: all only, as fiologparser_hist.py); mixed is the "
        "unified_rw_reporting section of a json+ stream (reads and writes in one histogram; "
        "all includes it); --direction is an older spelling",
    )
    # The spelling summary and fit had, kept so scripts that use it still run.
    g.add_argument("--direction", dest="directions", type=_directions, help=argparse.SUPPRESS)
    g.add_argument(
        "--host-from", type=_host_from, default="auto", metavar="MODE", help=HOST_FROM_HELP
    )
    g.add_argument(
        "--log-hist-msec",
        type=_int_in("--log-hist-msec", 1),
        default=None,
        metavar="MS",
        help="fio's log_hist_msec: the span of each direction's first record "
        "(default: from --job-file, else the median spacing of the stamps)",
    )
    g.add_argument(
        "--job-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="fio job file to read log_hist_msec from",
    )
    g.add_argument(
        "--group-nr",
        type=_int_in("--group-nr", MIN_GROUP_NR, MAX_GROUP_NR),
        default=None,
        metavar="N",
        help="fio's FIO_IO_U_PLAT_GROUP_NR if fio was rebuilt "
        f"({MIN_GROUP_NR}..{MAX_GROUP_NR}; default: detect from the column count)",
    )
    g.add_argument(
        "--usbin",
        action="store_true",
        help="bins are in µs (fio 2 logs; detected for 1216-bin layouts)",
    )
    g.add_argument(
        "--log-unit",
        choices=["ns", "us"],
        default="ns",
        help="unit of the values in fio's per-I/O latency logs (P_clat.N.log, P_lat.N.log, "
        "P_slat.N.log): ns since fio 3 (default), us for fio 2.x logs",
    )
    g.add_argument(
        "--strict",
        action="store_true",
        help="stop at the first bad line instead of counting and skipping it",
    )


def _add_percentiles(
    p: argparse.ArgumentParser, default: tuple[float, ...], *, more: str = ""
) -> None:
    p.add_argument(
        "--percentiles",
        type=_percentiles,
        # None: not given (a quanta file then prints the percentiles it holds).
        default=None if more else default,
        metavar="P[,P]",
        help=f"comma-separated percentiles (default {_csv(default)}{more})",
    )


def _add_host_filter(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host", action="append", default=[], help="only this host (repeatable; see --host-from)"
    )


def _add_text_or_json(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help="text for people (default) or json for scripts",
    )


# -- one adder per subcommand --------------------------------------------------------------


def _add_report(sub: SubParsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report",
        help="percentiles over time from finished fio logs (or a quanta file)",
        description="Percentiles over time, per direction, from fio hist logs and json+ "
        "status files: merged cluster-wide (and per host) in quanta of fixed length. "
        "From fio's per-I/O latency logs (write_lat_log with log_avg_msec=0: P_clat.N.log, "
        "P_lat.N.log, P_slat.N.log) the rows are exact: percentiles are the nearest rank, "
        "fio's rule (the p-th percentile of n values is the ceil(p*n/100)-th smallest; "
        "numpy's quantile method inverted_cdf), no interpolation; averaged logs "
        "(log_avg_msec > 0) give the smallest, mean and largest window value, no "
        "percentiles. Also reads back a quanta file (closed-quantum JSON lines), resolving "
        "revisions.",
        epilog=REPORT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _report_arguments(p)
    return p


def _add_plot(sub: SubParsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "plot",
        help="charts of a finished run: interactive HTML, or PNG/SVG",
        description="The charts of `fiomon report` (same inputs and options): percentile "
        "lines over time per direction with the mean, a latency heatmap, a host x time "
        "heatmap, a time x percentile surface, IOPS and throughput. FILE.html is one "
        "self-contained page (works offline); .png and .svg are a static figure of the "
        "main panels and need the plot extra (pip install 'fiomon[plot]').",
        epilog=PLOT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _report_arguments(p, plot=True)
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="FILE",
        help="FILE.html (interactive, self-contained), FILE.png or FILE.svg",
    )
    p.add_argument(
        "--sla",
        action="append",
        default=[],
        metavar="THRESHOLD",
        help="draw a labelled threshold line, [pPCT:][DIR:]LATENCY: e.g. 5ms (every "
        "latency panel) or p99:read:5ms (the read panel only, labelled 'SLA p99 read 5 "
        "ms'); repeatable",
    )
    p.add_argument("--title", default=None, help="page title (default: the first input)")
    p.add_argument(
        "--max-points",
        type=_int_in("--max-points", MIN_POINTS),
        default=MAX_POINTS,
        metavar="N",
        help="down-sample series longer than N quanta to N points, keeping each "
        f"group's min and max (default {MAX_POINTS}, at least {MIN_POINTS})",
    )
    return p


def _run_name(text: str) -> str:
    from fiomon.config import has_control  # noqa: PLC0415

    if not text.strip() or len(text.encode("utf-8")) > 512 or has_control(text):
        msg = f"a run label is 1..512 bytes without control characters, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return text


def _report_arguments(p: argparse.ArgumentParser, *, plot: bool = False) -> None:
    """The options of ``report`` (``plot`` takes the same, minus ``--format`` and ``--ci``)."""
    _add_input_options(p)
    p.add_argument(
        "--quantum",
        type=_duration("--quantum"),
        default=None,  # not given: QUANTUM, or a quanta file's own
        help=f"quantum length (default {QUANTUM}, or a quanta file's own; e.g. 250ms, 10s, 1m)",
    )
    p.add_argument(
        "--align",
        type=str,
        default="auto",
        help="quantum phase: auto (match the records; default), epoch "
        "(multiples of the quantum) or an offset such as 250ms",
    )
    _add_percentiles(p, DEFAULT_PERCENTILES, more="; a quanta file's: those it holds")
    p.add_argument(
        "--run",
        default=None,
        metavar="NAME",
        type=_run_name,
        help="the run label: fio output's rows carry it (runs in jsonl and csv); of a quanta "
        "file only the rows that hold records of run NAME are shown",
    )
    p.add_argument(
        "--per-host",
        action="store_true",
        help="also print host-scope rows, one host per --host-from label",
    )
    if not plot:
        p.add_argument(
            "--format",
            choices=FORMATS,
            default="table",
            help="table (default), csv, jsonl (closed-quantum JSON lines) or "
            "fiologparser (fio's fiologparser_hist.py columns)",
        )
    p.add_argument(
        "--confidence-level",
        type=_level,
        default=DEFAULT_LEVEL,
        metavar="LEVEL",
        help="level of each percentile's distribution-free confidence interval "
        f"(default {DEFAULT_LEVEL:g}; csv and jsonl always carry the intervals)",
    )
    if not plot:
        p.add_argument(
            "--ci",
            action="store_true",
            help="table: follow each percentile with its confidence interval [low, high]",
        )
    p.add_argument(
        "--target-error",
        type=_fraction,
        default=None,
        metavar="E",
        help="merge consecutive quanta until the --target-percentile's confidence interval "
        "is within E of it (relative half-width, e.g. 5%%); each row then covers a span",
    )
    p.add_argument(
        "--target-percentile",
        type=float,
        default=None,
        metavar="P",
        help="the percentile --target-error judges (default 99 if reported, else the "
        "highest of --percentiles)",
    )
    p.add_argument(
        "--max-span",
        type=_duration("--max-span"),
        default=MAX_SPAN,
        help=f"longest span of --target-error (default {MAX_SPAN}); a span that reaches it "
        "is flagged (target_met false, '*' in the table)",
    )
    p.add_argument(
        "--jobs",
        type=_int_in("--jobs", 0),
        default=0,
        metavar="N",
        help="parser threads (default: one per core, at most 2)",
    )
    prog = p.add_mutually_exclusive_group()
    prog.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="always show a progress line on stderr",
    )
    prog.add_argument(
        "--quiet",
        dest="progress",
        action="store_false",
        help="never show one (default: on a terminal, for inputs over 32 MB)",
    )


def _add_demo(sub: SubParsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "demo",
        help="the live system on a simulated cluster (no setup needed)",
        description="Simulate a cluster of fio clients (normal head + power-law tail "
        "latencies) logging live; real agent code follows each host's logs and sends "
        "wire-format messages through an in-process transport to the real aggregator, "
        "which prints cluster percentiles per quantum, serves /metrics and evaluates an "
        "SLA rule. A storage-node failure slows some hosts tenfold so the alert fires "
        "and resolves.",
    )
    p.add_argument(
        "--hosts",
        type=_int_in("--hosts", 1),
        default=DEMO_HOSTS,
        help=f"simulated hosts (default {DEMO_HOSTS})",
    )
    p.add_argument(
        "--jobs",
        type=_int_in("--jobs", 1),
        default=DEMO_JOBS,
        help=f"fio jobs per host (default {DEMO_JOBS})",
    )
    p.add_argument(
        "--duration",
        type=_duration("--duration", minimum=DEMO_MIN_DURATION),
        default=None,
        metavar="S",
        help="run S seconds (or a duration such as 2m; at least "
        f"{DEMO_MIN_DURATION}) and exit 0 (default: until Ctrl-C, a failure every minute)",
    )
    p.add_argument(
        "--real-fio",
        action="store_true",
        help="run real fio jobs (json+ status every second) on temporary files instead of "
        "the simulator; one host reads 64 MiB blocks for a quarter of the run",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="where /metrics is served (default: a free port on localhost)",
    )
    p.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help="write the simulated logs to DIR and keep them",
    )
    return p


def _add_summary(sub: SubParsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "summary",
        help="per-operation I/O statistics of a run, with a latency histogram",
        description="Count, bytes, mean, standard deviation and variance, min/max bounds, "
        "percentiles, IOPS and throughput per operation (read, write, trim, mixed, all), and a "
        "text histogram on bins you choose, from fio hist logs and json+ status files. "
        "From fio's per-I/O latency logs (write_lat_log=P with log_avg_msec=0: "
        "P_clat.N.log; P_lat / P_slat with --latency; not together with hist logs or json+), "
        "the IOstats report: the same numbers exact (total time = the sum of the "
        "latencies; min, max and nearest-rank percentiles, the value of rank "
        "ceil(p*n/100), read from the values in extra passes over the files), plus bytes "
        "per request (mean, stddev, min, max), bytes per second per request (bs / latency "
        "of each I/O) and of total time (bytes / total time), and the inter-arrival time: "
        "per file (one fio job) and direction, the differences of consecutive stamps in "
        "the file's order, pooled over the files (not the merged stream of all jobs, whose "
        "rate the IOPS give; fio stamps each I/O at its completion for clat and lat, at "
        "its submission for slat, in whole ms, so gaps are whole ms: 0 is two I/Os in one "
        "ms, and nothing finer can be told); a stamp that goes back (per_job_logs=0 files "
        "hold one job after another) starts a new sequence and is counted as a restart.",
        epilog="times for --from/--to: ISO 8601 (UTC unless it says otherwise), epoch "
        "seconds, or seconds since the job start for relative-time logs",
    )
    _add_input_options(p)
    _add_host_filter(p)
    p.add_argument(
        "--job",
        action="append",
        default=[],
        help="only streams whose name contains this (repeatable; per-I/O logs: the file's "
        "path, e.g. --job _clat.2. for fio's thread 2, as IOstats' -fileID)",
    )
    p.add_argument("--from", dest="from_", type=_when_ms, metavar="TIME", help="start")
    p.add_argument("--to", type=_when_ms, metavar="TIME", help="end")
    _add_percentiles(p, SUMMARY_PERCENTILES)
    p.add_argument("--hist-min", help="histogram start, e.g. 10us (default: around the data)")
    p.add_argument("--hist-max", help="histogram end, e.g. 100ms (default: around the data)")
    p.add_argument(
        "--hist-bins",
        type=_int_in("--hist-bins", 1),
        default=None,
        metavar="N",
        help=f"histogram bins (default {HIST_BINS}; with --hist-min and --hist-max)",
    )
    p.add_argument(
        "--hist-scale",
        choices=["log", "linear"],
        default=None,
        help=f"histogram bin spacing (default {HIST_SCALE}; with --hist-min and --hist-max)",
    )
    p.add_argument(
        "--hist-config",
        type=Path,
        metavar="YAML",
        help="histogram bins from a file: {min: 10us, max: 100ms, bins: 12, scale: log}",
    )
    _add_text_or_json(p)
    return p


def _add_fit(sub: SubParsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "fit",
        help="fit the latencies as a normal head plus a power-law tail",
        description="Fit each operation's latency histogram as a normal head plus a "
        "power-law tail (pivot by the smallest Kolmogorov-Smirnov distance, maximum "
        "likelihood on fio's bins), compare the tail with lognormal, exponential and "
        "Weibull fits, and report the tail share, the power-law exponent, every model's "
        "KS distance and the winner.",
    )
    _add_input_options(p)
    _add_host_filter(p)
    p.add_argument(
        "--per-quantum",
        nargs="?",
        type=_duration("--per-quantum"),
        const=QUANTUM,
        default=None,
        metavar="Q",
        help=f"fit every quantum (default {QUANTUM}) instead of the whole run",
    )
    _add_text_or_json(p)
    return p


def _add_fio(sub: SubParsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "fio",
        help="run fio with the output fiomon needs, starting on a quantum boundary",
        description="Run fio with a json+ status stream every second (the agent's live "
        "source), hist logs and epoch timestamps, starting at the next whole quantum of the "
        "wall clock so every host shares one phase. Put fio's own arguments after --.",
        epilog="example: fiomon fio --output-dir /var/lib/fio/results -- job.fio",
    )
    p.add_argument(
        "--output-dir",
        type=Path,
        default=Path(),
        metavar="DIR",
        help="where fio writes its status stream and hist logs (default: here)",
    )
    p.add_argument(
        "--name",
        default=None,
        metavar="NAME",
        help='the run\'s name: its files go to DIR/NAME/, and an agent with run: "{dir}" '
        "labels its records NAME (rows' runs, fiomon_run_info)",
    )
    p.add_argument(
        "--quantum",
        type=_duration("--quantum", minimum="0ms"),
        default=FIO_QUANTUM,
        help=f"start on a multiple of this (default {FIO_QUANTUM}; 0: at once)",
    )
    p.add_argument(
        "fio_args",
        nargs=argparse.REMAINDER,
        metavar="-- FIO ARGS",
        help="fio's own arguments (job files, options), after --",
    )
    return p


def _add_check_config(sub: SubParsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "check-config",
        help="validate a configuration file and list every problem",
        description="Validate an agent or aggregator configuration file (told apart by its "
        "keys: an agent has `watch`); every bad key is listed with its path. Exit 0 if "
        "valid, 2 if not.",
    )
    p.add_argument("file", type=Path, metavar="FILE", help="the YAML file")
    return p


def _add_version(sub: SubParsers) -> argparse.ArgumentParser:
    return sub.add_parser("version", help="print the version")


def _add_paths(sub: SubParsers) -> argparse.ArgumentParser:
    from fiomon.paths import PLACES  # noqa: PLC0415

    p = sub.add_parser(
        "paths",
        help="print where the shipped deploy files, example configs and docs are",
        description="Print where the installed deploy files (systemd units, Mosquitto, "
        "Prometheus, Grafana, Alertmanager, Ansible), example configs, the agents' kit and "
        "the docs are: <venv>/share/fiomon for a wheel install, the checkout's folders in a "
        "checkout. With NAME, only that path (for scripts). Exit 1 if not installed.",
    )
    p.add_argument("name", nargs="?", choices=list(PLACES), metavar="NAME",
                   help=f"one of: {', '.join(PLACES)}")  # fmt: skip
    return p


# -- handlers of the offline commands -------------------------------------------------------


def _error(name: str, message: str) -> None:
    print(f"fiomon {name}: {message}", file=sys.stderr)


def _read_inputs(args: argparse.Namespace, name: str) -> tuple[list[Path], SourceOptions]:
    """The files to read after ``--source`` and how to parse them (the input flags).

    Raises:
        UsageError: a bad call.
    """
    rows = [str(p) for p in args.logs if is_quanta_file(p)]
    if rows:  # report and plot read them before coming here; the others cannot
        msg = (
            f"{', '.join(rows)}: a quanta file (closed-quantum rows, no histograms); "
            f"{name} reads fio output (fiomon report and fiomon plot read quanta files)"
        )
        raise UsageError([msg])
    interval = args.log_hist_msec
    if interval is None and args.job_file is not None:
        try:
            interval = interval_from_job_file(args.job_file)
        except OSError as exc:
            raise UsageError([f"--job-file: {exc}"]) from None
        if interval is not None and interval <= 0:
            raise UsageError(["--log-hist-msec must be positive"])
    latency = resolve_latency(args.logs, args.latency)
    kind = latency.kind
    if kind != "clat" and args.source in ("hist", "both"):
        msg = f"--source {args.source} with --latency {kind}: hist logs hold clat only"
        raise UsageError([msg])
    try:
        # Per-I/O latency logs first (one truth: they are exact), then hist vs json+.
        paths, notes, exact = choose_iologs(latency.paths, args.source, kind)
        skips: dict[str, frozenset[int]] = {}
        if not exact:
            choice = None if args.source == "iolog" else args.source
            if kind != "clat" and choice is None:
                choice = "json"  # a json+ stream holds the other kinds of its jobs; hist logs not
            paths, more, skips = choose_sources(paths, choice)
            if choice != args.source:
                more = [n.replace("--source json:", f"--latency {kind}:") for n in more]
            notes += more
    except OverlapError as exc:
        raise UsageError([str(exc)]) from None
    paths, more = hist_logs(paths, kind)
    for note in [*latency.notes, *notes, *more]:
        _error(name, note)
    source = SourceOptions(
        interval_ms=interval,
        group_nr=args.group_nr,
        unit="us" if args.usbin else None,
        strict=args.strict,
        skip_jobs=skips,
        log_unit=args.log_unit,
        latency=kind,
    )
    return paths, source


def _report_options(
    args: argparse.Namespace, name: str
) -> tuple[QuantaOptions, ReportOptions, list[Path]]:
    """The options (computing, output) and inputs of ``report`` or ``plot``.

    Raises:
        UsageError: a bad call.
    """
    try:
        align = parse_align(args.align)
    except ConfigError as exc:
        raise UsageError([str(exc)]) from None
    fmt: Format = getattr(args, "format", "jsonl")  # plot has no --format
    quantum = args.quantum or parse_duration_ms(QUANTUM, what="--quantum")
    rows = _rows_selection(args, fmt)
    percentiles = args.percentiles or DEFAULT_PERCENTILES
    if rows is not None:
        percentiles = rows.percentiles or percentiles
        quantum = args.quantum or rows.quantum_ms or quantum
    directions = args.directions or DIRECTIONS
    target_pct = args.target_percentile
    if target_pct is None:
        target_pct = 99.0 if 99.0 in percentiles else max(percentiles)
    if args.target_error is not None:
        if fmt == "fiologparser":
            msg = (
                "--target-error does not fit --format fiologparser (its columns have no "
                "span); use table, csv or jsonl"
            )
            raise UsageError([msg])
        if target_pct not in percentiles:
            msg = (
                f"--target-percentile {target_pct:g} is not among --percentiles {_csv(percentiles)}"
            )
            raise UsageError([msg])
        if args.max_span < quantum:
            raise UsageError(["--max-span must be at least --quantum"])
    if fmt == "fiologparser":
        # fiologparser_hist.py always prints the median, and without --directions only the
        # mixed ("all") row.
        percentiles = tuple(sorted({50.0, *percentiles}))
        directions = args.directions or ("all",)
    if rows is None:
        logs, source = _read_inputs(args, name)
    else:
        logs, source = list(args.logs), SourceOptions()
        rows = Selection(percentiles, directions, args.per_host, args.quantum, rows.other)
    view = ReportOptions(
        fmt=fmt,
        directions_given=args.directions is not None,
        show_ci=getattr(args, "ci", False),  # plot draws the intervals as bands, no --ci
        progress=args.progress,
        rows=rows,
    )
    opts = QuantaOptions(
        quantum_ms=quantum,
        align=align,
        percentiles=percentiles,
        directions=directions,
        per_host=args.per_host,
        host_from=args.host_from,
        confidence_level=args.confidence_level,
        target_error=args.target_error,
        target_percentile=target_pct,
        max_span_ms=args.max_span,
        source=source,
        workers=args.jobs,
        run=args.run,
    )
    return opts, view, logs


def _rows_selection(args: argparse.Namespace, fmt: Format) -> Selection | None:
    """For quanta files given to ``report`` or ``plot``: what the flags ask of their rows.

    None: the inputs are fio output. The selection's percentiles are the flag's or the
    first row's (fiologparser adds the median, as for logs), its quantum the first row's;
    :attr:`Selection.other` lists the flags given that need histograms or fio's files.

    Raises:
        UsageError: quanta files and fio output are given together.
    """
    try:
        if not all_quanta_files(args.logs):
            return None
    except FiomonError as exc:
        raise UsageError([str(exc)]) from None
    try:
        first = first_row(args.logs)
    except FiomonError:
        first = None  # the run reports it, naming the line
    have = () if first is None else tuple(map(float, first.stats.percentiles_ns))
    pcts = args.percentiles or have or None
    if pcts is not None and fmt == "fiologparser":
        pcts = tuple(sorted({50.0, *pcts}))
    need = "needs the histograms, which a quanta file does not hold"
    other: dict[str, str] = {}
    if args.align != "auto":
        other["--align"] = f"another phase {need}"
    if args.target_error is not None:
        other["--target-error"] = f"merging quanta into spans {need}"
    if args.confidence_level != DEFAULT_LEVEL:
        other["--confidence-level"] = f"another level {need} (the rows carry their own)"
    fio_only = {
        "--source": args.source is not None,
        "--latency": args.latency is not None,
        "--log-hist-msec": args.log_hist_msec is not None,
        "--job-file": args.job_file is not None,
        "--group-nr": args.group_nr is not None,
        "--usbin": args.usbin,
        "--log-unit": args.log_unit != "ns",
        "--host-from": args.host_from != "auto",
    }
    other.update({flag: "reads fio output only" for flag, given in fio_only.items() if given})
    quantum = (
        None if first is None or first.target_met is not None else first.end_ms - first.start_ms
    )
    return Selection(pcts, (), args.per_host, quantum, other)


def _report(args: argparse.Namespace) -> int:
    opts, view, logs = _report_options(args, "report")
    return _engine_errors("report", lambda: run_report(logs, opts, sys.stdout, opts=view))


def _engine_errors(name: str, run: Callable[[], ReportSummary]) -> int:
    """Run a report engine; its errors become messages and exit codes."""
    try:
        summary = run()
    except ParseError as exc:
        _error(name, f"{exc} (--strict)")
        return EXIT_FAILED
    except FiomonError as exc:
        _error(name, str(exc))
        return EXIT_FAILED
    if summary.records == 0:
        _error(name, "no histogram records in the input")
        return EXIT_FAILED
    return EXIT_OK


def _plot(args: argparse.Namespace) -> int:
    from fiomon.offline.plot import plot_kind, run_plot  # noqa: PLC0415
    from fiomon.offline.plotdata import parse_sla  # noqa: PLC0415

    try:
        kind = plot_kind(args.output)
        sla = [parse_sla(x) for x in args.sla]
    except (PlotError, ConfigError) as exc:
        raise UsageError([str(exc)]) from None
    opts, _, logs = _report_options(args, "plot")
    title = args.title or (
        logs[0].name if len(logs) == 1 else f"{logs[0].name} and {len(logs) - 1} more"
    )
    if opts.latency != "clat":  # the charts' percentiles are of that latency
        title = f"{title} · {opts.latency} ({LATENCY_NAMES[opts.latency]})"
    try:
        return _engine_errors(
            "plot",
            lambda: run_plot(
                logs,
                opts,
                args.output,
                kind=kind,
                title=title,
                sla=sla,
                max_points=args.max_points,
            ),
        )
    except PlotError as exc:
        _error("plot", str(exc))
        return EXIT_FAILED


def _summary_bins(args: argparse.Namespace) -> HistBins | None:
    """The text histogram's bins of ``summary``, or None (around the data).

    Raises:
        UsageError: a bad call.
    """
    from fiomon.offline.summary import HistBins, bins_from_yaml  # noqa: PLC0415
    from fiomon.units import parse_latency_ns  # noqa: PLC0415

    if args.hist_config is None:
        if args.hist_min is None and args.hist_max is None:
            if args.hist_bins is not None or args.hist_scale is not None:
                raise UsageError(["--hist-bins/--hist-scale need --hist-min and --hist-max"])
            return None
        if args.hist_min is None or args.hist_max is None:
            raise UsageError(["give both --hist-min and --hist-max"])
    try:
        if args.hist_config is not None:
            return bins_from_yaml(args.hist_config)
        return HistBins(
            parse_latency_ns(args.hist_min, what="--hist-min"),
            parse_latency_ns(args.hist_max, what="--hist-max"),
            args.hist_bins or HIST_BINS,
            args.hist_scale or HIST_SCALE,
        )
    except ConfigError as exc:
        raise UsageError(exc.problems) from None


def _summary(args: argparse.Namespace) -> int:
    from fiomon.offline.summary import Filters, main_summary  # noqa: PLC0415

    bins = _summary_bins(args)
    filters = Filters(
        hosts=tuple(args.host),
        host_from=args.host_from,
        jobs=tuple(args.job),
        directions=args.directions or DIRECTIONS,
        from_ms=args.from_,
        to_ms=args.to,
    )
    logs, source = _read_inputs(args, "summary")
    try:
        return main_summary(
            logs,
            filters=filters,
            source=source,
            percentiles=args.percentiles,
            bins=bins,
            fmt=args.format,
        )
    except ParseError as exc:
        _error("summary", f"{exc} (--strict)")
        return EXIT_FAILED


def _fit(args: argparse.Namespace) -> int:
    from fiomon.offline.fitcmd import run_fit  # noqa: PLC0415
    from fiomon.offline.summary import Filters  # noqa: PLC0415

    logs, source = _read_inputs(args, "fit")
    return run_fit(
        logs,
        directions=args.directions or DIRECTIONS,
        source=source,
        per_quantum_ms=args.per_quantum,
        fmt=args.format,
        hosts=Filters(hosts=tuple(args.host), host_from=args.host_from),
    )


def _demo(args: argparse.Namespace) -> int:
    from fiomon.tools.demo import run_demo  # noqa: PLC0415 - report runs need not import it

    return run_demo(
        hosts=args.hosts,
        jobs=args.jobs,
        seconds=None if args.duration is None else args.duration // 1000,
        keep=args.keep,
        listen=args.listen,
        real_fio=args.real_fio,
    )


def _fio(args: argparse.Namespace) -> int:
    from fiomon.tools.runfio import run_fio  # noqa: PLC0415

    fio_args = args.fio_args[1:] if args.fio_args[:1] == ["--"] else args.fio_args
    return run_fio(
        fio_args, output_dir=args.output_dir, quantum_ms=max(1, args.quantum), name=args.name
    )


def _version(args: argparse.Namespace) -> int:
    del args
    print(f"fiomon {__version__}")
    return EXIT_OK


def _paths(args: argparse.Namespace) -> int:
    from fiomon.paths import PLACES, shipped_path  # noqa: PLC0415

    names = [args.name] if args.name else list(PLACES)
    found = {name: shipped_path(name) for name in names}
    missing = [name for name, path in found.items() if path is None]
    if args.name:
        if missing:
            _error("paths", f"{args.name}: not installed (no share/fiomon/ found)")
            return EXIT_FAILED
        print(found[args.name])
        return EXIT_OK
    for name, path in found.items():
        print(f"{name:<8} {path if path is not None else '(not installed)'}")
    return EXIT_FAILED if found["share"] is None else EXIT_OK


# Environment variables of the services; a flag wins over its variable, which wins over
# the configuration file (and the file over the built-in default).
ENV_BROKER = "FIOMON_BROKER"
ENV_LISTEN = "FIOMON_LISTEN"
ENV_LOG_FORMAT = "FIOMON_LOG_FORMAT"
ENV_LOG_LEVEL = "FIOMON_LOG_LEVEL"

SERVICE_EPILOG = """\
settings from the environment (a flag wins over its variable, the variable over the file):
  FIOMON_BROKER       like --broker{listen}
  FIOMON_LOG_FORMAT   like --log-format
  FIOMON_LOG_LEVEL    like --log-level

example configuration: config/{name}.example.yaml (installed in <venv>/share/fiomon/config/)
"""


def _service_parser(
    sub: SubParsers,
    name: str,
    *,
    help: str,
    description: str,
) -> argparse.ArgumentParser:
    """The subcommand of a service: its config file, overrides and logging."""
    listen = "\n  FIOMON_LISTEN       like --listen" if name in {"aggregator", "root"} else ""
    p = sub.add_parser(
        name,
        help=help,
        description=textwrap.fill(description, 88),
        epilog=SERVICE_EPILOG.format(name=name, listen=listen),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, required=True, metavar="FILE", help=f"{name} YAML")
    p.add_argument(
        "--broker",
        metavar="HOST[:PORT]",
        help="MQTT broker, overriding broker.host (and broker.port, if given) of the file; "
        "IPv6 as [ADDR]:PORT",
    )
    if name in {"aggregator", "root"}:
        p.add_argument(
            "--listen",
            metavar="HOST:PORT",
            help="where /metrics is served, overriding `listen` of the file",
        )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="one line per record, timestamped (UTC): logfmt (default, as Prometheus logs), "
        "json, or text; under systemd each line also carries its journal priority",
    )
    p.add_argument(
        "--log-level",
        choices=LEVELS,
        help="log verbosity on stderr (default: the configuration's log_level, else info)",
    )
    return p


def _setting(flag: str | None, env: str, flag_name: str) -> tuple[str | None, str]:
    """A setting and where it came from: the flag, else the environment variable."""
    if flag is not None:
        return flag, flag_name
    value = os.environ.get(env, "").strip()
    return (value, env) if value else (None, "")


def _overrides(args: argparse.Namespace, log_level: str | None) -> Overrides:
    """The settings of the flags or the environment that go over the file, as data.

    The service applies them with the file at start and again at every SIGHUP
    (:func:`fiomon.config.load`).
    """
    from fiomon.config import Overrides  # noqa: PLC0415

    broker, broker_from = _setting(args.broker, ENV_BROKER, "--broker")
    listen, listen_from = (None, "")
    if hasattr(args, "listen"):  # aggregator and root
        listen, listen_from = _setting(args.listen, ENV_LISTEN, "--listen")
    return Overrides(
        broker=broker,
        listen=listen,
        log_level=log_level,
        broker_from=broker_from or "--broker",
        listen_from=listen_from or "--listen",
    )


def _service(args: argparse.Namespace, name: str) -> int:
    """Run ``name`` (agent, aggregator or root) in the foreground until SIGTERM/SIGINT."""
    import asyncio  # noqa: PLC0415 - only the services need asyncio and aiomqtt
    import logging  # noqa: PLC0415

    from fiomon import config  # noqa: PLC0415
    from fiomon.logs import parse_log_format, parse_log_level, setup_logging  # noqa: PLC0415

    try:
        level, where = _setting(args.log_level, ENV_LOG_LEVEL, "--log-level")
        fmt, fmt_from = _setting(args.log_format, ENV_LOG_FORMAT, "--log-format")
        log_level = parse_log_level(level, what=where) if level is not None else None
        setup_logging(log_level or "info", parse_log_format(fmt or "logfmt", what=fmt_from))
        # A flag or FIOMON_LOG_LEVEL wins over the file's log_level, at start and reload.
        overrides = _overrides(args, log_level)
        cfg: AgentConfig | AggregatorConfig
        if name == "agent":
            cfg = overrides.apply_agent(config.load_agent_config(args.config))
        else:
            cfg = config.load(args.config, overrides)
            if name == "root":  # a file without a root section is checked here
                problems = config.root_problems(cfg)
                if problems:
                    raise ConfigError([f"{args.config}: {p}" for p in problems])
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"fiomon {name}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    for note in overrides.notes(cfg.broker):
        logging.getLogger(f"fiomon.{name}").info("%s", note)
    if isinstance(cfg, config.AgentConfig):
        from fiomon.agent.service import run_agent  # noqa: PLC0415

        main_coro = run_agent(cfg, config_path=args.config, overrides=overrides)
    elif name == "root":
        from fiomon.root.service import run_root  # noqa: PLC0415

        main_coro = run_root(cfg, final=args.final, config_path=args.config, overrides=overrides)
    else:
        from fiomon.aggregator.service import run_aggregator  # noqa: PLC0415

        main_coro = run_aggregator(
            cfg, final=args.final, config_path=args.config, overrides=overrides
        )
    try:
        asyncio.run(main_coro)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except asyncio.CancelledError:  # a second SIGTERM/SIGINT cut the stop short
        return EXIT_FAILED
    # e.g. an unreadable password file, a taken port, a state directory in use
    except (ConfigError, StateLockedError, OSError, RuntimeError) as exc:
        print(f"fiomon {name}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ExceptionGroup as group:  # the same, raised in one of the service's tasks
        expected, other = group.split((ConfigError, StateLockedError, OSError, RuntimeError))
        if other is not None or expected is None:
            raise
        for leaf in _leaves(expected):
            print(f"fiomon {name}: {leaf}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions of a (nested) exception group, in order."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def _root_summary(agg: AggregatorConfig) -> str:
    """What ``check-config`` checked of a root's configuration (``fiomon root``)."""
    from fiomon.config import RootConfig, root_ignored_keys  # noqa: PLC0415

    rc = agg.root or RootConfig()
    text = (
        f"root section valid (fiomon root: cells {', '.join(rc.cells)}, cell_timeout "
        f"{rc.cell_timeout_ms / 1000:g} s, max_skew {rc.max_skew_ms / 1000:g} s, "
        f"cells_lateness {rc.cells_lateness_ms / 1000:g} s, partials from "
        f"{Topics(agg.topic_prefix).all_partials})"
    )
    ignored = root_ignored_keys(agg)
    if ignored:
        text += f"; fiomon root ignores {', '.join(ignored)}"
    return text


def _check_config(args: argparse.Namespace) -> int:
    from fiomon.config import (  # noqa: PLC0415
        MAX_CONFIG_BYTES,
        check_agent,
        check_aggregator,
        watch_warnings,
    )
    from fiomon.yamlfile import read_yaml_noting_duplicates  # noqa: PLC0415

    try:  # a key given twice is a problem, listed with the others (its last value checked)
        data, twice = read_yaml_noting_duplicates(args.file, MAX_CONFIG_BYTES)
    except ConfigError as exc:
        return _config_problems(args.file, exc.problems)
    if isinstance(data, dict) and "watch" in data:
        agent, problems = check_agent(data)
        for warning in watch_warnings(agent, unit_note=True):
            print(f"{args.file}: warning: {warning}", file=sys.stderr)
        text = f"valid agent configuration (host {agent.host}, {len(agent.watch)} globs)"
        if agent.cell is not None:
            b = agent.broker
            text += f"; cell {agent.cell} (broker {b.host}:{b.port}, {agent.topic_prefix})"
    else:
        agg, problems = check_aggregator(data)
        text = (
            f"valid aggregator configuration ({len(agg.sla)} SLA rules, /metrics on {agg.listen})"
        )
        if agg.cell is not None:
            text += f"; cell {agg.cell}"
        if agg.root is not None and not problems:
            text += "; " + _root_summary(agg)
    if problems or twice:  # the keys' and the files' problems, all in one pass
        return _config_problems(args.file, twice + [f"{args.file}: {p}" for p in problems])
    print(f"{args.file}: {text}")
    return EXIT_OK


def _config_problems(file: Path, problems: list[str]) -> int:
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{file}: {len(problems)} problem(s)", file=sys.stderr)
    return EXIT_USAGE


def _add_agent(sub: SubParsers) -> argparse.ArgumentParser:
    return _service_parser(
        sub,
        "agent",
        help="follow fio's output on this host and publish it over MQTT",
        description="Follow fio json+ status files and hist logs matching the configured "
        "globs, and publish their interval histograms to the MQTT broker (QoS 1). Read "
        "positions and the spool live in state_dir; SIGTERM stops cleanly, SIGHUP reloads "
        "what it can (and names what needs a restart).",
    )


def _add_aggregator(sub: SubParsers) -> argparse.ArgumentParser:
    p = _service_parser(
        sub,
        "aggregator",
        help="merge every agent's records into live cluster percentiles, metrics and alerts",
        description="Subscribe to the agents' records (persistent MQTT session), close quanta "
        "on time, export Prometheus metrics on `listen`, append closed quanta to the quanta "
        "file and evaluate the SLA rules. SIGTERM stops cleanly: open quanta stay in the "
        "journal and the next start continues them. SIGHUP reloads the SLA rules, the "
        "webhook and the log level.",
    )
    p.add_argument(
        "--final",
        action="store_true",
        help="on SIGTERM/SIGINT close every open quantum too (the end of a run)",
    )
    return p


def _add_root(sub: SubParsers) -> argparse.ArgumentParser:
    p = _service_parser(
        sub,
        "root",
        help="merge the cells' closed quanta into exact cluster percentiles (the root)",
        description="Subscribe to the cells' partials (<prefix>/v1/_partials/+) on the "
        "root's broker, merge them into the same quanta one aggregator fed every record "
        "would close, export /metrics, append to the quanta file and evaluate the SLA "
        "rules. The config is an aggregator's, with a `root` section (cells, cell_timeout).",
    )
    p.add_argument(
        "--final",
        action="store_true",
        help="on SIGTERM/SIGINT close every open quantum too (the end of a run)",
    )
    return p


def _agent(args: argparse.Namespace) -> int:
    return _service(args, "agent")


def _aggregator(args: argparse.Namespace) -> int:
    return _service(args, "aggregator")


def _root(args: argparse.Namespace) -> int:
    return _service(args, "root")


# -- the table of subcommands ---------------------------------------------------------------


class Command(NamedTuple):
    """A subcommand: the adder of its flags and the handler that runs it."""

    add: Callable[[SubParsers], argparse.ArgumentParser]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {  # in the order of ``fiomon --help``
    "report": Command(_add_report, _report),
    "plot": Command(_add_plot, _plot),
    "compare": Command(comparecmd.add_parser, comparecmd.run),
    "demo": Command(_add_demo, _demo),
    "summary": Command(_add_summary, _summary),
    "fit": Command(_add_fit, _fit),
    "baseline": Command(baselinecmd.add_parser, baselinecmd.run),
    "fio": Command(_add_fio, _fio),
    "agent": Command(_add_agent, _agent),
    "aggregator": Command(_add_aggregator, _aggregator),
    "root": Command(_add_root, _root),
    "check-config": Command(_add_check_config, _check_config),
    "version": Command(_add_version, _version),
    "completion": Command(completion.add_parser, completion.run),
    "man": Command(manpage.add_parser, manpage.run),
    "paths": Command(_add_paths, _paths),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    p = argparse.ArgumentParser(
        prog="fiomon",
        description="Cluster-wide latency percentiles over time from fio's histograms.",
    )
    p.add_argument("--version", action="version", version=f"fiomon {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS.values():
        command.add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader (e.g. ``| head``) went away: stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = COMMANDS.get(args.command)
    if command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return command.run(args)
    except UsageError as exc:
        for problem in exc.problems:
            _error(args.command, problem)
        return EXIT_USAGE
