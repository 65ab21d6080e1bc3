"""``fiomon summary``: the classic per-operation I/O statistics of a run, from fio's histograms.

Per operation (read, write, trim, mixed, all): I/O count, bytes, mean, variance and standard
deviation, min and max bounds, percentiles, IOPS and throughput over the run, the first
and last record, and a text histogram on bins of the user's choosing.

Numbers and their bounds (the histograms are fio's log-linear bins, :mod:`fiomon.bins`):

* count and bytes are exact;
* mean and variance use bin midpoints: the mean is off by less than half the widest bin
  used (< 0.8 % of the value for fine bins >= 128 ns); the variance additionally omits the
  within-bin spread (at most 1/12 of the squared bin width per I/O);
* min and max are bounds (lower edge of the first, upper edge of the last non-empty bin);
* percentiles are interpolated as in ``fiomon report``;
* a text-histogram bin's count splits a fio bin that straddles its edge linearly.

The latency is fio's completion latency (``clat``) unless ``--latency`` says ``lat`` or
``slat`` (:mod:`fiomon.offline.kinds`); the text names it then, the JSON always
(``"latency"``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout, merged_layout
from fiomon.errors import ConfigError, FiomonError, LayoutError
from fiomon.fio.fiolog import TimeKind, time_kind_of
from fiomon.fio.iolog import IoLogReader, iolog_kind
from fiomon.fio.problems import ProblemLog
from fiomon.histogram import cumulative_at, summarize
from fiomon.model import DIRECTION_LABELS, LatencyKind, RecordBatch
from fiomon.offline.iostats import (
    ALL,
    DDIR_LABELS,
    DirAcc,
    IoStatsAccumulator,
    PerIoStats,
    RankFinder,
    bin_counts,
    per_io_stats,
)
from fiomon.offline.sources import (
    REFUSED,
    FileSource,
    SourceOptions,
    check_one_clock,
    check_refusals,
    host_labels,
)
from fiomon.units import format_latency_ns

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
HIST_BINS = 12  # the inter-arrival text histogram's bins
Scale = Literal["log", "linear"]


@dataclass(frozen=True, slots=True)
class HistBins:
    """Bins of the text histogram, in ns.

    Args:
        min_ns: lower edge of the first bin.
        max_ns: upper edge of the last bin.
        count: number of bins.
        scale: ``log`` (equal ratios) or ``linear`` (equal widths).
    """

    min_ns: float = 10_000.0
    max_ns: float = 100_000_000.0
    count: int = 12
    scale: Scale = "log"

    def __post_init__(self) -> None:
        if not 0 < self.min_ns < self.max_ns or self.count < 1 or self.count > 1000:
            msg = (
                f"histogram bins need 0 < min < max and 1..1000 bins, got min {self.min_ns} "
                f"ns, max {self.max_ns} ns, {self.count} bins"
            )
            raise ConfigError([msg])

    @classmethod
    def around(cls, min_ns: float, max_ns: float, count: int = 12) -> HistBins:
        """Log bins from the decade below ``min_ns`` to the decade above ``max_ns``."""
        lo = 10.0 ** math.floor(math.log10(max(min_ns, 1.0)))
        hi = 10.0 ** math.ceil(math.log10(max(max_ns, lo * 10)))
        return cls(lo, hi, count, "log")

    def edges(self) -> F64:
        """The ``count + 1`` edges."""
        if self.scale == "log":
            return np.geomspace(self.min_ns, self.max_ns, self.count + 1)
        return np.linspace(self.min_ns, self.max_ns, self.count + 1)


@dataclass(frozen=True, slots=True)
class Filters:
    """Which records count.

    Args:
        hosts: host labels to keep (empty: all).
        host_from: how files are given host labels (``--host-from``, see
            :func:`fiomon.offline.sources.host_labels`).
        jobs: substrings of the stream (file or fio job) name to keep (empty: all).
        directions: fio directions to report.
        from_ms: keep records ending after this (epoch ms, or ms for relative logs).
        to_ms: keep records ending at or before this.
    """

    hosts: tuple[str, ...] = ()
    host_from: str = "auto"
    jobs: tuple[str, ...] = ()
    directions: tuple[str, ...] = ("read", "write", "trim", "mixed", "all")
    from_ms: int | None = None
    to_ms: int | None = None


@dataclass(slots=True)
class _Acc:
    hist: F64
    nbytes: float = 0.0
    first_ms: int | None = None
    last_ms: int | None = None
    records: int = 0
    clocks: dict[str, TimeKind] = field(default_factory=dict)  # per input: epoch or relative


@dataclass(frozen=True, slots=True)
class OpStats:
    """The statistics of one operation type; latencies in ns, times in ms."""

    operation: str
    ios: float
    bytes: float
    mean_ns: float
    variance_ns2: float
    stddev_ns: float
    min_ns: float
    max_ns: float
    percentiles_ns: dict[str, float]
    saturated: tuple[str, ...]
    first_ms: int
    last_ms: int
    iops: float | None
    bytes_per_second: float | None
    records: int
    histogram: list[tuple[float, float, float]] = field(default_factory=list)
    below: float = 0.0
    above: float = 0.0
    per_io: PerIoStats | None = None  # from per-I/O logs: min, max, percentiles exact

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        extra = {} if self.per_io is None else {"exact": True, "per_io": self.per_io.to_json()}
        return {
            "operation": self.operation,
            "ios": self.ios,
            "bytes": self.bytes,
            "mean_ns": self.mean_ns,
            "variance_ns2": self.variance_ns2,
            "stddev_ns": self.stddev_ns,
            "min_ns": self.min_ns,
            "max_ns": self.max_ns,
            "percentiles_ns": self.percentiles_ns,
            "saturated": list(self.saturated),
            "first_ms": self.first_ms,
            "last_ms": self.last_ms,
            "iops": self.iops,
            "bytes_per_second": self.bytes_per_second,
            "records": self.records,
            "histogram": [{"from_ns": a, "to_ns": b, "ios": c} for a, b, c in self.histogram],
            "below_histogram": self.below,
            "above_histogram": self.above,
            **extra,
        }


def collect(
    paths: Sequence[Path],
    filters: Filters,
    source: SourceOptions,
    problems: ProblemLog,
) -> tuple[BinLayout, dict[int, _Acc]]:
    """Read every file; per fio direction, the summed histogram and its bookkeeping.

    Raises:
        FiomonError: no file could be read, or layouts cannot be merged.
        InputError: a file is fio output without readable histograms.
    """
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        msg = f"not a readable file: {', '.join(missing)}"
        raise FiomonError(msg)
    hosts = host_labels(list(paths), filters.host_from)
    layout: BinLayout | None = None
    acc: dict[int, _Acc] = {}
    refused: list[FileSource] = []
    for path, host in zip(paths, hosts, strict=True):
        if filters.hosts and host not in filters.hosts:
            continue
        src = FileSource(path, host, source)
        try:
            for batch in src.batches():
                if layout is None:
                    layout = batch.layout
                try:
                    merged = merged_layout(layout, batch.layout)
                except LayoutError as exc:
                    msg = f"{path}: {exc}"
                    raise LayoutError(msg) from None
                if merged != layout:
                    layout = merged
                    for a in acc.values():
                        a.hist = _coarsen_dense(a.hist, layout)
                _add(acc, _filtered(batch, filters), layout)
        finally:
            src.close()
            problems.merge(src.problems, exclude=REFUSED)
            if src.refusal is not None:
                refused.append(src)
    check_refusals(refused)
    if layout is None:
        msg = "no histogram records in the input"
        raise FiomonError(msg)
    return layout, acc


def _coarsen_dense(hist: F64, layout: BinLayout) -> F64:
    """A dense histogram of a finer layout, summed into ``layout``'s bins."""
    out: F64 = hist.reshape(layout.nbins, len(hist) // layout.nbins).sum(axis=1)
    return out


def _filtered(batch: RecordBatch, f: Filters) -> RecordBatch:
    keep = np.ones(len(batch), dtype=np.bool_)
    if f.jobs:
        ok = np.array([any(j in s.stream for j in f.jobs) for s in batch.streams] or [False])
        keep &= ok[batch.stream_idx]
    if f.from_ms is not None:
        keep &= batch.end_ms > f.from_ms
    if f.to_ms is not None:
        keep &= batch.end_ms <= f.to_ms
    return batch if keep.all() else batch.select(keep)


def _add(acc: dict[int, _Acc], batch: RecordBatch, layout: BinLayout) -> None:
    if not len(batch):
        return
    batch = batch.coarsened(layout)
    for d in np.unique(batch.direction).tolist():
        sel = batch.select(batch.direction == d)
        a = acc.get(d)
        if a is None:
            a = acc[d] = _Acc(np.zeros(layout.nbins))
        np.add.at(a.hist, sel.bins, sel.counts.astype(np.float64))
        a.nbytes += float(sel.nbytes.sum())
        a.records += len(sel)
        lo, hi = int(sel.start_ms.min()), int(sel.end_ms.max())
        a.first_ms = lo if a.first_ms is None else min(a.first_ms, lo)
        a.last_ms = hi if a.last_ms is None else max(a.last_ms, hi)
        for i in np.unique(sel.stream_idx).tolist():
            first = int(sel.start_ms[sel.stream_idx == i].min())
            a.clocks.setdefault(sel.streams[i].stream, time_kind_of(first))


def op_stats(
    name: str,
    hist: F64,
    layout: BinLayout,
    *,
    meta: _Acc,
    qs: Sequence[float],
    bins: HistBins | None,
) -> OpStats | None:
    """Statistics of one summed histogram (None when it is empty).

    ``bins`` None: log bins around the data (decades from its min to its max bound).
    """
    st = summarize(hist, layout, qs)
    if st is None or meta.first_ms is None or meta.last_ms is None:
        return None
    if bins is None:
        bins = HistBins.around(st.min_ns, st.max_ns)
    mids = layout.mids_ns()
    n = float(hist.sum())
    var = float(np.einsum("i,i->", hist, (mids - st.mean_ns) ** 2) / n)
    span_s = (meta.last_ms - meta.first_ms) / 1000.0
    edges = bins.edges()
    at = cumulative_at(hist, layout, edges / 1e9)
    table = [
        (float(a), float(b), float(c))
        for a, b, c in zip(edges[:-1], edges[1:], np.diff(at), strict=True)
    ]
    return OpStats(
        operation=name,
        ios=n,
        bytes=meta.nbytes,
        mean_ns=st.mean_ns,
        variance_ns2=var,
        stddev_ns=math.sqrt(var),
        min_ns=st.min_ns,
        max_ns=st.max_ns,
        percentiles_ns=st.percentiles_ns,
        saturated=st.saturated,
        first_ms=meta.first_ms,
        last_ms=meta.last_ms,
        iops=n / span_s if span_s > 0 else None,
        bytes_per_second=meta.nbytes / span_s if span_s > 0 else None,
        records=meta.records,
        histogram=table,
        below=float(at[0]),
        above=n - float(at[-1]),
    )


def summarize_run(
    paths: Sequence[Path],
    *,
    filters: Filters,
    source: SourceOptions,
    percentiles: Sequence[float],
    bins: HistBins | None,
    problems: ProblemLog,
) -> list[OpStats]:
    """Per requested operation, its statistics (operations without I/O are left out).

    Raises:
        FiomonError: nothing readable, or nothing left after the filters.
    """
    if any(iolog_kind(p) is not None for p in paths):
        return summarize_iologs(
            paths,
            filters=filters,
            source=source,
            percentiles=percentiles,
            bins=bins,
            problems=problems,
        )
    layout, acc = collect(paths, filters, source, problems)
    clocks = {k: v for a in acc.values() for k, v in a.clocks.items()}
    check_one_clock(clocks, "summarize")
    out: list[OpStats] = []
    total = _Acc(np.zeros(layout.nbins))
    for d, a in sorted(acc.items()):
        total.hist = total.hist + a.hist
        total.nbytes += a.nbytes
        total.records += a.records
        for attr, pick in (("first_ms", min), ("last_ms", max)):
            v = getattr(a, attr)
            cur = getattr(total, attr)
            setattr(total, attr, v if cur is None else pick(cur, v))
        label = DIRECTION_LABELS[d]
        if label in filters.directions:
            s = op_stats(label, a.hist, layout, meta=a, qs=percentiles, bins=bins)
            if s is not None:
                out.append(s)
    if "all" in filters.directions:
        s = op_stats("all", total.hist, layout, meta=total, qs=percentiles, bins=bins)
        if s is not None:
            out.append(s)
    if not out:
        msg = "no I/O left after the filters (check --host, --job, --direction, --from, --to)"
        raise FiomonError(msg)
    return out


def _iolog_inputs(
    paths: Sequence[Path], filters: Filters, source: SourceOptions, problems: ProblemLog
) -> list[Path]:
    """The per-I/O logs ``summary`` reads: those of the latency kind, through --host and --job.

    The logs of the other kinds hold the same I/Os (``P_lat.1.log`` beside ``P_clat.1.log``):
    they are named on stderr and left out.

    Raises:
        FiomonError: a missing file, per-I/O logs given with histogram inputs, or no log of
            the kind asked for.
    """
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        msg = f"not a readable file: {', '.join(missing)}"
        raise FiomonError(msg)
    others = [str(p) for p in paths if iolog_kind(p) is None]
    if others:
        msg = (
            "per-I/O latency logs and histogram inputs in one summary: summarize "
            f"{', '.join(others)} in a run of their own (the per-I/O logs give exact numbers)"
        )
        raise FiomonError(msg)
    latency: str = source.latency
    mine = [p for p in paths if iolog_kind(p) == latency]
    other_kinds = [p for p in paths if iolog_kind(p) != latency]
    if not mine:
        msg = (
            f"no {latency} per-I/O log among {', '.join(map(str, paths))} "
            "(fio names them P_clat.N.log, P_lat.N.log, P_slat.N.log; --latency picks the kind)"
        )
        raise FiomonError(msg)
    if other_kinds:
        kinds = "/".join(sorted({str(iolog_kind(p)) for p in other_kinds}))
        problems.warn(
            ", ".join(map(str, other_kinds)),
            0,
            "other-latency",
            f"left out: {kinds} logs, the same I/Os as the {latency} logs "
            "(--latency picks the kind)",
        )
    hosts = dict(zip(paths, host_labels(list(paths), filters.host_from), strict=True))
    return [
        p
        for p in mine
        if (not filters.hosts or hosts[p] in filters.hosts)
        and (not filters.jobs or any(j in str(p) for j in filters.jobs))
    ]


def _io_chunks(
    path: Path, source: SourceOptions, problems: ProblemLog, filters: Filters
) -> Iterator[tuple[I64, I64, I64, I64]]:
    """``(time_ms, value_ns, ddir, bs)`` of one per-I/O log, chunk by chunk, --from/--to applied.

    Raises:
        FiomonError: the file is not a readable per-I/O log (the reader's refusal), or it is
            averaged (``log_avg_msec > 0``): no per-I/O values in it.
    """
    reader = IoLogReader(path, log_unit=source.log_unit, problems=problems)
    if reader.refusal is not None:
        msg = f"{path}: {reader.refusal}"
        raise FiomonError(msg)
    if reader.averaged:
        msg = (
            f"{path}: an averaged log (fio's log_avg_msec > 0): one mean per window, so no "
            "per-I/O statistics (percentiles, inter-arrival, bytes per request) can come "
            "from it; fio writes one line per I/O with log_avg_msec=0"
        )
        raise FiomonError(msg)
    for chunk in reader.chunks():
        t = chunk.time_ms
        keep = np.ones(t.size, dtype=np.bool_)
        if filters.from_ms is not None:
            keep &= t > filters.from_ms
        if filters.to_ms is not None:
            keep &= t <= filters.to_ms
        if keep.all():
            yield t, chunk.value_ns, chunk.ddir, chunk.bs
        else:
            yield t[keep], chunk.value_ns[keep], chunk.ddir[keep], chunk.bs[keep]


MAX_PASSES = 8  # narrowing by SPLIT per pass: 2**63 ns is settled within 5


def summarize_iologs(
    paths: Sequence[Path],
    *,
    filters: Filters,
    source: SourceOptions,
    percentiles: Sequence[float],
    bins: HistBins | None,
    problems: ProblemLog,
) -> list[OpStats]:
    """Per operation, the exact and per-I/O statistics of fio's per-I/O latency logs.

    The first pass keeps moments, fio's fine bins and the inter-arrival counts
    (:mod:`fiomon.offline.iostats`); the next passes read the files again for the exact
    percentiles and the text histogram (bad lines are reported by the first pass only).

    Raises:
        FiomonError: see :func:`_iolog_inputs`; nothing left after the filters.
    """
    chosen = _iolog_inputs(paths, filters, source, problems)
    acc = IoStatsAccumulator()
    kinds: dict[str, TimeKind] = {}  # per file: epoch or relative stamps (its first line's)
    for path in chosen:
        for t, v, dirs, b in _io_chunks(path, source, problems, filters):
            if t.size and str(path) not in kinds:
                kinds[str(path)] = time_kind_of(int(t[0]))
            acc.add(str(path), t, v, dirs, b)
    check_one_clock(kinds, "summarize")
    wanted = [d for d in (0, 1, 2, ALL) if d in acc.dirs and DDIR_LABELS[d] in filters.directions]
    finders = {d: RankFinder(acc.dirs[d].fine, percentiles) for d in wanted}
    edges: dict[int, F64] = {}
    for d in wanted:
        lat = acc.dirs[d].latency
        assert lat.min is not None and lat.max is not None  # noqa: S101
        edges[d] = (bins or HistBins.around(lat.min, lat.max + 1)).edges()
    hist = {d: np.zeros(len(edges[d]) + 1, dtype=np.int64) for d in wanted}
    for n_pass in range(MAX_PASSES):
        if n_pass and not any(f.pending for f in finders.values()):
            break
        pending = [d for d in wanted if finders[d].pending]
        quiet = ProblemLog()
        for path in chosen:
            for _, v, dd, _ in _io_chunks(path, source, quiet, filters):
                for d in wanted:
                    vals = v if d == ALL else v[dd == d]
                    if n_pass == 0:
                        hist[d] += bin_counts(vals, edges[d])
                    if d in pending:
                        finders[d].feed(vals)
        for d in pending:
            finders[d].finish_pass()
    out = [
        _iolog_op_stats(d, acc.dirs[d], finders[d], edges=edges[d], hist=hist[d], qs=percentiles)
        for d in wanted
    ]
    if not out:
        raise FiomonError(_nothing_left(chosen))
    return out


def _nothing_left(chosen: Sequence[Path]) -> str:
    """Why per-I/O logs gave no I/O: every log empty (and why fio leaves one so), or filters."""
    if chosen and all(p.stat().st_size == 0 for p in chosen):
        names = ", ".join(map(str, chosen))
        why = ""
        if all(iolog_kind(p) == "slat" for p in chosen):
            why = (
                " (fio records no submission latency on synchronous engines such as psync: "
                "slat needs an asynchronous engine, libaio or io_uring)"
            )
        return f"no I/O in {names}: the per-I/O logs are empty{why}"
    return "no I/O left after the filters (check --host, --job, --direction, --from, --to)"


def _iolog_op_stats(
    d: int, a: DirAcc, finder: RankFinder, *, edges: F64, hist: I64, qs: Sequence[float]
) -> OpStats:
    lat = a.latency
    assert lat.min is not None and lat.max is not None and lat.variance is not None  # noqa: S101
    assert a.first_ms is not None and a.last_ms is not None  # noqa: S101
    span_s = (a.last_ms - a.first_ms) / 1000.0
    nbytes = float(a.request_bytes.total)
    return OpStats(
        operation=DDIR_LABELS[d],
        ios=float(lat.n),
        bytes=nbytes,
        mean_ns=lat.mean,
        variance_ns2=lat.variance,
        stddev_ns=math.sqrt(lat.variance),
        min_ns=lat.min,
        max_ns=lat.max,
        percentiles_ns={k: float(v) for k, v in finder.results.items()},
        saturated=(),
        first_ms=a.first_ms,
        last_ms=a.last_ms,
        iops=lat.n / span_s if span_s > 0 else None,
        bytes_per_second=nbytes / span_s if span_s > 0 else None,
        records=lat.n,
        histogram=[
            (float(x), float(y), float(c))
            for x, y, c in zip(edges[:-1], edges[1:], hist[1:-1], strict=True)
        ],
        below=float(hist[0]),
        above=float(hist[-1]),
        per_io=per_io_stats(a, qs, HIST_BINS),
    )


def _size(b: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def _when(ms: int) -> str:
    if ms >= 10**12:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"{ms / 1000:.3f} s"


def write_text(
    stats: list[OpStats], out: TextIO, width: int = 40, latency: LatencyKind = "clat"
) -> None:
    """The human-readable report (``latency``: the kind its latencies are, named unless clat)."""
    kind = "" if latency == "clat" else f"{latency} "
    for s in stats:
        span = (s.last_ms - s.first_ms) / 1000.0
        rate = "" if s.iops is None else f", {s.iops:,.0f} IOPS, {_size(s.bytes_per_second or 0)}/s"
        out.write(
            f"{s.operation}: {s.ios:,.0f} I/Os, {_size(s.bytes)} in {span:.1f} s "
            f"({_when(s.first_ms)} .. {_when(s.last_ms)}){rate}\n"
        )
        mean, sd, lo, hi = map(format_latency_ns, (s.mean_ns, s.stddev_ns, s.min_ns, s.max_ns))
        bounds = f"min {lo}  max {hi}" if s.per_io else f"min >= {lo}  max < {hi}"
        out.write(
            f"  {kind}latency  mean {mean}  stddev {sd}  variance {s.variance_ns2 / 1e6:.4g} us^2  "
            f"{bounds}\n"
        )
        pct = "  ".join(
            f"p{k} {'>= ' if k in s.saturated else ''}{format_latency_ns(v)}"
            for k, v in s.percentiles_ns.items()
        )
        out.write(f"  {kind}percentiles  {pct}\n")
        peak = max([c for _, _, c in s.histogram] + [1.0])
        for a, b, c in s.histogram:
            bar = "#" * round(width * c / peak)
            out.write(
                f"  {format_latency_ns(a):>9} .. {format_latency_ns(b):<9} {c:12,.0f} {bar}\n"
            )
        if s.below or s.above:
            out.write(f"  outside the histogram: {s.below:,.0f} below, {s.above:,.0f} above\n")
        if s.per_io is not None:
            _write_per_io(s.per_io, out, width)
        out.write("\n")


def _write_per_io(p: PerIoStats, out: TextIO, width: int) -> None:
    """The lines only per-I/O logs give: total time, per request, inter-arrival."""
    of_total = p.bytes_per_second_of_total_time
    out.write(
        f"  total time {p.total_latency_ns / 1e9:.6g} s (sum of latencies)"
        + ("" if of_total is None else f", {_size(of_total)}/s of total time")
        + "\n"
    )
    rb, rate = p.request_bytes, p.rate
    if rb.n and rb.variance is not None and rb.min is not None and rb.max is not None:
        out.write(
            f"  bytes per request  mean {_size(rb.mean)}  stddev {_size(math.sqrt(rb.variance))}  "
            f"min {_size(rb.min)}  max {_size(rb.max)}\n"
        )
    if rate.n and rate.variance is not None and rate.min is not None and rate.max is not None:
        zero = f"  ({p.zero_latency:,} of latency 0 left out)" if p.zero_latency else ""
        out.write(
            f"  bytes/s per request  mean {_size(rate.mean)}/s  "
            f"stddev {_size(math.sqrt(rate.variance))}/s  min {_size(rate.min)}/s  "
            f"max {_size(rate.max)}/s{zero}\n"
        )
    ia = p.interarrival
    if ia is None:
        out.write("  inter-arrival  fewer than two I/Os per file\n")
        return
    restarts = f", {ia.restarts} restarts (a stamp went back)" if ia.restarts else ""
    out.write(
        f"  inter-arrival ({ia.count:,} gaps, ms stamps{restarts})  mean {ia.mean_ms:.4g} ms  "
        f"stddev {ia.stddev_ms:.4g} ms  variance {ia.variance_ms2:.4g} ms^2  "
        f"min {ia.min_ms} ms  max {ia.max_ms} ms\n"
    )
    pct = "  ".join(f"p{k} {v} ms" for k, v in ia.percentiles_ms.items())
    out.write(f"  inter-arrival percentiles  {pct}\n")
    peak = max([c for _, _, c in ia.histogram] + [ia.same_stamp, 1])
    if ia.same_stamp:
        bar = "#" * round(width * ia.same_stamp / peak)
        out.write(f"  {'0 ms (same stamp)':>22} {ia.same_stamp:12,} {bar}\n")
    for a, b, c in ia.histogram:
        bar = "#" * round(width * c / peak)
        out.write(f"  {_ms(a):>9} .. {_ms(b):<9} {c:12,} {bar}\n")


def _ms(v: float) -> str:
    return format_latency_ns(v * 1e6)


def main_summary(
    paths: Sequence[Path],
    *,
    filters: Filters,
    source: SourceOptions,
    percentiles: Sequence[float],
    bins: HistBins | None,
    fmt: Literal["text", "json"],
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``fiomon summary``; returns the exit code (output to stdout/stderr by default)."""
    out = out or sys.stdout
    err = err or sys.stderr
    import json  # noqa: PLC0415 -- only this output needs it

    problems = ProblemLog(strict=source.strict)
    try:
        stats = summarize_run(
            paths,
            filters=filters,
            source=source,
            percentiles=percentiles,
            bins=bins,
            problems=problems,
        )
    except FiomonError as exc:
        problems.write_to(err)
        err.write(f"fiomon summary: {exc}\n")
        return 1
    problems.write_to(err)
    if fmt == "json":
        docs = [{**s.to_json(), "latency": source.latency} for s in stats]
        out.write(json.dumps(docs, indent=1) + "\n")
    else:
        write_text(stats, out, latency=source.latency)
    return 0


def bins_from_yaml(path: Path) -> HistBins:
    """Histogram bins from a small YAML file: ``{min: 10us, max: 100ms, bins: 12, scale: log}``.

    Raises:
        ConfigError: unreadable, or a bad key or value (each named).
    """
    from fiomon.config import read_yaml  # noqa: PLC0415
    from fiomon.units import parse_latency_ns  # noqa: PLC0415

    data = read_yaml(path)
    if not isinstance(data, dict):
        msg = f"{path}: expected a mapping with min, max, bins, scale"
        raise ConfigError([msg])
    problems = [
        f"{path}: {k}: unknown key" for k in data if k not in ("min", "max", "bins", "scale")
    ]
    kw: dict[str, Any] = {}
    for key, name in (("min", "min_ns"), ("max", "max_ns")):
        if key in data:
            try:
                kw[name] = parse_latency_ns(data[key], what=f"{path}: {key}")
            except ConfigError as exc:
                problems += exc.problems
    if "bins" in data:
        if isinstance(data["bins"], int) and not isinstance(data["bins"], bool):
            kw["count"] = data["bins"]
        else:
            problems.append(f"{path}: bins: expected an integer, got {data['bins']!r}")
    if "scale" in data:
        if data["scale"] in ("log", "linear"):
            kw["scale"] = data["scale"]
        else:
            problems.append(f"{path}: scale: expected log or linear, got {data['scale']!r}")
    if problems:
        raise ConfigError(problems)
    return HistBins(**kw)
