"""Accuracy-driven spans: consecutive quanta merged until a percentile is known well enough.

A p99 of 300 I/Os rests on its three slowest; merging quanta until the percentile's
confidence interval (:mod:`fiomon.confidence`) is narrow enough gives a low-rate job long
windows and leaves a busy one its short quanta. :class:`SpanMerger` takes closed quanta in
time order (each with its merged histogram, ``ClosedQuantum.hist``) and, per (scope, host,
direction), adds them up until

* the chosen percentile's *relative half-width* ``(high - low) / (2 * estimate)`` is at
  most ``target`` (a side the data cannot bound counts as infinitely wide): the span is
  emitted with ``target_met = True``; or
* the span reaches ``max_span_ms`` (from the start of its first quantum to the end of its
  last): it is emitted with ``target_met = False``, the target not reached.

A quantum that would stretch a span past ``max_span_ms`` (after a pause in the input)
first ends the span before it, unmet. :meth:`SpanMerger.flush` emits what is left at the
end of the input, met or not. An emitted row covers ``(start_ms, end_ms]`` of its first and
last quanta, with the statistics of the merged histogram: samples and bytes add up, IOPS
and bytes/s are per covered second (the sum of the quanta's), ``streams`` is the largest
count of any quantum, ``late_records`` the sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum, Scope, ci_dicts
from fiomon.confidence import DEFAULT_LEVEL, summarize_with_bounds
from fiomon.histogram import HistStats, pct_key

SpanKey = tuple[str, str, str]  # (scope, host or "", direction)


@dataclass(slots=True)
class _Span:
    """Quanta merged so far for one key."""

    scope: Scope
    host: str | None
    direction: str
    start_ms: int
    end_ms: int
    hist: npt.NDArray[np.float64]
    covered_s: float
    nbytes: float
    streams: int
    late_records: int
    min_ns: float
    max_ns: float
    total_ns: float  # sum of the latencies (each row's mean times its samples)
    samples: float


class SpanMerger:
    """Merges consecutive closed quanta until a percentile's interval is narrow enough.

    Args:
        layout: the bin layout of the rows' histograms.
        percentiles: percentiles of the emitted rows (as the engine's).
        target_percentile: the percentile whose accuracy decides, e.g. ``99``.
        target: relative half-width to reach, e.g. ``0.05`` for 5 %.
        max_span_ms: longest span; reaching it emits the span flagged as not met.
        level: confidence level of the intervals.
    """

    def __init__(
        self,
        *,
        layout: BinLayout,
        percentiles: Sequence[float],
        target_percentile: float,
        target: float,
        max_span_ms: int,
        level: float = DEFAULT_LEVEL,
    ) -> None:
        if target_percentile not in percentiles:
            msg = f"target percentile {target_percentile:g} is not among {list(percentiles)}"
            raise ValueError(msg)
        if not target > 0 or max_span_ms <= 0:
            msg = f"need target > 0 and max_span_ms > 0, got {target}, {max_span_ms}"
            raise ValueError(msg)
        self.layout = layout
        self.percentiles = tuple(percentiles)
        self.keys = [pct_key(q) for q in self.percentiles]
        self.target_index = self.percentiles.index(target_percentile)
        self.target = target
        self.max_span_ms = max_span_ms
        self.level = level
        self._open: dict[SpanKey, _Span] = {}

    def add(self, rows: Sequence[ClosedQuantum]) -> list[ClosedQuantum]:
        """Take closed quanta (time order); return the spans they complete.

        Each quantum is judged on its own (the result does not depend on how many quanta
        one call brings): the rows are taken one quantum end at a time.
        """
        by_end: dict[int, list[ClosedQuantum]] = {}
        for r in rows:
            by_end.setdefault(r.end_ms, []).append(r)
        out: list[ClosedQuantum] = []
        for end in sorted(by_end):
            out += self._add_quantum(by_end[end])
        return out

    def _add_quantum(self, rows: list[ClosedQuantum]) -> list[ClosedQuantum]:
        """Rows of one quantum end: merge them, emit the spans that are complete."""
        done: list[tuple[_Span, bool]] = []
        touched: dict[SpanKey, _Span] = {}
        for r in rows:
            if r.hist is None:
                msg = "SpanMerger needs each row's histogram (QuantumEngine keep_hists)"
                raise ValueError(msg)
            key = (r.scope, r.host or "", r.direction)
            span = self._open.get(key)
            if span is not None and r.end_ms - span.start_ms > self.max_span_ms:
                done.append((span, False))  # a pause: the span cannot take this quantum
                touched.pop(key, None)
                span = None
            covered = r.stats.samples / r.iops if r.iops else 0.0
            nbytes = (r.bytes_per_second or 0.0) * covered
            if span is None:
                span = _Span(
                    r.scope,
                    r.host,
                    r.direction,
                    r.start_ms,
                    r.end_ms,
                    r.hist.copy(),
                    covered,
                    nbytes,
                    r.streams,
                    r.late_records,
                    r.stats.min_ns,
                    r.stats.max_ns,
                    r.stats.mean_ns * r.stats.samples,
                    r.stats.samples,
                )
                self._open[key] = span
            else:
                span.end_ms = r.end_ms
                span.hist += r.hist
                span.covered_s += covered
                span.nbytes += nbytes
                span.streams = max(span.streams, r.streams)
                span.late_records += r.late_records
                span.min_ns = min(span.min_ns, r.stats.min_ns)
                span.max_ns = max(span.max_ns, r.stats.max_ns)
                span.total_ns += r.stats.mean_ns * r.stats.samples
                span.samples += r.stats.samples
            touched[key] = span
        out = self._rows(done)
        if touched:
            keys = list(touched)
            spans = [touched[k] for k in keys]
            rel = self._half_widths(spans)
            ready = []
            for k, s, w in zip(keys, spans, rel.tolist(), strict=True):
                met = w <= self.target
                if met or s.end_ms - s.start_ms >= self.max_span_ms:
                    ready.append((s, met))
                    del self._open[k]
            out += self._rows(ready)
        out.sort(key=lambda r: r.end_ms)
        return out

    def flush(self) -> list[ClosedQuantum]:
        """Emit every open span (the end of the input), met or not."""
        spans = list(self._open.values())
        self._open.clear()
        if not spans:
            return []
        rel = self._half_widths(spans)
        out = self._rows([(s, w <= self.target) for s, w in zip(spans, rel.tolist(), strict=True)])
        out.sort(key=lambda r: r.end_ms)
        return out

    def _half_widths(self, spans: list[_Span]) -> npt.NDArray[np.float64]:
        """Relative half-width of the target percentile's interval per span (inf: unbounded)."""
        hists = np.stack([s.hist for s in spans])
        q = [self.percentiles[self.target_index]]
        stats, low, high = summarize_with_bounds(hists, self.layout, q, level=self.level)
        est = np.array(
            [np.nan if st is None else next(iter(st.percentiles_ns.values())) for st in stats]
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = (high[:, 0] - low[:, 0]) / (2.0 * est)
        return np.where(np.isnan(rel), np.inf, rel)

    def _rows(self, spans: list[tuple[_Span, bool]]) -> list[ClosedQuantum]:
        """Closed-quantum rows of merged spans, each flagged with whether it met the target."""
        if not spans:
            return []
        hists = np.stack([s.hist for s, _ in spans])
        stats, low, high = summarize_with_bounds(
            hists, self.layout, self.percentiles, level=self.level
        )
        out = []
        cis = ci_dicts(self.keys, low, high)
        for (s, ok), binned, ci in zip(spans, stats, cis, strict=True):
            if binned is None:
                continue
            st = _exact_extremes(binned, s)
            out.append(
                ClosedQuantum(
                    start_ms=s.start_ms,
                    end_ms=s.end_ms,
                    scope=s.scope,
                    host=s.host,
                    direction=s.direction,
                    stats=st,
                    iops=st.samples / s.covered_s if s.covered_s > 0 else None,
                    bytes_per_second=s.nbytes / s.covered_s if s.covered_s > 0 else None,
                    streams=s.streams,
                    late_records=s.late_records,
                    ci_ns=ci,
                    target_met=ok,
                )
            )
        return out


def _exact_extremes(st: HistStats, s: _Span) -> HistStats:
    """A span's statistics with the min, max and mean of its rows (exact from per-I/O logs).

    The merged histogram gives bin bounds (``704ns`` for a smallest I/O of 711 ns); the rows
    hold the exact values where they have them, and the percentiles, from the bins, are
    kept within them (never above the largest I/O, unless fio's last bin: a lower bound).
    """
    lo, hi = s.min_ns, s.max_ns
    pct = {k: v if k in st.saturated else min(max(v, lo), hi) for k, v in st.percentiles_ns.items()}
    mean = s.total_ns / s.samples if s.samples > 0 else st.mean_ns
    return replace(st, min_ns=lo, max_ns=hi, mean_ns=mean, percentiles_ns=pct)
