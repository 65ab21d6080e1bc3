"""Exact closed quanta from fio's per-I/O latency logs (and mean/max from averaged logs).

A per-I/O log holds every I/O's latency, so a quantum's statistics need no histogram:

* ``samples`` = the lines in the quantum; ``min_ns``, ``mean_ns``, ``max_ns`` exact;
* ``percentiles_ns``: the nearest rank, fio's own rule: the p-th percentile of n values is
  ``x_(ceil(p n / 100))``, the smallest value with at least p % of the values at or below
  it (numpy's ``np.quantile(..., method="inverted_cdf")``); the rank is computed in exact
  integer arithmetic;
* ``percentiles_ci_ns``: the distribution-free order-statistic interval ``(x_(l), x_(u))``
  with the ranks of :func:`fiomon.confidence.rank_bounds` (the same level and rule as
  binned rows, on the values instead of bin edges; a side the data cannot bound is null);
* ``hist`` (when asked, for plots, fits and spans): the values binned in fio's layout;
* ``iops`` and ``bytes_per_second`` per second of the time the files cover within the
  quantum (the quantum, less the time before a file's first stamp or after its last).

Quanta are ``(phase + q Q, phase + (q + 1) Q]`` as for hist logs: an I/O stamped ``t`` ms
(fio stamps completions, truncated to ms) belongs to the quantum with ``start < t <= end``.
``align: auto`` starts the first quantum just before the earliest stamp.

fio writes each job's lines in completion order, so files are read in step, the one that
lags furthest first, and a quantum closes once every file still being read has passed its
end by one quantum (the slack for small disorder). Memory holds the values of the open
quanta only. A line that reaches a closed quantum is late: counted, not merged.

Averaged logs (``log_avg_msec > 0``) hold one mean (or, with ``log_max_value=1``, max) per
direction per window: their rows carry the lines as ``samples`` and the smallest, mean and
largest of the window values, and no percentiles (percentiles cannot come from averages).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt

from fiomon.align import phase_for
from fiomon.bins import BinLayout, plat_val_to_idx
from fiomon.closed import ClosedQuantum, Interval
from fiomon.confidence import rank_bounds
from fiomon.errors import FiomonError, InputError
from fiomon.fio.fiolog import time_kind_of
from fiomon.fio.iolog import IoChunk, IoLogReader, LogUnit, rate_log
from fiomon.fio.problems import ProblemLog
from fiomon.histogram import HistStats, nearest_rank, pct_key
from fiomon.model import DIRECTION_LABELS
from fiomon.offline.iosources import iolog_thread, is_iolog
from fiomon.offline.quanta import QuantaOptions, QuantaReader
from fiomon.offline.sources import REFUSED, check_one_clock, host_labels
from fiomon.offline.spans import SpanMerger

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
AVERAGED_NOTE = (
    "percentiles cannot come from averages: {files} averaged log(s) (log_avg_msec > 0) "
    "hold one mean (or, with log_max_value=1, max) per window; the rows give the smallest, "
    "mean and largest of those values and no percentiles (write_lat_log with "
    "log_avg_msec=0 writes one line per I/O)"
)
AVERAGED_NOT_PER_IO = (
    "an averaged log (fio's log_avg_msec > 0): one mean (or max) per window, not one "
    "value per I/O, so no distribution can be fitted to it; fio writes one line per I/O "
    "with log_avg_msec=0"
)


def _read(f: _File) -> tuple[IoChunk, int, int] | None:
    """Worker: a file's next chunk with its first and last stamps (None: at its end)."""
    chunk = next(f.chunks, None)
    if chunk is None:
        return None
    return chunk, int(chunk.time_ms.min()), int(chunk.time_ms.max())


@dataclass(slots=True)
class _File:
    """One log being read, and how far it got."""

    reader: IoLogReader
    host: int
    chunks: Iterator[IoChunk]
    first_ms: int | None = None
    max_ms: int | None = None
    done: bool = False


@dataclass(slots=True)
class _Quantum:
    """The lines of one open quantum, as the slices that arrived."""

    values: list[I64] = field(default_factory=list)
    ddirs: list[npt.NDArray[np.int8]] = field(default_factory=list)
    nbytes: list[F64] = field(default_factory=list)  # per slice, bytes per direction
    files: list[int] = field(default_factory=list)


class ExactReader:
    """One offline run over per-I/O (or averaged) latency logs, as :class:`QuantaReader`.

    The same surface as :class:`fiomon.offline.quanta.QuantaReader` (``with``, then
    :meth:`chunks`), so the report, plot and fit writers take either.

    Args:
        paths: the logs (one per job and host; a run's logs are all per-I/O or all
            averaged).
        options: what to compute (quantum, alignment, percentiles, directions, hosts).
        log_unit: unit of the values (``us`` for fio 2.x logs).

    Raises:
        FiomonError: a path is not a readable file; per-I/O and averaged logs mixed.
    """

    def __init__(
        self, paths: Sequence[Path], options: QuantaOptions, *, log_unit: LogUnit = "ns"
    ) -> None:
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            msg = f"not a readable file: {', '.join(missing)}"
            raise FiomonError(msg)
        self.options = options
        hosts = (
            host_labels(list(paths), options.host_from) if options.per_host else [""] * len(paths)
        )
        self.host_names: list[str] = list(dict.fromkeys(hosts))
        self.sources: list[_File] = []
        strict = options.source.strict
        for p, h in zip(paths, hosts, strict=True):
            # A log per reader: readers run on worker threads.
            r = IoLogReader(p, log_unit=log_unit, problems=ProblemLog(strict=strict))
            spans = [r.span]
            if iolog_thread(p) is None and r.refusal is None:
                # per_job_logs=0: fio appended each job's lines, its time starting again
                spans = r.time_spans(options.quantum_ms)
            for span in spans:
                if span != r.span:
                    log = ProblemLog(strict=strict)
                    r = IoLogReader(p, log_unit=log_unit, problems=log, span=span)
                self.sources.append(_File(r, self.host_names.index(h), r.chunks()))
        refused = {
            f.reader.source: f.reader.refusal for f in self.sources if f.reader.refusal is not None
        }
        if refused:
            raise InputError(refused)
        by_kind: dict[str, list[str]] = {}
        for f in self.sources:
            by_kind.setdefault(str(f.reader.kind), []).append(f.reader.source)
        if len(by_kind) > 1 or (by_kind and options.latency not in by_kind):
            listing = "; ".join(f"{k}: {', '.join(dict.fromkeys(v))}" for k, v in by_kind.items())
            msg = (
                f"per-I/O latency logs of another kind than --latency {options.latency} "
                f"(one kind a run; choose it with --latency clat|lat|slat): {listing}"
            )
            raise FiomonError(msg)
        kinds = {f.reader.averaged for f in self.sources if f.reader.columns}
        if len(kinds) > 1:
            listing = ", ".join(
                f"{f.reader.source} ({'averaged' if f.reader.averaged else 'per-I/O'})"
                for f in self.sources
            )
            msg = f"cannot mix per-I/O and averaged latency logs: {listing}; report them apart"
            raise FiomonError(msg)
        self.averaged = kinds == {True}
        self.total_bytes = sum(p.stat().st_size for p in paths)  # (spans: read again)
        self.layout = BinLayout()
        self.relative = False
        self.phase_ms = 0
        self.quantum_ms = options.quantum_ms  # the rows' (see QuantaOptions.regrid)
        self.records = 0
        self.late_records = 0
        self._open: dict[int, _Quantum] = {}
        self._closed_through: int | None = None  # every quantum <= this id is closed
        self._late: dict[int, int] = {}  # per host id, late lines since the last close
        self._merger: SpanMerger | None = None
        self._percentiles = () if self.averaged else options.percentiles

    @property
    def bytes_read(self) -> int:
        """Bytes of input read so far."""
        return sum(f.reader.bytes_read for f in self.sources)

    def problems(self) -> ProblemLog:
        """The problems every file met so far."""
        log = ProblemLog()
        for f in self.sources:
            log.merge(f.reader.problems, exclude=REFUSED)
        return log

    def __enter__(self) -> ExactReader:
        self._start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for f in self.sources:
            close = getattr(f.chunks, "close", None)
            if close is not None:
                close()

    def _start(self) -> None:
        """First chunk of every file: the time kind and the phase."""
        first: list[tuple[_File, IoChunk]] = []
        for f in self.sources:
            chunk = self._next(f)
            if chunk is not None:
                first.append((f, chunk))
        if not first:
            msg = "no input file held a readable latency line"
            raise FiomonError(msg)
        kinds = {f.reader.source: time_kind_of(int(c.time_ms[0])) for f, c in first}
        check_one_clock(kinds)
        self.relative = "relative" in kinds.values()
        q = self.options.quantum_ms
        phase = phase_for(self.options.align, q)
        if phase is None:  # auto: the first quantum starts just before the first I/O
            phase = (min(int(c.time_ms.min()) for _, c in first) - 1) % q
        if self.options.regrid is not None:
            # quanta are (start, end]: an I/O stamped t is in the one with start < t
            first_t = min(int(c.time_ms.min()) for _, c in first)
            first_q = phase + (first_t - phase - 1) // q * q
            self.quantum_ms, phase = self.options.regrid(first_q, self.relative)
        self.phase_ms = phase
        opts = self.options
        if opts.target_error is not None and not self.averaged:
            self._merger = SpanMerger(
                layout=self.layout,
                percentiles=opts.percentiles,
                target_percentile=opts.target_percentile,
                target=opts.target_error,
                max_span_ms=opts.max_span_ms,
                level=opts.confidence_level,
            )
        for f, c in first:
            self._add(f, c)

    def _next(self, f: _File) -> IoChunk | None:
        """File ``f``'s next chunk, its progress noted (the engine's thread only)."""
        return self._note(f, _read(f))

    @staticmethod
    def _note(f: _File, got: tuple[IoChunk, int, int] | None) -> IoChunk | None:
        if got is None:
            f.done = True
            return None
        chunk, lo, hi = got
        f.first_ms = lo if f.first_ms is None else min(f.first_ms, lo)
        f.max_ms = hi if f.max_ms is None else max(f.max_ms, hi)
        return chunk

    def _add(self, f: _File, c: IoChunk) -> None:
        """File ``f``'s chunk into the open quanta (lines of closed quanta: late)."""
        self.records += len(c)
        qid = np.floor_divide(c.time_ms - self.phase_ms - 1, self.quantum_ms)
        idx = self.sources.index(f)
        order: I64 | None = None
        if len(qid) > 1 and bool(np.any(qid[1:] < qid[:-1])):
            order = np.argsort(qid, kind="stable")
            qid = qid[order]
        bounds = np.flatnonzero(np.diff(qid)) + 1
        starts = [0, *bounds.tolist()]
        ends = [*bounds.tolist(), len(qid)]
        for s, e in zip(starts, ends, strict=True):
            q = int(qid[s])
            sel = slice(s, e) if order is None else order[s:e]
            if self._closed_through is not None and q <= self._closed_through:
                self._late[f.host] = self._late.get(f.host, 0) + (e - s)
                self.late_records += e - s
                continue
            oq = self._open.setdefault(q, _Quantum())
            oq.values.append(c.value_ns[sel])
            d = c.ddir[sel].astype(np.int8)  # 1 byte a line while the quantum is open
            oq.ddirs.append(d)
            oq.nbytes.append(np.bincount(d, weights=c.bs[sel], minlength=3).astype(np.float64))
            oq.files.append(idx)

    def chunks(self) -> Iterator[list[ClosedQuantum]]:
        """The closed rows, one list per chunk read (often empty: a progress tick)."""
        q = self.quantum_ms
        # Parsing runs on worker threads (numpy's text parser releases the GIL), one chunk
        # per file at a time; a file's progress counts only once its chunk is merged here,
        # so no quantum closes before the lines a worker is still reading.
        workers = self.options.workers or min(2, os.cpu_count() or 1)  # --jobs
        in_flight: dict[Future[tuple[IoChunk, int, int] | None], _File] = {}
        with ThreadPoolExecutor(workers, thread_name_prefix="fiomon-iolog") as pool:
            got: list[tuple[_File, IoChunk | None]] = []
            while True:
                # The most lagging files next (in step by time), ``workers`` at a time; they
                # are read while the chunks just read are merged.
                busy = set(map(id, in_flight.values()))
                idle = sorted(
                    (f for f in self.sources if not f.done and id(f) not in busy),
                    key=lambda s: -1 if s.max_ms is None else s.max_ms,
                )
                for f in idle[: max(0, workers - len(in_flight))]:
                    in_flight[pool.submit(_read, f)] = f
                for f, chunk in got:
                    if chunk is not None:
                        self._add(f, chunk)
                if got:
                    yield self._spans(self._close_ready(q))
                if not in_flight:
                    break
                finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                got = []
                for fut in finished:
                    f = in_flight.pop(fut)
                    got.append((f, self._note(f, fut.result())))
        yield self._spans(self._close_through(None), last=True)

    def _close_ready(self, q: int) -> list[ClosedQuantum]:
        """Close the quanta every file still being read has passed by a quantum."""
        live = [s for s in self.sources if not s.done]
        if live and all(s.max_ms is not None for s in live):
            return self._close_through(min(int(s.max_ms or 0) for s in live) - q)
        return []

    def _spans(self, rows: list[ClosedQuantum], *, last: bool = False) -> list[ClosedQuantum]:
        if self._merger is not None:
            rows = self._merger.add(rows) + (self._merger.flush() if last else [])
        if self.options.run is not None:
            rows = [dataclasses.replace(r, runs=(self.options.run,)) for r in rows]
        return rows

    def _close_through(self, t_ms: int | None) -> list[ClosedQuantum]:
        """Close every open quantum ending at or before ``t_ms`` (None: all of them)."""
        if t_ms is None:
            last = max(self._open, default=None)
        else:
            last = (t_ms - self.phase_ms) // self.quantum_ms - 1
        if last is None:
            return []
        out: list[ClosedQuantum] = []
        for q in sorted(k for k in self._open if k <= last):
            out.extend(self._rows(q, self._open.pop(q)))
            self._late.clear()
        if self._closed_through is None or last > self._closed_through:
            self._closed_through = last
        return out

    def _rows(self, q: int, oq: _Quantum) -> list[ClosedQuantum]:
        """The rows of one quantum: cluster rows, then each host's, in direction order."""
        opts = self.options
        start = self.phase_ms + q * self.quantum_ms
        end = start + self.quantum_ms
        values = np.concatenate(oq.values)
        ddir = np.concatenate(oq.ddirs)
        slice_bytes = np.stack(oq.nbytes)  # (slices, direction)
        slice_hosts = np.asarray([self.sources[i].host for i in oq.files], dtype=np.int64)
        lens = [len(v) for v in oq.values]
        files = np.repeat(np.asarray(oq.files, dtype=np.int64), lens)
        hosts = np.asarray([f.host for f in self.sources], dtype=np.int64)[files]
        scopes: list[tuple[str | None, npt.NDArray[np.bool_] | None]] = [(None, None)]
        if opts.per_host:
            present = np.flatnonzero(np.bincount(hosts, minlength=len(self.host_names)))
            scopes += [(self.host_names[h], hosts == h) for h in present.tolist()]
        groups: list[tuple[str | None, str, I64]] = []  # host, direction, line indices
        for host, in_host in scopes:
            for label in opts.directions:
                if label == "all":
                    m = in_host
                elif label in DIRECTION_LABELS[:3]:
                    d = ddir == DIRECTION_LABELS.index(label)
                    m = d if in_host is None else d & in_host
                else:
                    continue  # "mixed": json+ only
                idx = np.arange(len(values)) if m is None else np.flatnonzero(m)
                if len(idx):
                    groups.append((host, label, idx))
        if not groups:
            return []
        sorted_values = [np.sort(values[idx]) for _, _, idx in groups]
        ns = np.asarray([len(v) for v in sorted_values], dtype=np.int64)
        cis = self._intervals(sorted_values, ns)
        late_total = sum(self._late.values())
        rows = []
        for (host, label, idx), v, ci in zip(groups, sorted_values, cis, strict=True):
            f = np.flatnonzero(np.bincount(files[idx], minlength=len(self.sources)))
            lo = max(start, min(int(self.sources[i].first_ms or 0) for i in f.tolist()) - 1)
            hi = end
            if all(self.sources[i].done for i in f.tolist()):
                hi = min(end, max(int(self.sources[i].max_ms or 0) for i in f.tolist()))
            covered_s = (hi - lo) / 1000.0
            stats = self._stats(v)
            # spans (--target-error) merge the histograms of every row
            keep_hist = opts.target_error is not None or (
                opts.keep_hists and (host is None or opts.keep_host_hists)
            )
            rows.append(
                ClosedQuantum(
                    start_ms=start,
                    end_ms=end,
                    scope="cluster" if host is None else "host",
                    host=host,
                    direction=label,
                    stats=stats,
                    iops=None if self.averaged or covered_s <= 0 else len(v) / covered_s,
                    bytes_per_second=(
                        None
                        if self.averaged or covered_s <= 0
                        else self._bytes(slice_bytes, slice_hosts, host, label) / covered_s
                    ),
                    streams=len(f),
                    late_records=(
                        late_total
                        if host is None
                        else self._late.get(self.host_names.index(host), 0)
                    ),
                    hist=self._hist(v) if keep_hist and not self.averaged else None,
                    ci_ns=ci,
                )
            )
        return rows

    def _bytes(self, per_slice: F64, hosts: I64, host: str | None, label: str) -> float:
        """Bytes of a group, from each slice's bytes per direction."""
        rows = per_slice if host is None else per_slice[hosts == self.host_names.index(host)]
        if label == "all":
            return float(rows.sum())
        return float(rows[:, DIRECTION_LABELS.index(label)].sum())

    def _stats(self, v: I64) -> HistStats:
        n = len(v)
        pct = {pct_key(p): float(v[nearest_rank(p, n) - 1]) for p in self._percentiles}
        return HistStats(
            samples=n,
            min_ns=float(v[0]),
            mean_ns=float(v.sum()) / n,
            max_ns=float(v[-1]),
            percentiles_ns=pct,
            saturated=(),
        )

    def _intervals(self, sorted_values: list[I64], ns: I64) -> list[Interval | None]:
        """Per group, each percentile's order-statistic interval (None: not asked)."""
        if self.averaged or self.options.confidence_level is None:
            return [None] * len(ns)
        out: list[Interval] = [{} for _ in ns]
        for p in self._percentiles:
            key = pct_key(p)
            if not 0 < p < 100:
                for d in out:
                    d[key] = (None, None)
                continue
            lo, hi = rank_bounds(ns, p / 100.0, self.options.confidence_level)
            for i, v in enumerate(sorted_values):
                n, low, high = len(v), int(lo[i]), int(hi[i])
                out[i][key] = (
                    int(v[low - 1]) if low >= 1 else None,
                    int(v[high - 1]) if high <= n else None,
                )
        return list(out)

    def _hist(self, v: I64) -> F64:
        idx = plat_val_to_idx(v, self.layout.group_nr)
        return np.bincount(idx, minlength=self.layout.nbins).astype(np.float64)


def open_reader(paths: Sequence[Path], options: QuantaOptions) -> QuantaReader | ExactReader:
    """The reader of ``paths``: :class:`ExactReader` for per-I/O logs, else QuantaReader.

    Raises:
        FiomonError: per-I/O logs mixed with other inputs (the command line chooses
            before: :func:`fiomon.offline.iosources.choose_iologs`).
    """
    files = [p for p in paths if p.is_file()]
    iologs = [p for p in files if is_iolog(p)]
    if not iologs:
        return QuantaReader(paths, options)
    # fio's bw/iops logs go with whichever reader: each refuses them by name.
    others = [p for p in files if p not in iologs and rate_log(p) is None]
    if others:
        msg = (
            f"per-I/O latency logs ({', '.join(map(str, iologs[:4]))}) cannot be read together "
            f"with hist logs or json+ streams ({', '.join(map(str, others[:4]))}): report "
            "them separately"
        )
        raise FiomonError(msg)
    return ExactReader(paths, options, log_unit=options.source.log_unit)


def whole_hists(paths: Sequence[Path], log_unit: LogUnit, problems: ProblemLog) -> dict[int, F64]:
    """Per fio direction, the whole run's values of per-I/O logs binned in fio 3's layout.

    Raises:
        InputError: a file is not a readable per-I/O log, or it is averaged
            (``log_avg_msec > 0``: one value per window, not per I/O).
    """
    layout = BinLayout()
    out: dict[int, F64] = {}
    for p in paths:
        r = IoLogReader(p, log_unit=log_unit, problems=problems)
        if r.refusal is not None:
            raise InputError({r.source: r.refusal})
        if r.averaged:
            raise InputError({r.source: AVERAGED_NOT_PER_IO})
        for c in r.chunks():
            idx = plat_val_to_idx(c.value_ns, layout.group_nr)
            for d in np.unique(c.ddir).tolist():
                h = np.bincount(idx[c.ddir == d], minlength=layout.nbins).astype(np.float64)
                out[d] = out[d] + h if d in out else h
    return out
