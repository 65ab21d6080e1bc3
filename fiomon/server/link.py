"""The broker connection as the server sees it: a read-out the merger shows, never writes.

The server's intake (:mod:`fiomon.server.intake`) and the aggregator's session-takeover
protocol (:mod:`fiomon.aggregator.presence`) update one :class:`Link`; the merger reads
it when it builds a snapshot (``fiomon_broker_connected``,
``fiomon_mqtt_backlog_max``, ``fiomon_mqtt_session_taken_over``), so the connection's
state lives in the shell, not in the merger.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Link:
    """The state of the service's MQTT session.

    Args:
        connected: connected and subscribed on the broker now (0 while subscribing).
        backlog_max: the most messages waiting unprocessed at once (received, not yet
            handled), since the start.
        taken_over: another instance took this session (it stopped reading for good).
        ready: the first session was up and subscribed (systemd's ``READY=1`` went out).
    """

    connected: bool = False
    ready: bool = False
    backlog_max: int = 0
    taken_over: bool = False
