"""Cells and the exact root on real parts: two brokers, two cells, one root, six agents.

The root's quanta file must equal ``fiomon report --format jsonl`` over every host's logs
(one aggregator fed every record), also when a cell is ``kill -9``-ed and restarted
mid-run; a cell stopped for good is reported and no longer holds quanta open.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import sys
import time
import urllib.request
from pathlib import Path

import aiomqtt

from fiomon.aggregator.merger import AggregatorCore
from fiomon.aggregator.service import run_aggregator
from fiomon.config import AggregatorConfig, BrokerConfig, PartialsConfig
from fiomon.model import RecordBatch
from fiomon.partials import PartialsMessage, decode
from fiomon.root.merger import RootMerger
from fiomon.tools.simulate import write_cluster
from fiomon.wire import encode as encode_records
from tests.aggregator.test_aggregator_live import (
    _agent,
    assert_rows_equal,
    offline_report,
    replay_logs,
    subscription,
)
from tests.clock import T0
from tests.conftest import DEADLINE_S, Mosquitto, free_port, until
from tests.root.test_merger import assert_same, engine, records

ROOT_PREFIX = "fiomonroot"
CELLS = {"c1": (1, 2, 3), "c2": (4, 5, 6)}


class Cluster:
    """Two cell aggregators (on brokers ``a`` and ``b``) and a root (on broker ``a``)."""

    def __init__(
        self, tmp: Path, a: Mosquitto, b: Mosquitto, *, cell_timeout: str, lateness: str = "120s"
    ) -> None:
        self.tmp = tmp
        self.brokers = {"c1": a, "c2": b}
        self.root_broker = a
        self.logs: list[Path] = []
        self.root_quanta = tmp / "root-quanta.jsonl"
        self.root_port = free_port()
        self.root_cfg = tmp / "root.yaml"
        # The root's lateness is long: the data run ahead of the clock, so only the
        # cells' word closes quanta here (or a cell's absence, after cell_timeout). For
        # the same reason the cells' marks run ahead of the root's clock (by up to the
        # data's lead): max_skew is raised to take them.
        self.root_cfg.write_text(
            f"broker: {{port: {a.port}}}\ntopic_prefix: {ROOT_PREFIX}\n"
            f"client_id: fiomon-root-test\nquantum: 1s\nlateness: {lateness}\nalign: epoch\n"
            f"listen: 127.0.0.1:{self.root_port}\nquanta_file: {self.root_quanta}\n"
            f"root: {{cells: [c1, c2], cell_timeout: {cell_timeout}, max_skew: 10min, "
            "cells_lateness: 6s}\n"
            f"state_dir: {tmp / 'root-state'}\n"
        )
        for cell, broker in self.brokers.items():
            (tmp / f"{cell}.yaml").write_text(
                f"broker: {{port: {broker.port}}}\ntopic_prefix: fiomonlive\n"
                f"client_id: fiomon-{cell}\nquantum: 1s\nlateness: 6s\nalign: epoch\n"
                f"listen: 127.0.0.1:{free_port()}\nquanta_file: {tmp / f'{cell}-quanta.jsonl'}\n"
                f"state_dir: {tmp / f'{cell}-state'}\n"
                f"partials: {{cell: {cell}, broker: {{port: {a.port}}}, "
                f"topic_prefix: {ROOT_PREFIX}}}\n"
            )

    async def process(self, command: str, cfg: Path, name: str) -> asyncio.subprocess.Process:
        self.logs.append(self.tmp / f"{name}-{len(self.logs) + 1}.log")
        with self.logs[-1].open("wb") as log:  # kept for the failure message
            return await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "fiomon",
                command,
                "--config",
                str(cfg),
                "--log-level",
                "debug",
                stderr=log,
            )

    async def root(self) -> asyncio.subprocess.Process:
        since = len(self.root_broker.log_text())
        proc = await self.process("root", self.root_cfg, "root")
        await self.root_broker.wait_for_log(
            f"fiomon-root-test 1 {ROOT_PREFIX}/v1/_partials/+", since=since
        )
        return proc

    async def cell(self, cell: str) -> asyncio.subprocess.Process:
        broker = self.brokers[cell]
        since = len(broker.log_text())
        proc = await self.process("aggregator", self.tmp / f"{cell}.yaml", cell)
        await broker.wait_for_log(subscription(f"fiomon-{cell}"), since=since)
        return proc

    async def agents(self) -> list[asyncio.subprocess.Process]:
        out = []
        for cell, hosts in CELLS.items():
            broker = self.brokers[cell]
            for h in hosts:
                out.append(await _agent(self.tmp, f"client-{h:02d}", broker.port))
            for h in hosts:
                await broker.wait_for_log(f" as fiomon-agent-client-{h:02d} (")
        return out

    def root_rows(self) -> list[dict[str, object]]:
        """The root's quanta file's complete lines (the last may be mid-write)."""
        text = self.root_quanta.read_text() if self.root_quanta.exists() else ""
        return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]

    def closed_ends(self) -> set[int]:
        return {int(str(r["end_ms"])) for r in self.root_rows()}

    def said(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in self.logs)


def _lines(data: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in data.glob("*/*.log"))


async def _stop(procs: list[asyncio.subprocess.Process]) -> None:
    for p in procs:
        if p.returncode is None:
            p.terminate()
    for p in procs:
        await asyncio.wait_for(p.wait(), DEADLINE_S)


async def test_root_equals_one_aggregator_through_cell_and_root_kill_9(
    mosquitto: Mosquitto, mosquitto_bin: str, tmp_path: Path
) -> None:
    second = Mosquitto(mosquitto_bin, tmp_path / "mosquitto-b")
    second.start()
    procs: list[asyncio.subprocess.Process] = []
    writer: asyncio.Task[None] | None = None
    try:
        # Event time starts ahead of the clock and runs 4x faster: cells close early
        # (every live stream past a quantum), never on their clock.
        start = time.time_ns() // 1_000_000 // 1000 * 1000 + 3000
        staged = write_cluster(
            tmp_path / "staged", hosts=6, jobs_per_host=2, seconds=30, iops=300,
            start_ms=start, seed=21,
        )  # fmt: skip
        last_end = max(int(str(r["end_ms"])) for r in offline_report(staged)[0])
        data = tmp_path / "data"
        c = Cluster(tmp_path, mosquitto, second, cell_timeout="120s")
        procs.append(await c.root())
        cells = {name: await c.cell(name) for name in CELLS}
        procs += await c.agents()
        writer = asyncio.create_task(replay_logs(staged, data, start_ms=start, speedup=4.0))
        await until(c.closed_ends, what="the root closed quanta before the crash")
        cells["c2"].kill()  # SIGKILL: its open quanta and unsent partials die with it
        await cells["c2"].wait()
        at_kill = _lines(data)
        await until(
            lambda: _lines(data) >= at_kill + 12 or writer.done(),
            what="lines written while cell c2 is down",
        )
        cells["c2"] = await c.cell("c2")
        # Then the root: its open quanta are in its journal, what comes meanwhile is
        # queued by its broker for its session.
        before = len(c.closed_ends())
        await until(lambda: len(c.closed_ends()) > before, what="the root closed more quanta")
        procs[0].kill()
        await procs[0].wait()
        at_kill = _lines(data)
        await until(
            lambda: _lines(data) >= at_kill + 12 or writer.done(),
            what="lines written while the root is down",
        )
        procs[0] = await c.root()
        await writer
        await until(lambda: last_end in c.closed_ends(), what=f"the root closed {last_end}")
        procs += cells.values()
    finally:
        if writer is not None:
            writer.cancel()
        await _stop(procs)
        second.stop()
    files = sorted(p.resolve() for p in data.glob("*/*.log"))
    offline, _ = offline_report(files)
    online = c.root_rows()
    try:
        assert {r["host"] for r in online if r["host"]} == {f"client-{h:02d}" for h in range(1, 7)}
        # Every row complete (no cell missing: the root waited out both restarts); the
        # root's own key aside, the rows are the offline report's.
        assert [r for r in online if r["cells_missing"] != [] or not r["complete"]] == []
        assert_rows_equal(
            [{k: v for k, v in r.items() if k != "cells_missing"} for r in online], offline
        )
    except AssertionError as exc:
        msg = f"{exc}\nthe processes said:\n{c.said()}"
        raise AssertionError(msg) from None


def _metric(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


async def test_a_cell_gone_for_good_is_reported_and_holds_nothing_open(
    mosquitto: Mosquitto, mosquitto_bin: str, tmp_path: Path
) -> None:
    second = Mosquitto(mosquitto_bin, tmp_path / "mosquitto-b")
    second.start()
    procs: list[asyncio.subprocess.Process] = []
    writer: asyncio.Task[None] | None = None
    try:
        start = time.time_ns() // 1_000_000 // 1000 * 1000 + 3000
        staged = write_cluster(
            tmp_path / "staged", hosts=6, jobs_per_host=1, seconds=40, iops=200,
            start_ms=start, seed=5,
        )  # fmt: skip
        last_end = max(int(str(r["end_ms"])) for r in offline_report(staged)[0])
        data = tmp_path / "data"
        c = Cluster(tmp_path, mosquitto, second, cell_timeout="10s", lateness="10s")
        procs.append(await c.root())
        cells = {name: await c.cell(name) for name in CELLS}
        procs += await c.agents()
        procs.append(cells["c1"])
        writer = asyncio.create_task(replay_logs(staged, data, start_ms=start, speedup=4.0))
        await until(c.closed_ends, what="the root closed quanta")
        assert _metric(c.root_port, "fiomon_root_cells_up") == 2
        cells["c2"].kill()  # for good
        await cells["c2"].wait()
        killed_at = max(c.closed_ends())
        await until(
            lambda: _metric(c.root_port, "fiomon_root_cells_up") == 1,
            what="the root counts one cell up",
        )
        await writer
        # Without c2 the root closes on c1's word alone: every quantum, to the last.
        await until(lambda: last_end in c.closed_ends(), what=f"the root closed {last_end}")
    finally:
        if writer is not None:
            writer.cancel()
        await _stop(procs)
        second.stop()
    said = c.said()
    assert "cell c2 is gone" in said, said
    # Closed before the kill: complete; well after it: every row names c2 as missing.
    rows = c.root_rows()
    before = [r for r in rows if int(str(r["end_ms"])) <= killed_at]
    after = [r for r in rows if int(str(r["end_ms"])) > killed_at + 10_000]
    assert before and all(r["complete"] and r["cells_missing"] == [] for r in before), said
    assert after and all(not r["complete"] and r["cells_missing"] == ["c2"] for r in after), said
    late_hosts = {
        r["host"] for r in c.root_rows() if r["host"] and int(str(r["end_ms"])) > killed_at + 10_000
    }
    assert late_hosts == {"client-01", "client-02", "client-03"}, said


def _records_at(now: int) -> RecordBatch:
    """Two minutes of host ``a``'s records, moved to start at ``now`` (ms) as T0."""
    batch = records(random.Random(4), ["a"], 120)
    return dataclasses.replace(
        batch, start_ms=batch.start_ms - T0 + now, end_ms=batch.end_ms - T0 + now
    )


def _cell_c1(client_id: str, port: int, root_port: int, state_dir: Path) -> AggregatorConfig:
    """Cell ``c1`` in-process on the broker at ``port``, its partials to ``root_port``;
    nothing closes on the clock (lateness 2 min): only its final stop closes quanta."""
    return AggregatorConfig(
        broker=BrokerConfig(port=port),
        topic_prefix="fiomonlive",
        client_id=client_id,
        lateness_ms=120_000,
        align="epoch",
        listen=f"127.0.0.1:{free_port()}",
        state_dir=state_dir,
        partials=PartialsConfig(
            cell="c1", broker=BrokerConfig(port=root_port), topic_prefix=ROOT_PREFIX
        ),
    )


async def test_a_final_stop_sends_the_final_close_to_the_root(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    """``--final`` closes what is open; those partials reach the root's broker before exit."""
    now = time.time_ns() // 1_000_000 // 1000 * 1000
    batch = _records_at(now)
    one = engine(partials=False)
    one.add(batch)
    want = one.flush()
    cfg = _cell_c1("fiomon-cell-final", mosquitto.port, mosquitto.port, tmp_path / "cell")
    got: list[PartialsMessage] = []
    cores: list[AggregatorCore] = []
    stop = asyncio.Event()
    async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="root-spy") as spy:
        await spy.subscribe(f"{ROOT_PREFIX}/v1/_partials/+", qos=1)

        async def collect() -> None:
            async for m in spy.messages:
                got.append(decode(bytes(m.payload)))

        collector = asyncio.create_task(collect())
        cell = asyncio.create_task(run_aggregator(cfg, stop=stop, ready=cores.append, final=True))
        await mosquitto.wait_for_log(subscription("fiomon-cell-final"))
        async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="pub") as pub:
            await pub.publish("fiomonlive/v1/a/records", encode_records("a", "s", 0, batch), qos=1)
        await until(lambda: cores[0].counts.records["received"] == len(batch), what="records in")
        await until(
            lambda: cores[0].engine is not None and cores[0].engine.open_quanta > 0,
            what="open quanta in the cell",
        )
        stop.set()
        await asyncio.wait_for(cell, DEADLINE_S)
        last = max(r.end_ms for r in want)
        await until(
            lambda: any(m.closed_through_ms >= last for m in got),
            what="the final close at the root's broker",
        )
        collector.cancel()
    root = RootMerger(
        quantum_ms=1000,
        lateness_ms=5000,
        percentiles=cfg.percentiles,
        confidence_level=cfg.confidence_level,
        per_host=True,
        cells=["c1"],
        cell_timeout_ms=60_000,
        now_ms=now,
    )
    at = max(m.closed_through_ms for m in got)  # the root's clock past the cell's last mark
    for m in got:
        root.take(m, at, cell=m.cell)
    assert_same(root.close(at), want)


async def test_partials_the_root_broker_refuses_stay_in_the_outbox(
    mosquitto: Mosquitto, mosquitto_bin: str, tmp_path: Path
) -> None:
    """A root broker whose ACL denies the partials topic: nothing counts as sent.

    Mosquitto acknowledges a denied QoS 1 publish all the same (with MQTT 5, with reason
    code 0x87 "Not authorized"): a cell that took any PUBACK as delivery would drop every
    partial for good while its log, its outbox and its counters said all was well.
    """
    root_broker = Mosquitto(mosquitto_bin, tmp_path / "mosquitto-root")
    acl = tmp_path / "root.acl"
    acl.write_text(f"topic read {ROOT_PREFIX}/#\n")  # no write on the partials topic
    with root_broker.conf.open("a") as f:
        f.write(f"acl_file {acl}\nlog_type debug\n")  # debug: "Denied PUBLISH from ..."
    root_broker.start()
    now = time.time_ns() // 1_000_000 // 1000 * 1000
    batch = _records_at(now)
    cfg = _cell_c1("fiomon-cell-refused", mosquitto.port, root_broker.port, tmp_path / "cell")
    cores: list[AggregatorCore] = []
    stop = asyncio.Event()
    cell = asyncio.create_task(run_aggregator(cfg, stop=stop, ready=cores.append))
    try:
        await mosquitto.wait_for_log(subscription("fiomon-cell-refused"))
        async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="pub") as pub:
            await pub.publish("fiomonlive/v1/a/records", encode_records("a", "s", 0, batch), qos=1)
        denied = "Denied PUBLISH from fiomon-cell-c1"
        # Two denials: the first publish's round trip ended before the second began.
        await until(
            lambda: root_broker.log_text().count(denied) >= 2,
            what="the root's broker denied two partials publishes",
        )
        outbox = cores[0].outbox
        assert outbox is not None
        assert outbox.sent == 0, "a refused message was taken as delivered"
        assert outbox.backlog_bytes > 0
        await until(lambda: outbox.refused >= 1, what="the refusal counted")
        cores[0].refresh_snapshot()
        counted = {k[0]: v for k, v in cores[0].snapshot.counters.items()}
        assert counted["fiomon_partials_messages"][("refused",)] >= 1
    finally:
        stop.set()
        await asyncio.wait_for(cell, DEADLINE_S)
        root_broker.stop()
