"""The aggregator as a service: MQTT in, ``/metrics`` out, alert sinks, signals.

:func:`run_aggregator` restores the journal, serves the exporter from its HTTP thread,
and runs two tasks: the MQTT loop (a persistent MQTT v5 session, so a restart receives
what the broker queued meanwhile; reconnects with capped, jittered backoff) and the close
loop (ticks the :class:`~fiomon.aggregator.AggregatorCore`, publishes alert states to the
retained alert topic and posts to Alertmanager).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import aiomqtt

from fiomon import __version__
from fiomon.aggregator import AggregatorCore
from fiomon.alerts import AlertBook, Phase, Transition
from fiomon.config import AggregatorConfig
from fiomon.exporter import FiomonCollector, serve_metrics
from fiomon.mqtt import Backoff, Topics, make_client
from fiomon.runtime import keep_alive, sd_notify

log = logging.getLogger("fiomon.aggregator")


class AlertSinks:
    """Publishes alert transitions: retained MQTT topic and an optional Alertmanager.

    Args:
        cfg: the configuration.
    """

    def __init__(self, cfg: AggregatorConfig) -> None:
        self.cfg = cfg
        self.webhook_failures = 0
        self._last_post = 0.0

    def alertmanager_payload(self, book: AlertBook, transitions: list[Transition]) -> list[Any]:
        """Alertmanager v2 alerts: every firing alert, plus the ones that just resolved."""
        now = datetime.now(UTC).isoformat()
        out: list[Any] = []
        for rule, host, state in book.firing():
            labels = {"alertname": "FiomonSLA", "rule": rule.name, "direction": rule.direction}
            if host:
                labels["host"] = host
            out.append(
                {
                    "labels": labels,
                    "annotations": {
                        "summary": f"p{rule.percentile:g} {rule.direction} latency above "
                        f"{rule.threshold_ns / 1e6:g} ms",
                        "value_ms": f"{(state.value_ns or 0) / 1e6:.3f}",
                    },
                    "startsAt": datetime.fromtimestamp(
                        (state.fired_ms or 0) / 1000, UTC
                    ).isoformat(),
                }
            )
        for t in transitions:
            if t.new is Phase.RESOLVED:
                labels = {
                    "alertname": "FiomonSLA",
                    "rule": t.rule.name,
                    "direction": t.rule.direction,
                }
                if t.host:
                    labels["host"] = t.host
                out.append({"labels": labels, "endsAt": now})
        return out

    def post(self, alerts: list[Any]) -> None:
        """POST to Alertmanager (blocking: call from a thread)."""
        hook = self.cfg.webhook
        if hook is None or not alerts:
            return
        req = urllib.request.Request(  # noqa: S310 -- the configured http(s) URL
            hook.url.rstrip("/") + "/api/v2/alerts",
            data=json.dumps(alerts).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=hook.timeout_ms / 1000):  # noqa: S310
                pass
        except (urllib.error.URLError, OSError) as exc:
            self.webhook_failures += 1
            log.warning("alertmanager %s: %s", hook.url, exc)


async def run_aggregator(
    cfg: AggregatorConfig,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[AggregatorCore], None] | None = None,
) -> None:
    """Run until SIGTERM/SIGINT (or ``stop``); closes what is open before leaving."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    core = AggregatorCore(cfg)
    core.restore()
    collector = FiomonCollector(lambda: core.snapshot)
    addr, port = cfg.listen_addr
    server, _thread, _reg = serve_metrics(
        addr, port, collector, certfile=cfg.tls_cert, keyfile=cfg.tls_key
    )
    log.info(
        "fiomon aggregator %s: /metrics on %s, broker %s:%d, quantum %d ms, lateness %d ms",
        __version__,
        cfg.listen,
        cfg.broker.host,
        cfg.broker.port,
        cfg.quantum_ms,
        cfg.lateness_ms,
    )
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    sinks = AlertSinks(cfg)
    topics = Topics(cfg.topic_prefix)
    outbox: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(maxsize=1000)
    if ready is not None:
        ready(core)

    def status() -> str:
        return (
            f"{core.records['received']} records, {core.quanta_closed} quanta closed, "
            f"{sum(core.online.values())} hosts up"
        )

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_mqtt_loop(cfg, core, topics, outbox, stop), name="fiomon.mqtt")
            tg.create_task(_close_loop(cfg, core, sinks, outbox, stop), name="fiomon.close")
            tg.create_task(keep_alive(stop, status), name="fiomon.systemd")
            sd_notify("READY=1", f"STATUS=serving /metrics on {cfg.listen}")
    finally:
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        server.shutdown()
        server.server_close()
        if core.quanta is not None:
            core.quanta.close()


async def _close_loop(
    cfg: AggregatorConfig,
    core: AggregatorCore,
    sinks: AlertSinks,
    outbox: asyncio.Queue[tuple[str, bytes]],
    stop: asyncio.Event,
) -> None:
    period = min(0.25, cfg.quantum_ms / 4000)
    last_resend = 0.0
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)
        rows = core.tick() if not stop.is_set() else core.flush()
        if not rows:
            core.refresh_snapshot()
        transitions, core.transitions = core.transitions, []
        resend = (
            cfg.webhook is not None and loop.time() - last_resend > cfg.webhook.resend_ms / 1000
        )
        if transitions:
            body = json.dumps({"time_ms": core.now_ms(), "alerts": core.alerts.snapshot()})
            with contextlib.suppress(asyncio.QueueFull):
                outbox.put_nowait((cfg.alert_topic, body.encode()))
        if cfg.webhook is not None and (transitions or (resend and core.alerts.firing())):
            last_resend = loop.time()
            payload = sinks.alertmanager_payload(core.alerts, transitions)
            await asyncio.to_thread(sinks.post, payload)


async def _mqtt_loop(
    cfg: AggregatorConfig,
    core: AggregatorCore,
    topics: Topics,
    outbox: asyncio.Queue[tuple[str, bytes]],
    stop: asyncio.Event,
) -> None:
    # A persistent session (REFERENCE §4): the broker queues QoS 1 records while we are
    # away and replays them on reconnect.
    client = make_client(
        cfg.broker,
        identifier=cfg.client_id,
        persistent_session_s=max(1, cfg.session_expiry_ms // 1000),
    )
    backoff = Backoff()
    records_prefix = f"{cfg.topic_prefix}/v1/"
    while not stop.is_set():
        try:
            async with client:
                backoff.reset()
                await client.subscribe(topics.all_records, qos=1)
                await client.subscribe(topics.all_status, qos=1)
                log.info("subscribed on %s:%d", cfg.broker.host, cfg.broker.port)
                publisher = asyncio.create_task(_publish_outbox(client, outbox))
                try:
                    async for m in _until(client.messages, stop):
                        topic = m.topic.value
                        payload = m.payload
                        parts = topic[len(records_prefix) :].split("/")
                        if len(parts) != 2 or not topic.startswith(records_prefix):
                            continue
                        if parts[1] == "records":
                            core.on_records(parts[0], payload)
                        elif parts[1] == "status":
                            core.on_status(parts[0], payload)
                finally:
                    publisher.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await publisher
                return
        except aiomqtt.MqttError as exc:
            log.warning("broker %s:%d: %s", cfg.broker.host, cfg.broker.port, exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff.next())


async def _until(
    messages: AsyncIterator[aiomqtt.Message], stop: asyncio.Event
) -> AsyncIterator[aiomqtt.Message]:
    """Iterate ``messages`` until ``stop`` is set (the loser of the race is cancelled)."""
    it = messages.__aiter__()
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
            yield nxt.result()
    finally:
        stopper.cancel()


async def _publish_outbox(client: aiomqtt.Client, outbox: asyncio.Queue[tuple[str, bytes]]) -> None:
    while True:
        topic, payload = await outbox.get()
        try:
            await client.publish(topic, payload, qos=1, retain=True)
        except aiomqtt.MqttError as exc:
            log.warning("cannot publish %s: %s", topic, exc)
