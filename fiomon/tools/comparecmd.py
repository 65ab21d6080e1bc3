"""``fiomon compare BASELINE CANDIDATE``: two runs' percentiles side by side, with verdicts.

Each run is a file, a folder (read recursively) or a quoted glob of one run's fio output
(:func:`fiomon.offline.compare.run.run_files`), read with ``report``'s input options
(:func:`fiomon.cli._read_inputs`, once per run, so the one-truth choice between json+ and
hist logs is each run's own). :func:`fiomon.offline.compare.run.run_compare` aligns and
judges; :mod:`fiomon.offline.compare.output` prints; ``-o`` draws
(:mod:`fiomon.offline.compare.page`).

Times given to ``--align-at``: ``HH:MM:SS[.fff]`` is a wall-clock time in this machine's
time zone (``TZ=UTC fiomon compare ...`` for UTC) on the date the run covers (resolved by
the engine from the run's first stamp: :func:`fiomon.offline.compare.align.time_of_day_at`);
an ISO datetime without a zone is local too; ``+95s`` / ``+1m30s`` is an offset from the
run's start. A wall-clock time on relative-stamped logs is refused by the engine.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fiomon.errors import FiomonError, ParseError, PlotError, UsageError

if TYPE_CHECKING:
    from fiomon.align import Align
    from fiomon.offline.compare.model import (
        AlignPoint,
        CompareOptions,
        CompareResult,
        RunName,
    )
    from fiomon.offline.compare.run import RunInput

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

FORMATS = ("table", "jsonl", "csv")
WINDOW = "10s"
RUNS: tuple[RunName, RunName] = ("baseline", "candidate")

EPILOG = """\
runs:
  BASELINE and CANDIDATE are each one run's fio output: a file, a folder (read
  recursively, hidden files skipped) or a quoted glob ('runs/a/**/*.log'); anything
  fiomon report reads except quanta files (they hold no histograms) and averaged
  latency logs (no percentiles). From a folder or a glob only fio's latency output is
  taken (hist logs, per-I/O latency logs, json+ documents): the job file, fio's text
  output, bw/iops logs and data files are left out, with a note. The input options
  apply to both runs.

alignment (aligned time 0):
  default          each run's first quantum start
  --shift D        the candidate's 0 is D after its start (negative: --shift=-5s)
  --align-at baseline=T,candidate=T
                   an event in each run; T is HH:MM:SS[.fff] (wall clock, this machine's
                   time zone, the date of the run), an ISO datetime, or +95s / +1m30s
                   from that run's start; 0 snaps to the run's quantum grid

reading the table:
  ratio = candidate / baseline of one percentile in one window (or the whole run); its
  interval comes from the two runs' order-statistic intervals (MOVER); worse / better
  when the interval excludes 1. At 95 % about 1 window verdict in 20 is flagged by
  chance alone when nothing changed: trust the whole-run lines and runs of neighbouring
  windows more than one window.

examples:
  fiomon compare runs/before runs/after
  fiomon compare --window 30s --percentiles 50,99 --format csv runs/a runs/b > cmp.csv
  fiomon compare --per-host --align-at baseline=12:03:10,candidate=14:41:55 a/ b/ -o cmp.html
"""


class _Figure(Protocol):
    def __call__(self, result: CompareResult, path: Path, kind: str, title: str) -> None: ...


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    """``fiomon compare``."""
    from fiomon import cli  # noqa: PLC0415 -- the CLI imports this module
    from fiomon.confidence import DEFAULT_LEVEL  # noqa: PLC0415
    from fiomon.model import DEFAULT_PERCENTILES  # noqa: PLC0415

    p = sub.add_parser(
        "compare",
        help="compare two runs: per window and percentile, the ratio and whether it changed",
        description="Put two runs of fio side by side over aligned time: per window "
        "(--window), direction and percentile, the baseline's and the candidate's value, "
        "their ratio and its interval at --confidence-level, and whether the change is "
        "significant (the interval excludes 1); plus one whole-run line per direction and "
        "percentile, whose interval also covers a paired block bootstrap over windows. "
        "Regressions name the candidate hosts that carry them. -o draws both runs, the "
        "ratio and IOPS over time (FILE.html, self-contained; .png or .svg with the plot "
        "extra).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for run in RUNS:
        p.add_argument(
            run,
            metavar=run.upper(),
            help=f"the {run} run's fio output: a file, a folder (read recursively; fio's "
            "latency output in it) or a quoted glob",
        )
    cli._add_input_options(p, logs=False)
    p.add_argument(
        "--quantum",
        type=cli._duration("--quantum"),
        default=None,
        help=f"quantum length, as report's (default {cli.QUANTUM}); windows are whole quanta",
    )
    p.add_argument(
        "--align",
        default="auto",
        help="quantum phase, as report's: auto (match the records; default), epoch or an "
        "offset such as 250ms",
    )
    cli._add_percentiles(p, DEFAULT_PERCENTILES)
    p.add_argument(
        "--per-host",
        action="store_true",
        help="also compare each host (--host-from) of both runs; the figure gets per-host panels",
    )
    p.add_argument(
        "--confidence-level",
        type=cli._level,
        default=DEFAULT_LEVEL,
        metavar="LEVEL",
        help="level of every interval: each run's percentiles and the ratio's "
        f"(default {DEFAULT_LEVEL:g})",
    )
    p.add_argument(
        "--jobs",
        type=cli._int_in("--jobs", 0),
        default=0,
        metavar="N",
        help="parser threads (default: one per core, at most 2)",
    )
    p.add_argument(
        "--window",
        type=cli._duration("--window"),
        default=WINDOW,
        help=f"window length, a multiple of --quantum (default {WINDOW})",
    )
    align = p.add_mutually_exclusive_group()
    align.add_argument(
        "--shift",
        type=_shift,
        default=0,
        metavar="D",
        help="the candidate's aligned 0 is D after its own start (a multiple of --quantum; "
        "negative: --shift=-5s)",
    )
    align.add_argument(
        "--align-at",
        type=_align_at,
        default=None,
        metavar="baseline=T,candidate=T",
        help="align an event in each run: T is HH:MM:SS[.fff] (wall clock, local time "
        "zone), an ISO datetime, or +95s from that run's start",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table (default: the whole run, then the significant windows worst first), "
        "jsonl (one verdict per line) or csv",
    )
    p.add_argument(
        "--all",
        dest="all_windows",
        action="store_true",
        help="table: every window, not only the significant ones",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        metavar="FILE",
        help="also draw the comparison: FILE.html (interactive, self-contained), FILE.png "
        "or FILE.svg",
    )
    p.add_argument(
        "--title",
        default=None,
        help="the figure's title (default: 'BASELINE vs CANDIDATE')",
    )
    return p


# -- converters -------------------------------------------------------------------------------


def _shift(text: str) -> int:
    from fiomon.offline.compare.align import parse_shift  # noqa: PLC0415

    try:
        return parse_shift(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _align_at(text: str) -> tuple[AlignPoint, AlignPoint]:
    from fiomon.offline.compare.align import parse_align_at  # noqa: PLC0415

    try:
        return parse_align_at(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- the run ----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Compare the two runs; the table, jsonl or csv on stdout; -o draws the figure."""
    from fiomon import cli  # noqa: PLC0415 -- the CLI imports this module
    from fiomon.offline.compare.output import (  # noqa: PLC0415
        write_csv,
        write_jsonl,
        write_table,
    )
    from fiomon.offline.compare.run import run_compare  # noqa: PLC0415
    from fiomon.offline.plot import plot_kind  # noqa: PLC0415

    _check_flags(args)  # before reading anything
    kind = None
    if args.output is not None:
        try:
            kind = plot_kind(args.output)
        except PlotError as exc:
            raise UsageError([str(exc)]) from None
    try:
        baseline, candidate = (_run_input(args, name) for name in RUNS)
        opts = _options(args, baseline, candidate)
        result = run_compare(baseline, candidate, opts, sys.stderr)
    except UsageError:
        raise  # the command line's: fiomon prints it and exits 2
    except ParseError as exc:
        cli._error("compare", f"{exc} (--strict)")
        return cli.EXIT_FAILED
    except FiomonError as exc:
        cli._error("compare", str(exc))
        return cli.EXIT_FAILED
    if args.format == "table":
        write_table(result, sys.stdout, all_windows=args.all_windows)
    else:
        for note in result.notes:  # the table says them in its header
            cli._error("compare", f"note: {note}")
        (write_jsonl if args.format == "jsonl" else write_csv)(result, sys.stdout)
    sys.stdout.flush()
    if kind is not None:
        title = args.title or f"{args.baseline} vs {args.candidate}"
        try:
            _figure()(result, args.output, kind, title)
        except PlotError as exc:
            cli._error("compare", str(exc))
            return cli.EXIT_FAILED
        cli._error("compare", f"wrote {args.output}")
    return cli.EXIT_OK


def _figure() -> _Figure:
    """:func:`fiomon.offline.compare.page.write_figure`, loaded only when -o asks for it."""
    page = importlib.import_module("fiomon.offline.compare.page")
    draw: _Figure = page.write_figure
    return draw


def _run_input(args: argparse.Namespace, name: RunName) -> RunInput:
    """One run's files (``run_files``, then report's one-truth choice) and parsing options.

    Raises:
        UsageError: a quanta file, or input flags that do not fit the run's files.
        FiomonError: the spec names nothing readable.
    """
    from fiomon import cli  # noqa: PLC0415 -- the CLI imports this module
    from fiomon.offline.compare.run import RunInput, run_files  # noqa: PLC0415

    spec: str = getattr(args, name)
    skipped: list[Path] = []
    files = run_files(spec, skipped)
    if skipped:
        shown = ", ".join(str(p) for p in skipped[:5]) + (", ..." if len(skipped) > 5 else "")
        cli._error(
            "compare",
            f"note: {name}: {len(skipped)} file(s) that are not fio's latency output left "
            f"out: {shown}",
        )
    one = copy.copy(args)
    one.logs = files
    try:
        paths, source = cli._read_inputs(one, "compare")
    except UsageError as exc:  # say which run
        raise UsageError([f"{name}: {p}" for p in exc.problems]) from None
    return RunInput(name=name, spec=spec, files=tuple(paths), source=source)


def _options(args: argparse.Namespace, baseline: RunInput, candidate: RunInput) -> CompareOptions:
    """The flags as :class:`CompareOptions` (the engine dates ``--align-at``'s times of day).

    Raises:
        UsageError: the runs read other latencies (and what :func:`_check_flags` refuses).
    """
    from fiomon.model import DEFAULT_PERCENTILES, DIRECTIONS  # noqa: PLC0415
    from fiomon.offline.compare.model import CompareOptions  # noqa: PLC0415
    from fiomon.offline.quanta import QuantaOptions  # noqa: PLC0415

    align, quantum = _check_flags(args)
    if baseline.source.latency != candidate.source.latency:
        msg = (
            f"the baseline's logs hold {baseline.source.latency}, the candidate's "
            f"{candidate.source.latency}: compare one latency (--latency)"
        )
        raise UsageError([msg])
    quanta = QuantaOptions(
        quantum_ms=quantum,
        align=align,
        percentiles=args.percentiles or DEFAULT_PERCENTILES,
        directions=args.directions or DIRECTIONS,
        per_host=args.per_host,
        host_from=args.host_from,
        confidence_level=args.confidence_level,
        workers=args.jobs,
        source=baseline.source,
    )
    return CompareOptions(
        quanta=quanta, window_ms=args.window, shift_ms=args.shift, align_at=args.align_at
    )


def _check_flags(args: argparse.Namespace) -> tuple[Align, int]:
    """The quantum phase and length; --window and --shift checked against the quantum.

    Raises:
        UsageError: a bad --align, --window or --shift not a multiple of --quantum.
    """
    from fiomon import cli  # noqa: PLC0415 -- the CLI imports this module
    from fiomon.align import parse_align  # noqa: PLC0415
    from fiomon.errors import ConfigError  # noqa: PLC0415
    from fiomon.units import parse_duration_ms  # noqa: PLC0415

    try:
        align = parse_align(args.align)
    except ConfigError as exc:
        raise UsageError([str(exc)]) from None
    quantum: int = args.quantum or parse_duration_ms(cli.QUANTUM, what="--quantum")
    problems = [
        f"{flag} {value / 1000:g}s is not a multiple of --quantum {quantum / 1000:g}s"
        for flag, value in (("--window", args.window), ("--shift", args.shift))
        if value % quantum
    ]
    if problems:
        raise UsageError(problems)
    return align, quantum
