"""The root as a service: SLA rules, its closed mark, buckets, cells, intake and signals."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from fiomon.bins import BinLayout
from fiomon.config import (
    AggregatorConfig,
    BrokerConfig,
    ExportConfig,
    RootConfig,
    SlaRule,
    load_aggregator_config,
    root_ignored_keys,
)
from fiomon.model import DIRECTIONS
from fiomon.root.service import LEGACY_MARK_FILE, RootService, run_root
from fiomon.server.journal import StateLock
from fiomon.server.state import GRID_STATE_FILE
from tests.clock import T0, FakeClock
from tests.conftest import Mosquitto, free_port, until
from tests.root.test_merger import LAY, Q, _one_row_message

ALWAYS = (SlaRule("p99-read", "read", 99.0, 1.0, for_quanta=1, min_samples=1),)  # 1 ns


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("with_quanta", [False, True])
def test_sla_rules_fire_with_or_without_state_dir_and_quanta_file(
    tmp_path: Path, with_state: bool, with_quanta: bool
) -> None:
    clock = FakeClock(T0)
    cfg = AggregatorConfig(
        align="epoch",
        lateness_ms=5000,
        root=RootConfig(cells=("c1",)),
        sla=ALWAYS,
        state_dir=tmp_path / "s" if with_state else None,
        quanta_file=tmp_path / "q.jsonl" if with_quanta else None,
    )
    svc = RootService(cfg, now_ms=clock)
    svc.on_message("c1", _one_row_message("c1", T0 + Q, T0 + Q))
    assert len(svc.tick()) == 1
    assert [a["state"] for a in svc.publisher.alerts.snapshot()] == ["firing"]
    svc.close()


def test_the_final_flush_is_exported_and_alerted(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    cfg = AggregatorConfig(
        align="epoch", lateness_ms=5000, root=RootConfig(cells=("c1",)), sla=ALWAYS
    )
    svc = RootService(cfg, now_ms=clock)
    svc.on_message("c1", _one_row_message("c1", T0 + Q, T0))  # c1 has not closed it
    assert svc.tick() == []
    (row,) = svc.flush()
    assert row.end_ms == T0 + Q
    assert [a["state"] for a in svc.publisher.alerts.snapshot()] == ["firing"]
    assert svc.publisher.buckets.total["read"] == 10
    svc.close()


def test_a_restart_without_quanta_file_closes_nothing_twice(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    cfg = AggregatorConfig(
        align="epoch", lateness_ms=5000, state_dir=tmp_path / "s", root=RootConfig(cells=("c1",))
    )
    first = RootService(cfg, now_ms=clock)
    for i in range(1, 6):
        first.on_message("c1", _one_row_message("c1", T0 + i * Q, T0 + i * Q))
        clock.t = T0 + i * Q + 10
        assert len(first.tick()) == 1
    first.on_message("c1", _one_row_message("c1", T0 + 6 * Q, T0 + 5 * Q))  # stays open
    assert first.tick() == []
    first.close()  # as after kill -9 (nothing was flushed)
    mark = json.loads((tmp_path / "s" / GRID_STATE_FILE).read_text())  # as an aggregator's
    assert mark["closed_ms"] == T0 + 5 * Q and mark["quantum_ms"] == Q
    second = RootService(cfg, now_ms=clock)
    assert second.merger.open_quanta == 1  # only the open quantum is re-formed
    clock.t += 60_000
    assert {r.end_ms for r in second.tick()} == {T0 + 6 * Q}
    assert second.publisher.buckets.total["read"] == 10
    second.close()
    # Everything is closed and marked: the journal is released, a third start re-forms nothing.
    assert not list((tmp_path / "s" / "journal").glob("*.jnl"))
    third = RootService(cfg, now_ms=clock)
    assert third.merger.open_quanta == 0
    third.close()


@pytest.mark.parametrize("name", [GRID_STATE_FILE, LEGACY_MARK_FILE])
def test_a_mark_of_another_quantum_is_ignored(tmp_path: Path, name: str) -> None:
    state = tmp_path / "s"
    state.mkdir()
    doc = {"version": 1, "quantum_ms": 5000, "phase_ms": 0, "layout": [1, 1, "ns"]}
    (state / name).write_text(json.dumps(doc | {"closed_ms": T0}))
    svc = RootService(
        AggregatorConfig(align="epoch", state_dir=state, root=RootConfig(cells=("c1",)))
    )
    assert svc.merger.closed_ms is None
    svc.close()


def test_the_mark_of_an_earlier_version_is_read_once_there_is_no_grid_state(
    tmp_path: Path,
) -> None:
    state = tmp_path / "s"
    state.mkdir()
    (state / LEGACY_MARK_FILE).write_text(json.dumps({"quantum_ms": Q, "closed_ms": T0 + Q}))
    cfg = AggregatorConfig(align="epoch", state_dir=state, root=RootConfig(cells=("c1",)))
    svc = RootService(cfg, now_ms=FakeClock(T0 + 2 * Q))
    assert svc.merger.closed_ms == T0 + Q  # an upgrade closes nothing twice
    svc.close()


def test_buckets_are_configured_exported_at_0_and_follow_the_layout() -> None:
    clock = FakeClock(T0)
    cfg = AggregatorConfig(
        align="epoch",
        lateness_ms=5000,
        root=RootConfig(cells=("c1",)),
        export=ExportConfig(buckets_per_octave=8),
    )
    svc = RootService(cfg, now_ms=clock)
    assert set(svc.publisher.buckets.counts) == set(DIRECTIONS)
    assert all(not c.any() for c in svc.publisher.buckets.counts.values())
    ratios = np.diff(np.log2(svc.publisher.buckets.edges_s[:20]))
    assert np.allclose(ratios, 1 / 8, atol=0.01)
    other = BinLayout(coarseness=1)
    assert other != LAY
    svc.on_message("c1", _one_row_message("c1", T0 + Q, T0 + Q, layout=other))
    svc.tick()
    assert svc.publisher.buckets.layout == other
    assert svc.publisher.buckets.total["read"] == 10
    assert set(svc.publisher.buckets.counts) == set(DIRECTIONS)


def test_cells_up_counts_listed_cells_and_an_unlisted_one_is_refused() -> None:
    clock = FakeClock(T0)
    cfg = AggregatorConfig(
        align="epoch", root=RootConfig(cells=("c1", "c2"), cell_timeout_ms=10_000)
    )
    svc = RootService(cfg, now_ms=clock)
    clock.t += 11_000  # the expected cells are gone
    svc.on_message("stray", _one_row_message("stray", T0 + Q, T0 + Q))
    svc.tick()
    g = {name: v for (name, _, _), v in svc.snapshot.gauges.items()}
    assert g["fiomon_root_cells_up"] == {(): 0.0}
    assert g["fiomon_root_cells_expected"] == {(): 2.0}
    # An unlisted cell is refused: no series, nothing merged, not waited for.
    assert g["fiomon_root_cell_up"] == {("c1",): 0.0, ("c2",): 0.0}
    c = {name: v for (name, _, _), v in svc.snapshot.counters.items()}
    assert c["fiomon_root_partials_messages"] == {}
    assert c["fiomon_root_invalid_partials"] == {("unlisted",): 1.0}
    assert svc.merger.open_quanta == 0


def _live_cfg(
    mosquitto: Mosquitto,
    client_id: str,
    *,
    state_dir: Path | None = None,
    quanta_file: Path | None = None,
) -> AggregatorConfig:
    """A root of cell c1 on the test broker, epoch-aligned, /metrics on a free port."""
    return AggregatorConfig(
        align="epoch",
        broker=BrokerConfig(port=mosquitto.port),
        listen=f"127.0.0.1:{free_port()}",
        client_id=client_id,
        state_dir=state_dir,
        quanta_file=quanta_file,
        root=RootConfig(cells=("c1",)),
    )


async def _publish(port: int, topic: str, payload: bytes) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as c:
        await c.publish(topic, payload, qos=1)


async def test_a_failing_message_is_counted_and_a_lost_broker_reconnects(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    cfg = _live_cfg(mosquitto, "root-test")
    stop = asyncio.Event()
    box: list[RootService] = []
    calls = 0

    def ready(svc: RootService) -> None:
        box.append(svc)
        take = svc.on_message

        def on_message(cell: str, payload: bytes) -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                msg = "a bug"
                raise RuntimeError(msg)
            take(cell, payload)

        svc.on_message = on_message  # type: ignore[method-assign]

    task = asyncio.create_task(run_root(cfg, stop=stop, ready=ready))
    await until(lambda: box and box[0].broker_connected, what="the root connected")
    svc = box[0]
    topic = "fiomon/v1/_partials/c1"
    base = (time.time_ns() // 1_000_000 // Q + 60) * Q  # a minute ahead: not late
    await _publish(mosquitto.port, topic, _one_row_message("c1", base + Q, base))
    await until(lambda: svc.merger.counts.invalid["internal"] == 1, what="the bug counted")
    await _publish(mosquitto.port, topic, _one_row_message("c1", base + 2 * Q, base))
    await until(lambda: svc.merger.counts.rows["merged"] == 1, what="the next message merged")
    # The reader ends with the connection: the root reconnects instead of idling.
    mosquitto.stop()
    await until(lambda: not svc.broker_connected, what="the loss noticed")
    mosquitto.start()
    await until(lambda: svc.broker_connected, what="reconnected")
    await _publish(mosquitto.port, topic, _one_row_message("c1", base + 3 * Q, base))
    await until(lambda: svc.merger.counts.rows["merged"] == 2, what="merged after reconnecting")
    stop.set()
    await task


async def test_sighup_does_not_stop_the_root_and_handlers_go(tmp_path: Path) -> None:
    conf = tmp_path / "root.yaml"
    conf.write_text("align: epoch\nlateness: 10s\nroot: {cells: [c1]}\nlog_level: info\n")
    cfg = AggregatorConfig(
        align="epoch",
        broker=BrokerConfig(port=free_port()),  # nobody there: the root keeps retrying
        listen=f"127.0.0.1:{free_port()}",
        root=RootConfig(cells=("c1",)),
    )
    stop = asyncio.Event()
    box: list[RootService] = []
    reloaded = asyncio.Event()

    def ready(svc: RootService) -> None:
        box.append(svc)
        real = svc.reload

        def reload(new: AggregatorConfig) -> list[str]:
            done = real(new)
            reloaded.set()
            return done

        svc.reload = reload  # type: ignore[method-assign]

    task = asyncio.create_task(run_root(cfg, stop=stop, ready=ready, config_path=conf))
    await until(lambda: box, what="the root started")
    os.kill(os.getpid(), signal.SIGHUP)
    await asyncio.wait_for(reloaded.wait(), 30)
    assert not task.done()
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(task, 30)
    assert stop.is_set()
    loop = asyncio.get_running_loop()
    assert not loop.remove_signal_handler(signal.SIGHUP)  # run_root removed its handlers
    assert not loop.remove_signal_handler(signal.SIGTERM)


def test_a_reload_refuses_rules_at_a_confidence_level_the_root_does_not_compute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The file is valid on its own (its rule's level is its confidence_level), but the
    # running root computes bounds at 0.95 only: the rule would never have its bounds.
    conf = tmp_path / "root.yaml"
    conf.write_text(
        "align: epoch\nlateness: 10s\nroot: {cells: [c1]}\nconfidence_level: 0.9\n"
        "sla:\n  - {name: r, direction: read, percentile: 99, threshold: 5ms, confidence: 0.9}\n"
    )
    cfg = AggregatorConfig(align="epoch", root=RootConfig(cells=("c1",)), sla=ALWAYS)
    svc = RootService(cfg)
    assert cfg.confidence_level == 0.95
    svc.reload(load_aggregator_config(conf))
    assert svc.cfg.sla == ALWAYS
    assert [r.name for r in svc.publisher.alerts.rules] == ["p99-read"]
    assert "SIGHUP: SLA rules r need confidence bounds at a level" in caplog.text
    # The same rule at the running level is taken.
    conf.write_text(conf.read_text().replace("0.9", "0.95"))
    svc.reload(load_aggregator_config(conf))
    assert [r.name for r in svc.cfg.sla] == ["r"]
    svc.close()


def test_the_keys_the_root_ignores_are_named(tmp_path: Path) -> None:
    conf = tmp_path / "root.yaml"
    conf.write_text("align: epoch\nlateness: 10s\ntopic_prefix: lab\nroot: {cells: [c1]}\n")
    assert root_ignored_keys(load_aggregator_config(conf)) == []  # alert_topic's default: lab/...
    conf.write_text(
        "align: epoch\nlateness: 10s\ntopic_prefix: lab\nroot: {cells: [c1]}\n"
        "webhook: {url: 'http://127.0.0.1:9093/api/v2/alerts'}\nalert_topic: lab/alerts\n"
    )
    assert root_ignored_keys(load_aggregator_config(conf)) == ["webhook", "alert_topic"]


async def test_a_final_stop_closes_writes_unlocks_then_disconnects(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    cfg = _live_cfg(
        mosquitto, "root-order", state_dir=tmp_path / "s", quanta_file=tmp_path / "q.jsonl"
    )
    stop = asyncio.Event()
    box: list[RootService] = []
    at_close: list[tuple[bool, int]] = []  # (connected, open quanta) as the flush starts

    def ready(svc: RootService) -> None:
        box.append(svc)
        close = svc.close

        def closing(timeout_s: float = 10.0) -> None:
            at_close.append((svc.broker_connected, svc.merger.open_quanta))
            close(timeout_s)

        svc.close = closing  # type: ignore[method-assign]

    task = asyncio.create_task(run_root(cfg, stop=stop, ready=ready, final=True))
    await until(lambda: box and box[0].broker_connected, what="the root connected")
    svc = box[0]
    base = (time.time_ns() // 1_000_000 // Q + 60) * Q  # a minute ahead: stays open
    await _publish(mosquitto.port, "fiomon/v1/_partials/c1", _one_row_message("c1", base + Q, base))
    await until(lambda: svc.merger.counts.rows["merged"] == 1, what="merged")
    assert svc.merger.open_quanta == 1
    stop.set()
    await asyncio.wait_for(task, 30)
    # In order: the final close, then the flush (still connected), then the disconnect.
    assert at_close == [(True, 0)]
    (line,) = (tmp_path / "q.jsonl").read_text().splitlines()
    assert json.loads(line)["end_ms"] == base + Q
    StateLock(tmp_path / "s").release()
    assert "root-order disconnected" in mosquitto.log_text()
