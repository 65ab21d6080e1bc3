"""The shell's MQTT intake: journal before acknowledge, in batches, over one persistent session.

A persistent MQTT 5 session (a restart receives what the broker queued meanwhile) kept
by :class:`~fiomon.mqtt.MqttSession`'s one reconnect loop, with capped, jittered
backoff. Messages are taken in batches: the merger journals a batch
(:meth:`~fiomon.server.app.Merger.handle`), then the batch is acknowledged (manual
PUBACKs, one socket write per batch), so a message is always either journaled or the
broker's to redeliver. paho reads in bulk (one ``recv`` for many packets), and stops
reading while ``max_inflight`` messages wait unprocessed.

At ``stop`` the intake takes no more messages (``intake_stopped``) but keeps a connection
that is up until ``disconnect``, so the stop sequence can still publish on it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fiomon.mqtt import Backoff, MqttSession
from fiomon.runtime import cancel_and_wait, sd_notify

if TYPE_CHECKING:
    from fiomon.server.app import Merger, Server


class Intake:
    """The MQTT task of a :class:`~fiomon.server.app.Server`.

    Args:
        merger: takes the batches (and says what to subscribe to).
        server: the stop sequence's events (``stop``, ``intake_stopped``, ``disconnect``).
    """

    def __init__(self, merger: Merger, server: Server) -> None:
        self.merger = merger
        self.server = server

    async def run(self) -> None:
        """Receive until stop; reconnect on errors; end for good if reading must stop."""
        try:
            await self._receive()
        finally:
            self.server.intake_stopped.set()

    async def _receive(self) -> None:
        merger, server = self.merger, self.server
        cfg, link, log, stop = merger.cfg, merger.link, merger.log, server.stop
        # Messages waiting unprocessed are bounded by max_inflight: asked of the broker
        # (MQTT 5 Receive Maximum) and held by pausing the reader, as Mosquitto 2.0.11
        # sends a resumed session's whole backlog regardless once we acknowledge one.
        # The broker restarts in seconds; one client, so no herd to spread: reconnect fast.
        session = MqttSession(
            cfg.broker,
            identifier=cfg.client_id,
            logger=log,
            persistent_session_s=max(1, cfg.session_expiry_ms // 1000),
            receive_maximum=cfg.max_inflight,
            manual_ack=True,  # acknowledge only after journaling
            bulk_read=True,  # paho's per-packet reading cost a third of intake
            max_unread=cfg.max_inflight,
            backoff=Backoff(base_s=0.25, cap_s=5.0),
        )

        def taken_over() -> bool:  # (a call: the handlers may set it while we await)
            return link.taken_over

        async def connected() -> bool:
            for topic in merger.subscriptions():
                await session.subscribe(topic)
            link.connected = True  # and subscribed: what is published now arrives
            # Lateness resumes when reading starts, not at the CONNACK: subscribing can
            # take seconds on a loaded machine while the backlog waits for us.
            merger.connected(merger.now_ms())
            log.info("subscribed on %s:%d", cfg.broker.host, cfg.broker.port)
            if not link.ready:
                link.ready = True
                sd_notify("READY=1", f"STATUS={merger.status()}")
            tasks = [asyncio.create_task(c) for c in merger.session(session.client)]
            try:
                async for batch in session.batches(stop):
                    # Unacknowledged until journaled: at most max_inflight wait here.
                    link.backlog_max = max(link.backlog_max, len(batch) + session.unread)
                    merger.handle(batch)
                    session.ack(batch)
                    if await merger.after_batch(session.client):
                        break
                if stop.is_set():
                    # Intake has stopped; the stop sequence may still publish on this
                    # connection (it says when it may close).
                    server.intake_stopped.set()
                    await server.disconnect.wait()
            finally:
                for task in tasks:
                    await cancel_and_wait(task)
            return False

        def down() -> None:
            merger.disconnected(merger.now_ms())
            link.connected = False

        await session.run(
            connected, until=lambda: stop.is_set() or taken_over(), wake=stop, down=down
        )
        if taken_over():
            await merger.not_reading(stop)
