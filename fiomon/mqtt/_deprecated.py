"""Names the services used before :class:`~fiomon.mqtt.MqttSession`; kept until they move.

Deprecated: ``fiomon/aggregator/service.py`` and ``root_service.py`` (and
``benchmarks/bench_intake.py``, ``tests/test_deploy_mosquitto.py``) still build their
client by hand from these. Once they use :class:`~fiomon.mqtt.MqttSession`, delete this
module, its re-exports in ``fiomon/mqtt/__init__.py`` and ``fiomon/aggregator/mqttread.py``.
No :class:`DeprecationWarning`: the test suite turns warnings into errors.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import aiomqtt

from fiomon.config import BrokerConfig
from fiomon.mqtt._session import PubackCodes, new_client


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
    """Deprecated: use :class:`~fiomon.mqtt.MqttSession` (its ``client``).

    A client for ``broker``, as :func:`fiomon.mqtt._session.new_client` (same arguments).
    """
    return new_client(
        broker,
        identifier=identifier,
        will=will,
        timeout_s=timeout_s,
        persistent_session_s=persistent_session_s,
        receive_maximum=receive_maximum,
        queue_type=queue_type,
        mqtt5=mqtt5,
    )


class IncomingQueue(asyncio.Queue[aiomqtt.Message]):
    """Deprecated: :class:`~fiomon.mqtt.MqttSession` holds its client's queue itself.

    aiomqtt's incoming queue, made by aiomqtt itself (``make_client(queue_type=...)``):
    the newest one is :attr:`made` ``[-1]`` right after the client is made (one event
    loop: nothing else makes one in between).
    """

    made: ClassVar[list[IncomingQueue]] = []

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        IncomingQueue.made.append(self)
        del IncomingQueue.made[:-1]  # only the newest matters


class CheckedPublisher(PubackCodes):
    """Deprecated: use :meth:`~fiomon.mqtt.MqttSession.publish_checked`.

    QoS 1 publishes on ``client`` (made with ``mqtt5=True``) that raise
    :class:`~fiomon.mqtt.PublishRefusedError` on a failure reason code; see
    :class:`~fiomon.mqtt._session.PubackCodes`.
    """
