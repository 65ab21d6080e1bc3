"""The server shell around a minimal merger, on a real Mosquitto.

The merger here only records what the shell asks of it, so the shell's contract is
checked alone: a message is handed over before it is acknowledged (the broker does not
redeliver it to the next session), the close loop ticks, and the stop runs its written
order once: intake stops, the close loop ends (``final``: one flush), the merger is
closed, its last words come while the connection is up, then every task is released.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import aiomqtt

from fiomon.closed import ClosedQuantum
from fiomon.config import AggregatorConfig, BrokerConfig
from fiomon.server.alerts import AlertBook
from fiomon.server.app import Hooks, Server
from fiomon.server.exporter import Snapshot
from fiomon.server.link import Link
from fiomon.server.metrics import Counts, Health, QuantumGauges, build_snapshot
from tests.conftest import DEADLINE_S, Mosquitto, free_port, until

TOPIC = "shell/v1/in"


class Recorder(Hooks):
    """A merger that merges nothing and remembers every call of the shell, in order."""

    name = "test"
    log = logging.getLogger("fiomon.test")

    def __init__(self, cfg: AggregatorConfig) -> None:
        self.cfg = cfg
        self.link = Link()
        self.counts = Counts()
        self.calls: list[str] = []
        self.payloads: list[bytes] = []
        self.snapshot = self._build()

    def _build(self) -> Snapshot:
        health = Health(open_quanta=0, broker_connected=self.link.connected)
        return build_snapshot(self.counts, QuantumGauges((50.0,)), health, AlertBook(()))

    def now_ms(self) -> int:
        return 0

    def subscriptions(self) -> list[str]:
        return [TOPIC]

    def handle(self, batch: Sequence[aiomqtt.Message]) -> None:
        self.payloads += [bytes(m.payload) for m in batch]

    def tick(self) -> list[ClosedQuantum]:
        if not self.calls or self.calls[-1] != "tick":
            self.calls.append("tick")
        return []

    def flush(self) -> list[ClosedQuantum]:
        self.calls.append("flush")
        return []

    def reload(self, new: AggregatorConfig) -> list[str]:
        return []

    def close(self, timeout_s: float) -> None:
        self.calls.append(f"close connected={self.link.connected}")

    async def after_close(self, left: Callable[[], float], intake: asyncio.Task[None]) -> None:
        self.calls.append(f"after_close connected={self.link.connected}")

    def release(self) -> None:
        self.calls.append("release")

    def banner(self) -> str:
        return "test shell"

    def status(self) -> str:
        return "testing"

    def stopping(self, *, final: bool) -> str:
        return "stopping"

    def summary(self) -> str:
        return f"{len(self.payloads)} messages"


def _config(port: int, client_id: str) -> AggregatorConfig:
    return AggregatorConfig(
        broker=BrokerConfig(port=port),
        client_id=client_id,
        listen=f"127.0.0.1:{free_port()}",
        topic_prefix="shell",
    )


async def _serve(
    mosquitto: Mosquitto, merger: Recorder, client_id: str, *, final: bool
) -> tuple[asyncio.Event, asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(Server(merger, stop=stop, final=final).run())
    await mosquitto.wait_for_log(f"{client_id} 1 {TOPIC}")
    await until(lambda: merger.link.connected, what="the shell says it is connected")
    return stop, task


async def test_messages_reach_the_merger_once_and_the_stop_runs_in_order(
    mosquitto: Mosquitto,
) -> None:
    first = Recorder(_config(mosquitto.port, "shell-a"))
    stop, task = await _serve(mosquitto, first, "shell-a", final=True)
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as c:
        for i in range(3):
            await c.publish(TOPIC, f"m{i}".encode(), qos=1)
    await until(lambda: len(first.payloads) == 3, what="three messages handed over")
    await until(lambda: "tick" in first.calls, what="the close loop ticks")
    stop.set()
    await asyncio.wait_for(task, DEADLINE_S)
    assert first.payloads == [b"m0", b"m1", b"m2"]
    # Intake stopped, the final flush, the state written while still connected, the
    # last words while connected, then (after disconnecting) everything released.
    assert first.calls[-4:] == [
        "flush",
        "close connected=True",
        "after_close connected=True",
        "release",
    ]
    assert not first.link.connected

    # Acknowledged once handed over: a new session on the same client id gets nothing.
    second = Recorder(_config(mosquitto.port, "shell-a"))
    stop, task = await _serve(mosquitto, second, "shell-a", final=False)
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as c:
        await c.publish(TOPIC, b"after", qos=1)
    await until(lambda: second.payloads, what="the new message")
    stop.set()
    await asyncio.wait_for(task, DEADLINE_S)
    assert second.payloads == [b"after"]
    assert "flush" not in second.calls  # not final: open quanta stay in the journal
