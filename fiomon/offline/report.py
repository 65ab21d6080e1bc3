"""``fiomon report``: percentiles over time from finished fio logs.

Files are read in chunks, in step by time: the file whose records lag furthest is read
next, and every quantum that ends before all files' progress (minus each file's slack) is
closed and written at once. Memory therefore depends on the chunk size, the number of files
and the time skew between them, not on the length of the run. Parsing runs on a small
thread pool (numpy releases the GIL in the heavy passes); merging stays on one thread.

With ``align: auto`` the phase is chosen from the first chunk of every file, which holds
hundreds of records each: fio keeps a stable phase per job, so that is representative.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from fiomon.align import Align, auto_phase, phase_for
from fiomon.bins import BinLayout
from fiomon.confidence import DEFAULT_LEVEL
from fiomon.errors import FiomonError, LayoutError
from fiomon.model import RecordBatch
from fiomon.offline.output import (
    CsvWriter,
    FiologparserWriter,
    Format,
    JsonlWriter,
    RowWriter,
    TableWriter,
)
from fiomon.offline.sources import FileSource, SourceOptions, host_labels
from fiomon.offline.spans import SpanMerger
from fiomon.problems import ProblemLog
from fiomon.windows import ALL_DIRECTIONS, ClosedQuantum, PreparedBatch, QuantumEngine

PROGRESS_MIN_BYTES = 32 << 20

# Builds the consumer of closed rows once the layout and the time kind are known:
# ``(layout, relative) -> writer``; rows then carry their cluster histograms (``hist``).
WriterFactory = Callable[[BinLayout, bool], RowWriter]


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """Options of ``fiomon report`` (see ``fiomon report --help``)."""

    quantum_ms: int = 1000
    align: Align = "auto"
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)
    directions: tuple[str, ...] = ALL_DIRECTIONS
    directions_given: bool = False
    per_host: bool = False
    host_from: str = "auto"  # --host-from: how files get host labels (sources.host_labels)
    fmt: Format = "table"
    source: SourceOptions = field(default_factory=SourceOptions)
    confidence_level: float = DEFAULT_LEVEL  # of each percentile's confidence interval
    show_ci: bool = False  # --ci: the table shows the intervals (csv and jsonl always do)
    target_error: float | None = None  # --target-error: merge quanta into spans (spans.py)
    target_percentile: float = 99.0  # whose relative half-width must reach target_error
    max_span_ms: int = 60_000  # --max-span: longest span (reaching it is flagged)
    workers: int = 0  # 0: one per core, at most 2 per file pair
    progress: bool | None = None  # None: when stderr is a terminal and input is large


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


def _writer(opts: ReportOptions, out: TextIO, relative: bool, unit_ns: int) -> RowWriter:
    spans = opts.target_error is not None
    if opts.fmt == "jsonl":
        return JsonlWriter(out)
    if opts.fmt == "csv":
        return CsvWriter(out, opts.percentiles, spans=spans)
    if opts.fmt == "fiologparser":
        return FiologparserWriter(
            out, opts.percentiles, with_dir=opts.directions_given, unit_ns=unit_ns
        )
    return TableWriter(
        out,
        opts.percentiles,
        relative=relative,
        show_host=opts.per_host,
        ci_level=opts.confidence_level if opts.show_ci else None,
        spans=spans,
    )


def _common_layout(sources: Sequence[FileSource]) -> BinLayout:
    layouts = {s.name: s.layout for s in sources if s.layout is not None}
    if not layouts:
        msg = "no input file held a readable histogram record"
        raise FiomonError(msg)
    base = next(iter(layouts.values()))
    odd = [
        n for n, lay in layouts.items() if lay.group_nr != base.group_nr or lay.unit != base.unit
    ]
    if odd:
        listing = "; ".join(f"{n}: {lay.describe()}" for n, lay in layouts.items())
        msg = f"input files have incompatible bin layouts (cannot merge exactly): {listing}"
        raise LayoutError(msg)
    return BinLayout(base.group_nr, max(lay.coarseness for lay in layouts.values()), base.unit)


def run_report(
    paths: Sequence[Path],
    opts: ReportOptions,
    out: TextIO,
    err: TextIO = sys.stderr,
    *,
    sink: WriterFactory | None = None,
) -> ReportSummary:
    """Write the report of ``paths`` to ``out``; problems and progress go to ``err``.

    With ``sink``, the closed rows go to the writer it builds instead of a text format
    (``fiomon plot``), with the cluster rows' merged histograms attached.

    Raises:
        FiomonError: nothing could be read, layouts cannot be merged, or epoch and
            relative inputs are mixed (and, with strict parsing, the first bad line).
    """
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        msg = f"not a readable file: {', '.join(missing)}"
        raise FiomonError(msg)
    hosts = host_labels(list(paths), opts.host_from) if opts.per_host else [""] * len(paths)
    sources = [FileSource(p, h, opts.source) for p, h in zip(paths, hosts, strict=True)]
    total = sum(s.size for s in sources)
    show = (
        opts.progress
        if opts.progress is not None
        else (err.isatty() and total >= PROGRESS_MIN_BYTES)
    )
    progress = _Progress(err, total, show)
    workers = opts.workers or min(2, os.cpu_count() or 1, len(sources)) or 1
    summary = ReportSummary(files=len(sources))
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fiomon-parse") as pool:
            summary = _run(
                sources=sources,
                opts=opts,
                out=out,
                pool=pool,
                workers=workers,
                progress=progress,
                summary=summary,
                sink=sink,
            )
    finally:
        for s in sources:
            s.close()
        progress.end()
        # Problems are shown even when the report fails: they usually say why.
        log = ProblemLog()
        for s in sources:
            log.merge(s.problems)
        summary.problems = log
        log.write_to(err)
        if summary.late_records:
            err.write(
                f"fiomon: warning: {summary.late_records} records reached quanta that had "
                "already closed and are not in the report (a file's records are out of time "
                "order by more than two intervals)\n"
            )
    return summary


def _run(
    *,
    sources: list[FileSource],
    opts: ReportOptions,
    out: TextIO,
    pool: ThreadPoolExecutor,
    workers: int,
    progress: _Progress,
    summary: ReportSummary,
    sink: WriterFactory | None,
) -> ReportSummary:
    # First chunk of every file: layouts, time kinds and (for auto) the phase.
    first: dict[FileSource, list[RecordBatch]] = {s: [] for s in sources}
    for s, batch in zip(sources, pool.map(_first_batch, sources), strict=True):
        if batch is not None and len(batch):
            first[s].append(batch)
    layout = _common_layout(sources)
    kinds = {s.name: s.time_kind for s in sources if s.time_kind is not None}
    if len(set(kinds.values())) > 1:
        listing = ", ".join(f"{n} ({k})" for n, k in kinds.items())
        msg = (
            f"cannot mix epoch-stamped and relative-time inputs: {listing}; re-run fio "
            "with log_unix_epoch=1 or report them separately"
        )
        raise FiomonError(msg)
    relative = "relative" in kinds.values()
    phase = phase_for(opts.align, opts.quantum_ms)
    if phase is None:
        batches = [b for bs in first.values() for b in bs]
        ends = np.concatenate([b.end_ms for b in batches]) if batches else np.zeros(0, np.int64)
        weights = (
            np.concatenate([b.samples() for b in batches]).astype(np.float64)
            if batches
            else np.zeros(0)
        )
        phase = auto_phase(ends, weights, opts.quantum_ms)
    summary.phase_ms = phase
    engine = QuantumEngine(
        layout=layout,
        quantum_ms=opts.quantum_ms,
        phase_ms=phase,
        percentiles=opts.percentiles,
        directions=opts.directions,
        per_host=opts.per_host,
        confidence_level=opts.confidence_level,
        # Spans are merged from each quantum's histogram, and plot draws the cluster ones.
        keep_hists=sink is not None or opts.target_error is not None,
        keep_host_hists=opts.target_error is not None,
    )
    merger = (
        None
        if opts.target_error is None
        else SpanMerger(
            layout=layout,
            percentiles=opts.percentiles,
            target_percentile=opts.target_percentile,
            target=opts.target_error,
            max_span_ms=opts.max_span_ms,
            level=opts.confidence_level,
        )
    )
    writer = sink(layout, relative) if sink else _writer(opts, out, relative, layout.unit_ns)
    for bs in first.values():
        for b in bs:
            engine.add(b)
    del first

    def emit(rows: list[ClosedQuantum], *, last: bool = False) -> None:
        if merger is not None:
            rows = merger.add(rows) + (merger.flush() if last else [])
        if rows:
            writer.write(rows)
            summary.rows += len(rows)
            summary.quanta += len({r.end_ms for r in rows})

    # Closing follows what the main thread has merged, never what a worker has read: a
    # worker updates its source while its batch is still in flight, so the marks come from
    # snapshots taken when each batch is merged.
    seen: dict[FileSource, _Step] = {s: _Step.of(s, None) for s in sources}
    in_flight: dict[Future[_Step], FileSource] = {}
    while True:
        busy = set(in_flight.values())
        idle = sorted(
            (s for s in sources if not s.done and s not in busy),
            key=lambda s: -1 if s.max_end_ms is None else s.max_end_ms,
        )
        for s in idle[: max(0, workers - len(in_flight))]:
            in_flight[pool.submit(_step, s, engine)] = s
        if not in_flight:
            break
        finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
        for fut in finished:
            step = fut.result()
            seen[in_flight.pop(fut)] = step
            if step.prepared is not None:
                engine.commit(step.prepared)
        live = [st for st in seen.values() if not st.done]
        if live and all(st.max_end_ms is not None for st in live):
            mark = min(int(st.max_end_ms or 0) - st.slack_ms for st in live)
            emit(engine.close_through(mark - opts.quantum_ms))
        progress.update(sum(s.bytes_read for s in sources), summary.rows)
    emit(engine.flush(), last=True)
    writer.close()
    summary.records = engine.records
    summary.late_records = sum(engine.late_records.values())
    progress.update(sum(s.bytes_read for s in sources), summary.rows, force=True)
    return summary


@dataclass(frozen=True, slots=True)
class _Step:
    """A source's state right after one of its chunks was parsed (and the batch)."""

    prepared: PreparedBatch | None
    max_end_ms: int | None
    slack_ms: int
    done: bool

    @classmethod
    def of(cls, source: FileSource, prepared: PreparedBatch | None) -> _Step:
        return cls(prepared, source.max_end_ms, source.slack_ms, source.done)


def _step(source: FileSource, engine: QuantumEngine) -> _Step:
    """Worker: parse the next chunk and cut it into quanta (engine settings only)."""
    batch = source.next_batch()
    prepared = engine.prepare(batch) if batch is not None and len(batch) else None
    return _Step.of(source, prepared)


def _first_batch(source: FileSource) -> RecordBatch | None:
    """Read chunks until the file yields records or ends."""
    return next(source.batches(), None)
