"""The cell's and the root's own families follow Prometheus' conventions, like the rest."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from fiomon.closed import ClosedQuantum, Scope
from fiomon.histogram import HistStats
from fiomon.server.alerts import AlertBook
from fiomon.server.exporter import Snapshot, render
from fiomon.server.metrics import (
    Counts,
    Health,
    QuantumGauges,
    build_snapshot,
    with_outbox,
    with_root,
)
from tests.metricskit import parse_samples


def test_cell_and_root_families_pass_promtool() -> None:
    snap = with_outbox(Snapshot(), backlog_bytes=4096, sent=12, dropped=0, refused=3)
    snap = with_root(
        snap,
        cells_up=1,
        cells_expected=2,
        cell_up={"c2": False, "c1": True},
        rows={"merged": 40, "late": 2},
        invalid={"layout": 1},
        closed_by_lateness=5,
    )
    text = render(snap).decode()
    samples = parse_samples(text)
    assert samples[("fiomon_partials_backlog_bytes", ())] == 4096
    assert samples[("fiomon_partials_messages_total", (("result", "refused"),))] == 3
    assert samples[("fiomon_root_cells_up", ())] == 1
    assert samples[("fiomon_root_cells_expected", ())] == 2
    assert samples[("fiomon_root_cell_up", (("cell", "c1"),))] == 1
    assert samples[("fiomon_root_cell_up", (("cell", "c2"),))] == 0
    # Every outcome is present from the start, at 0 (alerts see the series before it grows).
    assert samples[("fiomon_root_partial_rows_total", (("outcome", "duplicate"),))] == 0
    assert samples[("fiomon_root_partial_rows_total", (("outcome", "late"),))] == 2
    assert samples[("fiomon_root_invalid_partials_total", (("reason", "layout"),))] == 1
    assert samples[("fiomon_root_quanta_closed_by_lateness_total", ())] == 5
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run scripts/test or apt-get install prometheus")
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


SCOPES: tuple[tuple[Scope, str | None], ...] = (("cluster", None), ("host", "h1"))


def _rows(
    end_ms: int, *, complete: bool, cells_missing: tuple[str, ...] | None = None
) -> list[ClosedQuantum]:
    stats = HistStats(100.0, 1e5, 2e5, 9e5, {"50": 2e5, "99": 8e5}, ())
    return [
        ClosedQuantum(end_ms - 1000, end_ms, scope, host, "read", stats, 100.0, 4e5, 1, 0,
                      complete=complete if host is None else True, cells_missing=cells_missing)
        for scope, host in SCOPES
    ]  # fmt: skip


def test_incomplete_quanta_are_counted_and_the_last_ones_completeness_is_a_gauge() -> None:
    # The Publisher feeds both from the rows, for the aggregator and the root alike.
    gauges = QuantumGauges((50.0, 99.0))

    def scrape(health: Health) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        snap = build_snapshot(Counts(), gauges, health, AlertBook(()))
        return parse_samples(render(snap).decode())

    before = scrape(Health(active=True))
    assert before[("fiomon_quanta_incomplete_total", ())] == 0  # from the start, at 0
    assert ("fiomon_quantum_complete", ()) not in before  # no quantum closed yet
    t = 1_700_000_000_000
    gauges.observe(_rows(t + 1000, complete=True) + _rows(t + 2000, complete=False), t + 7000)
    m = scrape(Health(active=True))
    assert m[("fiomon_quanta_incomplete_total", ())] == 1
    assert m[("fiomon_quantum_complete", ())] == 0
    assert m[("fiomon_quantum_end_timestamp_seconds", ())] == (t + 2000) / 1000
    gauges.observe(_rows(t + 3000, complete=False, cells_missing=("cell-a",)), t + 8000)
    gauges.observe(_rows(t + 4000, complete=True, cells_missing=()), t + 9000)
    m = scrape(Health(active=False))  # idle: the gauge stays, as the quantum's end does
    assert m[("fiomon_quanta_incomplete_total", ())] == 2
    assert m[("fiomon_quantum_complete", ())] == 1
    text = render(build_snapshot(Counts(), gauges, Health(active=True), AlertBook(()))).decode()
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run scripts/test or apt-get install prometheus")
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def test_every_family_served_is_in_docs_metrics_md() -> None:
    """The contract is docs/metrics.md: each family a scrape can carry is named there."""
    from pathlib import Path  # noqa: PLC0415

    from prometheus_client import CollectorRegistry, generate_latest  # noqa: PLC0415
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    from fiomon.procstats import ServiceProcessCollector  # noqa: PLC0415

    snap = build_snapshot(
        Counts(), QuantumGauges((50.0, 99.0)), Health(active=True, cell="c1"), AlertBook(())
    )
    snap = with_outbox(snap, backlog_bytes=1, sent=1, dropped=0, refused=0)
    snap = with_root(
        snap, cells_up=1, cells_expected=1, cell_up={"c1": True}, rows={}, invalid={},
        closed_by_lateness=0,
    )  # fmt: skip
    process = CollectorRegistry()
    ServiceProcessCollector(registry=process)
    text = render(snap).decode() + generate_latest(process).decode()
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    served = {
        f.name + ("_total" if f.type == "counter" else "")
        for f in text_string_to_metric_families(text)
    }
    assert {"fiomon_build_info", "process_cpu_seconds_total"} <= served
    missing = sorted(n for n in served if f"`{n}`" not in docs and f"`{n}{{" not in docs)
    assert not missing, f"docs/metrics.md does not name {missing}"
