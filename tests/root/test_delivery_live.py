"""End-to-end delivery between a cell and the root, on real Mosquittos (issue 24).

A cell keeps its partials until the *root* acknowledged them (journaled), not merely its
broker: a root's broker that PUBACKs and then loses them (``kill -9`` with nothing saved,
no subscriber yet) loses nothing, and a message lost on the way is asked for again.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import aiomqtt
import pytest

from fiomon.aggregator.merger import AggregatorCore
from fiomon.aggregator.outbox import Outbox
from fiomon.aggregator.service import run_aggregator
from fiomon.config import AggregatorConfig, BrokerConfig, PartialsConfig, RootConfig
from fiomon.partials import peek
from fiomon.root.service import RootService, run_root
from fiomon.wire import encode as encode_records
from tests.aggregator.test_aggregator_live import subscription
from tests.batches import batch
from tests.conftest import DEADLINE_S, Mosquitto, free_port, until

ROOT_PREFIX = "fiomonroot"
Q = 1000
Row = dict[str, object]


def _cell(tmp: Path, broker_port: int, root_port: int) -> AggregatorConfig:
    """Cell ``c1`` on ``broker_port``, its partials to ``root_port``; it closes a quantum
    once its one stream reported past it (lateness 2 min: never on the clock)."""
    return AggregatorConfig(
        broker=BrokerConfig(port=broker_port),
        topic_prefix="fiomonlive",
        client_id="fiomon-cell-live",
        lateness_ms=120_000,
        align="epoch",
        listen=f"127.0.0.1:{free_port()}",
        quanta_file=tmp / "cell-quanta.jsonl",
        state_dir=tmp / "cell-state",
        partials=PartialsConfig(
            cell="c1", broker=BrokerConfig(port=root_port), topic_prefix=ROOT_PREFIX
        ),
    )


def _root_yaml(tmp: Path, port: int) -> Path:
    """The root, closing only on cell c1's word (lateness 2 min), with a state directory.

    The fed records run 4x ahead of the clock, and so do the cell's closed marks:
    ``max_skew: 10min`` lets the root believe them (the default 5 s would ignore them).
    """
    path = tmp / "root.yaml"
    path.write_text(
        f"broker: {{port: {port}}}\ntopic_prefix: {ROOT_PREFIX}\n"
        "client_id: fiomon-root-live\nquantum: 1s\nlateness: 120s\nalign: epoch\n"
        f"listen: 127.0.0.1:{free_port()}\nquanta_file: {tmp / 'root-quanta.jsonl'}\n"
        "root: {cells: [c1], cell_timeout: 120s, max_skew: 10min}\n"
        f"state_dir: {tmp / 'root-state'}\n"
    )
    return path


def _rows(path: Path) -> list[Row]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines()]


def _key(r: Row) -> tuple[object, ...]:
    return (r["end_ms"], r["scope"], r["host"], r["direction"])


def _ends(path: Path) -> set[int]:
    return {int(str(r["end_ms"])) for r in _rows(path)}


async def _feed(port: int, start_ms: int, n: int, every_s: float) -> None:
    """Host ``a``'s records, one a quantum, at ``every_s`` (the data source's pace)."""
    async with aiomqtt.Client("127.0.0.1", port, identifier="feeder") as pub:
        for k in range(n):
            rec = (start_ms + k * Q, start_ms + (k + 1) * Q, k % 2, {500 + k % 40: 100 + k})
            payload = encode_records("a", "s", k, batch([rec], host="a"))
            await pub.publish("fiomonlive/v1/a/records", payload, qos=1)
            await asyncio.sleep(every_s)


def _assert_root_has_the_cells_quanta_once(tmp: Path, upto: int, said: Callable[[], str]) -> None:
    """Every row the cell wrote for quanta ending by ``upto`` is in the root's file, once."""
    cell = {_key(r): r for r in _rows(tmp / "cell-quanta.jsonl") if int(str(r["end_ms"])) <= upto}
    assert len({k[0] for k in cell}) >= 20
    root_rows = _rows(tmp / "root-quanta.jsonl")
    twice = [k for k, n in Counter(map(_key, root_rows)).items() if n > 1]
    root = {_key(r): r for r in root_rows}
    missing = sorted(k for k in cell if k not in root)
    assert not missing, f"{len(missing)} cell rows absent at the root: {missing[:8]}\n{said()}"
    assert not twice, f"rows written twice by the root: {twice[:8]}"
    for k, r in cell.items():
        assert root[k]["samples"] == r["samples"], k
        assert root[k]["percentiles_ns"] == r["percentiles_ns"], k


async def test_partials_outlive_a_root_broker_that_is_killed_and_loses_its_sessions(
    mosquitto: Mosquitto, mosquitto_bin: str, tmp_path: Path
) -> None:
    """The issue's fault: the root's broker ``kill -9``-ed with nothing saved; the cell
    reconnects first and its partials are PUBACKed into the void. None may be lost."""
    root_broker = Mosquitto(mosquitto_bin, tmp_path / "root-broker")
    root_broker.conf.write_text(
        root_broker.conf.read_text().replace("persistence true", "persistence false")
    )
    root_broker.start()
    logs: list[Path] = []

    async def start_root() -> asyncio.subprocess.Process:
        since = len(root_broker.log_text())
        logs.append(tmp_path / f"root-{len(logs) + 1}.log")
        with logs[-1].open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "fiomon", "root", "--config", str(root_cfg),
                "--log-level", "debug", stderr=log,
            )  # fmt: skip
        await root_broker.wait_for_log(
            f"fiomon-root-live 1 {ROOT_PREFIX}/v1/_partials/+", since=since
        )
        return proc

    def said() -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-4000:]}" for p in logs)

    root_cfg = _root_yaml(tmp_path, root_broker.port)
    cfg = _cell(tmp_path, mosquitto.port, root_broker.port)
    cores: list[AggregatorCore] = []
    stop = asyncio.Event()
    root = await start_root()
    cell = asyncio.create_task(run_aggregator(cfg, stop=stop, ready=cores.append))
    feeder: asyncio.Task[None] | None = None
    try:
        await mosquitto.wait_for_log(subscription("fiomon-cell-live"))
        start = time.time_ns() // 1_000_000 // Q * Q
        feeder = asyncio.create_task(_feed(mosquitto.port, start, 60, 0.25))
        await until(lambda: bool(cores), what="the cell serving")
        box = cores[0].outbox
        assert box is not None
        await until(lambda: box.root_acks, what="the root's first acknowledgement")
        await until(lambda: len(_ends(tmp_path / "root-quanta.jsonl")) >= 3, what="root rows")
        # The crash: the root's broker dies with every session and retained message, and
        # the root with it (it comes back later than the cell reconnects).
        assert root_broker.proc is not None
        root_broker.proc.kill()
        root_broker.proc.wait(DEADLINE_S)
        root.kill()
        await root.wait()
        root_broker.start()  # the same port, nothing remembered
        sent = box.sent
        await until(lambda: box.sent >= sent + 5, what="partials PUBACKed with no root there")
        # The broker took them and dropped them (no subscriber): the cell still holds them.
        assert box.backlog_messages >= 5, box.backlog_messages
        root = await start_root()
        await feeder
        cell_quanta = tmp_path / "cell-quanta.jsonl"
        await until(lambda: len(_ends(cell_quanta)) >= 55, what="the cell closed its quanta")
        await until(
            lambda: _ends(cell_quanta) <= _ends(tmp_path / "root-quanta.jsonl"),
            what="every quantum the cell closed at the root",
        )
        upto = max(_ends(cell_quanta))
        await until(lambda: box.backlog_messages <= 1, what="the root acknowledged the rest")
    finally:
        if feeder is not None:
            feeder.cancel()
        stop.set()
        await asyncio.wait_for(cell, DEADLINE_S)
        if root.returncode is None:
            root.terminate()
            await asyncio.wait_for(root.wait(), DEADLINE_S)
        root_broker.stop()
    _assert_root_has_the_cells_quanta_once(tmp_path, upto, said)
    assert box.resent > 0


def _metric(port: int, name: str, labels: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.split()[1])
    return None


async def test_a_message_lost_between_cell_and_root_is_counted_asked_for_and_resent(
    mosquitto: Mosquitto, mosquitto_bin: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The cell's partials go through a relay (the cell's broker to the root's) that drops
    one message once: the root logs the hole with its numbers, counts it, names it in its
    acknowledgement, and the cell's resend fills it."""
    root_broker = Mosquitto(mosquitto_bin, tmp_path / "root-broker")
    root_broker.start()
    cfg = _cell(tmp_path, mosquitto.port, mosquitto.port)  # partials to the relay
    root_cfg = AggregatorConfig(
        broker=BrokerConfig(port=root_broker.port),
        topic_prefix=ROOT_PREFIX,
        client_id="fiomon-root-live",
        lateness_ms=120_000,
        align="epoch",
        listen=f"127.0.0.1:{free_port()}",
        quanta_file=tmp_path / "root-quanta.jsonl",
        state_dir=tmp_path / "root-state",
        # Marks run ahead of the clock with the fed records (see _root_yaml).
        root=RootConfig(cells=("c1",), cell_timeout_ms=120_000, max_skew_ms=600_000),
    )
    roots: list[RootService] = []
    cores: list[AggregatorCore] = []
    stop = asyncio.Event()
    root = asyncio.create_task(run_root(root_cfg, stop=stop, ready=roots.append))
    await root_broker.wait_for_log(f"fiomon-root-live 1 {ROOT_PREFIX}/v1/_partials/+")
    dropped: list[int] = []
    partials = f"{ROOT_PREFIX}/v1/_partials/c1"
    acks = f"{ROOT_PREFIX}/v1/_partials_ack/c1"

    async def relay() -> None:
        """Partials relay -> root (message 8 dropped once), acknowledgements root -> relay."""
        async with (
            aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="relay-cell") as near,
            aiomqtt.Client("127.0.0.1", root_broker.port, identifier="relay-root") as far,
        ):
            await near.subscribe(partials, qos=1)
            await far.subscribe(acks, qos=1)

            async def up() -> None:
                async for m in near.messages:
                    body = bytes(m.payload)
                    head = peek(body)
                    if head is not None and head[1] == 8 and not dropped:
                        dropped.append(8)
                        continue
                    await far.publish(partials, body, qos=1)

            async def down() -> None:
                async for m in far.messages:
                    await near.publish(acks, bytes(m.payload), qos=1, retain=True)

            async with asyncio.TaskGroup() as tg:
                tg.create_task(up())
                tg.create_task(down())

    relaying = asyncio.create_task(relay())
    cell = asyncio.create_task(run_aggregator(cfg, stop=stop, ready=cores.append))
    feeder: asyncio.Task[None] | None = None
    try:
        await mosquitto.wait_for_log(f"relay-cell 1 {partials}")
        await mosquitto.wait_for_log(subscription("fiomon-cell-live"))
        start = time.time_ns() // 1_000_000 // Q * Q
        feeder = asyncio.create_task(_feed(mosquitto.port, start, 24, 0.2))
        await until(lambda: bool(dropped), what="the relay dropped message 8")
        await until(lambda: bool(roots), what="the root serving")
        svc = roots[0]
        await until(lambda: svc.delivery.cells["c1"].gaps >= 1, what="the hole counted")
        await feeder
        await until(lambda: len(_ends(tmp_path / "cell-quanta.jsonl")) >= 20, what="cell rows")
        await until(
            lambda: _ends(tmp_path / "cell-quanta.jsonl") <= _ends(tmp_path / "root-quanta.jsonl"),
            what="every quantum the cell closed at the root",
        )
        upto = max(_ends(tmp_path / "cell-quanta.jsonl"))
        c1 = svc.delivery.cells["c1"]
        assert c1.next_seq is not None and c1.next_seq > 8
        assert (c1.gaps, c1.lost) == (1, 0)
        port = int(root_cfg.listen.rsplit(":", 1)[1])
        await until(
            lambda: _metric(port, "fiomon_root_partials_gaps_total", 'cell="c1"') == 1,
            what="fiomon_root_partials_gaps_total{cell=c1} 1 on /metrics",
        )
        box: Outbox | None = cores[0].outbox
        assert box is not None and box.resent >= 1
    finally:
        if feeder is not None:
            feeder.cancel()
        stop.set()
        await asyncio.wait_for(asyncio.gather(cell, root), DEADLINE_S)
        relaying.cancel()
        root_broker.stop()
    assert "cell c1: partials messages 8..8 missing" in caplog.text
    _assert_root_has_the_cells_quanta_once(tmp_path, upto, lambda: caplog.text[-4000:])
