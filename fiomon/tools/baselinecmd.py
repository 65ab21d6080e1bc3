"""``fiomon baseline``: suggested SLA rules from a healthy baseline run's logs or quanta file.

Reads what ``fiomon report`` reads (fio hist logs and json+ streams, or an aggregator's
quanta file), computes the run's quanta as the aggregator would, and prints ``sla:``
rules whose thresholds are ``--margin`` times the highest percentile the baseline held
for ``--for`` quanta in a row (:mod:`fiomon.offline.baseline`).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from fiomon.errors import FiomonError, UsageError

if TYPE_CHECKING:
    from fiomon.closed import ClosedQuantum

    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

BASELINE_DIRECTIONS = ("read", "write", "trim", "mixed")

EPILOG = """\
how to use it:
  1. run the benchmark once on a healthy cluster, as the real runs will be (same jobs,
     block sizes, queue depths, file sizes: a page-cache run is not a disk run);
  2. fiomon baseline on its logs (or on the aggregator's quanta file of that run), with
     the aggregator's quantum;
  3. paste the rules under sla: in aggregator.yaml; fiomon check-config; SIGHUP the
     aggregator (it reloads sla).

examples:
  fiomon baseline results/*/*_clat_hist.*.log
  fiomon baseline --margin 1.5 --per-host /var/lib/fiomon-aggregator/quanta.jsonl*
"""


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    """``fiomon baseline``."""
    from fiomon import cli  # noqa: PLC0415 -- the CLI imports this module

    p = sub.add_parser(
        "baseline",
        help="suggest SLA rules from a healthy baseline run (thresholds it never held)",
        description="Print sla: rules for aggregator.yaml from a baseline run: per "
        "direction and percentile, the highest value the run held for --for quanta in a "
        "row (quanta under --min-samples I/Os are no evidence, as in a rule), times "
        "--margin. A rule at or above that never fires on the baseline itself.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cli._add_input_options(p)
    p.add_argument(
        "--quantum",
        type=cli._duration("--quantum"),
        default=None,
        help=f"the aggregator's quantum (default {cli.QUANTUM}, or a quanta file's own)",
    )
    p.add_argument(
        "--align", default="auto", help="quantum phase, as the aggregator's align (default auto)"
    )
    p.add_argument(
        "--percentiles",
        type=cli._percentiles,
        default=(99.0,),
        metavar="P[,P]",
        help="the rules' percentiles (default 99; each must be one the aggregator computes)",
    )
    p.add_argument(
        "--margin",
        type=_margin,
        default=2.0,
        metavar="X",
        help="threshold = X times the sustained worst (default 2; at least 1)",
    )
    p.add_argument(
        "--for",
        dest="for_quanta",
        type=cli._int_in("--for", 1),
        default=3,
        metavar="N",
        help="the rules' for: consecutive breaching quanta before one fires (default 3)",
    )
    p.add_argument(
        "--min-samples",
        type=cli._int_in("--min-samples", 0),
        default=100,
        metavar="N",
        help="the rules' min_samples: quanta with fewer I/Os are no evidence (default 100)",
    )
    p.add_argument("--per-host", action="store_true", help="also a scope: host rule per direction")
    p.add_argument(
        "--run",
        default=None,
        metavar="NAME",
        type=cli._run_name,
        help="of a quanta file (which holds every run the aggregator saw), only the rows "
        "holding records of run NAME: the baseline run alone",
    )
    return p


def _margin(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1.0 or value == float("inf"):
        msg = f"--margin: expected a number of at least 1, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def run(args: argparse.Namespace) -> int:
    """Print the suggested rules; notes (directions without enough quanta) on stderr."""
    from fiomon import cli  # noqa: PLC0415 -- the CLI imports this module
    from fiomon.align import parse_align  # noqa: PLC0415
    from fiomon.errors import ConfigError  # noqa: PLC0415
    from fiomon.offline.baseline import baselines, suggest_rules  # noqa: PLC0415
    from fiomon.offline.quanta import QuantaOptions, iter_quanta  # noqa: PLC0415
    from fiomon.offline.quantafiles import (  # noqa: PLC0415
        Selection,
        all_quanta_files,
        resolve_rows,
    )
    from fiomon.units import parse_duration_ms  # noqa: PLC0415

    directions = args.directions or BASELINE_DIRECTIONS
    try:
        align = parse_align(args.align)
    except ConfigError as exc:
        raise UsageError([str(exc)]) from None
    rows: list[ClosedQuantum]
    latency = "clat"  # a quanta file's rows do not say theirs
    try:
        if all_quanta_files(args.logs):
            select = Selection(args.percentiles, directions, args.per_host, args.quantum)
            got, picked = resolve_rows(args.logs, select)
            if args.run is not None:
                runs = sorted({r for f in got.rows for r in f.row.runs})
                picked = [f for f in picked if args.run in f.row.runs]
                if not picked:
                    held = ", ".join(runs) or "none (its rows carry no run labels)"
                    print(
                        f"fiomon baseline: no row holds records of run {args.run!r}; its "
                        f"runs: {held}",
                        file=sys.stderr,
                    )
                    return 1
            rows, quantum = [f.row for f in picked], args.quantum or got.quantum_ms
        else:
            if args.run is not None:
                raise UsageError(["--run selects a quanta file's rows; fio output has no runs"])
            paths, source = cli._read_inputs(args, "baseline")
            latency = source.latency
            quantum = args.quantum or parse_duration_ms(cli.QUANTUM, what="--quantum")
            opts = QuantaOptions(
                quantum_ms=quantum,
                align=align,
                percentiles=args.percentiles,
                directions=directions,
                per_host=args.per_host,
                host_from=args.host_from,
                source=source,
            )
            rows = list(iter_quanta(paths, opts))
    except UsageError:
        raise  # the command line's: fiomon prints it and exits 2
    except FiomonError as exc:
        print(f"fiomon baseline: {exc}", file=sys.stderr)
        return 1
    found = baselines(
        rows, args.percentiles, for_quanta=args.for_quanta, min_samples=args.min_samples
    )
    if not found:  # an idle run (or none of --directions): say so, not a bare "sla: []"
        where = f"in the directions {','.join(directions)}"
        why = (
            f"no I/O {where} (an idle run)"
            if not any(r.stats.samples for r in rows)
            else f"no quantum {where} has --min-samples {args.min_samples} I/Os"
        )
        print(f"fiomon baseline: {why}: no rule", file=sys.stderr)
    span = (min(r.start_ms for r in rows), max(r.end_ms for r in rows)) if rows else None
    text, notes = suggest_rules(
        found,
        margin=args.margin,
        for_quanta=args.for_quanta,
        min_samples=args.min_samples,
        quantum_ms=quantum,
        span_ms=span,
    )
    for note in notes:
        print(f"fiomon baseline: {note}", file=sys.stderr)
    if latency != "clat":  # thresholds of another latency hold only where it is measured
        print(
            f"# thresholds of fio's {latency} (--latency): set the aggregator's latency: {latency}"
        )
    print(text, end="")
    return 0 if "  - {" in text else 1
