"""Two aggregators on one MQTT client id: who has the session, said on retained topics.

The broker hands a persistent session to whichever client connected last with its id,
and two aggregators on one session each count the other's records as lost. Each instance
announces itself on :meth:`Topics.presence <fiomon.topics.Topics.presence>` (retained). One that
reads another instance's announcement there after its own has lost its session to it:
it stops reading (no reconnect loop), says so in the log and on
``fiomon_mqtt_session_taken_over``, and tells the other one on ``.../conflict``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable

import aiomqtt

from fiomon import __version__
from fiomon.runtime import wait_event
from fiomon.server.link import Link
from fiomon.server.metrics import Counts
from fiomon.topics import Topics

log = logging.getLogger("fiomon.aggregator")

MAX_DOC_BYTES = 4096  # an announcement is ~150 bytes; anything larger is not ours


class Presence:
    """This instance's side of the session-takeover protocol.

    Args:
        topic_prefix: the MQTT topic prefix.
        client_id: the MQTT client id the instances would share.
        link: the server's connection read-out (``taken_over`` is set here).
        counts: where takeovers are counted.
        now_ms: the wall clock (epoch ms).
        outbox: the queue of retained publications (the announcement goes there).
        changed: called when the snapshot must show a takeover at once.
    """

    def __init__(
        self,
        topic_prefix: str,
        client_id: str,
        *,
        link: Link,
        counts: Counts,
        now_ms: Callable[[], int],
        outbox: asyncio.Queue[tuple[str, bytes, bool]],
        changed: Callable[[], object],
    ) -> None:
        self.client_id = client_id
        self.link = link
        self.counts = counts
        self.now_ms = now_ms
        self.outbox = outbox
        self.changed = changed
        self.instance = uuid.uuid4().hex[:12]
        topics = Topics(topic_prefix)
        self.presence_topic = topics.presence(client_id)
        self.conflict_topic = topics.conflict(client_id)
        self.announced = False
        self.own_seen = False  # our announcement came back to us
        self.presence_seen = asyncio.Event()
        self.rival: object = None

    def topics(self) -> list[str]:
        """The two topics to subscribe to."""
        return [self.presence_topic, self.conflict_topic]

    def connected(self) -> None:
        """A new session is subscribed: the retained announcement comes again."""
        self.presence_seen.clear()

    def on_presence(self, payload: bytes) -> None:
        """A retained announcement (ours, an earlier instance's or a newer one's)."""
        self.presence_seen.set()
        doc = _doc(payload)
        if doc is None:
            return
        if doc.get("instance") == self.instance:
            self.own_seen = True  # the broker's order: anything after this is newer than us
            return
        who = f"instance {doc.get('instance')} on {doc.get('host')} (pid {doc.get('pid')})"
        if not self.own_seen:
            log.info("previous aggregator with this client_id: %s", who)
            return
        self.rival = doc.get("instance")
        self.link.taken_over = True
        self.counts.session_takeovers += 1
        self.changed()
        log.error(
            "another aggregator, %s, connected with our client_id %r and took our MQTT "
            "session: this one stops reading (two aggregators on one session each count the "
            "other's records as lost). Stop one of them, or give each its own client_id.",
            who,
            self.client_id,
        )

    def on_conflict(self, payload: bytes) -> None:
        """The instance whose session we took tells us so."""
        doc = _doc(payload)
        if doc is None or doc.get("rival") != self.instance:
            return
        self.counts.session_takeovers += 1
        log.error(
            "aggregator instance %s on %s (pid %s) had our client_id %r; we took its MQTT "
            "session and it stopped reading. If that one should run, stop this one.",
            doc.get("instance"),
            doc.get("host"),
            doc.get("pid"),
            self.client_id,
        )

    def _identity(self) -> dict[str, object]:
        return {
            "instance": self.instance,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "time_ms": self.now_ms(),
        }

    async def announce(self) -> None:
        """Announce this instance on the retained presence topic.

        The first time at once. After a reconnect only once the retained announcement has
        been read and is ours (or there is none): if it is another instance's, that one
        connected after us and has our session (:meth:`on_presence` stops us).
        """
        if self.announced:
            await wait_event(self.presence_seen, 0.5)
        if self.link.taken_over:
            return
        body = json.dumps(self._identity()).encode()
        await self.outbox.put((self.presence_topic, body, True))
        self.announced = True

    async def tell_conflict(self, client: aiomqtt.Client) -> None:
        """Tell the instance that took our session (its persistent session keeps this)."""
        doc = {**self._identity(), "rival": self.rival}
        with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
            async with asyncio.timeout(5):
                await client.publish(self.conflict_topic, json.dumps(doc).encode(), qos=1)

    async def not_reading(self, stop: asyncio.Event) -> None:
        """Until ``stop``: say every minute why this instance does not read."""
        while not stop.is_set():
            log.error(
                "not reading from the broker: another aggregator uses client_id %r (see "
                "above); stop one of them or give each its own client_id, then restart "
                "this one",
                self.client_id,
            )
            await wait_event(stop, 60.0)


def _doc(payload: bytes) -> dict[str, object] | None:
    if len(payload) > MAX_DOC_BYTES:
        return None
    try:
        doc = json.loads(payload)
    except Exception:  # anyone may write here: any failure means "not ours"
        return None
    return doc if isinstance(doc, dict) else None
