"""The exposition: render() gives what prometheus_client gives; the latency buckets' edges."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fiomon.histogram import cumulative_at
from fiomon.server.exporter import Snapshot, bucket_edges_s, render
from tests.aggregator.corekit import LAY
from tests.metricskit import FiomonCollector

HOSTS = ["h1", 'we"ird', "back\\slash", "new\nline", "ü-host"]


def rich_snapshot() -> Snapshot:
    """Every kind of family, hostile label values, values Go formats differently."""
    return Snapshot(
        quantum_end_s=1_795_000_123.0,
        cluster={("read", "99"): 0.00081, ("write", "50"): 1.5e-05},
        hosts={(h, "read", "99.9"): 0.001 * i for i, h in enumerate(HOSTS)},
        edges_s=(1e-06, 0.005, 17.0),
        buckets={"read": ((1.0, 2_000_000.0, 3e9), 3e9, 12.5)},
        sla_breach={("p99-read", ""): 1, ("p99-host", "h1"): 0},
        sla_breaches={"p99-read": 2},
        counters={
            ("fiomon_records", "Records by result.", ("result",)): {
                ("received",): 1_234_567.0,
                ("duplicate",): 0.0,
            },
            ("fiomon_late_records", "Late, by host.", ("host",)): {
                (h,): float(i) for i, h in enumerate(HOSTS)
            },
            ("fiomon_quanta_closed", "Quanta closed.", ()): {(): 7.0},
        },
        gauges={
            ("fiomon_hosts_up", "Hosts up.", ()): {(): 5.0},
            ("fiomon_odd", "Odd values.", ("v",)): {
                ("inf",): float("inf"),
                ("nan",): float("nan"),
                ("neg",): -3.5,
                ("big",): 1e22,
                ("tiny",): 1e-300,
            },
        },
        histograms={
            ("fiomon_quantum_close_delay_seconds", "Close delay."): (
                (0.25, 0.5, 5.0),
                (1.0, 3.0, 4.0),
                4.0,
                2.25,
            )
        },
    )


def test_render_gives_byte_for_byte_what_generate_latest_gives() -> None:
    snap = rich_snapshot()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: snap))
    want = generate_latest(registry)
    assert render(snap) == want
    cache: dict[str, dict[tuple[str, ...], str]] = {}
    assert render(snap, cache) == want
    assert render(snap, cache) == want  # the second render reuses every series prefix
    assert render(Snapshot()) == generate_latest(_registry(Snapshot()))


def _registry(snap: Snapshot) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: snap))
    return registry


# -- bucket edges ------------------------------------------------------------------------------


def test_bucket_counts_equal_the_histogram_at_each_edge() -> None:
    rng = np.random.default_rng(1)
    hist = np.zeros(LAY.nbins)
    hist[rng.integers(200, 1200, 300)] += rng.random(300) * 10
    edges = bucket_edges_s(LAY, [5e6])
    assert 0.005 in edges.tolist()
    got = cumulative_at(hist, LAY, edges)
    lower, upper = LAY.edges_ns()
    for e, g in zip(edges * 1e9, got, strict=True):
        frac = np.clip((e - lower) / (upper - lower), 0, 1)
        assert g == pytest.approx(float((hist * frac).sum()), rel=1e-12, abs=1e-9)
    assert np.all(np.diff(got) >= -1e-9)


@pytest.mark.parametrize(("per_octave", "widest"), [(4, 0.197), (16, 0.046)])
def test_bucket_resolution_and_its_error_bound(per_octave: int, widest: float) -> None:
    # The bound docs/metrics.md and deploy/README.md state for histogram_quantile: one
    # bucket's width, 2**(1/k) - 1 plus the rounding of the le labels.
    edges = bucket_edges_s(LAY, [5e6, 1.234e6], per_octave)
    assert {0.005, 0.001234} <= set(edges.tolist())  # SLA thresholds are exact edges
    widths = edges[1:] / edges[:-1] - 1
    assert widths.max() <= widest
    assert widths.max() >= 2 ** (1 / per_octave) - 1 - 1e-9  # the bound is not loose
    assert edges[0] == 1e-6
    assert edges[-1] < LAY.edges_ns()[1][-1] / 1e9
    assert len(edges) == 24 * per_octave + 2 + 1  # 24 octaves from 1 us, the thresholds


def test_default_bucket_edges_are_unchanged() -> None:
    # Dashboards and recorded series key on le labels: the default stays what it was.
    edges = bucket_edges_s(LAY, [5e6])
    assert len(edges) == 98
    assert edges[:4].tolist() == [1e-06, 1.19e-06, 1.41e-06, 1.68e-06]
