"""``fiomon aggregator``: the record merger in the server shell.

:func:`run_aggregator` restores the :class:`~fiomon.aggregator.merger.AggregatorCore` and
runs it in the one service shell (:class:`fiomon.server.app.Server`: ``/metrics``,
signals, the MQTT intake with journal-before-acknowledge, the close loop, SIGHUP, the
ordered stop). :class:`AggregatorService` is what the shell drives; it adds what only an
aggregator does:

* records and agent statuses from ``<prefix>/v1/<host>/records|status``, handed to the
  core (journaled before the batch is acknowledged);
* ``fiomon.alertmanager``: alert transitions go to Alertmanager
  (:class:`~fiomon.server.alerts.AlertDispatcher`) and, retained, to the broker;
* ``fiomon.partials`` (a cell, ``partials:`` configured): the closed quanta go from the
  outbox to the root's broker (:mod:`fiomon.aggregator.outbox`);
* the session-takeover protocol (:mod:`fiomon.aggregator.presence`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import aiomqtt

from fiomon import __version__
from fiomon.aggregator.merger import SNAPSHOT_EVERY_MS, AggregatorCore
from fiomon.aggregator.outbox import publish_partials
from fiomon.aggregator.presence import Presence
from fiomon.closed import ClosedQuantum
from fiomon.config import AggregatorConfig, Overrides
from fiomon.mqtt import Topics
from fiomon.runtime import GRACE_S
from fiomon.server.alerts import AlertDispatcher
from fiomon.server.app import Hooks, Server
from fiomon.server.exporter import Snapshot
from fiomon.server.metrics import Counts

log = logging.getLogger("fiomon.aggregator")

QUEUED_BYTES_LIMIT = 256 * 1024 * 1024  # received but not merged: merge now beyond this


class AggregatorService(Hooks):
    """The aggregator as the server's merger: the core plus alert sinks and presence.

    Args:
        core: the restored core (its ``link`` is the server's connection read-out).
    """

    name = "aggregator"
    log = log

    def __init__(self, core: AggregatorCore) -> None:
        self.core = core
        self.link = core.link
        cfg = core.cfg
        self.topics = Topics(cfg.topic_prefix)
        self.dispatcher = AlertDispatcher(
            cfg.webhook, core.counts.alert_deliveries, core.now_ms, latency=cfg.latency
        )
        # Retained publications in order (alert state, presence); drained at the stop.
        self.outbox: asyncio.Queue[tuple[str, bytes, bool]] = asyncio.Queue(maxsize=100)
        self.presence = Presence(
            cfg.topic_prefix,
            cfg.client_id,
            link=self.link,
            counts=core.counts,
            now_ms=core.now_ms,
            outbox=self.outbox,
            changed=core.refresh_snapshot,
        )
        self.alerts_final = asyncio.Event()
        self.alerts_task: asyncio.Task[None] | None = None
        self.partials: asyncio.Task[None] | None = None

    # -- what the shell reads ---------------------------------------------------------------

    @property
    def cfg(self) -> AggregatorConfig:
        """The running configuration: the core's (a reload replaces it there only)."""
        return self.core.cfg

    @property
    def snapshot(self) -> Snapshot:
        """The core's newest snapshot."""
        return self.core.snapshot

    @property
    def counts(self) -> Counts:
        """The core's counters."""
        return self.core.counts

    def now_ms(self) -> int:
        """The core's wall clock."""
        return self.core.now_ms()

    def banner(self) -> str:
        """The start-up line."""
        cfg = self.cfg
        return (
            f"fiomon aggregator {__version__} (instance {self.presence.instance}): /metrics on "
            f"{cfg.listen}, broker {cfg.broker.host}:{cfg.broker.port}, quantum "
            f"{cfg.quantum_ms} ms, lateness {cfg.lateness_ms} ms, latency {cfg.latency}"
        )

    def stopping(self, *, final: bool) -> str:
        """What the first stop signal logs."""
        if final:
            return "stopping (open quanta close now: --final)"
        return "stopping (open quanta stay in the journal)"

    def status(self) -> str:
        """Systemd's ``STATUS=`` line."""
        core, counts = self.core, self.core.counts
        if self.link.taken_over:
            return "STOPPED READING: another aggregator took our MQTT session (see the log)"
        if not self.link.ready:
            b = self.cfg.broker
            return f"waiting for the broker at {b.host}:{b.port} (/metrics on {self.cfg.listen})"
        return (
            f"{counts.records['received']} records, {counts.quanta_closed} quanta closed, "
            f"{core.hosts_up()} hosts up"
        )

    def summary(self) -> str:
        """The counters an operator checks after a stop, as one line."""
        core, counts = self.core, self.core.counts
        engine = core.engine
        late = sum(engine.late_records.values()) if engine is not None else 0
        still_open = engine.open_quanta if engine is not None else 0
        return (
            f"{counts.records['received']} records received, "
            f"{counts.records['duplicate']} duplicate, {sum(counts.lost.values())} lost, "
            f"{late} late, {sum(counts.invalid.values())} invalid messages; "
            f"{counts.quanta_closed} quanta closed, {still_open} left open"
        )

    # -- intake -----------------------------------------------------------------------------

    def subscriptions(self) -> list[str]:
        """Records and statuses of every agent, and the presence topics."""
        return [self.topics.all_records, self.topics.all_status, *self.presence.topics()]

    def connected(self, now_ms: int) -> None:
        """Reading starts: lateness runs again (the watermark's clock bound)."""
        self.core.watermark.connected(now_ms)
        self.presence.connected()

    def disconnected(self, now_ms: int) -> None:
        """No input now: the watermark must not take the silence for the hosts'."""
        self.core.watermark.disconnected(now_ms)

    def session(self, client: aiomqtt.Client) -> list[Coroutine[Any, Any, None]]:
        """The retained publications and the announcement, for this connection."""
        return [self._publish_outbox(client), self.presence.announce()]

    def handle(self, batch: Sequence[aiomqtt.Message]) -> None:
        """Records to the core (journaled before this returns), statuses, presence."""
        core = self.core
        counts = core.counts
        records: list[tuple[str, bytes]] = []
        parse = self.topics.parse
        presence = self.presence
        for m in batch:
            topic = m.topic.value
            payload = m.payload
            try:
                kind, name = parse(topic) or ("", "")
                if kind == "records":
                    records.append((name, payload))
                elif kind == "status":
                    core.on_status(name, payload, retained=m.retain)
                elif topic == presence.presence_topic:
                    presence.on_presence(payload)
                elif topic == presence.conflict_topic:
                    presence.on_conflict(payload)
            except Exception:  # a bug must not stop intake: say so, count it, go on
                counts.invalid["internal"] += 1
                log.exception("cannot handle a message on %s", topic)
        if records:
            try:
                core.receive(records)
            except Exception:
                counts.invalid["internal"] += len(records)
                log.exception("cannot take %d messages", len(records))
            if core.queued_bytes > QUEUED_BYTES_LIMIT:
                core.tick()

    async def after_batch(self, client: aiomqtt.Client) -> bool:
        """Stop reading for good once another instance took the session (telling it)."""
        if not self.link.taken_over:
            return False
        await self.presence.tell_conflict(client)
        return True

    async def not_reading(self, stop: asyncio.Event) -> None:
        """Say why this instance does not read, until stopped."""
        await self.presence.not_reading(stop)

    async def _publish_outbox(self, client: aiomqtt.Client) -> None:
        """Publish the outbox (alert state, presence) in order; ``outbox.join()`` waits."""
        while True:
            topic, payload, retain = await self.outbox.get()
            try:
                await client.publish(topic, payload, qos=1, retain=retain)
            except aiomqtt.MqttError as exc:
                self.counts.alert_deliveries[("mqtt", "failed")] += 1
                log.warning("cannot publish %s: %s", topic, exc)
            finally:
                self.outbox.task_done()

    # -- merging ------------------------------------------------------------------------------

    def tick(self) -> list[ClosedQuantum]:
        """Merge and close; between closes, counters at most ``SNAPSHOT_EVERY_MS`` old."""
        rows = self.core.tick()
        if not rows:
            self.core.refresh_snapshot(min_age_ms=SNAPSHOT_EVERY_MS)
        return rows

    def stalled(self, ms: int) -> None:
        """Tell the core (a pause is no silence of the input)."""
        self.core.stalled(ms)

    def flush(self) -> list[ClosedQuantum]:
        """Merge what is queued and close everything open (a final stop)."""
        return self.core.flush()

    def after_tick(self) -> None:
        """Hand the alert transitions to the broker (retained) and to Alertmanager."""
        core = self.core
        transitions, core.transitions = core.transitions, []
        if transitions:
            body = json.dumps(
                {"time_ms": core.now_ms(), "alerts": core.publisher.alerts.snapshot()}
            )
            try:
                self.outbox.put_nowait((self.cfg.alert_topic, body.encode(), True))
                self.counts.alert_deliveries[("mqtt", "queued")] += 1
            except asyncio.QueueFull:
                self.counts.alert_deliveries[("mqtt", "dropped")] += 1
        self.dispatcher.offer(core.publisher.alerts, transitions)

    def reload(self, new: AggregatorConfig) -> list[str]:
        """SLA rules, webhook, log level, host timeout (the core's rule)."""
        done = self.core.reload(new)
        self.dispatcher.reconfigure(self.core.cfg.webhook)
        return done

    # -- tasks and the stop ---------------------------------------------------------------------

    def start(self, tg: asyncio.TaskGroup, server: Server) -> None:
        """Alertmanager's task, and a cell's partials task."""
        self.alerts_task = tg.create_task(
            self.dispatcher.run(self.alerts_final), name="fiomon.alertmanager"
        )
        core = self.core
        if self.cfg.partials is not None and core.outbox is not None:
            # A cell: its closed quanta go to the root's broker on their own task. A final
            # stop sends the final close too (within the grace time).
            self.partials = tg.create_task(
                publish_partials(
                    self.cfg.partials,
                    core.outbox,
                    server.stop,
                    closed=server.closed if server.final else None,
                    grace_s=GRACE_S,
                ),
                name="fiomon.partials",
            )

    async def before_close(self, left: Callable[[], float]) -> None:
        """A cell's partials task ends (with ``final``: once the final close is sent)."""
        if self.partials is not None:
            await asyncio.wait({self.partials}, timeout=left())

    def close(self, timeout_s: float) -> None:
        """Write, save the grid, close the journal, unlock; a cell's outbox stays open.

        The partials task may still hold the outbox (:meth:`release` closes it).
        """
        self.core.close(timeout_s, outbox=False)

    async def after_close(self, left: Callable[[], float], intake: asyncio.Task[None]) -> None:
        """The final alert state: Alertmanager's last delivery and the retained topic."""
        self.alerts_final.set()
        self.dispatcher.wake()
        if self.alerts_task is not None:
            await asyncio.wait({self.alerts_task}, timeout=left())
        if not intake.done():  # connected: the outbox drains, or the connection ends first
            drained = asyncio.ensure_future(self.outbox.join())
            await asyncio.wait(
                {drained, intake}, timeout=left(), return_when=asyncio.FIRST_COMPLETED
            )
            drained.cancel()

    def release(self) -> None:
        """No task reads a cell's outbox any more."""
        if self.core.outbox is not None:
            self.core.outbox.close()


async def run_aggregator(
    cfg: AggregatorConfig,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[AggregatorCore], None] | None = None,
    final: bool = False,
    config_path: Path | None = None,
    overrides: Overrides | None = None,
) -> None:
    """The aggregator until SIGTERM/SIGINT (or ``stop``), in the server shell.

    ``cfg`` is the configuration; ``ready`` is called with the core once it is restored
    and serving; the other arguments are :class:`~fiomon.server.app.Server`'s.

    Raises:
        fiomon.errors.StateLockedError: another aggregator holds the state directory.
    """
    core = AggregatorCore(cfg)
    core.restore()
    # Until connected (and lateness after), only the streams' own progress closes quanta:
    # records of the quanta that were open may still be queued in the broker.
    core.watermark.hold(
        core.published_ms if core.published_ms is not None else core.now_ms() - cfg.lateness_ms
    )
    server = Server(
        AggregatorService(core),
        stop=stop,
        final=final,
        config_path=config_path,
        overrides=overrides,
    )
    await server.run(None if ready is None else lambda: ready(core))
