"""Prometheus exposition: a custom collector over an immutable snapshot, served by a thread.

The aggregator builds a new :class:`Snapshot` whenever a quantum closes and swaps one
reference; :class:`FiomonCollector` turns the current one into metric families on every
scrape (``prometheus_client`` serves from HTTP threads, so nothing is shared but that
reference). A sample of what it exports::

    # HELP fiomon_cluster_latency_seconds Cluster-wide latency percentile of the last ...
    # TYPE fiomon_cluster_latency_seconds gauge
    fiomon_cluster_latency_seconds{direction="read",quantile="0.99"} 0.00081
    # TYPE fiomon_cluster_latency_histogram_seconds histogram
    fiomon_cluster_latency_histogram_seconds_bucket{direction="read",le="0.005"} 123456.0
    # TYPE fiomon_sla_breach gauge
    fiomon_sla_breach{rule="p99-read"} 0.0

Bucket edges are about four per octave from 1 us to fio's cap, plus every SLA threshold
exactly. A fio bin that straddles an edge is split linearly, as percentiles are
interpolated, so the bucket counts are the exact histogram's values at those edges.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from fiomon.bins import BinLayout

F64 = npt.NDArray[np.float64]


def bucket_edges_s(layout: BinLayout, thresholds_ns: Sequence[float] = ()) -> F64:
    """``le`` edges in seconds: 4 per octave from 1 us to fio's cap, plus the thresholds."""
    cap_ns = float(layout.edges_ns()[1][-1])
    k = np.arange(0, int(np.ceil(4 * np.log2(cap_ns / 1000.0))) + 1)
    edges = 1000.0 * np.exp2(k / 4.0)
    edges = edges[edges < cap_ns]
    # Round to 3 significant digits so le labels read well (0.00119, not 0.001189207...).
    edges = np.array([float(f"{e:.3g}") for e in edges])
    allx = np.unique(np.concatenate([edges, np.asarray(thresholds_ns, dtype=np.float64)]))
    return allx / 1e9


def cumulative_at(hist: F64, layout: BinLayout, edges_s: F64) -> F64:
    """Counts at or below each edge, splitting straddling bins linearly."""
    lower, upper = layout.edges_ns()
    edges_ns = edges_s * 1e9
    cum = np.concatenate([[0.0], np.cumsum(hist)])
    k = np.searchsorted(upper, edges_ns, side="right")  # bins [0, k) are wholly below
    partial = np.zeros(len(edges_ns))
    inside = k < len(hist)
    kk = k[inside]
    frac = np.clip((edges_ns[inside] - lower[kk]) / (upper[kk] - lower[kk]), 0.0, 1.0)
    partial[inside] = hist[kk] * frac
    out: F64 = cum[k] + partial
    return out


@dataclass(slots=True)
class BucketHistogram:
    """Cumulative-since-start bucket histogram per direction (monotonic, for ``rate()``).

    Args:
        layout: the engine's bin layout.
        edges_s: bucket edges (seconds).
    """

    layout: BinLayout
    edges_s: F64
    counts: dict[str, F64] = field(default_factory=dict)
    total: dict[str, float] = field(default_factory=dict)
    sum_s: dict[str, float] = field(default_factory=dict)

    def add(self, direction: str, hist: F64, mean_ns: float) -> None:
        """Add one closed quantum's histogram."""
        at = cumulative_at(hist, self.layout, self.edges_s)
        n = float(hist.sum())
        self.counts[direction] = self.counts.get(direction, 0.0) + at
        self.total[direction] = self.total.get(direction, 0.0) + n
        self.sum_s[direction] = self.sum_s.get(direction, 0.0) + n * mean_ns / 1e9

    def frozen(self) -> dict[str, tuple[tuple[float, ...], float, float]]:
        """Immutable copy: direction -> (cumulative counts, total, sum seconds)."""
        return {
            d: (tuple(self.counts[d].tolist()), self.total[d], self.sum_s[d]) for d in self.counts
        }


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything ``/metrics`` shows; replaced, never changed.

    Args:
        quantum_end_s: end of the quantum the latency gauges describe (epoch s).
        cluster: ``(direction, quantile) -> seconds`` (quantile as in ``0.99``).
        hosts: ``(host, direction, quantile) -> seconds``.
        edges_s: bucket edges of the histogram.
        buckets: ``direction -> (cumulative counts, total, sum seconds)``.
        sla_breach: ``(rule, host or "") -> 0/1``.
        sla_breaches: ``rule -> times it started firing``.
        counters: ``(metric, help, label names) -> {label values: value}``, counters.
        gauges: the same for gauges.
        histograms: ``(metric, help) -> (edges, cumulative counts, count, sum)``.
    """

    quantum_end_s: float | None = None
    cluster: dict[tuple[str, str], float] = field(default_factory=dict)
    hosts: dict[tuple[str, str, str], float] = field(default_factory=dict)
    edges_s: tuple[float, ...] = ()
    buckets: dict[str, tuple[tuple[float, ...], float, float]] = field(default_factory=dict)
    sla_breach: dict[tuple[str, str], int] = field(default_factory=dict)
    sla_breaches: dict[str, int] = field(default_factory=dict)
    counters: dict[tuple[str, str, tuple[str, ...]], dict[tuple[str, ...], float]] = field(
        default_factory=dict
    )
    gauges: dict[tuple[str, str, tuple[str, ...]], dict[tuple[str, ...], float]] = field(
        default_factory=dict
    )
    histograms: dict[tuple[str, str], tuple[tuple[float, ...], tuple[float, ...], float, float]] = (
        field(default_factory=dict)
    )


class FiomonCollector:
    """Builds metric families from the current snapshot on every scrape.

    Args:
        current: returns the latest snapshot (a reference swap on the aggregator side).
    """

    def __init__(self, current: Callable[[], Snapshot]) -> None:
        self._current = current

    def describe(self) -> list[Metric]:
        """Nothing up front (the series appear with the data)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The metric families of the current snapshot."""
        s = self._current()
        g = GaugeMetricFamily(
            "fiomon_cluster_latency_seconds",
            "Cluster-wide latency percentile of the last closed quantum.",
            labels=["direction", "quantile"],
        )
        for (d, q), v in sorted(s.cluster.items()):
            g.add_metric([d, q], v)
        yield g
        h = GaugeMetricFamily(
            "fiomon_host_latency_seconds",
            "Per-host latency percentile of the last closed quantum (hosts capped).",
            labels=["host", "direction", "quantile"],
        )
        for (host, d, q), v in sorted(s.hosts.items()):
            h.add_metric([host, d, q], v)
        yield h
        if s.quantum_end_s is not None:
            yield GaugeMetricFamily(
                "fiomon_quantum_end_timestamp_seconds",
                "End of the quantum the latency gauges describe (Unix time).",
                value=s.quantum_end_s,
            )
        hist = HistogramMetricFamily(
            "fiomon_cluster_latency_histogram_seconds",
            "Cluster-wide I/O latencies since the aggregator started, from fio's histograms.",
            labels=["direction"],
        )
        for d, (counts, total, sum_s) in sorted(s.buckets.items()):
            buckets = [(_le(e), c) for e, c in zip(s.edges_s, counts, strict=True)]
            buckets.append(("+Inf", total))
            hist.add_metric([d], buckets, sum_value=sum_s)
        yield hist
        breach = GaugeMetricFamily(
            "fiomon_sla_breach", "1 while the SLA rule fires.", labels=["rule", "host"]
        )
        for (rule, host), v in sorted(s.sla_breach.items()):
            breach.add_metric([rule, host], v)
        yield breach
        breaches = CounterMetricFamily(
            "fiomon_sla_breaches", "Times the SLA rule started firing.", labels=["rule"]
        )
        for rule, v in sorted(s.sla_breaches.items()):
            breaches.add_metric([rule], v)
        yield breaches
        families: tuple[tuple[type[CounterMetricFamily | GaugeMetricFamily], Any], ...] = (
            (CounterMetricFamily, s.counters),
            (GaugeMetricFamily, s.gauges),
        )
        for kind, table in families:
            for (name, text, labels), values in sorted(table.items()):
                metric = kind(name, text, labels=list(labels))
                for lv, v in sorted(values.items()):
                    metric.add_metric(list(lv), v)
                yield metric
        for (name, text), (edges, counts, n, total) in sorted(s.histograms.items()):
            fam = HistogramMetricFamily(name, text)
            b = [(_le(e), c) for e, c in zip(edges, counts, strict=True)]
            b.append(("+Inf", n))
            fam.add_metric([], b, sum_value=total)
            yield fam


def _le(edge_s: float) -> str:
    """The ``le`` label as Prometheus spells it (PromQL matches ``le`` as a string)."""
    text: str = floatToGoString(edge_s)  # type: ignore[no-untyped-call]
    return text


def serve_metrics(
    addr: str,
    port: int,
    collector: FiomonCollector,
    *,
    certfile: Path | None = None,
    keyfile: Path | None = None,
) -> tuple[WSGIServer, threading.Thread, CollectorRegistry]:
    """Serve ``/metrics`` from a thread on a private registry; stop with ``shutdown()``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, thread = start_http_server(
        port,
        addr=addr,
        registry=registry,
        certfile=str(certfile) if certfile else None,
        keyfile=str(keyfile) if keyfile else None,
    )
    return server, thread, registry
