"""The MQTT session (``fiomon.mqtt.MqttSession``) against a real Mosquitto.

Its reconnect loop, batches and manual acknowledgement: what a persistent session's
connection left unread or unacknowledged comes again on the next one, and nothing else
does; the loop outlives a broker restart; a publish the broker's ACL denies raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
from pathlib import Path

import aiomqtt
import pytest

from fiomon.config import BrokerConfig
from fiomon.mqtt import Backoff, MqttSession, PublishRefusedError
from tests.conftest import DEADLINE_S, Mosquitto, until
from tests.mqttkit import once, publish, take

log = logging.getLogger("test.session")


def _session(port: int, ident: str, **options: object) -> MqttSession:
    """A persistent, manually acknowledging session, as the services make them."""
    return MqttSession(
        BrokerConfig(port=port),
        identifier=ident,
        logger=log,
        persistent_session_s=300,
        receive_maximum=100,
        manual_ack=True,
        backoff=Backoff(0.05, 0.5),
        **options,  # type: ignore[arg-type]
    )


async def test_unread_messages_are_dropped_and_redelivered_on_the_next_connection(
    mosquitto: Mosquitto, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="test.session")
    session = _session(mosquitto.port, "stale-test")
    await once(session, lambda: session.subscribe("t/#"))  # the session exists from now on
    n = 10
    sent = [f"m{i}".encode() for i in range(n)]
    await publish(mosquitto.port, "t/x", sent)

    # The backlog arrives; this connection ends with all of it unread and unacknowledged.
    async def leave_unread() -> None:
        await session.subscribe("t/#")
        await until(lambda: session.unread == n, what="the backlog received")

    await once(session, leave_unread)
    assert session.unread == n

    # The next connection starts without them (their packet ids were the last one's) and
    # the broker redelivers every one.
    async def redelivered() -> None:
        await session.subscribe("t/#")
        got = await take(session, n)
        assert [m.payload for m in got] == sent
        session.ack(got)

    await once(session, redelivered)
    assert f"{n} messages of the previous connection left for the broker" in caplog.text
    await publish(mosquitto.port, "t/x", [b"last"])

    async def only_the_last() -> None:
        await session.subscribe("t/#")
        assert [m.payload for m in await take(session, 1)] == [b"last"]

    await once(session, only_the_last)


async def test_ack_acknowledges_exactly_the_batch(mosquitto: Mosquitto) -> None:
    session = _session(mosquitto.port, "batch-ack", bulk_read=True, max_unread=100)
    await once(session, lambda: session.subscribe("t/#"))
    sent = [f"m{i}".encode() for i in range(10)]
    await publish(mosquitto.port, "t/x", sent)

    async def ack_the_first_four() -> None:
        await session.subscribe("t/#")
        first = await take(session, 4)
        session.ack(first)
        second = await take(session, 3)  # taken, not acknowledged
        assert [m.payload for m in first + second] == sent[:7]

    await once(session, ack_the_first_four)

    # Everything but the acknowledged batch comes again: the unacknowledged batch first.
    async def the_rest_again() -> None:
        await session.subscribe("t/#")
        again = await take(session, 6)
        assert [m.payload for m in again] == sent[4:]
        session.ack(again)

    await once(session, the_rest_again)
    await publish(mosquitto.port, "t/x", [b"marker"])

    async def only_the_marker() -> None:  # nothing acknowledged comes again
        await session.subscribe("t/#")
        (marker,) = await take(session, 1)
        assert marker.payload == b"marker"
        session.ack([marker])

    await once(session, only_the_marker)


async def test_ack_needs_manual_acknowledgement(mosquitto: Mosquitto) -> None:
    session = MqttSession(BrokerConfig(port=mosquitto.port), identifier="auto", logger=log)
    with pytest.raises(RuntimeError, match="manual_ack"):
        session.ack([])


async def test_the_reconnect_loop_survives_a_broker_restart(mosquitto: Mosquitto) -> None:
    session = _session(mosquitto.port, "restart", bulk_read=True, max_unread=100)
    stop = asyncio.Event()
    got: list[bytes] = []
    rounds = {"up": 0, "down": 0, "failed": 0}

    async def consume() -> None:
        rounds["up"] += 1
        await session.subscribe("t/#")
        async for batch in session.batches(stop):
            got.extend(bytes(m.payload) for m in batch)
            session.ack(batch)

    def down() -> None:
        rounds["down"] += 1

    def failed(_: aiomqtt.MqttError) -> None:
        rounds["failed"] += 1

    loop = asyncio.create_task(
        session.run(consume, until=stop.is_set, wake=stop, failed=failed, down=down)
    )
    try:
        await until(lambda: session.connected, what="connected")
        await mosquitto.wait_for_log("restart 1 t/#")
        before = [f"a{i}".encode() for i in range(5)]
        await publish(mosquitto.port, "t/x", before)
        await until(lambda: len(got) >= 5, what="the messages before the restart")

        await asyncio.to_thread(mosquitto.stop)
        await until(lambda: rounds["failed"] >= 2, what="reconnects refused while down")
        assert not session.connected
        mark = len(mosquitto.log_text())
        await asyncio.to_thread(mosquitto.start)
        await mosquitto.wait_for_log("restart 1 t/#", since=mark)
        after = [f"b{i}".encode() for i in range(5)]
        await publish(mosquitto.port, "t/x", after)
        await until(lambda: len(got) >= 10, what="the messages after the restart")
        # (An acknowledgement still in flight when the broker stopped may bring one again.)
        assert list(dict.fromkeys(got)) == before + after
        assert rounds["up"] == 2
        # Every round that ended was an error: the lost connection, the refused attempts.
        assert rounds["down"] == rounds["failed"] >= 2
    finally:
        stop.set()
        await asyncio.wait_for(loop, DEADLINE_S)
    assert not session.connected


async def test_a_publish_the_broker_refuses_raises_and_slows_the_reconnects(
    mosquitto_bin: str, tmp_path: Path
) -> None:
    broker = Mosquitto(mosquitto_bin, tmp_path / "mosquitto-acl")
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite t/ok\ntopic read t/#\n")  # no write on t/denied
    with broker.conf.open("a") as f:
        f.write(f"acl_file {acl}\n")
    broker.start()
    try:
        session = MqttSession(
            BrokerConfig(port=broker.port),
            identifier="checked",
            logger=log,
            mqtt5=True,
            backoff=Backoff(0.01, 0.05),
        )
        attempts: list[int] = []

        async def body() -> bool:
            attempts.append(session.backoff.attempt)
            await session.publish("t/denied", b"x")  # unchecked: acknowledged all the same
            await session.publish_checked("t/ok", b"x")
            if len(attempts) < 3:
                await session.publish_checked("t/denied", b"x")
            return True

        refused: list[PublishRefusedError] = []

        def failed(exc: aiomqtt.MqttError) -> None:
            assert isinstance(exc, PublishRefusedError), exc
            refused.append(exc)

        async with asyncio.timeout(DEADLINE_S):
            await session.run(body, failed=failed)
        assert [(e.topic, e.reason) for e in refused] == [("t/denied", "Not authorized")] * 2
        # A refusing broker is not retried from the backoff's base: it keeps growing.
        assert attempts == [0, 1, 2]
        pubacks = session._pubacks
        assert pubacks is not None
        assert (pubacks._codes, pubacks._awaiting) == ({}, set())  # nothing kept behind
    finally:
        broker.stop()


async def test_a_packet_queued_as_the_broker_hangs_up_leaves_no_bad_descriptor(
    mosquitto: Mosquitto,
) -> None:
    """A publish queued in the loop turn in which paho closes the socket: no EBADF traceback.

    Another client takes our client id, so the broker hangs up on us; in one loop turn we
    queue a publish (paho asks for a writer) and paho reads the hang-up and closes the
    socket, as its reader callback would. aiomqtt 2.5 alone registered that writer one
    callback later, on the closed descriptor (asyncio logged ``OSError: [Errno 9] Bad
    file descriptor``: the agents' stops and takeovers).
    """
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, ctx: errors.append(ctx))
    session = MqttSession(BrokerConfig(port=mosquitto.port), identifier="same", logger=log)
    paho = session.client._client

    async def body() -> None:
        sock = paho._sock
        assert sock is not None
        # Without yielding to the loop (which would see the hang-up first): another
        # client connects with our id (MQTT 3.1.1 CONNECT, clean session, keep-alive 60 s)
        # and the broker closes our connection.
        with socket.create_connection(("127.0.0.1", mosquitto.port), timeout=DEADLINE_S) as rival:
            rival.sendall(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04same")
            assert rival.recv(4) == b"\x20\x02\x00\x00"  # CONNACK, accepted
            select.select([sock], [], [], DEADLINE_S)  # blocks the loop, on purpose
            paho.publish("t/x", b"x", qos=0)  # queued: a writer is asked for
            paho.loop_read()  # the hang-up, as the reader callback reads it: socket closed
            assert paho._sock is None
            for _ in range(5):
                await asyncio.sleep(0)  # the loop runs what the callbacks scheduled

    with contextlib.suppress(aiomqtt.MqttError):
        async with asyncio.timeout(DEADLINE_S):
            await session.run(body, until=lambda: session.backoff.attempt > 0)
    await asyncio.sleep(0.1)
    assert not errors, [(e.get("message"), e.get("exception")) for e in errors]
