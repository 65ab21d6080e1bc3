"""``fiomon report``: percentiles over time from finished fio logs, written as they close.

The computing is :class:`fiomon.offline.quanta.QuantaReader`, or for fio's per-I/O latency
logs :class:`fiomon.offline.exact.ExactReader` (exact values; library users:
:func:`fiomon.offline.quanta.iter_quanta`); this module picks the writer, shows a progress
line for large inputs and reports the files' problems.

Quanta files (an aggregator's or root's closed-quantum JSON lines, recognised by content)
are read back instead (:mod:`fiomon.offline.quantafiles`): their rows, each key at its
highest revision, go to the same writers.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from fiomon.bins import BinLayout
from fiomon.errors import FiomonError
from fiomon.fio.problems import ProblemLog
from fiomon.offline.exact import AVERAGED_NOTE, open_reader
from fiomon.offline.output import (
    CsvWriter,
    FiologparserWriter,
    Format,
    JsonlWriter,
    RowWriter,
    TableWriter,
)
from fiomon.offline.quanta import QuantaOptions, file_selection
from fiomon.offline.quantafiles import FileRow, Selection, all_quanta_files, resolve_rows

PROGRESS_MIN_BYTES = 32 << 20

# Builds the consumer of closed rows once the layout and the time kind are known:
# ``(layout, relative) -> writer``; rows then carry their cluster histograms (``hist``).
WriterFactory = Callable[[BinLayout, bool], RowWriter]


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """How ``fiomon report`` writes the rows (what it computes is :class:`QuantaOptions`).

    Args:
        fmt: ``table``, ``csv``, ``jsonl`` or ``fiologparser``.
        directions_given: ``--directions`` was given (fiologparser then has a dir column).
        show_ci: the table shows the confidence intervals (csv and jsonl always do).
        progress: show a progress line on ``err``; ``None``: when it is a terminal and
            the input is large.
        rows: what to print of quanta files (the command line knows which options were
            given); ``None``: derived from the :class:`QuantaOptions` (every percentile
            and the quantum as they say).
    """

    fmt: Format = "table"
    directions_given: bool = False
    show_ci: bool = False
    progress: bool | None = None
    rows: Selection | None = None


@dataclass(slots=True)
class ReportSummary:
    """What a report run saw."""

    files: int = 0
    records: int = 0
    rows: int = 0
    quanta: int = 0
    phase_ms: int = 0
    late_records: int = 0
    problems: ProblemLog | None = None


class _Progress:
    def __init__(self, err: TextIO, total: int, enabled: bool) -> None:
        self.err, self.total, self.enabled = err, total, enabled
        self.t0 = time.monotonic()
        self.last = 0.0
        self.tty = err.isatty()

    def update(self, done: int, rows: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self.last < (0.2 if self.tty else 2.0):
            return
        self.last = now
        line = (
            f"fiomon report: {done / 1e6:.0f}/{self.total / 1e6:.0f} MB read, "
            f"{rows} quanta written, {now - self.t0:.1f} s"
        )
        self.err.write(("\r" + line) if self.tty else (line + "\n"))
        self.err.flush()

    def end(self) -> None:
        if self.enabled and self.tty:
            self.err.write("\n")


def _writer(
    q: QuantaOptions, opts: ReportOptions, out: TextIO, relative: bool, unit_ns: int
) -> RowWriter:
    spans = q.target_error is not None
    if opts.fmt == "jsonl":
        return JsonlWriter(out)
    if opts.fmt == "csv":
        return CsvWriter(out, q.percentiles, spans=spans, relative=relative, latency=q.latency)
    if opts.fmt == "fiologparser":
        return FiologparserWriter(
            out, q.percentiles, with_dir=opts.directions_given, unit_ns=unit_ns
        )
    return TableWriter(
        out,
        q.percentiles,
        relative=relative,
        show_host=q.per_host,
        ci_level=q.confidence_level if opts.show_ci else None,
        spans=spans,
        latency=q.latency,
    )


def run_report(
    paths: Sequence[Path],
    quanta: QuantaOptions,
    out: TextIO,
    err: TextIO = sys.stderr,
    *,
    opts: ReportOptions | None = None,
    sink: WriterFactory | None = None,
) -> ReportSummary:
    """Write the report of ``paths`` to ``out``; problems and progress go to ``err``.

    With ``sink``, the closed rows go to the writer it builds instead of a text format
    (``fiomon plot``), with the cluster rows' merged histograms attached.

    Raises:
        FiomonError: nothing could be read, layouts cannot be merged, or epoch and
            relative inputs are mixed (and, with strict parsing, the first bad line).
    """
    opts = opts or ReportOptions()
    if all_quanta_files(paths):
        return _report_rows(paths, quanta, out, err, opts=opts, sink=sink)
    if sink is not None:
        # plot draws the cluster rows' histograms.
        quanta = dataclasses.replace(quanta, keep_hists=True)
    reader = open_reader(paths, quanta)
    if getattr(reader, "averaged", False):
        # fio's averaged logs hold one mean (or max) per window: no percentiles.
        if quanta.target_error is not None:
            msg = "--target-error needs percentiles, which averaged latency logs cannot give"
            raise FiomonError(msg)
        err.write("fiomon: note: " + AVERAGED_NOTE.format(files=len(paths)) + "\n")
        quanta = dataclasses.replace(quanta, percentiles=())
    show = (
        opts.progress
        if opts.progress is not None
        else (err.isatty() and reader.total_bytes >= PROGRESS_MIN_BYTES)
    )
    progress = _Progress(err, reader.total_bytes, show)
    summary = ReportSummary(files=len(reader.sources))
    try:
        with reader:
            summary.phase_ms = reader.phase_ms
            writer = (
                sink(reader.layout, reader.relative)
                if sink
                else _writer(quanta, opts, out, reader.relative, reader.layout.unit_ns)
            )
            for rows in reader.chunks():
                if rows:
                    writer.write(rows)
                    summary.rows += len(rows)
                    summary.quanta += len({r.end_ms for r in rows})
                progress.update(reader.bytes_read, summary.rows)
            writer.close()
            summary.records = reader.records
            summary.late_records = reader.late_records
            progress.update(reader.bytes_read, summary.rows, force=True)
    finally:
        progress.end()
        # Problems are shown even when the report fails: they usually say why.
        log = reader.problems()
        summary.problems = log
        log.write_to(err)
        if summary.late_records:
            err.write(
                f"fiomon: warning: {summary.late_records} records reached quanta that had "
                "already closed and are not in the report (a file's records are out of time "
                "order by more than two intervals)\n"
            )
    return summary


def _report_rows(
    paths: Sequence[Path],
    quanta: QuantaOptions,
    out: TextIO,
    err: TextIO,
    *,
    opts: ReportOptions,
    sink: WriterFactory | None,
) -> ReportSummary:
    """:func:`run_report` of quanta files: their resolved rows, written as they are.

    ``--format jsonl`` writes each row's line as the file holds it (a file read back
    prints itself, less the publications a later revision replaced).
    """
    got, rows = resolve_rows(paths, opts.rows or file_selection(quanta))
    for warning in got.warnings:
        err.write(f"fiomon: warning: {warning}\n")
    if quanta.run is not None:  # --run: only the rows that hold records of that run
        chosen = [f for f in rows if quanta.run in f.row.runs]
        if rows and not chosen:  # a misspelt run is no empty report (nor a 1970 chart)
            runs = {r for f in got.rows for r in f.row.runs}
            held = ", ".join(sorted(runs)) or "none (its rows carry no run labels)"
            names = ", ".join(str(p) for p in paths)
            msg = f"{names}: no row holds records of run {quanta.run!r}; its runs: {held}"
            raise FiomonError(msg)
        rows = chosen
    if opts.rows is not None and opts.rows.percentiles is None:
        quanta = dataclasses.replace(quanta, percentiles=tuple(map(float, got.percentiles)))
    summary = ReportSummary(
        files=len(paths),
        records=got.lines,
        rows=len(rows),
        quanta=len({f.row.end_ms for f in rows}),
    )
    if sink is not None:
        writer = sink(BinLayout(), got.relative)  # no histograms: the charts draw no heat
    elif opts.fmt == "jsonl":
        out.write("".join(f.line for f in rows))
        return summary
    else:
        # Latencies in ns: the file's rows are, whatever the fio logs' unit was.
        writer = _writer(quanta, opts, out, got.relative, 1)
    _write_all(writer, rows)
    return summary


def _write_all(writer: RowWriter, rows: list[FileRow]) -> None:
    step = 4096  # writers take batches; one list of a long run's rows at once is fine too
    for i in range(0, len(rows), step):
        writer.write([f.row for f in rows[i : i + step]])
    writer.close()
