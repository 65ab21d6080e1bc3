"""``/-/ready`` of a real aggregator: 503 with the reason until subscribed and while the
broker is away, 200 in between; ``/-/healthy`` 200 throughout."""

from __future__ import annotations

import asyncio

from fiomon.aggregator.service import run_aggregator
from fiomon.config import AggregatorConfig, BrokerConfig
from tests.conftest import DEADLINE_S, Mosquitto, free_port
from tests.metricskit import http_get

PREFIX = "fiomonready"
STARTING = "fiomon is not ready: starting: state restored, not yet subscribed on the broker\n"
AWAY = "fiomon is not ready: not connected to the MQTT broker (reconnecting)\n"


async def answers(port: int, path: str, want: tuple[int, str]) -> None:
    """Until ``path`` answers ``want`` (the last answers in the failure)."""
    got: list[tuple[int, str] | str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not got or got[-1] != want:
        assert loop.time() < deadline, f"{path}: wanted {want}, got {got[-3:]}"
        if got:
            await asyncio.sleep(0.1)
        try:
            got.append(await asyncio.to_thread(http_get, port, path))
        except OSError as exc:  # not listening yet
            got.append(str(exc))


async def test_ready_says_why_until_subscribed_and_while_the_broker_is_away(
    mosquitto: Mosquitto,
) -> None:
    mosquitto.stop()  # the aggregator starts before its broker
    port = free_port()
    cfg = AggregatorConfig(
        broker=BrokerConfig(port=mosquitto.port),
        topic_prefix=PREFIX,
        client_id="fiomon-aggregator-ready",
        listen=f"127.0.0.1:{port}",
    )
    stop = asyncio.Event()
    agg = asyncio.create_task(run_aggregator(cfg, stop=stop))
    try:
        await answers(port, "/-/healthy", (200, "fiomon is healthy.\n"))
        await answers(port, "/-/ready", (503, STARTING))
        mosquitto.start()
        await answers(port, "/-/ready", (200, "fiomon is ready.\n"))
        mosquitto.stop()
        await answers(port, "/-/ready", (503, AWAY))
        assert await asyncio.to_thread(http_get, port, "/-/healthy") == (
            200,
            "fiomon is healthy.\n",
        )
        mosquitto.start()
        await answers(port, "/-/ready", (200, "fiomon is ready.\n"))
    finally:
        stop.set()
        await asyncio.wait_for(agg, DEADLINE_S)
