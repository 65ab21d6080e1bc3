"""``fiomon root``: the exact root as a service (cells' partials over MQTT in, quanta out).

Reads an aggregator configuration (its ``broker``, ``topic_prefix``, ``client_id``,
``quantum``, ``lateness``, ``percentiles``, ``confidence_level``, ``per_host``,
``listen``, ``quanta_file``, ``sla``, ``max_message_size``) plus its ``root`` section
(expected ``cells``, ``cell_timeout``), subscribes to ``<prefix>/v1/_partials/+`` with a
persistent session, merges with :class:`~fiomon.aggregator.root.RootMerger`, writes the
closed quanta with the aggregators' quanta file writer, evaluates the SLA rules (cluster
scope: the whole cluster) and serves ``/metrics`` like an aggregator (the same latency
families, plus ``fiomon_root_*``: cells up, rows merged/duplicate/late, refused
messages).

With a ``state_dir``, every message is journaled before it is acknowledged to the broker
(manual PUBACK, as the aggregator does), and a restart replays the journal, so the quanta
open when the root stopped (or was ``kill -9``-ed) are re-formed; a segment goes once the
quanta file confirms every quantum its rows touch. Without one, partials of open quanta
die with the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import platform
import signal
import time
from collections.abc import Callable

import aiomqtt

from fiomon import __version__
from fiomon.aggregator.alerts import AlertBook
from fiomon.aggregator.exporter import BucketHistogram, Snapshot, bucket_edges_s
from fiomon.aggregator.journal import Journal, StateLock
from fiomon.aggregator.metrics import Counts, Health, QuantumGauges, build_snapshot
from fiomon.aggregator.metrics_server import MetricsProcess
from fiomon.aggregator.quantafile import QuantaFile, QuantaWriter
from fiomon.aggregator.root import RootMerger
from fiomon.config import AggregatorConfig, RootConfig
from fiomon.mqtt import Backoff, make_client
from fiomon.runtime import cancel_and_wait
from fiomon.windows import ClosedQuantum

log = logging.getLogger("fiomon.root")

GRACE_S = 10.0


def _now() -> int:
    return time.time_ns() // 1_000_000


class RootService:
    """The root's state between its tasks (one event loop).

    Args:
        cfg: the configuration.
        now_ms: the wall clock (epoch ms).
    """

    def __init__(self, cfg: AggregatorConfig, now_ms: Callable[[], int] = _now) -> None:
        self.cfg = cfg
        self.rc = cfg.root or RootConfig()
        self.now_ms = now_ms
        self.counts = Counts()
        self.quanta: QuantaFile | None = None
        self.writer: QuantaWriter | None = None
        if cfg.quanta_file is not None:
            self.quanta = QuantaFile(
                cfg.quanta_file, cfg.quanta_file_max_bytes, cfg.quanta_file_keep, self.problem
            )
            self.writer = QuantaWriter(self.quanta, None, self.problem)
        tail = self.quanta.tail() if self.quanta is not None else None
        self.merger = RootMerger(
            quantum_ms=cfg.quantum_ms,
            lateness_ms=cfg.lateness_ms,
            percentiles=cfg.percentiles,
            confidence_level=cfg.confidence_level,
            per_host=cfg.per_host,
            cells=self.rc.cells,
            cell_timeout_ms=self.rc.cell_timeout_ms,
            now_ms=now_ms(),
            closed_ms=tail.end_ms if tail is not None else None,
        )
        self.lock: StateLock | None = None
        self.journal: Journal | None = None
        if cfg.state_dir is not None:
            try:
                self.lock = StateLock(cfg.state_dir)
            except BlockingIOError:
                msg = f"another process uses the state directory {cfg.state_dir}"
                raise RuntimeError(msg) from None
            self.journal = Journal(cfg.state_dir / "journal", problems=self.problem)
            self._replay()
        self.alerts = AlertBook(cfg.sla, cfg.max_hosts)
        self.gauges = QuantumGauges(cfg.percentiles, fit_tail=False)
        self.buckets: BucketHistogram | None = None
        self.broker_connected = False
        self.snapshot = self._build()

    def _replay(self) -> None:
        """Re-form the open quanta from the journal (rows of closed quanta are skipped)."""
        assert self.journal is not None  # noqa: S101 -- only called with a journal
        n = 0
        for segment, _, payload in self.journal.replay():
            end = self.merger.receive(payload, self.now_ms())
            self.journal.note(segment, end if end is not None else -(2**62))
            n += 1
        if n:
            merged = self.merger.counts.rows["merged"]
            self.merger.counts.rows.clear()  # replays are neither late nor duplicates
            log.info(
                "re-formed %d partial rows of open quanta from %d journaled messages", merged, n
            )

    def on_message(self, cell: str, payload: bytes) -> None:
        """One message from the broker: journaled, then merged (the caller acknowledges)."""
        segment = self.journal.append([(cell, payload)]) if self.journal is not None else -1
        end = self.merger.receive(payload, self.now_ms(), max_bytes=self.cfg.max_message_bytes)
        if self.journal is not None and end is not None:
            self.journal.note(segment, end)

    def problem(self, kind: str, text: str) -> None:
        """A disk problem: logged and counted."""
        self.counts.state_errors[kind] += 1
        log.error("%s: %s", kind, text)

    def tick(self) -> list[ClosedQuantum]:
        """Close what can close; write, alert and export it."""
        now = self.now_ms()
        rows = self.merger.close(now)
        if rows:
            self.counts.quanta_closed = self.merger.counts.quanta_closed
            if self.writer is not None:
                self.writer.submit(rows, self.merger.closed_ms or 0, None)
            if self.buckets is None and self.merger.layout is not None:
                lay = self.merger.layout
                self.buckets = BucketHistogram(
                    lay, bucket_edges_s(lay, [r.threshold_ns for r in self.cfg.sla])
                )
                self.gauges.buckets = self.buckets
            self.gauges.observe(rows, now)
        if self.journal is not None and self.writer is not None:
            confirmed = self.writer.confirmed_ms
            if confirmed is not None:
                self.journal.release(confirmed)
            for t in self.alerts.observe(rows):
                log.info("sla %s", json.dumps(t.to_json(), separators=(",", ":")))
        self.snapshot = self._build()
        return rows

    def _build(self) -> Snapshot:
        now = self.now_ms()
        live = self.merger.live_cells(now)
        m = self.merger.counts
        health = Health(
            open_quanta=self.merger.open_quanta,
            broker_connected=self.broker_connected,
            active=bool(live),
            version=__version__,
            python=platform.python_version(),
        )
        snap = build_snapshot(self.counts, self.gauges, health, self.alerts)
        known = sorted(self.merger.cells)
        gauges = dict(snap.gauges)
        gauges[("fiomon_root_cells_up", "Cells heard from within root.cell_timeout.", ())] = {
            (): float(len(live))
        }
        gauges[("fiomon_root_cells_expected", "Cells listed in root.cells.", ())] = {
            (): float(len(self.merger.expected))
        }
        gauges[("fiomon_root_cell_up", "1 while the cell is heard from, else 0.", ("cell",))] = {
            (c,): float(c in live) for c in known
        }
        counters = dict(snap.counters)
        counters[
            (
                "fiomon_root_partial_rows",
                "Partial rows by outcome (merged, duplicate, late, future).",
                ("outcome",),
            )
        ] = {(k,): float(m.rows[k]) for k in ("merged", "duplicate", "late", "future")}
        counters[
            ("fiomon_root_invalid_partials", "Partials messages refused, by reason.", ("reason",))
        ] = {(k,): float(v) for k, v in m.invalid.items()}
        counters[
            (
                "fiomon_root_quanta_closed_by_lateness",
                "Quanta the root closed on its lateness, not every live cell's word.",
                (),
            )
        ] = {(): float(m.closed_by_lateness)}
        return dataclasses.replace(snap, gauges=gauges, counters=counters)

    def close(self, timeout_s: float = GRACE_S) -> None:
        """Write what was closed (open quanta are dropped: the root keeps no journal)."""
        if self.writer is not None and not self.writer.close(timeout_s):
            self.problem("quanta-file-write", f"the disk did not finish in {timeout_s:g} s")
        if self.journal is not None:
            self.journal.close()
        if self.lock is not None:
            self.lock.release()


async def run_root(
    cfg: AggregatorConfig,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[RootService], None] | None = None,
    final: bool = False,
) -> None:
    """Run the root until SIGTERM/SIGINT (or ``stop``); ``final`` closes everything open."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    svc = RootService(cfg)
    if cfg.log_level:
        logging.getLogger().setLevel(cfg.log_level.upper())
    addr, port = cfg.listen_addr
    metrics = MetricsProcess(
        addr, port, lambda: svc.snapshot, certfile=cfg.tls_cert, keyfile=cfg.tls_key
    )
    metrics.start()
    log.info(
        "fiomon root %s: /metrics on %s, broker %s:%d, cells %s, quantum %d ms, lateness %d ms",
        __version__,
        cfg.listen,
        cfg.broker.host,
        cfg.broker.port,
        ",".join(svc.rc.cells) or "(any)",
        cfg.quantum_ms,
        cfg.lateness_ms,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready(svc)
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_mqtt_loop(svc, stop), name="fiomon.root.mqtt")
            tg.create_task(_close_loop(svc, stop, metrics), name="fiomon.root.close")
    finally:
        if final:
            rows = svc.merger.flush()
            if rows and svc.writer is not None:
                svc.writer.submit(rows, svc.merger.closed_ms or 0, None)
        svc.close()
        metrics.close()
        m = svc.merger.counts
        log.info(
            "stopped: %d quanta closed (%d by lateness), rows %s, %d refused messages",
            m.quanta_closed,
            m.closed_by_lateness,
            dict(m.rows),
            sum(m.invalid.values()),
        )


async def _close_loop(svc: RootService, stop: asyncio.Event, metrics: MetricsProcess) -> None:
    period = min(0.25, svc.cfg.quantum_ms / 4000)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)
        svc.tick()
        metrics.poke()


async def _mqtt_loop(svc: RootService, stop: asyncio.Event) -> None:
    cfg = svc.cfg
    topic = f"{cfg.topic_prefix}/v1/_partials/+"
    client = make_client(
        cfg.broker,
        identifier=cfg.client_id,
        persistent_session_s=max(1, cfg.session_expiry_ms // 1000),
    )
    # Acknowledge only after journaling (aiomqtt has no manual-ack API: paho's switch).
    paho = client._client
    paho.manual_ack_set(True)
    backoff = Backoff(base_s=0.25, cap_s=5.0)
    while not stop.is_set():
        try:
            async with client:
                await client.subscribe(topic, qos=1)
                svc.broker_connected = True
                backoff.reset()
                log.info("subscribed to %s on %s:%d", topic, cfg.broker.host, cfg.broker.port)
                reader = asyncio.create_task(_read(svc, client))
                try:
                    await stop.wait()
                finally:
                    await cancel_and_wait(reader)
        except aiomqtt.MqttError as exc:
            log.warning("broker %s:%d: %s", cfg.broker.host, cfg.broker.port, exc)
        svc.broker_connected = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff.next())


async def _read(svc: RootService, client: aiomqtt.Client) -> None:
    paho = client._client
    async for m in client.messages:
        svc.on_message(str(m.topic).rsplit("/", 1)[-1], bytes(m.payload))
        if m.qos > 0:
            paho.ack(m.mid, m.qos)
