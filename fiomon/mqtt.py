"""MQTT plumbing shared by agent and aggregator: topics, client construction, backoff.

Topics (``docs/wire-format.md``): records on ``<prefix>/v1/<host>/records`` (QoS 1), the
agent's retained status on ``<prefix>/v1/<host>/status`` (its Will says ``offline``).
aiomqtt 2.5's client is reusable, not re-entrant, and must be created inside the running
loop; each ``async with`` connects once (REFERENCE.md §4).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from fiomon.config import BrokerConfig
from fiomon.errors import ConfigError

WIRE_LEVEL = "v1"


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names under one prefix.

    Args:
        prefix: the configured ``topic_prefix``.
    """

    prefix: str

    def records(self, host: str) -> str:
        """Where ``host``'s agent publishes records."""
        return f"{self.prefix}/{WIRE_LEVEL}/{host}/records"

    def status(self, host: str) -> str:
        """``host``'s agent status (retained; Will = offline)."""
        return f"{self.prefix}/{WIRE_LEVEL}/{host}/status"

    @property
    def all_records(self) -> str:
        """Subscription filter for every agent's records."""
        return f"{self.prefix}/{WIRE_LEVEL}/+/records"

    @property
    def all_status(self) -> str:
        """Subscription filter for every agent's status."""
        return f"{self.prefix}/{WIRE_LEVEL}/+/status"


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
    """
    extra: dict[str, Any] = {}
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
