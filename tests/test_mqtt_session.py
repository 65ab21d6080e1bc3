"""A persistent session's unread messages across a reconnect (``fiomon.mqtt``), real broker.

The aggregator and the root acknowledge by hand after journaling. Messages a connection
left in the client's queue carry that connection's packet ids; :func:`drop_stale` drops
them before the next connection, and the broker redelivers every one of them there.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import aiomqtt
import pytest

from fiomon.config import BrokerConfig
from fiomon.mqtt import IncomingQueue, drop_stale, make_client
from tests.conftest import Mosquitto, until


async def test_dropped_stale_messages_are_redelivered_on_the_next_connection(
    mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="test.stale")
    log = logging.getLogger("test.stale")
    client = make_client(
        BrokerConfig(port=mosquitto.port),
        identifier="stale-test",
        persistent_session_s=300,
        receive_maximum=100,
        queue_type=cast("type[asyncio.Queue[aiomqtt.Message]]", IncomingQueue),
    )
    queue = IncomingQueue.made[-1]
    paho = client._client
    paho.manual_ack_set(True)
    async with client:
        await client.subscribe("t/#", qos=1)  # the session exists from now on
    n = 10
    sent = [f"m{i}".encode() for i in range(n)]
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as pub:
        for payload in sent:
            await pub.publish("t/x", payload, qos=1)

    # The backlog arrives; this connection ends with all of it unread and unacknowledged.
    async with client:
        await client.subscribe("t/#", qos=1)
        await until(lambda: queue.qsize() == n, what="the backlog received")
    assert drop_stale(queue, log) == n
    assert queue.empty()
    assert f"{n} messages of the previous connection left for the broker" in caplog.text

    # The broker redelivers every one; only those wait in the queue (nothing stale).
    async with client:
        await client.subscribe("t/#", qos=1)
        await until(lambda: queue.qsize() == n, what="the backlog redelivered")
        got = [queue.get_nowait() for _ in range(n)]
        assert [m.payload for m in got] == sent
        for m in got:
            paho.ack(m.mid, m.qos)
        # Acknowledged on this connection: a marker sent after them comes alone next time.
        await client.publish("t/marker", b"marker", qos=1)
        await until(lambda: queue.qsize() == 1, what="the marker received")
        marker = queue.get_nowait()
        paho.ack(marker.mid, marker.qos)
    assert drop_stale(queue, log) == 0
    async with aiomqtt.Client("127.0.0.1", mosquitto.port) as pub:
        await pub.publish("t/x", b"last", qos=1)
    async with client:
        await client.subscribe("t/#", qos=1)
        await until(lambda: queue.qsize() >= 1, what="the last message received")
        assert [queue.get_nowait().payload] == [b"last"]
