"""AggregatorCore on a fake clock: closing, the exported snapshot, idling, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fiomon.aggregator.merger import AggregatorCore
from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.config import ExportConfig, SlaRule
from fiomon.model import RecordBatch
from fiomon.server.alerts import Phase
from fiomon.server.exporter import Snapshot
from fiomon.server.metrics import CELL_INFO
from fiomon.wire import encode
from tests.aggregator.corekit import batch, close_delays, core
from tests.clock import T0, FakeClock
from tests.metricskit import FiomonCollector

# -- the exported snapshot ----------------------------------------------------------------------


def test_bucket_histogram_is_exported_at_zero_from_the_start_with_the_cell() -> None:
    # rate() counts a series' growth from its first scrape: born with the first quantum's
    # counts, it would lose that quantum (in each cell of a cross-cell sum differently).
    clock = FakeClock(T0)
    c = core(clock, cell="cell-a", export=ExportConfig(buckets_per_octave=16))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: c.snapshot))
    for d in ("read", "write", "trim", "all"):
        labels = {"direction": d, "latency": "clat"}
        assert registry.get_sample_value("fiomon_cluster_io_latency_seconds_count", labels) == 0
        labels["le"] = "+Inf"
        assert registry.get_sample_value("fiomon_cluster_io_latency_seconds_bucket", labels) == 0
    assert len(c.snapshot.edges_s) == 24 * 16 + 1
    assert registry.get_sample_value("fiomon_cell_info", {"name": "cell-a"}) == 1.0
    # ... and the records' counts then add to those same series.
    c.on_records("h1", encode("h1", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 4)])))
    clock.advance(10_000)
    assert c.tick()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: c.snapshot))
    count = registry.get_sample_value(
        "fiomon_cluster_io_latency_seconds_count", {"direction": "read", "latency": "clat"}
    )
    assert count == pytest.approx(3 * 200)
    assert registry.get_sample_value("fiomon_cell_info", {"name": "cell-a"}) == 1.0
    assert core(clock).snapshot.gauges.get(CELL_INFO) is None  # no cell: no series


def test_metrics_text_passes_promtool(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    c = core(clock, sla=(SlaRule("p99-read", "read", 99.0, 5e6, for_quanta=1, min_samples=1),))
    clock.advance(20_000)
    c.on_records("h1", encode("h1", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 8)])))
    c.on_records(
        "h2", encode("h2", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 8)], bin_=1400))
    )
    clock.advance(5001)  # no more records: the wall clock decides
    rows = c.tick()
    assert rows, "quanta older than the lateness close on the clock"
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: c.snapshot))
    text = generate_latest(registry).decode()
    # Every latency and SLA series says which latency it is (the aggregator's `latency`).
    read_p99 = 'direction="read",latency="clat",percentile="99"'
    assert f"fiomon_cluster_latency_percentile_seconds{{{read_p99}}}" in text
    assert (
        'fiomon_cluster_io_latency_seconds_bucket{direction="read",latency="clat",le="0.005"}'
        in text
    )
    breach = {"rule": "p99-read", "host": "", "latency": "clat"}
    assert registry.get_sample_value("fiomon_sla_breach", breach) == 1.0
    assert registry.get_sample_value("fiomon_quantum_end_timestamp_seconds") == (T0 + 7000) / 1000
    count = registry.get_sample_value(
        "fiomon_cluster_io_latency_seconds_count", {"direction": "read", "latency": "clat"}
    )
    assert count == pytest.approx(2 * 7 * 200)
    threshold = {"rule": "p99-read", "direction": "read", "percentile": "99", "latency": "clat"}
    assert registry.get_sample_value("fiomon_sla_threshold_seconds", threshold) == 0.005
    assert registry.get_sample_value("fiomon_benchmark_active") == 1.0
    assert registry.get_sample_value("fiomon_broker_connected") == 0.0
    assert registry.get_sample_value(
        "fiomon_host_last_seen_timestamp_seconds", {"host": "h2"}
    ) == pytest.approx((T0 + 20_000) / 1000)
    assert "fiomon_build_info{" in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run .ci/run or apt-get install prometheus")
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    # Prometheus' conventions hold: promtool has no finding at all.
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (res.stdout + res.stderr).strip(), res.stdout + res.stderr
    # The confidence bounds bracket the percentile; a side the data cannot bound is absent.
    bound = {"direction": "read", "percentile": "99", "latency": "clat"}
    value = registry.get_sample_value("fiomon_cluster_latency_percentile_seconds", bound)
    low = registry.get_sample_value("fiomon_cluster_latency_percentile_lower_seconds", bound)
    high = registry.get_sample_value("fiomon_cluster_latency_percentile_upper_seconds", bound)
    assert value is not None and low is not None and high is not None
    assert low <= value <= high
    # 400 I/Os a quantum cannot bound p99.9 from above: that series is absent, not NaN.
    top = {"direction": "read", "percentile": "99.9", "latency": "clat"}
    assert registry.get_sample_value("fiomon_cluster_latency_percentile_upper_seconds", top) is None
    assert registry.get_sample_value("fiomon_cluster_latency_percentile_lower_seconds", top)


def test_idle_withdraws_the_per_quantum_series_and_settles_the_alert() -> None:
    # records ......... 7 s of them, then silence
    # lateness 5 s:     the last quantum closes at +5 s, the alert fires (for: 1)
    # idle at 2 x lateness after the last record: series gone, alert resolved
    clock = FakeClock(T0)
    c = core(clock, sla=(SlaRule("p99-read", "read", 99.0, 5e6, for_quanta=1, min_samples=1),))
    clock.advance(8_000)
    c.on_records(
        "h1", encode("h1", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 8)], bin_=1400))
    )
    clock.advance(5001)
    assert c.tick()
    snap = c.snapshot
    assert c.active and snap.cluster and snap.hosts
    assert snap.sla_breach[("p99-read", "")] == 1
    clock.advance(c.idle_after_ms - 5001 - 1)
    c.tick()
    assert c.active, "still within the idle time"
    clock.advance(1)
    c.tick()
    assert not _active(c)
    snap = c.snapshot
    assert not snap.cluster and not snap.hosts, "per-quantum gauges are withdrawn"
    names = {k[0] for k in snap.gauges}
    assert "fiomon_cluster_iops" not in names
    assert "fiomon_cluster_latency_percentile_saturated" not in names
    assert snap.gauges[("fiomon_benchmark_active", *_help(snap, "fiomon_benchmark_active"))] == {
        (): 0.0
    }
    assert snap.sla_breach[("p99-read", "")] == 0, "a run that ended is no breach"
    assert [(t.old, t.new, t.idle) for t in c.transitions[-1:]] == [
        (Phase.FIRING, Phase.RESOLVED, True)
    ]
    # Records again: active, and the next quanta bring the series back.
    c.on_records("h1", encode("h1", "s@1", 7, batch([clock.t + 1000 * i for i in range(1, 3)])))
    c.tick()
    assert c.active
    assert c.snapshot.gauges[("fiomon_benchmark_active", *_help(snap, "fiomon_benchmark_active"))]


def _active(c: AggregatorCore) -> bool:
    return c.active  # read through a call: mypy would keep an earlier assert's narrowing


def _help(snap: Snapshot, name: str) -> tuple[str, tuple[str, ...]]:
    ((_, text, labels),) = [k for k in snap.gauges if k[0] == name]
    return text, labels


def test_skipped_tail_fits_are_counted_on_metrics() -> None:
    # One occupied bin per quantum: nothing to fit a distribution to. The operator sees
    # the skipped fits on /metrics instead of tail gauges that never come.
    clock = FakeClock(T0 + 20_000)
    c = core(clock, fit_tail=True)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: c.snapshot))
    assert registry.get_sample_value("fiomon_tail_fits_skipped_total") == 0.0
    c.on_records("h1", encode("h1", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 4)])))
    clock.advance(5001)
    assert c.tick()
    text = generate_latest(registry).decode()
    assert "fiomon_cluster_tail_share{" not in text
    # One close: its newest quantum is fitted per direction with I/O (read, all).
    skipped = registry.get_sample_value("fiomon_tail_fits_skipped_total")
    assert skipped == 2


# -- bad input and faults -----------------------------------------------------------------------


def test_bad_payloads_are_counted_by_reason_and_nothing_else_changes() -> None:
    clock = FakeClock(T0 + 20_000)
    c = core(clock, max_message_bytes=64 * 1024)
    good = encode("h1", "s@1", 0, batch([T0 + 1000, T0 + 2000]))
    c.on_records("h1", b"\x00garbage" * 10)
    c.on_records("h1", good[:30])
    c.on_records("h1", good[:4] + b"\x09" + good[5:])  # another version
    c.on_records("h1", good + b"\0" * 70_000)  # oversized
    c.on_records("h2", good)  # published under another host's topic
    coarse = batch([T0 + 1000])
    c.on_records("h1", good)
    c.on_records("h1", good)  # a redelivery
    wrong = encode(
        "h1",
        "s@2",
        0,
        RecordBatch(
            layout=BinLayout(19, 0, "us"),
            streams=coarse.streams,
            stream_idx=coarse.stream_idx,
            direction=coarse.direction,
            start_ms=coarse.start_ms,
            end_ms=coarse.end_ms,
            nbytes=coarse.nbytes,
            indptr=coarse.indptr,
            bins=coarse.bins,
            counts=coarse.counts,
        ),
    )
    c.on_records("h1", wrong)
    future = encode("h1", "s@3", 0, batch([T0 + 3_600_000]))
    c.on_records("h1", future)
    assert dict(c.counts.invalid) == {
        "not-fiomon": 1,
        "truncated": 1,
        "version": 1,
        "oversized": 1,
        "agent-mismatch": 1,
        "layout": 1,
        "future": 1,
    }
    assert c.counts.records["received"] == 2
    assert c.counts.records["duplicate"] == 2
    assert c.counts.records["invalid-future"] == 1


def test_a_silent_agent_does_not_hold_quanta_open() -> None:
    clock = FakeClock(T0)
    c = core(clock)
    c.on_status("h1", json.dumps({"state": "online", "instance": "x"}).encode())
    c.on_status("h2", json.dumps({"state": "online", "instance": "y"}).encode())
    before = close_delays(c)
    for s in range(1, 30):
        before = close_delays(c)
        clock.t = T0 + 1000 * s + 300
        c.on_records("h1", encode("h1", "a@1", s - 1, batch([T0 + 1000 * s])))
        if s < 8:  # h2 falls silent after 7 s
            c.on_records("h2", encode("h2", "b@1", s - 1, batch([T0 + 1000 * s])))
        c.tick()
    # With lateness 5 s and h2 silent, quanta still close about 1 s behind h1.
    assert c.engine is not None
    after = close_delays(c)
    assert after.n > before.n, "the last tick closed a quantum"
    assert after.at_most(1.5) - before.at_most(1.5) == after.n - before.n
    assert sum(c.engine.late_records.values()) == 0


def test_host_flood_is_capped_and_two_agents_with_one_id_are_noticed() -> None:
    clock = FakeClock(T0 + 20_000)
    c = core(clock, max_hosts=5)
    for h in range(40):
        name = f"h{h}"
        c.on_records(name, encode(name, "s@1", 0, batch([T0 + 1000])))
    clock.advance(5001)  # no more records: the wall clock decides
    rows = c.tick()
    assert c.engine is not None and c.engine.hosts_over_cap == 35
    hosts = {r.host for r in rows if r.scope == "host"}
    assert len(hosts) == 5
    cluster = [r for r in rows if r.scope == "cluster" and r.direction == "read"]
    assert cluster[0].stats.samples == 40 * 200  # every host still counts in the cluster
    assert c.counts.lost == {}
    assert set(c.counts.duplicates) <= {f"h{i}" for i in range(5)} | {"_other"}
    c.on_status("h1", json.dumps({"state": "online", "instance": "one"}).encode())
    c.on_status("h1", json.dumps({"state": "online", "instance": "two"}).encode())
    assert c.counts.id_conflicts["h1"] == 1
    # A restart is no second agent: the old instance went offline first (its Will after
    # kill -9, or its clean stop), then the new one came online within seconds.
    c.on_status("h2", json.dumps({"state": "online", "instance": "one"}).encode())
    c.on_status("h2", json.dumps({"state": "offline"}).encode())
    c.on_status("h2", json.dumps({"state": "online", "instance": "two"}).encode())
    assert c.counts.id_conflicts["h2"] == 0


def _two_hosts(
    c: AggregatorCore, clock: FakeClock[int], *, h2_until: int, h2_offline: bool
) -> list[ClosedQuantum]:
    """h1 reports 1..29 s, h2 1..``h2_until`` s (then offline if asked); every row closed."""
    rows: list[ClosedQuantum] = []
    for s in range(1, 30):
        clock.t = T0 + 1000 * s + 300
        c.on_records("h1", encode("h1", "a@1", s - 1, batch([T0 + 1000 * s])))
        if s <= h2_until:
            c.on_records("h2", encode("h2", "b@1", s - 1, batch([T0 + 1000 * s])))
        elif s == h2_until + 1 and h2_offline:
            c.on_status("h2", json.dumps({"state": "offline"}).encode())
        rows += c.tick()
    return rows


def test_quanta_closed_without_a_host_that_fell_silent_are_incomplete() -> None:
    clock = FakeClock(T0)
    c = core(clock)
    rows = _two_hosts(c, clock, h2_until=7, h2_offline=False)
    incomplete = {(r.end_ms - T0) // 1000 for r in rows if not r.complete}
    # h2's last record ends at 7 s: the quanta starting within lateness (idle) after it
    # closed without it; then it counts as gone and the quanta hold h1 alone, complete.
    assert incomplete == {8, 9, 10, 11, 12}
    assert all(r.scope == "cluster" for r in rows if not r.complete)
    h1 = [r for r in rows if r.host == "h1"]
    assert h1 and all(r.complete for r in h1)  # h1's rows hold all h1 sent
    assert all(r.complete for r in rows if r.end_ms <= T0 + 7000)  # before: both there
    line = json.loads(next(r for r in rows if not r.complete).to_json_line())
    assert line["complete"] is False
    assert "cells_missing" not in line
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: c.snapshot))
    assert registry.get_sample_value("fiomon_quanta_incomplete_total") == 5
    assert registry.get_sample_value("fiomon_quantum_complete") == 1.0  # the last one is


def test_a_host_whose_agent_stopped_cleanly_is_not_waited_for() -> None:
    clock = FakeClock(T0)
    c = core(clock)
    rows = _two_hosts(c, clock, h2_until=7, h2_offline=True)
    assert rows and all(r.complete for r in rows)
