"""The aggregator as a service: MQTT in, ``/metrics`` out, alert sinks, signals, reload.

:func:`run_aggregator` restores the state directory, serves ``/metrics`` from a child
process (:mod:`fiomon.aggregator.metrics_server`: each new snapshot is pickled to it; rendering and
every request's HTTP work happen there, off this interpreter's lock), and runs these tasks
on one event loop:

* ``fiomon.mqtt``: a persistent MQTT 5 session (a restart receives what the broker queued
  meanwhile), reconnecting with capped, jittered backoff. Messages are taken in batches:
  the core journals a batch with one write, then the batch is acknowledged (manual
  PUBACKs, one socket write per batch), so a message is always either journaled or the
  broker's to redeliver. paho reads through :mod:`fiomon.aggregator.mqttread` (one
  ``recv`` for many packets, plain PUBLISH parsed without MQTT 5 property objects).
* ``fiomon.close``: ticks the core a few times per quantum (decode, merge, close), then
  hands the alerts to the sinks without waiting for them.
* ``fiomon.alertmanager``: posts to Alertmanager
  (:class:`~fiomon.aggregator.alerts.AlertDispatcher`).
* ``fiomon.partials`` (a cell, ``partials:`` configured): sends the closed quanta from
  the outbox to the root's broker (:mod:`fiomon.aggregator.outbox`).
* ``fiomon.reload``: SIGHUP re-reads the configuration and applies what can change
  while running (SLA rules, webhook, log level, host timeout), logging what it did.
* ``fiomon.systemd``: ``STATUS=`` and watchdog keep-alives.

Stopping (SIGTERM, SIGINT) goes in a written order (:func:`_shutdown`) under one
``GRACE_S``: intake stops; nothing open is closed early (it is in the journal; the next
start continues exactly as after ``kill -9``), or with ``final=True`` everything open
closes (the end of a run); what was closed is written and the grid saved; the final alert
state goes to Alertmanager and the broker; then the connection closes. A second signal
cuts the waiting short.

Two aggregators must not share a client id: the broker hands the session to whichever
connected last, and each counts the other's records as lost. Each instance announces
itself on a retained topic; one that finds another instance there after its own
announcement has lost its session to it: it stops reading (no reconnect loop), says so
in the log and on ``fiomon_mqtt_session_taken_over``, and tells the other one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import cast

import aiomqtt

from fiomon import __version__
from fiomon.aggregator import mqttread
from fiomon.aggregator.alerts import AlertDispatcher
from fiomon.aggregator.core import SNAPSHOT_EVERY_MS, AggregatorCore
from fiomon.aggregator.metrics_server import MetricsProcess
from fiomon.aggregator.outbox import publish_partials
from fiomon.config import AggregatorConfig, load_aggregator_config
from fiomon.errors import ConfigError
from fiomon.mqtt import (
    SUBSCRIBE_TIMEOUT_S,
    Backoff,
    IncomingQueue,
    Topics,
    drop_stale,
    make_client,
)
from fiomon.runtime import GRACE_S, cancel_and_wait, keep_alive, sd_notify, stop_on_signals

log = logging.getLogger("fiomon.aggregator")

BATCH_MESSAGES = 2000  # messages taken from the client's queue at once
QUEUED_BYTES_LIMIT = 256 * 1024 * 1024  # received but not merged: merge now beyond this
STALL_TOLERANCE_MS = 1000  # ticks further apart than the period plus this: a stall


class _Service:
    """State shared by the service's tasks."""

    def __init__(
        self,
        cfg: AggregatorConfig,
        core: AggregatorCore,
        stop: asyncio.Event,
        *,
        final: bool,
        config_path: Path | None,
        log_level_fixed: bool,
    ) -> None:
        self.cfg = cfg
        self.core = core
        self.stop = stop
        self.final = final
        self.config_path = config_path
        self.log_level_fixed = log_level_fixed
        self.topics = Topics(cfg.topic_prefix)
        self.dispatcher = AlertDispatcher(cfg.webhook, core.counts.alert_deliveries, core.now_ms)
        self.outbox: asyncio.Queue[tuple[str, bytes, bool]] = asyncio.Queue(maxsize=100)
        self.reload = asyncio.Event()
        self.instance = uuid.uuid4().hex[:12]
        self.presence_topic = self.topics.presence(cfg.client_id)
        self.conflict_topic = self.topics.conflict(cfg.client_id)
        self.announced = False
        self.own_seen = False  # our announcement came back to us
        self.presence_seen = asyncio.Event()
        self.rival: object = None
        self.forced = False
        self.metrics: MetricsProcess | None = None  # set once serving
        self.ready = False  # READY=1 sent: the first broker session was up and subscribed
        self.closed = asyncio.Event()  # the close loop is done (a final close included)
        # The stop sequence's steps (_shutdown): the MQTT task takes no more messages;
        # the last alerts are handed over; the MQTT task may close the connection.
        self.intake_stopped = asyncio.Event()
        self.alerts_final = asyncio.Event()
        self.disconnect = asyncio.Event()

    def taken_over(self) -> bool:
        """Another aggregator took our MQTT session (we stopped reading)."""
        return self.core.session_taken_over

    def status(self) -> str:
        core = self.core
        if core.session_taken_over:
            return "STOPPED READING: another aggregator took our MQTT session (see the log)"
        if not self.ready:
            b = self.cfg.broker
            return f"waiting for the broker at {b.host}:{b.port} (/metrics on {self.cfg.listen})"
        return (
            f"{core.records['received']} records, {core.counts.quanta_closed} quanta closed, "
            f"{core.hosts_up()} hosts up"
        )


async def run_aggregator(
    cfg: AggregatorConfig,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[AggregatorCore], None] | None = None,
    final: bool = False,
    config_path: Path | None = None,
    log_level_fixed: bool = False,
) -> None:
    """Run until SIGTERM/SIGINT (or ``stop``).

    Args:
        cfg: the configuration.
        stop: set it to stop (tests); signals set it too.
        ready: called with the core once it is restored and serving.
        final: close every open quantum when stopping (the end of a run); otherwise open
            quanta stay in the journal for the next start.
        config_path: the file SIGHUP re-reads (None: SIGHUP is logged and ignored).
        log_level_fixed: the command line fixed the log level (a reload keeps it).

    Raises:
        fiomon.aggregator.StateLockedError: another aggregator holds the state directory.
    """
    stop = stop or asyncio.Event()
    core = AggregatorCore(cfg)
    core.restore()
    if cfg.log_level and not log_level_fixed:
        logging.getLogger().setLevel(cfg.log_level.upper())
    now = core.now_ms()
    # Until connected (and lateness after), only the streams' own progress closes quanta:
    # records of the quanta that were open may still be queued in the broker.
    core.watermark.hold(
        core.published_ms if core.published_ms is not None else now - cfg.lateness_ms
    )
    svc = _Service(
        cfg,
        core,
        stop,
        final=final,
        config_path=config_path,
        log_level_fixed=log_level_fixed,
    )
    addr, port = cfg.listen_addr

    def restarted() -> None:
        core.counts.metrics_server_restarts += 1

    try:
        # /metrics from a child process: rendering and HTTP stay off our interpreter lock.
        metrics = MetricsProcess(
            addr,
            port,
            lambda: core.snapshot,
            certfile=cfg.tls_cert,
            keyfile=cfg.tls_key,
            on_restart=restarted,
        )
        metrics.start()
    except BaseException:
        core.close()
        raise
    svc.metrics = metrics
    log.info(
        "fiomon aggregator %s (instance %s): /metrics on %s, broker %s:%d, quantum %d ms, "
        "lateness %d ms",
        __version__,
        svc.instance,
        cfg.listen,
        cfg.broker.host,
        cfg.broker.port,
        cfg.quantum_ms,
        cfg.lateness_ms,
    )
    main = asyncio.current_task()

    def cut_short(signame: str) -> None:
        log.warning("%s again: not waiting any longer", signame)
        svc.forced = True
        if main is not None:
            main.cancel()

    if ready is not None:
        ready(core)
    closed = False
    try:
        with stop_on_signals(
            stop,
            again=cut_short,
            reload=svc.reload.set,
            logger=log,
            stopping="stopping (open quanta stay in the journal)"
            if not final
            else "stopping (open quanta close now: --final)",
        ):
            async with asyncio.TaskGroup() as tg:
                mqtt = tg.create_task(_mqtt_loop(svc), name="fiomon.mqtt")
                closer = tg.create_task(_close_loop(svc), name="fiomon.close")
                alerts = tg.create_task(
                    svc.dispatcher.run(svc.alerts_final), name="fiomon.alertmanager"
                )
                tg.create_task(_reload_loop(svc), name="fiomon.reload")
                partials: asyncio.Task[None] | None = None
                if cfg.partials is not None and core.outbox is not None:
                    # A cell: its closed quanta go to the root's broker on their own task.
                    # A final stop sends the final close too (within the grace time).
                    partials = tg.create_task(
                        publish_partials(
                            cfg.partials,
                            core.outbox,
                            stop,
                            closed=svc.closed if final else None,
                            grace_s=GRACE_S,
                        ),
                        name="fiomon.partials",
                    )
                # READY=1 comes from the MQTT task once the first session is subscribed;
                # until then STATUS= says what it waits for (systemctl status shows it).
                tg.create_task(keep_alive(stop, svc.status), name="fiomon.systemd")
                await stop.wait()
                closed = True  # _shutdown closes the core, whatever happens in it
                await _shutdown(svc, mqtt=mqtt, closer=closer, alerts=alerts, partials=partials)
    finally:
        if not closed:  # a task failed, or the stop was cut short before the sequence
            core.close(timeout_s=0.5 if svc.forced else GRACE_S)
        elif core.outbox is not None:  # no task reads it any more
            core.outbox.close()
        metrics.close()
        log.info("stopped: %s", _final_counters(core))


async def _shutdown(
    svc: _Service,
    *,
    mqtt: asyncio.Task[None],
    closer: asyncio.Task[None],
    alerts: asyncio.Task[None],
    partials: asyncio.Task[None] | None = None,
) -> None:
    """The aggregator's stop, in this order, all within ``GRACE_S`` (``stop`` is set).

    1. Intake stops: the MQTT task leaves its receive loop but stays connected; what it
       has not taken stays unacknowledged, the broker's to redeliver at the next start.
    2. The close loop ends; with ``final`` every open quantum closes and its alerts are
       handed over. A cell's partials task ends: with ``final`` once the final close
       reached the root's broker (or the grace time is up: the rest waits in the outbox
       for the next start), else after the message in flight.
    3. Flush: the quanta file and the grid are written, the journal closed and the state
       directory unlocked (:meth:`AggregatorCore.close`, in a thread: it waits for the disk).
    4. The final alert state goes out: Alertmanager's last delivery and the MQTT outbox
       (the retained alert state), while the connection is up.
    5. Disconnect.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + GRACE_S

    def left() -> float:
        return max(0.0, end - loop.time())

    try:
        # Step 1: a batch taken as `stop` came is still journaled and acknowledged; the
        # journal closes only after that (as long as the MQTT task needs, as before).
        intake = asyncio.ensure_future(svc.intake_stopped.wait())
        try:
            await asyncio.wait({intake, mqtt}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            intake.cancel()
        await closer  # step 2
        if partials is not None:
            await asyncio.wait({partials}, timeout=left())
    finally:
        # Even when cut short: what was closed is written and the directory unlocked.
        # The outbox stays open: the partials task may still hold it (run_aggregator
        # closes it once the task group is done).
        timeout = 0.5 if svc.forced else max(0.5, left())
        await asyncio.shield(
            asyncio.to_thread(functools.partial(svc.core.close, timeout, outbox=False))
        )
    svc.alerts_final.set()
    svc.dispatcher.wake()
    await asyncio.wait({alerts}, timeout=left())
    if not mqtt.done():  # connected: the outbox drains, or the connection ends first
        drained = asyncio.ensure_future(svc.outbox.join())
        await asyncio.wait({drained, mqtt}, timeout=left(), return_when=asyncio.FIRST_COMPLETED)
        drained.cancel()
    svc.disconnect.set()


def _final_counters(core: AggregatorCore) -> str:
    """The counters an operator checks after a stop, as one line."""
    engine = core.engine
    late = sum(engine.late_records.values()) if engine is not None else 0
    still_open = engine.open_quanta if engine is not None else 0
    return (
        f"{core.records['received']} records received, "
        f"{core.records['duplicate']} duplicate, {sum(core.lost.values())} lost, "
        f"{late} late, {sum(core.invalid.values())} invalid messages; "
        f"{core.counts.quanta_closed} quanta closed, {still_open} left open"
    )


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def _step(svc: _Service) -> None:
    """One tick: merge and close, then hand the alerts over (nothing here waits)."""
    core = svc.core
    rows = core.tick()
    if not rows:
        core.refresh_snapshot(min_age_ms=SNAPSHOT_EVERY_MS)
    _alerts_out(svc)


def _alerts_out(svc: _Service) -> None:
    core = svc.core
    transitions, core.transitions = core.transitions, []
    if transitions:
        body = json.dumps({"time_ms": core.now_ms(), "alerts": core.alerts.snapshot()})
        try:
            svc.outbox.put_nowait((svc.cfg.alert_topic, body.encode(), True))
            core.counts.alert_deliveries[("mqtt", "queued")] += 1
        except asyncio.QueueFull:
            core.counts.alert_deliveries[("mqtt", "dropped")] += 1
    svc.dispatcher.offer(core.alerts, transitions)


async def _close_loop(svc: _Service) -> None:
    """Tick the core until stop; on a final stop, close what is open.

    Ticks come every ``period``; a gap much longer than that means the process could not
    run (a long step, CPU starvation, SIGSTOP or a VM pause) and so could not read its
    input either: the core is told, so the pause is not taken for input silence.
    """
    period = min(0.25, svc.cfg.quantum_ms / 4000)
    core = svc.core
    last: int | None = None
    while not svc.stop.is_set():
        await _wait(svc.stop, period)
        if svc.stop.is_set():
            break
        now = core.now_ms()
        if last is not None:
            core.stalled(now - last - int(period * 1000) - STALL_TOLERANCE_MS)
        last = now
        snap = core.snapshot
        _step(svc)
        if core.snapshot is not snap and svc.metrics is not None:
            svc.metrics.poke()
    if svc.final:
        rows = svc.core.flush()
        log.info("final stop: closed %d open rows", len(rows))
        _alerts_out(svc)
    svc.closed.set()


async def _reload_loop(svc: _Service) -> None:
    """Apply SIGHUP: re-read the file, take what can change, log what happened."""
    while not svc.stop.is_set():
        await _wait(svc.reload, 1.0)
        if not svc.reload.is_set():
            continue
        svc.reload.clear()
        sd_notify("RELOADING=1")
        _reload(svc)
        sd_notify("READY=1")


def _reload(svc: _Service) -> None:
    if svc.config_path is None:
        log.warning("SIGHUP: no configuration file to re-read; nothing reloaded")
        return
    try:
        new = load_aggregator_config(svc.config_path)
    except ConfigError as exc:
        for p in exc.problems:
            log.error("SIGHUP: %s", p)
        log.error("SIGHUP: %s not reloaded; the running configuration stays", svc.config_path)
        return
    done = svc.core.reload(new)
    svc.dispatcher.reconfigure(new.webhook)
    if new.log_level and not svc.log_level_fixed:
        logging.getLogger().setLevel(new.log_level.upper())
    elif new.log_level and svc.log_level_fixed:
        done.append("log_level kept (set by --log-level)")
    svc.cfg = svc.core.cfg
    log.info("SIGHUP: reloaded %s: %s", svc.config_path, "; ".join(done) if done else "no changes")


async def _mqtt_loop(svc: _Service) -> None:
    """Receive until stop; reconnect on errors; stop for good if our session was taken.

    At ``stop`` it takes no more messages (``intake_stopped``) but keeps a connection that
    is up until ``disconnect``, so the stop sequence can publish the final alert state.
    """
    try:
        await _receive(svc)
    finally:
        svc.intake_stopped.set()


async def _receive(svc: _Service) -> None:
    cfg, core = svc.cfg, svc.core
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
    # paho's per-packet reading and MQTT 5 properties cost a third of intake: read in bulk.
    # Messages waiting unprocessed are bounded by max_inflight: asked of the broker (MQTT 5
    # Receive Maximum) and held here, as Mosquitto 2.0.11 sends a resumed session's whole
    # backlog regardless once we acknowledge a message, which would land in memory. Held
    # only while the batches below are consumed: before that, a hold would also hold the
    # SUBACKs we wait for behind the messages (until then the broker keeps to the limit).
    consuming = False

    def hold() -> bool:
        # (one less: the consumer may be taking one out of the queue as we read)
        return consuming and queue.qsize() >= max(1, cfg.max_inflight - 1)

    reader = mqttread.install(paho, hold=hold)
    # The broker restarts in seconds; one client, so no herd to spread: reconnect fast.
    backoff = Backoff(base_s=0.25, cap_s=5.0)
    while not svc.stop.is_set() and not svc.taken_over():
        drop_stale(queue, log)
        try:
            async with client:
                core.broker_connected = True
                backoff.reset()
                topics = svc.topics
                for t in (
                    topics.all_records,
                    topics.all_status,
                    svc.presence_topic,
                    svc.conflict_topic,
                ):
                    await client.subscribe(t, qos=1, timeout=SUBSCRIBE_TIMEOUT_S)
                # The clock bound resumes lateness after we start reading, not after the
                # CONNACK: subscribing can take seconds (timing out) on a loaded machine,
                # while the session's backlog waits for us.
                core.watermark.connected(core.now_ms())
                log.info("subscribed on %s:%d", cfg.broker.host, cfg.broker.port)
                if not svc.ready:
                    svc.ready = True
                    sd_notify("READY=1", f"STATUS={svc.status()}")
                svc.presence_seen.clear()
                publisher = asyncio.create_task(_publish_outbox(client, svc))
                announce = asyncio.create_task(_announce(svc))
                try:
                    consuming = True
                    async for batch in _batches(client, queue, svc.stop):
                        # Unacknowledged until journaled: at most max_inflight wait here.
                        core.backlog_max = max(core.backlog_max, len(batch) + queue.qsize())
                        _handle(svc, batch)
                        mqttread.ack_many(paho, [(m.mid, m.qos) for m in batch if m.qos > 0])
                        if reader is not None:
                            reader.resume()
                        if svc.taken_over():
                            await _tell_conflict(client, svc)
                            break
                    if svc.stop.is_set():
                        # Intake has stopped; the final alert state still goes out on
                        # this connection (_shutdown says when it may close).
                        svc.intake_stopped.set()
                        await svc.disconnect.wait()
                finally:
                    consuming = False
                    for task in (publisher, announce):
                        await cancel_and_wait(task)
        except aiomqtt.MqttError as exc:
            log.warning("broker %s:%d: %s", cfg.broker.host, cfg.broker.port, exc)
        core.watermark.disconnected(core.now_ms())
        core.broker_connected = False
        if svc.taken_over():
            break
        await _wait(svc.stop, backoff.next())
    while svc.taken_over() and not svc.stop.is_set():
        log.error(
            "not reading from the broker: another aggregator uses client_id %r (see above); "
            "stop one of them or give each its own client_id, then restart this one",
            cfg.client_id,
        )
        await _wait(svc.stop, 60.0)


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


def _handle(svc: _Service, batch: list[aiomqtt.Message]) -> None:
    """Records to the core (journaled before this returns), statuses, presence."""
    core = svc.core
    records: list[tuple[str, bytes]] = []
    parse, client_id = svc.topics.parse, svc.cfg.client_id
    for m in batch:
        topic = m.topic.value
        payload = m.payload
        try:
            match parse(topic):
                case ("records", host):
                    records.append((host, payload))
                case ("status", host):
                    core.on_status(host, payload, retained=m.retain)
                case ("presence", name) if name == client_id:
                    _presence(svc, payload)
                case ("conflict", name) if name == client_id:
                    _conflict(svc, payload)
        except Exception:  # a bug must not stop intake: say so, count it, go on
            core.invalid["internal"] += 1
            log.exception("cannot handle a message on %s", topic)
    if records:
        try:
            core.receive(records)
        except Exception:
            core.invalid["internal"] += len(records)
            log.exception("cannot take %d messages", len(records))
        if core.queued_bytes > QUEUED_BYTES_LIMIT:
            core.tick()


def _doc(payload: bytes) -> dict[str, object] | None:
    if len(payload) > 4096:
        return None
    try:
        doc = json.loads(payload)
    except Exception:  # anyone may write here: any failure means "not ours"
        return None
    return doc if isinstance(doc, dict) else None


def _presence(svc: _Service, payload: bytes) -> None:
    svc.presence_seen.set()
    doc = _doc(payload)
    if doc is None:
        return
    if doc.get("instance") == svc.instance:
        svc.own_seen = True  # the broker's order: anything after this is newer than us
        return
    who = f"instance {doc.get('instance')} on {doc.get('host')} (pid {doc.get('pid')})"
    if not svc.own_seen:
        log.info("previous aggregator with this client_id: %s", who)
        return
    core = svc.core
    svc.rival = doc.get("instance")
    core.session_taken_over = True
    core.counts.session_takeovers += 1
    core.refresh_snapshot()
    log.error(
        "another aggregator, %s, connected with our client_id %r and took our MQTT "
        "session: this one stops reading (two aggregators on one session each count the "
        "other's records as lost). Stop one of them, or give each its own client_id.",
        who,
        svc.cfg.client_id,
    )


def _conflict(svc: _Service, payload: bytes) -> None:
    doc = _doc(payload)
    if doc is None or doc.get("rival") != svc.instance:
        return
    core = svc.core
    core.counts.session_takeovers += 1
    log.error(
        "aggregator instance %s on %s (pid %s) had our client_id %r; we took its MQTT "
        "session and it stopped reading. If that one should run, stop this one.",
        doc.get("instance"),
        doc.get("host"),
        doc.get("pid"),
        svc.cfg.client_id,
    )


def _identity(svc: _Service) -> dict[str, object]:
    return {
        "instance": svc.instance,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "version": __version__,
        "time_ms": svc.core.now_ms(),
    }


async def _announce(svc: _Service) -> None:
    """Announce this instance on the retained presence topic.

    The first time at once. After a reconnect only once the retained announcement has
    been read and is ours (or there is none): if it is another instance's, that one
    connected after us and has our session (:func:`_presence` stops us).
    """
    if svc.announced:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(svc.presence_seen.wait(), 0.5)
    if svc.core.session_taken_over:
        return
    body = json.dumps(_identity(svc)).encode()
    await svc.outbox.put((svc.presence_topic, body, True))
    svc.announced = True


async def _tell_conflict(client: aiomqtt.Client, svc: _Service) -> None:
    """Tell the instance that took our session (its persistent session keeps this)."""
    doc = {**_identity(svc), "rival": svc.rival}
    with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
        async with asyncio.timeout(5):
            await client.publish(svc.conflict_topic, json.dumps(doc).encode(), qos=1)


async def _publish_outbox(client: aiomqtt.Client, svc: _Service) -> None:
    """Publish the outbox (alert state, presence) in order; ``outbox.join()`` waits for it."""
    while True:
        topic, payload, retain = await svc.outbox.get()
        try:
            await client.publish(topic, payload, qos=1, retain=retain)
        except aiomqtt.MqttError as exc:
            svc.core.counts.alert_deliveries[("mqtt", "failed")] += 1
            log.warning("cannot publish %s: %s", topic, exc)
        finally:
            svc.outbox.task_done()
