"""Prometheus exposition: an immutable snapshot, rendered once, served to any number of scrapers.

The aggregator builds a new :class:`Snapshot` when a quantum closes (and at most once a
second between closes, for its counters) and hands it to the ``/metrics`` child process
(:mod:`fiomon.server.metrics_server`), which renders it to the text format once
(:func:`render`, a few ms for thousands of hosts) and serves those bytes, gzipped once
too, to every scrape until the next snapshot: a scrape costs no Python work over the
series, and none of it in the aggregator's interpreter.

The tests' ``FiomonCollector`` (``tests/metricskit.py``) builds ``prometheus_client``
families from the same snapshot and checks that :func:`render` gives byte for byte what
``generate_latest`` gives for it.
A sample of what it exports::

    # HELP fiomon_cluster_latency_percentile_seconds Cluster-wide latency percentile of ...
    # TYPE fiomon_cluster_latency_percentile_seconds gauge
    fiomon_cluster_latency_percentile_seconds{direction="read",latency="clat",percentile="99"} 8e-4
    # TYPE fiomon_cluster_io_latency_seconds histogram
    fiomon_cluster_io_latency_seconds_bucket{direction="read",latency="clat",le="0.005"} 123456.0
    # TYPE fiomon_sla_breach gauge
    fiomon_sla_breach{host="",latency="clat",rule="p99-read"} 0.0

Every latency and SLA family carries ``latency``, the kind the aggregator merges
(``clat``, ``lat`` or ``slat``: its ``latency`` setting), on every series.

Names follow Prometheus' conventions (``promtool check metrics`` finds nothing): the
per-quantum percentiles are gauges with a ``percentile`` label (``"99"``, ``"99.9"``, the
quanta file's keys), since ``quantile`` is reserved for summaries; the full contract is
``docs/metrics.md``. While the aggregator is idle (no records for ``2 x lateness``) the
snapshot holds no per-quantum series at all, so they vanish from ``/metrics``.

Bucket edges are four per octave (``export.buckets_per_octave``) from 1 us to fio's cap,
plus every SLA threshold exactly. A fio bin that straddles an edge is split linearly, as
percentiles are interpolated, so the bucket counts are the exact histogram's values at those edges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from prometheus_client.utils import floatToGoString

from fiomon.bins import BinLayout
from fiomon.histogram import cumulative_at
from fiomon.model import DIRECTIONS

if TYPE_CHECKING:  # the live page's data rides on snapshots; the module loads with it
    from fiomon.server.live import LiveView

F64 = npt.NDArray[np.float64]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The per-quantum families (docs/metrics.md; the README's migration note has the old names).
CLUSTER_LATENCY = "fiomon_cluster_latency_percentile_seconds"
HOST_LATENCY = "fiomon_host_latency_percentile_seconds"
LATENCY_HISTOGRAM = "fiomon_cluster_io_latency_seconds"
QUANTUM_END = "fiomon_quantum_end_timestamp_seconds"
SLA_BREACH = "fiomon_sla_breach"
SLA_BREACHES = "fiomon_sla_breaches"  # a counter: rendered with ``_total``
# Help texts of the families above, shared by both renderings (collector and render()).
HELP = {
    CLUSTER_LATENCY: "Cluster-wide latency percentile of the last closed quantum.",
    HOST_LATENCY: "Per-host latency percentile of the last closed quantum (hosts capped).",
    LATENCY_HISTOGRAM: (
        "Cluster-wide I/O latencies since the aggregator started, from fio's histograms."
    ),
    QUANTUM_END: "End of the quantum the latency gauges describe (Unix time).",
    SLA_BREACH: "1 while the SLA rule fires.",
    SLA_BREACHES: "Times the SLA rule started firing.",
}


def bucket_edges_s(
    layout: BinLayout, thresholds_ns: Sequence[float] = (), per_octave: int = 4
) -> F64:
    """``le`` edges in seconds: ``per_octave`` per doubling from 1 us to fio's cap, plus SLAs.

    Every threshold in ``thresholds_ns`` is an edge exactly.

    The geometric edges are rounded to 3 significant digits at 4 per octave or fewer (the
    historical labels: ``0.00119``, not ``0.001189207...``), to 4 above, where 3 digits
    would make neighbours uneven. ``histogram_quantile`` interpolates linearly inside a
    bucket, so a percentile it derives is within one bucket's width of the exact one:
    at most 19.7 % relative at 4 per octave, 4.6 % at 16 (``2 ** (1 / per_octave) - 1``
    plus rounding; ``tests/server/test_exporter.py`` pins these bounds).
    """
    cap_ns = float(layout.edges_ns()[1][-1])
    k = np.arange(0, int(np.ceil(per_octave * np.log2(cap_ns / 1000.0))) + 1)
    edges = 1000.0 * np.exp2(k / per_octave)
    edges = edges[edges < cap_ns]
    digits = 3 if per_octave <= 4 else 4
    edges = np.array([float(f"{e:.{digits}g}") for e in edges])
    allx = np.unique(np.concatenate([edges, np.asarray(thresholds_ns, dtype=np.float64)]))
    return allx / 1e9


@dataclass(slots=True)
class BucketHistogram:
    """Cumulative-since-start bucket histogram per direction (monotonic, for ``rate()``).

    Args:
        layout: the engine's bin layout.
        edges_s: bucket edges (seconds).
        directions: directions exported at 0 from the start. ``rate()`` and ``increase()``
            count nothing of a series' first sample: a series that appeared with the
            first closed quantum's counts would lose that quantum from every rate, and
            from every sum across cells (each cell losing a different share).
    """

    layout: BinLayout
    edges_s: F64
    directions: tuple[str, ...] = ()
    counts: dict[str, F64] = field(default_factory=dict)
    total: dict[str, float] = field(default_factory=dict)
    sum_s: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for d in self.directions:
            self.counts.setdefault(d, np.zeros(len(self.edges_s)))
            self.total.setdefault(d, 0.0)
            self.sum_s.setdefault(d, 0.0)

    @classmethod
    def for_rules(
        cls, layout: BinLayout, thresholds_ns: Sequence[float], per_octave: int
    ) -> BucketHistogram:
        """The exported histogram (aggregator and root), every direction at 0.

        Args:
            layout: the engine's bin layout.
            thresholds_ns: the SLA rules' thresholds, each an exact bucket edge.
            per_octave: ``export.buckets_per_octave``.
        """
        return cls(layout, bucket_edges_s(layout, thresholds_ns, per_octave), DIRECTIONS)

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
        cluster: ``(direction, percentile) -> seconds`` (percentile as in ``"99.9"``).
        hosts: ``(host, direction, percentile) -> seconds``.
        edges_s: bucket edges of the histogram.
        buckets: ``direction -> (cumulative counts, total, sum seconds)``.
        sla_breach: ``(rule, host or "") -> 0/1``.
        sla_breaches: ``rule -> times it started firing``.
        counters: ``(metric, help, label names) -> {label values: value}``, counters.
        gauges: the same for gauges.
        histograms: ``(metric, help) -> (edges, cumulative counts, count, sum)``.
        live: the live page's recent quanta and status (not part of ``/metrics``).
        latency: the ``latency`` label of the latency and SLA families above (``cluster``
            to ``sla_breaches``; the tables in ``counters`` and ``gauges`` carry it in
            their keys already).
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
    live: LiveView | None = None
    latency: str = "clat"


def _le(edge_s: float) -> str:
    """The ``le`` label as Prometheus spells it (PromQL matches ``le`` as a string)."""
    text: str = floatToGoString(edge_s)  # type: ignore[no-untyped-call]
    return text


def _value(v: float) -> str:
    """A sample value exactly as ``prometheus_client`` writes it (Go's float format)."""
    f = float(v)
    if -1e300 < f < 1e6:  # repr is Go's format here; the rest (>= 1e6, inf, nan) is not
        return repr(f)
    text: str = floatToGoString(f)  # type: ignore[no-untyped-call]
    return text


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


class _Writer:
    """Text-format lines, with each series' ``name{labels} `` prefix built once and reused.

    Args:
        prefixes: a cache of prefixes kept between renders (cleared when it grows past
            ``max_prefixes``, which bounds it when hosts come and go).
        max_prefixes: cache size bound.
    """

    def __init__(self, prefixes: dict[str, dict[tuple[str, ...], str]], max_prefixes: int) -> None:
        if sum(map(len, prefixes.values())) > max_prefixes:
            prefixes.clear()
        self.prefixes = prefixes
        self.out: list[str] = []

    def head(self, name: str, kind: str, text: str) -> None:
        doc = text.replace("\\", r"\\").replace("\n", r"\n")
        self.out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")

    def samples(
        self, name: str, labels: Sequence[str], rows: Iterable[tuple[tuple[str, ...], float]]
    ) -> None:
        """One line per row: labels sorted by name, as ``generate_latest`` writes them."""
        cache = self.prefixes.get(name)
        if cache is None:
            cache = self.prefixes[name] = {}
        order = sorted(range(len(labels)), key=lambda i: labels[i])
        names = [labels[i] for i in order]
        out = self.out
        for values, v in rows:
            prefix = cache.get(values)
            if prefix is None:
                if values:
                    inner = ",".join(
                        f'{n}="{_escape(values[i])}"' for n, i in zip(names, order, strict=True)
                    )
                    prefix = f"{name}{{{inner}}} "
                else:
                    prefix = f"{name} "
                cache[values] = prefix
            f = float(v)
            # repr is Go's float format here; the rest (>= 1e6, inf, nan) is not
            out.append(f"{prefix}{repr(f) if -1e300 < f < 1e6 else _value(f)}\n")

    def histogram(
        self,
        name: str,
        labels: tuple[str, ...],
        values: tuple[str, ...],
        *,
        edges: Sequence[float],
        counts: Sequence[float],
        total: float,
        sum_value: float,
    ) -> None:
        les = [*(_le(e) for e in edges), "+Inf"]
        self.samples(
            f"{name}_bucket",
            (*labels, "le"),
            (((*values, le), c) for le, c in zip(les, [*counts, total], strict=True)),
        )
        self.samples(f"{name}_count", labels, [(values, total)])
        self.samples(f"{name}_sum", labels, [(values, sum_value)])


def render(s: Snapshot, prefixes: dict[str, dict[tuple[str, ...], str]] | None = None) -> bytes:
    """The text exposition (format 0.0.4) of ``s``: what ``generate_latest`` gives for it.

    Args:
        s: the snapshot.
        prefixes: a cache of series prefixes to reuse between renders (optional).
    """
    w = _Writer({} if prefixes is None else prefixes, max_prefixes=1_000_000)
    kind = s.latency
    w.head(CLUSTER_LATENCY, "gauge", HELP[CLUSTER_LATENCY])
    w.samples(
        CLUSTER_LATENCY,
        ("direction", "percentile", "latency"),
        [((*k, kind), v) for k, v in sorted(s.cluster.items())],
    )
    w.head(HOST_LATENCY, "gauge", HELP[HOST_LATENCY])
    w.samples(
        HOST_LATENCY,
        ("host", "direction", "percentile", "latency"),
        [((*k, kind), v) for k, v in sorted(s.hosts.items())],
    )
    if s.quantum_end_s is not None:
        w.head(QUANTUM_END, "gauge", HELP[QUANTUM_END])
        w.samples(QUANTUM_END, (), [((), s.quantum_end_s)])
    name = LATENCY_HISTOGRAM
    w.head(name, "histogram", HELP[name])
    for d, (counts, total, sum_s) in sorted(s.buckets.items()):
        w.histogram(
            name,
            ("direction", "latency"),
            (d, kind),
            edges=s.edges_s,
            counts=counts,
            total=total,
            sum_value=sum_s,
        )
    w.head(SLA_BREACH, "gauge", HELP[SLA_BREACH])
    w.samples(
        SLA_BREACH,
        ("rule", "host", "latency"),
        [((*k, kind), v) for k, v in sorted(s.sla_breach.items())],
    )
    w.head(f"{SLA_BREACHES}_total", "counter", HELP[SLA_BREACHES])
    w.samples(
        f"{SLA_BREACHES}_total",
        ("rule", "latency"),
        [((k, kind), v) for k, v in sorted(s.sla_breaches.items())],
    )
    for kind, table in (("counter", s.counters), ("gauge", s.gauges)):
        for (base, text, labels), values in sorted(table.items()):
            series = f"{base}_total" if kind == "counter" else base
            w.head(series, kind, text)
            w.samples(series, labels, sorted(values.items()))
    for (base, text), (edges, counts, n, total) in sorted(s.histograms.items()):
        w.head(base, "histogram", text)
        w.histogram(base, (), (), edges=edges, counts=counts, total=n, sum_value=total)
    return "".join(w.out).encode("utf-8")
