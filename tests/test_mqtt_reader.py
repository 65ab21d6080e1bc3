"""The bulk MQTT reader (``fiomon.mqtt._reader``, a session's ``bulk_read``), real Mosquitto.

What paho's own reader would deliver, it delivers: every topic, payload, QoS, retain flag
and MQTT 5 property, for payloads from empty to larger than one read, packets split
across reads and many in one; acknowledgements still reach the broker (nothing comes
again after a reconnect), and a new connection starts with a clean buffer.
"""

from __future__ import annotations

import logging
import time

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from fiomon.config import BrokerConfig
from fiomon.mqtt import MqttSession
from fiomon.mqtt._reader import RECV_BYTES
from tests.conftest import Mosquitto
from tests.mqttkit import once, take

TOPIC = "fiomonread/v1"
log = logging.getLogger("test.reader")


def _payloads() -> list[tuple[str, bytes, int, bool]]:
    """(topic, payload, qos, retain): sizes around and beyond one read, both QoS."""
    big = bytes(range(256)) * (3 * RECV_BYTES // 256 + 7)  # 3 reads and a bit
    out = [
        (f"{TOPIC}/a/records", b"", 1, False),
        (f"{TOPIC}/a/records", b"x", 0, False),
        (f"{TOPIC}/b/records", big, 1, False),
        (f"{TOPIC}/b/status", b'{"state":"online"}', 1, False),
    ]
    # Many small ones: several packets per read, some cut in two by a read's end.
    out += [
        (f"{TOPIC}/h{k}/records", bytes([k % 251]) * (k * 97), k % 2, False) for k in range(300)
    ]
    return out


@pytest.mark.parametrize("v5", [True, False], ids=["mqtt5", "mqtt311"])
async def test_reader_delivers_what_was_published(mosquitto: Mosquitto, v5: bool) -> None:
    broker = BrokerConfig("127.0.0.1", mosquitto.port)
    ident = f"reader-{time.monotonic_ns()}"
    sub = MqttSession(
        broker,
        identifier=ident,
        logger=log,
        persistent_session_s=60 if v5 else None,
        bulk_read=True,
    )
    reader = sub.reader
    assert reader is not None
    sent = _payloads()
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = ("k", "v")
    retained = (f"{TOPIC}/r/status", b'{"state":"online"}', 1, True)
    got: list[aiomqtt.Message] = []
    async with aiomqtt.Client(
        "127.0.0.1", mosquitto.port, protocol=aiomqtt.ProtocolVersion.V5
    ) as pub:
        # Retained before we subscribe: it comes with the retain flag set.
        await pub.publish(*retained[:2], qos=1, retain=True)

        async def receive() -> None:
            await sub.subscribe(f"{TOPIC}/#")
            got.extend(await take(sub, 1))
            for topic, payload, qos, retain in sent:
                await pub.publish(topic, payload, qos=qos, retain=retain)
            # A message with a property: paho's own parser takes it (and keeps it).
            await pub.publish(f"{TOPIC}/p/records", b"with-props", qos=1, properties=props)
            got.extend(await take(sub, len(sent) + 1))

        await once(sub, receive)
    first, got = got[0], got[1:]
    assert (first.topic.value, first.payload, first.qos, first.retain) == retained
    want = [*sent, (f"{TOPIC}/p/records", b"with-props", 1, False)]
    assert [(m.topic.value, m.payload, m.qos, m.retain) for m in got] == want
    last = got[-1]
    if v5:
        assert last.properties is not None
        assert last.properties.UserProperty == [("k", "v")]  # type: ignore[attr-defined]
        assert reader.fast == len(sent) + 1  # every plain PUBLISH parsed by the reader
    else:
        assert reader.fast == len(sent) + 2
    assert reader.packets > reader.fast  # CONNACK, SUBACK: paho's handlers


async def test_acknowledged_messages_do_not_come_again(mosquitto: Mosquitto) -> None:
    # The aggregator's way: manual acknowledgement on a persistent MQTT 5 session, and the
    # same client connecting twice (the second connection's buffer starts empty).
    broker = BrokerConfig("127.0.0.1", mosquitto.port)
    sub = MqttSession(
        broker,
        identifier="acks",
        logger=log,
        persistent_session_s=60,
        manual_ack=True,
        bulk_read=True,
    )
    assert sub.reader is not None
    got: list[aiomqtt.Message] = []
    async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="acks-pub") as pub:

        async def ack_forty() -> None:
            await sub.subscribe(f"{TOPIC}/#")
            for k in range(50):
                await pub.publish(f"{TOPIC}/x/records", str(k).encode() * 1000, qos=1)
            # Acknowledged ten at a time with one write each, as the aggregator does per
            # batch (the broker sends at most 20 unacknowledged: Mosquitto's
            # max_inflight_messages); the last ten not at all.
            for _ in range(4):
                ten = await take(sub, 10)
                sub.ack(ten)
                got.extend(ten)
            got.extend(await take(sub, 10))

        await once(sub, ack_forty)
        assert [m.payload for m in got] == [str(k).encode() * 1000 for k in range(50)]

        # 10 were not acknowledged: the broker sends them again, before anything newer.
        async def again() -> None:
            await pub.publish(f"{TOPIC}/x/records", b"marker", qos=1)
            more = await take(sub, 11)
            sub.ack(more)
            assert [m.payload for m in more] == [m.payload for m in got[40:]] + [b"marker"]

        await once(sub, again)

        async def only_new() -> None:
            await pub.publish(f"{TOPIC}/x/records", b"marker2", qos=1)
            (only,) = await take(sub, 1)
            sub.ack([only])
            assert only.payload == b"marker2"  # everything acknowledged stayed acknowledged

        await once(sub, only_new)
