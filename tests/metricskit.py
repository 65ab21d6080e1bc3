"""Prometheus in tests: one parser for every test that scrapes, and the exporter's oracle.

A scrape becomes ``{(sample name, sorted labels): value}``, so a test asks for one series
with ``s[("fiomon_records_total", (("result", "received"),))]``. Parsing goes through
prometheus_client's own parser (the format's reference reader), not regular expressions.
:class:`FiomonCollector` builds prometheus_client's families from a snapshot, the
reference that the aggregator's own renderer is checked against.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from fiomon.server.exporter import (
    CLUSTER_LATENCY,
    HELP,
    HOST_LATENCY,
    LATENCY_HISTOGRAM,
    QUANTUM_END,
    SLA_BREACH,
    SLA_BREACHES,
    Snapshot,
)
from tests.conftest import DEADLINE_S

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


def parse_samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and sorted labels."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def scrape_text(port: int, timeout: float = 20, path: str = "/metrics") -> str:
    """The body of ``http://127.0.0.1:<port><path>``.

    Raises:
        OSError: nothing answers (yet), or the request timed out.
    """
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        body: bytes = r.read()
    return body.decode()


def scrape(port: int, timeout: float = 20) -> Samples:
    """The samples ``/metrics`` on ``port`` serves now."""
    return parse_samples(scrape_text(port, timeout))


def scrape_or_none(port: int) -> Samples | None:
    """:func:`scrape`, or None while nothing answers on ``port``."""
    try:
        return scrape(port, timeout=2)
    except OSError:
        return None


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def query(port: int, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """A Prometheus instant query on ``port``, now or ``at`` a Unix time (s)."""
    params: dict[str, str | float] = {"query": expr}
    if at is not None:
        params["time"] = at
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", (expr, doc)
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


async def wait_http(url: str, seconds: float = DEADLINE_S) -> None:
    """Until ``url`` answers at all (Prometheus ``/-/ready``, a ``/metrics`` endpoint)."""
    async with asyncio.timeout(seconds):
        while True:
            try:
                await asyncio.to_thread(urllib.request.urlopen, url, None, 2)
                return
            except OSError:
                await asyncio.sleep(0.2)


class FiomonCollector:
    """The oracle of :func:`fiomon.server.exporter.render`: the snapshot as families.

    Registered in a ``CollectorRegistry``, ``generate_latest`` writes what ``/metrics``
    must serve for the snapshot, byte for byte (prometheus_client's own text writer).

    Args:
        current: returns the latest snapshot (a reference swap on the aggregator side).
    """

    def __init__(self, current: Callable[[], Snapshot]) -> None:
        self.current = current

    def describe(self) -> list[Metric]:
        """Nothing up front (the series appear with the data)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The metric families of the current snapshot."""
        s = self.current()
        g = GaugeMetricFamily(
            CLUSTER_LATENCY, HELP[CLUSTER_LATENCY], labels=["direction", "percentile"]
        )
        for (d, q), v in sorted(s.cluster.items()):
            g.add_metric([d, q], v)
        yield g
        h = GaugeMetricFamily(
            HOST_LATENCY, HELP[HOST_LATENCY], labels=["host", "direction", "percentile"]
        )
        for (host, d, q), v in sorted(s.hosts.items()):
            h.add_metric([host, d, q], v)
        yield h
        if s.quantum_end_s is not None:
            yield GaugeMetricFamily(QUANTUM_END, HELP[QUANTUM_END], value=s.quantum_end_s)
        hist = HistogramMetricFamily(
            LATENCY_HISTOGRAM, HELP[LATENCY_HISTOGRAM], labels=["direction"]
        )
        for d, (counts, total, sum_s) in sorted(s.buckets.items()):
            buckets = [(_le(e), c) for e, c in zip(s.edges_s, counts, strict=True)]
            buckets.append(("+Inf", total))
            hist.add_metric([d], buckets, sum_value=sum_s)
        yield hist
        breach = GaugeMetricFamily(SLA_BREACH, HELP[SLA_BREACH], labels=["rule", "host"])
        for (rule, host), v in sorted(s.sla_breach.items()):
            breach.add_metric([rule, host], v)
        yield breach
        breaches = CounterMetricFamily(SLA_BREACHES, HELP[SLA_BREACHES], labels=["rule"])
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
    """The ``le`` label as prometheus_client spells it."""
    text: str = floatToGoString(edge_s)  # type: ignore[no-untyped-call]
    return text


def http_get(port: int, path: str) -> tuple[int, str]:
    """Status and body of ``GET http://127.0.0.1:<port><path>`` (error statuses included)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
