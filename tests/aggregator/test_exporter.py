"""The exposition: render() gives what prometheus_client gives for the same snapshot."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from fiomon.aggregator.exporter import Snapshot, render
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
