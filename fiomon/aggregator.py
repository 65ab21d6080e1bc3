"""The central aggregator: MQTT in, quanta closed on time, metrics, quanta file and alerts.

:class:`AggregatorCore` is the logic without I/O, driven by ``now_ms`` (tests use a fake
clock): :meth:`~AggregatorCore.on_records` validates a payload, drops duplicates and
counts gaps by ``(agent, stream, seq)``, refuses records from the far future or with
absurd spans, and queues the rest; :meth:`~AggregatorCore.tick` merges what is queued into
the shared :class:`~fiomon.windows.QuantumEngine` (the report's engine, so the same logs
give the same numbers), closes what the :class:`~fiomon.watermark.Watermark` allows, and
feeds the quanta file, the alert book and a fresh exporter snapshot.

:func:`run_aggregator` wires it to MQTT (a persistent MQTT v5 session: fixed client id,
``clean_start=False`` and a session expiry, so a restart receives what the broker queued
meanwhile), to the exporter's HTTP thread and to the alert sinks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import aiomqtt
import numpy as np

from fiomon import __version__
from fiomon.alerts import AlertBook, Phase, Transition
from fiomon.align import auto_phase, phase_for
from fiomon.bins import BinLayout
from fiomon.config import AggregatorConfig
from fiomon.dedup import SeqTracker
from fiomon.errors import LayoutError, WireFormatError
from fiomon.exporter import BucketHistogram, FiomonCollector, Snapshot, bucket_edges_s
from fiomon.histogram import pct_key
from fiomon.model import RecordBatch
from fiomon.mqtt import Backoff, Topics, make_client
from fiomon.quantafile import QuantaFile
from fiomon.watermark import Watermark
from fiomon.windows import ALL_DIRECTIONS, ClosedQuantum, QuantumEngine
from fiomon.wire import decode

log = logging.getLogger("fiomon.aggregator")

MAX_FUTURE_MS = 10 * 60_000  # records ending further ahead of our clock are refused
MAX_SPAN_MS = 3_600_000  # a record spanning more than this is refused
OTHER_HOST = "_other"  # label of per-host counters beyond the host cap

_REASONS = (
    ("oversized", "oversized"),
    ("truncated", "truncated"),
    ("not a fiomon message", "not-fiomon"),
    ("unsupported wire format version", "version"),
    ("invalid bin layout", "layout"),
    ("inconsistent", "inconsistent"),
)


def _reason(exc: WireFormatError) -> str:
    text = str(exc)
    for prefix, reason in _REASONS:
        if text.startswith(prefix):
            return reason
    return "invalid"


class AggregatorCore:
    """Everything between decoded payloads and published results, without I/O.

    Args:
        cfg: the configuration.
        now_ms: wall clock in epoch ms.
    """

    def __init__(self, cfg: AggregatorConfig, now_ms: Callable[[], int] | None = None) -> None:
        self.cfg = cfg
        self.now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self.tracker = SeqTracker(cfg.max_streams)
        self.watermark = Watermark(cfg.lateness_ms)
        self.alerts = AlertBook(cfg.sla, cfg.max_hosts)
        self.engine: QuantumEngine | None = None
        self.buckets: BucketHistogram | None = None
        self.quanta = (
            QuantaFile(cfg.quanta_file, cfg.quanta_file_max_bytes, cfg.quanta_file_keep)
            if cfg.quanta_file
            else None
        )
        self._queue: list[RecordBatch] = []
        self._queued_since: int | None = None
        self.snapshot = Snapshot()
        self.records: Counter[str] = Counter()  # by result
        self.invalid: Counter[str] = Counter()  # messages by reason
        self.lost: Counter[str] = Counter()  # by host
        self.recovered: Counter[str] = Counter()
        self.duplicates: Counter[str] = Counter()
        self.online: dict[str, bool] = {}
        self.instances: dict[str, tuple[str, int]] = {}
        self.id_conflicts: Counter[str] = Counter()
        self.close_delays_ms: deque[int] = deque(maxlen=10_000)
        self.quanta_closed = 0
        self.transitions: list[Transition] = []
        self._host_labels: set[str] = set()

    # -- intake --------------------------------------------------------------------------

    def on_records(self, topic_host: str, payload: bytes) -> None:
        """One message from ``<prefix>/v1/<topic_host>/records``."""
        now = self.now_ms()
        try:
            msg = decode(payload, max_bytes=self.cfg.max_message_bytes)
        except WireFormatError as exc:
            self._invalid(_reason(exc), f"from {topic_host}: {exc}")
            return
        if msg.agent != topic_host:
            self._invalid("agent-mismatch", f"agent {msg.agent!r} published as {topic_host!r}")
            return
        layout = self._layout(msg.batch.layout)
        if layout is None:
            self._invalid(
                "layout", f"from {topic_host}: layout {msg.batch.layout.describe()} cannot merge"
            )
            return
        n = len(msg.batch)
        verdict = self.tracker.judge(msg.agent, msg.stream, msg.first_seq, n)
        host = self._host_label(msg.agent)
        if verdict.refused:
            self._invalid("streams-over-cap", f"stream {msg.stream!r} of {msg.agent}")
            self.records["refused"] += n
            return
        self.records["duplicate"] += verdict.duplicates
        self.duplicates[host] += verdict.duplicates
        if verdict.lost:
            self.lost[host] += verdict.lost
            log.warning(
                "%s: %d records of %s lost (seq gap before %d)",
                msg.agent,
                verdict.lost,
                msg.stream,
                msg.first_seq + int(np.argmax(verdict.new)),
            )
        self.recovered[host] += verdict.recovered
        batch = msg.batch
        keep = verdict.new.copy()
        future = batch.end_ms > now + MAX_FUTURE_MS
        span = (batch.end_ms - batch.start_ms) > MAX_SPAN_MS
        for mask, reason in ((future, "future"), (span, "span")):
            bad = int((keep & mask).sum())
            if bad:
                self.records[f"invalid-{reason}"] += bad
                self._invalid(reason, f"{bad} records of {msg.stream} from {msg.agent}")
                keep &= ~mask
        if keep.any():
            self.watermark.observe(msg.agent, msg.stream, int(batch.end_ms[keep].max()), now)
            self._queue.append(batch if keep.all() else batch.select(keep))
            if self._queued_since is None:
                self._queued_since = now
            self.records["received"] += int(keep.sum())

    def on_status(self, topic_host: str, payload: bytes) -> None:
        """An agent's retained status (online with counters, or offline)."""
        try:
            doc = json.loads(payload)
            state = doc["state"]
        except (ValueError, KeyError, TypeError):
            self._invalid("status", f"unreadable status of {topic_host}")
            return
        online = state == "online"
        was = self.online.get(topic_host)
        self.online[topic_host] = online
        self.watermark.set_online(topic_host, online)
        if was is not None and was != online:
            log.info("agent %s is %s", topic_host, "online" if online else "offline")
        instance = doc.get("instance") if isinstance(doc, dict) else None
        if online and isinstance(instance, str):
            now = self.now_ms()
            prev = self.instances.get(topic_host)
            if prev is not None and prev[0] != instance and now - prev[1] < 30_000:
                self.id_conflicts[topic_host] += 1
                log.warning(
                    "two agents claim the id %r (instances %s and %s): give each host its own "
                    "`host` name; their records cannot be told apart",
                    topic_host,
                    prev[0],
                    instance,
                )
            self.instances[topic_host] = (instance, now)

    def _invalid(self, reason: str, detail: str) -> None:
        self.invalid[reason] += 1
        # The first few of each reason are logged; the counters say the rest.
        if self.invalid[reason] <= 5 or self.invalid[reason] % 1000 == 0:
            log.warning("refused (%s, %d so far): %s", reason, self.invalid[reason], detail)

    def _layout(self, layout: BinLayout) -> BinLayout | None:
        """The engine layout this batch can merge into, or None."""
        base = self.engine.layout if self.engine is not None else self._first_layout
        if base is None:
            self._first_layout = layout
            return layout
        if layout.group_nr != base.group_nr or layout.unit != base.unit:
            return None
        if layout.coarseness > base.coarseness:
            return None
        return base

    _first_layout: BinLayout | None = None

    def _host_label(self, host: str) -> str:
        if host in self._host_labels:
            return host
        if len(self._host_labels) < self.cfg.max_hosts:
            self._host_labels.add(host)
            return host
        return OTHER_HOST

    # -- closing -------------------------------------------------------------------------

    def tick(self) -> list[ClosedQuantum]:
        """Merge what is queued and close what may close; returns the closed rows."""
        now = self.now_ms()
        if not self._merge(now, force=False):
            return []
        assert self.engine is not None  # noqa: S101 -- _merge made it
        rows = self.engine.close_through(self.watermark.close_through(now))
        if rows:
            self._closed(rows, now)
        return rows

    def _merge(self, now: int, *, force: bool) -> bool:
        """Merge the queue into the engine (creating it once the phase is known)."""
        if self.engine is None and not self._start_engine(now, force=force):
            return False
        engine = self.engine
        assert engine is not None  # noqa: S101 -- _start_engine made it
        if self._queue:
            batches, self._queue = self._queue, []
            self._queued_since = None
            for b in batches:
                try:
                    engine.add(b)
                except LayoutError as exc:  # a layout change within one agent's stream
                    self._invalid("layout", str(exc))
        return True

    def _start_engine(self, now: int, *, force: bool = False) -> bool:
        """Create the engine once the phase is known (auto: from the first records)."""
        if not self._queue or self._first_layout is None:
            return False
        phase = phase_for(self.cfg.align, self.cfg.quantum_ms)
        if phase is None:
            # auto: wait one lateness for records from many streams, then choose.
            waited = self._queued_since is not None and now - self._queued_since >= (
                self.cfg.lateness_ms
            )
            if not (waited or force):
                return False
            ends = np.concatenate([b.end_ms for b in self._queue])
            weights = np.concatenate([b.samples() for b in self._queue]).astype(np.float64)
            phase = auto_phase(ends, weights, self.cfg.quantum_ms)
            log.info("align auto: quanta end at %d ms past each quantum", phase)
        self.engine = QuantumEngine(
            layout=self._first_layout,
            quantum_ms=self.cfg.quantum_ms,
            phase_ms=phase,
            percentiles=self.cfg.percentiles,
            directions=ALL_DIRECTIONS,
            per_host=self.cfg.per_host,
            max_hosts=self.cfg.max_hosts,
            max_open_quanta=self.cfg.max_open_quanta,
            keep_hists=True,
        )
        self.buckets = BucketHistogram(
            self._first_layout,
            bucket_edges_s(self._first_layout, [r.threshold_ns for r in self.cfg.sla]),
        )
        return True

    def flush(self) -> list[ClosedQuantum]:
        """Merge what is queued and close everything still open (shutdown)."""
        if not self._merge(self.now_ms(), force=True) or self.engine is None:
            return []
        rows = self.engine.flush()
        if rows:
            self._closed(rows, self.now_ms())
        return rows

    def _closed(self, rows: list[ClosedQuantum], now: int) -> None:
        ends = sorted({r.end_ms for r in rows})
        self.quanta_closed += len(ends)
        self.close_delays_ms.extend(now - e for e in ends)
        if self.quanta is not None:
            self.quanta.write(rows)
        assert self.buckets is not None  # noqa: S101 -- made with the engine
        for r in rows:
            if r.scope == "cluster" and r.hist is not None:
                self.buckets.add(r.direction, r.hist, r.stats.mean_ns)
        for t in self.alerts.observe(rows):
            self.transitions.append(t)
            log.info("sla %s", json.dumps(t.to_json(), separators=(",", ":")))
        self.snapshot = self._build_snapshot(rows)

    # -- exporter snapshot ----------------------------------------------------------------

    def _build_snapshot(self, rows: list[ClosedQuantum] | None = None) -> Snapshot:
        last_end = max((r.end_ms for r in rows), default=None) if rows else None
        prev = self.snapshot
        cluster = dict(prev.cluster)
        hosts: dict[tuple[str, str, str], float] = dict(prev.hosts) if not rows else {}
        saturated: dict[tuple[str, ...], float] = {}
        if rows and last_end is not None:
            cluster = {}
            for r in rows:
                if r.end_ms != last_end:
                    continue
                for q in self.cfg.percentiles:
                    key = pct_key(q)
                    v = r.stats.percentiles_ns.get(key)
                    if v is None:
                        continue
                    quantile = _quantile_label(q)
                    if r.scope == "cluster":
                        cluster[(r.direction, quantile)] = v / 1e9
                        saturated[(r.direction, quantile)] = float(key in r.stats.saturated)
                    elif r.host is not None:
                        hosts[(r.host, r.direction, quantile)] = v / 1e9
        engine = self.engine
        counters: dict[tuple[str, str, tuple[str, ...]], dict[tuple[str, ...], float]] = {
            (
                "fiomon_records",
                "Records by result (received, duplicate, refused, invalid-*).",
                ("result",),
            ): {(k,): float(v) for k, v in self.records.items()},
            ("fiomon_invalid_messages", "Payloads refused, by reason.", ("reason",)): {
                (k,): float(v) for k, v in self.invalid.items()
            },
            (
                "fiomon_lost_records",
                "Records never received (sequence gaps), by host.",
                ("host",),
            ): {(k,): float(v) for k, v in self.lost.items()},
            ("fiomon_recovered_records", "Records received after being counted lost.", ("host",)): {
                (k,): float(v) for k, v in self.recovered.items()
            },
            ("fiomon_duplicate_records", "Records received again and dropped.", ("host",)): {
                (k,): float(v) for k, v in self.duplicates.items()
            },
            ("fiomon_quanta_closed", "Quanta closed.", ()): {(): float(self.quanta_closed)},
            ("fiomon_agent_id_conflicts", "Two agents seen with one id.", ("host",)): {
                (k,): float(v) for k, v in self.id_conflicts.items()
            },
        }
        gauges: dict[tuple[str, str, tuple[str, ...]], dict[tuple[str, ...], float]] = {
            (
                "fiomon_hosts_up",
                "Agents whose status is online.",
                (),
            ): {(): float(sum(self.online.values()))},
            ("fiomon_streams", "Streams tracked for dedup.", ()): {(): float(len(self.tracker))},
            (
                "fiomon_cluster_latency_saturated",
                "1 if the percentile fell in fio's last bin (the value is a lower bound).",
                ("direction", "quantile"),
            ): saturated or dict(prev.gauges.get(_SAT_KEY, {})),
        }
        if engine is not None:
            late = Counter({self._host_label(h): n for h, n in engine.late_records.items()})
            counters[
                ("fiomon_late_records", "Records that reached a closed quantum.", ("host",))
            ] = {(k,): float(v) for k, v in late.items()}
            counters[("fiomon_hosts_over_cap", "Hosts beyond max_hosts (cluster only).", ())] = {
                (): float(engine.hosts_over_cap)
            }
            counters[("fiomon_forced_closes", "Quanta closed early by max_open_quanta.", ())] = {
                (): float(engine.forced_closes)
            }
            gauges[("fiomon_open_quanta", "Quanta open now.", ())] = {(): float(engine.open_quanta)}
        if self.close_delays_ms:
            gauges[
                (
                    "fiomon_quantum_close_delay_seconds",
                    "Wall-clock delay of the last close after its quantum's end.",
                    (),
                )
            ] = {(): self.close_delays_ms[-1] / 1000.0}
        firing = {(r.name, h or ""): 1 for r, h, _ in self.alerts.firing()}
        breach = {
            (name, host or ""): firing.get((name, host or ""), 0)
            for name, host in self.alerts.states
        }
        return Snapshot(
            quantum_end_s=last_end / 1000.0 if last_end is not None else prev.quantum_end_s,
            cluster=cluster,
            hosts=hosts,
            edges_s=tuple(self.buckets.edges_s.tolist()) if self.buckets else (),
            buckets=self.buckets.frozen() if self.buckets else {},
            sla_breach=breach,
            sla_breaches=dict(self.alerts.breaches),
            counters=counters,
            gauges=gauges,
        )

    def refresh_snapshot(self) -> None:
        """Rebuild the snapshot's counters between closes (scrapes see fresh counts)."""
        self.snapshot = self._build_snapshot(None)


_SAT_KEY = (
    "fiomon_cluster_latency_saturated",
    "1 if the percentile fell in fio's last bin (the value is a lower bound).",
    ("direction", "quantile"),
)


def _quantile_label(q: float) -> str:
    """``99`` -> ``0.99``, ``99.9`` -> ``0.999`` (Prometheus' quantile convention)."""
    return f"{q / 100:.6f}".rstrip("0").rstrip(".")


# -- I/O: MQTT, HTTP, sinks -------------------------------------------------------------------


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
    collector = FiomonCollector(lambda: core.snapshot)
    from fiomon.exporter import serve_metrics  # noqa: PLC0415 -- keeps the import light

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
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_mqtt_loop(cfg, core, topics, outbox, stop), name="fiomon.mqtt")
            tg.create_task(_close_loop(cfg, core, sinks, outbox, stop), name="fiomon.close")
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
