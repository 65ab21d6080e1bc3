"""MQTT plumbing shared by agent and aggregator: client construction, backoff.

Topics (``docs/wire-format.md``) are :class:`fiomon.topics.Topics`, re-exported here.
aiomqtt 2.5's client is reusable, not re-entrant, and must be created inside the running
loop; each ``async with`` connects once (REFERENCE.md §4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any, ClassVar

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from fiomon.config import BrokerConfig
from fiomon.errors import ConfigError
from fiomon.topics import WIRE_LEVEL, Topics

__all__ = [
    "SUBSCRIBE_TIMEOUT_S",
    "WIRE_LEVEL",
    "Backoff",
    "CheckedPublisher",
    "IncomingQueue",
    "PublishRefusedError",
    "Topics",
    "drop_stale",
    "make_client",
    "read_password",
]

# How long a persistent-session subscriber (aggregator, root) waits for its SUBACK.
# Mosquitto 2.0.11, resuming a session whose previous connection acknowledged messages,
# sends the whole queued backlog at once (measured: 4,000 of 4,000 queued messages with
# max_inflight_messages 100; a session never acknowledged gets 100). Our SUBACK comes
# after it, and paho read one packet per loop turn (before mqttread): with a minute of
# backlog (hundreds of MB) the default 10 s timeout expired, the aggregator reconnected,
# the broker sent it all again, and a restarted aggregator retried for two minutes
# (4.8 GB of RSS). So wait that long.
SUBSCRIBE_TIMEOUT_S = 120.0


def read_password(broker: BrokerConfig) -> str | None:
    """The first line of the password file, or None.

    Raises:
        ConfigError: the file cannot be read.
    """
    if broker.password_file is None:
        return None
    try:
        text = broker.password_file.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"broker.password_file: cannot read {broker.password_file} ({exc.strerror or exc})"
        raise ConfigError([msg]) from exc
    return text.splitlines()[0] if text else ""


def make_client(
    broker: BrokerConfig,
    *,
    identifier: str,
    will: aiomqtt.Will | None = None,
    timeout_s: float = 10.0,
    persistent_session_s: int | None = None,
    receive_maximum: int | None = None,
    queue_type: type[asyncio.Queue[aiomqtt.Message]] | None = None,
    mqtt5: bool = False,
) -> aiomqtt.Client:
    """A client for ``broker`` (call inside the running event loop).

    Args:
        broker: where and how to connect.
        identifier: the MQTT client id.
        will: the Last Will, if any.
        timeout_s: connect/publish/subscribe timeout.
        persistent_session_s: ask for a persistent MQTT 5 session kept this long while we
            are away (``clean_start=False`` plus a session expiry: aiomqtt's default
            clean-start option would discard the session on every reconnect).
        receive_maximum: with ``persistent_session_s``, the most QoS 1 messages the broker
            may send us unacknowledged (MQTT 5 Receive Maximum; the protocol's default is
            65,535: a broker without its own in-flight cap would send a resumed session's
            whole backlog at once).
        queue_type: the class of aiomqtt's incoming queue (the aggregator passes one it
            can drain in batches).
        mqtt5: speak MQTT 5 with a clean start (implied by ``persistent_session_s``): only
            MQTT 5 acknowledgements carry a reason code (:class:`CheckedPublisher`).
    """
    extra: dict[str, Any] = {}
    if mqtt5:
        extra = {"protocol": aiomqtt.ProtocolVersion.V5}
    if persistent_session_s is not None:
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = persistent_session_s
        if receive_maximum is not None:
            props.ReceiveMaximum = receive_maximum
        extra = {
            "protocol": aiomqtt.ProtocolVersion.V5,
            "clean_start": False,
            "properties": props,
        }
    tls = None
    if broker.tls is not None:
        tls = aiomqtt.TLSParameters(
            ca_certs=str(broker.tls.ca_file) if broker.tls.ca_file else None,
            certfile=str(broker.tls.cert_file) if broker.tls.cert_file else None,
            keyfile=str(broker.tls.key_file) if broker.tls.key_file else None,
        )
    return aiomqtt.Client(
        broker.host,
        broker.port,
        identifier=identifier,
        username=broker.username,
        password=read_password(broker),
        will=will,
        keepalive=broker.keepalive_s,
        timeout=timeout_s,
        tls_params=tls,
        tls_insecure=broker.tls.insecure if broker.tls is not None else None,
        queue_type=queue_type,
        **extra,
    )


class IncomingQueue(asyncio.Queue[aiomqtt.Message]):
    """aiomqtt's incoming queue, made by aiomqtt itself (``make_client(queue_type=...)``).

    aiomqtt keeps its queue private; made through this class, the newest one is
    :attr:`made` ``[-1]`` right after the client is made (one event loop: nothing else
    makes one in between), for the services to drain (:func:`drop_stale`, batches).
    """

    made: ClassVar[list[IncomingQueue]] = []

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        IncomingQueue.made.append(self)
        del IncomingQueue.made[:-1]  # only the newest matters


def drop_stale(queue: asyncio.Queue[aiomqtt.Message], logger: logging.Logger) -> int:
    """Forget messages a previous connection left unhandled, before connecting again.

    Their packet ids belong to that connection: acknowledging one on the next connection
    (manual PUBACK) would acknowledge whichever message the broker sent there under the
    same id, one we may not have journaled yet. Never acknowledged, they are the broker's
    to redeliver (persistent session), so dropping them here loses nothing.

    Returns:
        how many were dropped (logged at info when any).
    """
    n = 0
    with contextlib.suppress(asyncio.QueueEmpty):
        while True:
            queue.get_nowait()
            n += 1
    if n:
        logger.info("%d messages of the previous connection left for the broker to redeliver", n)
    return n


class Backoff:
    """Capped exponential backoff with jitter (seconds), so agents do not reconnect in step.

    Args:
        base_s: first delay's upper bound.
        cap_s: largest delay.
        rng: random source (injected for tests).
    """

    def __init__(self, base_s: float = 0.5, cap_s: float = 30.0, rng: random.Random | None = None):
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0
        self._rng = rng or random.Random()  # noqa: S311 -- jitter, not cryptography

    def reset(self) -> None:
        """After a success: start from the base again."""
        self.attempt = 0

    def next(self) -> float:
        """The next delay: uniform in [b/2, b] with b = min(cap, base * 2**attempt)."""
        bound = min(self.cap_s, self.base_s * 2**self.attempt)
        self.attempt = min(self.attempt + 1, 30)
        return self._rng.uniform(bound / 2, bound)


class PublishRefusedError(aiomqtt.MqttError):
    """The broker acknowledged a QoS 1 publish with a failure reason code (not delivered).

    Args:
        topic: the topic of the refused message.
        reason: the PUBACK's reason code, e.g. "Not authorized" (an ACL denial).
    """

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"the broker refused a publish on {topic}: {reason}")
        self.topic = topic
        self.reason = reason


class CheckedPublisher:
    """QoS 1 publishes that fail when the broker's PUBACK says they were not delivered.

    Mosquitto acknowledges a publish its ACL denies like any other; only an MQTT 5 PUBACK
    says so, with a reason code (0x87 "Not authorized"), and aiomqtt 2.5 ignores it. This
    wraps the client's paho callbacks to keep each acknowledged message id's reason code.
    Create it once per client (made with ``mqtt5=True``); one task publishes at a time.

    Args:
        client: the aiomqtt client (not yet connected or connected).
    """

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self._codes: dict[int, ReasonCode] = {}
        self._mid: int | None = None
        paho = client._client
        inner_on_publish: Callable[..., None] | None = paho.on_publish  # aiomqtt's
        inner_publish: Callable[..., Any] = paho.publish

        def on_publish(c: object, u: object, mid: int, rc: ReasonCode, props: object) -> None:
            self._codes[mid] = rc  # before aiomqtt wakes the publisher
            if inner_on_publish is not None:
                inner_on_publish(c, u, mid, rc, props)

        def publish(*args: Any, **kwargs: Any) -> Any:
            info = inner_publish(*args, **kwargs)
            self._mid = info.mid
            return info

        paho.on_publish = on_publish
        setattr(paho, "publish", publish)  # noqa: B010 -- an instance override of a method

    async def publish(self, topic: str, payload: bytes) -> None:
        """Publish with QoS 1; returns once the broker acknowledged delivery.

        Raises:
            PublishRefusedError: the broker's PUBACK carried a failure reason code.
            aiomqtt.MqttError: the connection failed.
        """
        self._mid = None
        await self.client.publish(topic, payload, qos=1)
        rc = self._code()
        if rc is not None and rc.is_failure:
            raise PublishRefusedError(topic, str(rc))

    def _code(self) -> ReasonCode | None:
        """The reason code of the last publish's PUBACK (None: not seen)."""
        mid, self._mid = self._mid, None
        return None if mid is None else self._codes.pop(mid, None)
