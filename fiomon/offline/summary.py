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
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout, merged_layout
from fiomon.errors import ConfigError, FiomonError, LayoutError
from fiomon.fio.problems import ProblemLog
from fiomon.histogram import cumulative_at, summarize
from fiomon.model import DIRECTION_LABELS, LatencyKind, RecordBatch
from fiomon.offline.sources import (
    REFUSED,
    FileSource,
    SourceOptions,
    check_refusals,
    host_labels,
)
from fiomon.units import format_latency_ns

F64 = npt.NDArray[np.float64]
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

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
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
    layout, acc = collect(paths, filters, source, problems)
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
        out.write(
            f"  {kind}latency  mean {mean}  stddev {sd}  variance {s.variance_ns2 / 1e6:.4g} us^2  "
            f"min >= {lo}  max < {hi}\n"
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
        out.write("\n")


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
