"""Closed quanta from finished fio output files: the offline engine, without any output.

Files are read in chunks, in step by time: the file whose records lag furthest is read
next, and every quantum that ends before all files' progress (minus each file's slack) is
closed at once. Memory therefore depends on the chunk size, the number of files and the
time skew between them, not on the length of the run. Parsing runs on a small thread pool
(numpy releases the GIL in the heavy passes); merging stays on one thread.

With ``align: auto`` the phase is chosen from the first chunk of every file, which holds
hundreds of records each: fio keeps a stable phase per job, so that is representative.

:func:`iter_quanta` is the library entry point; ``fiomon report`` (:mod:`.report`) and
``fiomon fit --per-quantum`` are writers over :class:`QuantaReader`, which also says what
the run saw (layout, time kind, phase, records, late records, problems).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from fiomon.align import Align, phase_for, phase_from
from fiomon.bins import BinLayout, merged_layout
from fiomon.closed import ClosedQuantum
from fiomon.confidence import DEFAULT_LEVEL
from fiomon.engine import PreparedBatch, QuantumEngine
from fiomon.errors import FiomonError, LayoutError
from fiomon.fio.problems import ProblemLog
from fiomon.model import DEFAULT_PERCENTILES, DIRECTIONS, LatencyKind, RecordBatch
from fiomon.offline.quantafiles import Selection, all_quanta_files, resolve_rows
from fiomon.offline.sources import (
    REFUSED,
    FileSource,
    SourceOptions,
    check_one_clock,
    check_refusals,
    host_labels,
)
from fiomon.offline.spans import SpanMerger


@dataclass(frozen=True, slots=True)
class QuantaOptions:
    """What to compute from the files (see ``fiomon report --help``; no output settings).

    Args:
        quantum_ms: quantum length, ms.
        align: quantum phase (``auto``, ``epoch`` or an offset).
        percentiles: the percentiles of every row, in percent.
        directions: the direction rows (``read``, ``write``, ``trim``, ``all``).
        per_host: host rows too (hosts labelled by ``host_from``, see
            :func:`fiomon.offline.sources.host_labels`).
        host_from: how files get host labels.
        source: parsing options.
        confidence_level: of each percentile's confidence interval.
        target_error: merge quanta into spans until the ``target_percentile``'s relative
            half-width reaches it (:mod:`fiomon.offline.spans`); ``None``: plain quanta.
        target_percentile: see ``target_error``.
        max_span_ms: longest span (reaching it is flagged in ``target_met``).
        workers: parsing threads; 0: one per core, at most 2, at most one per file.
        keep_hists: keep each cluster row's merged histogram (:attr:`ClosedQuantum.hist`).
        keep_host_hists: with ``keep_hists``, host rows keep theirs too (``fiomon compare``
            attributes a tail to hosts).
        run: ``--run``: fio output's rows carry this run label (:attr:`ClosedQuantum.runs`);
            a quanta file's rows are kept only when they name it.
        latency: the latency read (``--latency``); the rows do not carry it, the writers'
            headers say it. Given here or as ``source.latency``: the two agree.
        regrid: ``fiomon compare``'s windows: called once, when the reader opens, with the
            start (ms) of the run's first quantum (of ``quantum_ms``, at the phase ``align``
            gives) and whether its stamps are relative; returns the ``(quantum_ms,
            phase_ms)`` the rows are closed in instead. ``None``: ``quantum_ms`` and the
            phase.
    """

    quantum_ms: int = 1000
    align: Align = "auto"
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    directions: tuple[str, ...] = DIRECTIONS
    per_host: bool = False
    host_from: str = "auto"
    source: SourceOptions = field(default_factory=SourceOptions)
    confidence_level: float = DEFAULT_LEVEL
    target_error: float | None = None
    target_percentile: float = 99.0
    max_span_ms: int = 60_000
    workers: int = 0
    keep_hists: bool = False
    keep_host_hists: bool = False
    run: str | None = None
    latency: LatencyKind = "clat"
    regrid: Callable[[int, bool], tuple[int, int]] | None = None

    def __post_init__(self) -> None:
        """Make ``latency`` and ``source.latency`` one (either may be given).

        Raises:
            ValueError: both are given and differ.
        """
        if self.latency == self.source.latency:
            return
        if self.source.latency == "clat":
            object.__setattr__(
                self, "source", dataclasses.replace(self.source, latency=self.latency)
            )
        elif self.latency == "clat":
            object.__setattr__(self, "latency", self.source.latency)
        else:
            msg = f"latency {self.latency!r} differs from source.latency {self.source.latency!r}"
            raise ValueError(msg)


def iter_quanta(
    paths: Sequence[Path], options: QuantaOptions | None = None, problems: ProblemLog | None = None
) -> Iterator[ClosedQuantum]:
    """The closed quanta of fio hist logs / json+ outputs ``paths``, in time order.

    The same rows as ``fiomon report --format jsonl`` (each row's :meth:`ClosedQuantum.to_json`
    is that line). The files' problems (bad lines, ...) are merged into ``problems`` when
    given, also when the run fails.

    Quanta files (closed-quantum JSON lines, :mod:`fiomon.offline.quantafiles`) give their
    rows back, per key the highest revision, with the ``options``' directions, host rows
    and percentiles (each must be in the rows); options that need histograms (another
    quantum, ``align``, ``target_error``) are refused.

    Raises:
        FiomonError: a file is missing, nothing could be read, layouts cannot be merged,
            epoch and relative inputs are mixed, or quanta files and fio output are mixed.
        ParseError: with ``source.strict``, the first bad line.
    """
    opts = options or QuantaOptions()
    if all_quanta_files(paths):
        yield from _file_rows(paths, opts)
        return
    from fiomon.offline.exact import open_reader  # noqa: PLC0415 -- exact imports this module

    reader = open_reader(paths, opts)
    try:
        with reader:
            for rows in reader.chunks():
                yield from rows
    finally:
        if problems is not None:
            problems.merge(reader.problems())


class QuantaReader:
    """One offline run over ``paths``: a context manager whose :meth:`chunks` close quanta.

    Opening (``with``) reads the first chunk of every file and fixes :attr:`layout`,
    :attr:`relative` and :attr:`phase_ms`; leaving closes the files and the thread pool.

    Raises:
        FiomonError: at construction, a path is not a readable file; at opening, nothing
            could be read, the layouts cannot be merged or time kinds are mixed.
        InputError: at opening (or at the end), a file is fio output without readable
            histograms (plain json, a lat log, ...).
    """

    def __init__(self, paths: Sequence[Path], options: QuantaOptions) -> None:
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            msg = f"not a readable file: {', '.join(missing)}"
            raise FiomonError(msg)
        self.options = options
        hosts = (
            host_labels(list(paths), options.host_from) if options.per_host else [""] * len(paths)
        )
        self.sources: list[FileSource] = []
        try:
            for p, h in zip(paths, hosts, strict=True):
                self.sources.append(FileSource(p, h, options.source))
        except BaseException:
            self._close_sources()
            raise
        self.total_bytes = sum(s.size for s in self.sources)
        self.workers = options.workers or min(2, os.cpu_count() or 1, len(self.sources)) or 1
        self.layout = BinLayout()
        self.relative = False
        self.phase_ms = 0
        self.quantum_ms = options.quantum_ms  # the rows' (see QuantaOptions.regrid)
        self.records = 0
        self.late_records = 0
        self._pool: ThreadPoolExecutor | None = None
        self._engine: QuantumEngine | None = None
        self._merger: SpanMerger | None = None

    @property
    def bytes_read(self) -> int:
        """Bytes of input parsed so far."""
        return sum(s.bytes_read for s in self.sources)

    def problems(self) -> ProblemLog:
        """The problems every file met so far, merged."""
        log = ProblemLog()
        for s in self.sources:
            log.merge(s.problems, exclude=REFUSED)
        return log

    def __enter__(self) -> QuantaReader:
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="fiomon-parse")
        try:
            self._open(self._pool)
        except BaseException:
            self._shutdown()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)  # a worker may still be parsing a chunk
            self._pool = None
        self._close_sources()

    def _close_sources(self) -> None:
        for s in self.sources:
            s.close()

    def _open(self, pool: ThreadPoolExecutor) -> None:
        opts = self.options
        # First chunk of every file: layouts, time kinds and (for auto) the phase.
        first: dict[FileSource, list[RecordBatch]] = {s: [] for s in self.sources}
        for s, batch in zip(self.sources, pool.map(_first_batch, self.sources), strict=True):
            if batch is not None and len(batch):
                first[s].append(batch)
        check_refusals(self.sources)
        self.layout = _common_layout(self.sources)
        kinds = {s.name: s.time_kind for s in self.sources if s.time_kind is not None}
        check_one_clock(kinds)
        self.relative = "relative" in kinds.values()
        phase = phase_for(opts.align, opts.quantum_ms)
        if phase is None:
            phase = phase_from([b for bs in first.values() for b in bs], opts.quantum_ms)
        if opts.regrid is not None:
            starts = [int(b.start_ms.min()) for bs in first.values() for b in bs if len(b)]
            q = opts.quantum_ms
            first_q = phase + (min(starts, default=phase) - phase) // q * q
            self.quantum_ms, phase = opts.regrid(first_q, self.relative)
        self.phase_ms = phase
        self._engine = QuantumEngine(
            layout=self.layout,
            quantum_ms=self.quantum_ms,
            phase_ms=phase,
            percentiles=opts.percentiles,
            directions=opts.directions,
            per_host=opts.per_host,
            confidence_level=opts.confidence_level,
            # Spans are merged from each quantum's histogram.
            keep_hists=opts.keep_hists or opts.target_error is not None,
            keep_host_hists=opts.target_error is not None
            or (opts.keep_hists and opts.keep_host_hists),
        )
        self._merger = (
            None
            if opts.target_error is None
            else SpanMerger(
                layout=self.layout,
                percentiles=opts.percentiles,
                target_percentile=opts.target_percentile,
                target=opts.target_error,
                max_span_ms=opts.max_span_ms,
                level=opts.confidence_level,
            )
        )
        for bs in first.values():
            for b in bs:
                self._engine.add(b)

    def chunks(self) -> Iterator[list[ClosedQuantum]]:
        """The closed rows, one list per parsed chunk (often empty: a progress tick).

        Call once, inside ``with``. :attr:`records` and :attr:`late_records` are final
        once it is exhausted.
        """
        engine, pool, merger = self._engine, self._pool, self._merger
        if engine is None or pool is None:
            msg = "QuantaReader.chunks() outside its with block"
            raise RuntimeError(msg)
        quantum_ms = self.quantum_ms

        run = self.options.run

        def spans(rows: list[ClosedQuantum], *, last: bool = False) -> list[ClosedQuantum]:
            if merger is not None:
                rows = merger.add(rows) + (merger.flush() if last else [])
            if run is not None:
                rows = [dataclasses.replace(r, runs=(run,)) for r in rows]
            return rows

        # Closing follows what the main thread has merged, never what a worker has read: a
        # worker updates its source while its batch is still in flight, so the marks come
        # from snapshots taken when each batch is merged.
        seen: dict[FileSource, _Step] = {s: _Step.of(s, None) for s in self.sources}
        in_flight: dict[Future[_Step], FileSource] = {}
        while True:
            busy = set(in_flight.values())
            idle = sorted(
                (s for s in self.sources if not s.done and s not in busy),
                key=lambda s: -1 if s.max_end_ms is None else s.max_end_ms,
            )
            for s in idle[: max(0, self.workers - len(in_flight))]:
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
            rows: list[ClosedQuantum] = []
            if live and all(st.max_end_ms is not None for st in live):
                mark = min(int(st.max_end_ms or 0) - st.slack_ms for st in live)
                rows = spans(engine.close_through(mark - quantum_ms))
            yield rows
        check_refusals(self.sources)  # a file found out late (records, then none readable)
        last = spans(engine.flush(), last=True)
        self.records = engine.records
        self.late_records = sum(engine.late_records.values())
        yield last


def file_selection(opts: QuantaOptions) -> Selection:
    """What ``opts`` ask of quanta files: every option as given (none was "left out")."""
    other = {}
    if opts.align != "auto":
        other["align"] = "the phase of quanta is fixed when they close"
    if opts.target_error is not None:
        other["target_error"] = "spans merge the quanta's histograms"
    return Selection(opts.percentiles, opts.directions, opts.per_host, opts.quantum_ms, other)


def _file_rows(paths: Sequence[Path], opts: QuantaOptions) -> Iterator[ClosedQuantum]:
    """:func:`iter_quanta` of quanta files."""
    _, rows = resolve_rows(paths, file_selection(opts))
    for f in rows:
        if opts.run is None or opts.run in f.row.runs:
            yield f.row


def _common_layout(sources: Sequence[FileSource]) -> BinLayout:
    """The layout all files' histograms merge into exactly.

    Raises:
        FiomonError: no file held a histogram record.
        LayoutError: two files' layouts cannot merge.
    """
    layouts = {s.name: s.layout for s in sources if s.layout is not None}
    if not layouts:
        msg = "no input file held a readable histogram record"
        raise FiomonError(msg)
    try:
        return functools.reduce(merged_layout, layouts.values())
    except LayoutError:
        listing = "; ".join(f"{n}: {lay.describe()}" for n, lay in layouts.items())
        msg = f"input files have incompatible bin layouts (cannot merge exactly): {listing}"
        raise LayoutError(msg) from None


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
