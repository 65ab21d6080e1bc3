"""The shell's MQTT intake: journal before acknowledge, in batches, over one persistent session.

A persistent MQTT 5 session (a restart receives what the broker queued meanwhile),
reconnecting with capped, jittered backoff. Messages are taken in batches: the merger
journals a batch (:meth:`~fiomon.server.app.Merger.handle`), then the batch is
acknowledged (manual PUBACKs, one socket write per batch), so a message is always
either journaled or the broker's to redeliver. paho reads through
:mod:`fiomon.aggregator.mqttread` (one ``recv`` for many packets, plain PUBLISH parsed
without MQTT 5 property objects).

At ``stop`` the intake takes no more messages (``intake_stopped``) but keeps a connection
that is up until ``disconnect``, so the stop sequence can still publish on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, cast

import aiomqtt

# The bulk reader is the MQTT session helper's (it keeps this name importable).
from fiomon.aggregator import mqttread
from fiomon.mqtt import SUBSCRIBE_TIMEOUT_S, Backoff, IncomingQueue, drop_stale, make_client
from fiomon.runtime import cancel_and_wait, sd_notify, wait_event

if TYPE_CHECKING:
    from fiomon.server.app import Merger, Server

BATCH_MESSAGES = 2000  # messages taken from the client's queue at once


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
        client = make_client(
            cfg.broker,
            identifier=cfg.client_id,
            persistent_session_s=max(1, cfg.session_expiry_ms // 1000),
            receive_maximum=cfg.max_inflight,
            queue_type=cast("type[asyncio.Queue[aiomqtt.Message]]", IncomingQueue),
        )
        queue = IncomingQueue.made[-1]
        # Acknowledge only after journaling. aiomqtt 2.5 has no public manual-ack API
        # (REFERENCE §4; aiomqtt #345); paho's own switch on its client is the way.
        paho = client._client
        paho.manual_ack_set(True)
        # paho's per-packet reading and MQTT 5 properties cost a third of intake: read in
        # bulk. Messages waiting unprocessed are bounded by max_inflight: asked of the
        # broker (MQTT 5 Receive Maximum) and held here, as Mosquitto 2.0.11 sends a
        # resumed session's whole backlog regardless once we acknowledge a message, which
        # would land in memory. Held only while the batches below are consumed: before
        # that, a hold would also hold the SUBACKs we wait for behind the messages (until
        # then the broker keeps to the limit).
        consuming = False

        def hold() -> bool:
            # (one less: the consumer may be taking one out of the queue as we read)
            return consuming and queue.qsize() >= max(1, cfg.max_inflight - 1)

        reader = mqttread.install(paho, hold=hold)
        # The broker restarts in seconds; one client, so no herd to spread: reconnect fast.
        backoff = Backoff(base_s=0.25, cap_s=5.0)

        def taken_over() -> bool:  # (a call: the handlers may set it while we await)
            return link.taken_over

        while not stop.is_set() and not taken_over():
            # What the last connection left unread must not be acknowledged on this one.
            drop_stale(queue, log)
            try:
                async with client:
                    backoff.reset()
                    for topic in merger.subscriptions():
                        await client.subscribe(topic, qos=1, timeout=SUBSCRIBE_TIMEOUT_S)
                    link.connected = True  # and subscribed: what is published now arrives
                    # Lateness resumes when reading starts, not at the CONNACK: subscribing
                    # can take seconds on a loaded machine while the backlog waits for us.
                    merger.connected(merger.now_ms())
                    log.info("subscribed on %s:%d", cfg.broker.host, cfg.broker.port)
                    if not link.ready:
                        link.ready = True
                        sd_notify("READY=1", f"STATUS={merger.status()}")
                    session = [asyncio.create_task(c) for c in merger.session(client)]
                    try:
                        consuming = True
                        async for batch in _batches(client, queue, stop):
                            # Unacknowledged until journaled: at most max_inflight wait here.
                            link.backlog_max = max(link.backlog_max, len(batch) + queue.qsize())
                            merger.handle(batch)
                            mqttread.ack_many(paho, [(m.mid, m.qos) for m in batch if m.qos > 0])
                            if reader is not None:
                                reader.resume()
                            if await merger.after_batch(client):
                                break
                        if stop.is_set():
                            # Intake has stopped; the stop sequence may still publish on
                            # this connection (it says when it may close).
                            server.intake_stopped.set()
                            await server.disconnect.wait()
                    finally:
                        consuming = False
                        for task in session:
                            await cancel_and_wait(task)
            except aiomqtt.MqttError as exc:
                log.warning("broker %s:%d: %s", cfg.broker.host, cfg.broker.port, exc)
            merger.disconnected(merger.now_ms())
            link.connected = False
            if taken_over():
                break
            await wait_event(stop, backoff.next())
        if taken_over():
            await merger.not_reading(stop)


async def _batches(
    client: aiomqtt.Client, queue: asyncio.Queue[aiomqtt.Message], stop: asyncio.Event
) -> AsyncIterator[list[aiomqtt.Message]]:
    """Messages in batches: one awaited, then whatever else is already waiting."""
    it = client.messages.__aiter__()
    stopper = asyncio.ensure_future(stop.wait())
    try:
        while True:
            nxt = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({nxt, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if nxt not in done:
                nxt.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await nxt
                return
            batch = [nxt.result()]
            with contextlib.suppress(asyncio.QueueEmpty):
                while len(batch) < BATCH_MESSAGES:
                    batch.append(queue.get_nowait())
            yield batch
    finally:
        stopper.cancel()
