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
quanta file confirms every quantum its rows touch, or, without a quanta file, once the
root's closed-through mark (``<state_dir>/root-state.json``, written after each close) is
past them, so a restart never closes a quantum twice. Without one, partials of open
quanta die with the process.

Stopping (SIGTERM, SIGINT) goes in a written order (:func:`_shutdown`) under one
``GRACE_S``: intake stops, the open quanta close (``final``) or stay in the journal,
what was closed is written and the state directory unlocked, then the connection
closes. A second signal cuts the waiting short.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import aiomqtt

from fiomon import __version__
from fiomon.aggregator.alerts import AlertBook, rules_not_computed
from fiomon.aggregator.exporter import BucketHistogram, Snapshot
from fiomon.aggregator.journal import Journal, StateLock, write_atomic
from fiomon.aggregator.metrics import Counts, Health, QuantumGauges, build_snapshot, with_root
from fiomon.aggregator.metrics_server import MetricsProcess
from fiomon.aggregator.quantafile import QuantaFile, QuantaWriter
from fiomon.aggregator.root import RootMerger
from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.config import AggregatorConfig, RootConfig, load_aggregator_config, root_ignored_keys
from fiomon.errors import ConfigError
from fiomon.mqtt import SUBSCRIBE_TIMEOUT_S, Backoff, IncomingQueue, Topics, drop_stale, make_client
from fiomon.runtime import GRACE_S, cancel_and_wait, stop_on_signals

log = logging.getLogger("fiomon.root")

STATE_FILE = "root-state.json"  # the closed-through mark (used without a quanta file)


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
        self.lock: StateLock | None = None
        self.state_path: Path | None = None
        if cfg.state_dir is not None:
            try:
                self.lock = StateLock(cfg.state_dir)
            except BlockingIOError:
                msg = f"another process uses the state directory {cfg.state_dir}"
                raise RuntimeError(msg) from None
            self.state_path = cfg.state_dir / STATE_FILE
        # What was closed before: the quanta file's last quantum (the record of
        # publication), else the mark in the state directory.
        tail = self.quanta.tail() if self.quanta is not None else None
        closed = tail.end_ms if tail is not None else self._load_mark()
        self._saved_ms = closed
        self.merger = RootMerger(
            quantum_ms=cfg.quantum_ms,
            lateness_ms=cfg.lateness_ms,
            percentiles=cfg.percentiles,
            confidence_level=cfg.confidence_level,
            per_host=cfg.per_host,
            cells=self.rc.cells,
            cell_timeout_ms=self.rc.cell_timeout_ms,
            now_ms=now_ms(),
            closed_ms=closed,
        )
        self.alerts = AlertBook(cfg.sla, cfg.max_hosts)
        self.gauges = QuantumGauges(cfg.percentiles, fit_tail=False)
        # At 0 from the start with fio's standard bins (as the aggregator's): rate() sees a
        # series' growth only from its first scrape, so the first quantum must not create it.
        self.buckets = self._new_buckets(BinLayout())
        self.gauges.buckets = self.buckets
        self.journal: Journal | None = None
        if cfg.state_dir is not None:
            self.journal = Journal(cfg.state_dir / "journal", problems=self.problem)
            self._replay()
        self.broker_connected = False
        self.snapshot = self._build()

    def _new_buckets(self, layout: BinLayout) -> BucketHistogram:
        """The exported bucket histogram for this configuration, every direction at 0."""
        return BucketHistogram.for_rules(
            layout, [r.threshold_ns for r in self.cfg.sla], self.cfg.export.buckets_per_octave
        )

    def _load_mark(self) -> int | None:
        """The closed-through mark a previous run saved (None: none, or not usable)."""
        if self.state_path is None:
            return None
        try:
            d = json.loads(self.state_path.read_bytes())
            quantum, closed = int(d["quantum_ms"]), d["closed_ms"]
            closed = None if closed is None else int(closed)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            self.problem("state-unreadable", f"{self.state_path}: {exc}")
            return None
        if quantum != self.cfg.quantum_ms:
            log.warning(
                "quantum changed since the last run (%d ms, now %d ms): %s is ignored",
                quantum,
                self.cfg.quantum_ms,
                self.state_path,
            )
            return None
        return closed

    def _save_mark(self) -> None:
        """Save the closed-through mark (on the grid), once it moved past a quantum end."""
        m = self.merger
        if self.state_path is None or m.closed_ms is None or m.phase_ms is None:
            return
        q = m.quantum_ms
        mark = m.closed_ms - (m.closed_ms - m.phase_ms) % q  # the last quantum end <= closed_ms
        if self._saved_ms is not None and mark <= self._saved_ms:
            return
        doc = {"version": 1, "quantum_ms": q, "closed_ms": mark}
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.state_path, json.dumps(doc).encode())
        except OSError as exc:
            self.problem("state-write", f"cannot write {self.state_path}: {exc}")
            return
        self._saved_ms = mark

    def _replay(self) -> None:
        """Re-form the open quanta from the journal (rows of closed quanta are skipped)."""
        assert self.journal is not None  # noqa: S101 -- only called with a journal
        n = 0
        for segment, _, payload in self.journal.replay():
            end = self.merger.receive(payload, self.now_ms(), replay=True)
            self.journal.note(segment, end if end is not None else -(2**62))
            n += 1
        if n:
            merged = self.merger.counts.rows["merged"]
            self.merger.counts.rows.clear()  # replays are neither late nor duplicates
            log.info(
                "re-formed %d partial rows of open quanta from %d journaled messages", merged, n
            )
        self._release()

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
        self._closed(rows, now)
        self.snapshot = self._build()
        return rows

    def flush(self) -> list[ClosedQuantum]:
        """Close everything open (a final stop); written, alerted and exported as a tick."""
        now = self.now_ms()
        rows = self.merger.flush()
        self._closed(rows, now)
        self.snapshot = self._build()
        return rows

    def _closed(self, rows: list[ClosedQuantum], now: int) -> None:
        if rows:
            self.counts.quanta_closed = self.merger.counts.quanta_closed
            if self.writer is not None:
                self.writer.submit(rows, self.merger.closed_ms or 0, None)
            lay = self.merger.layout
            if lay is not None and lay != self.buckets.layout:
                self.buckets = self._new_buckets(lay)
                self.gauges.buckets = self.buckets
            self.gauges.observe(rows, now)
            for t in self.alerts.observe(rows):
                log.info("sla %s", t.log_text())
        self._save_mark()
        self._release()

    def _release(self) -> None:
        """Let the journal drop what is done with.

        With a quanta file: what it confirmed; without one: what the saved mark passed.
        """
        if self.journal is None:
            return
        done = self.writer.confirmed_ms if self.writer is not None else self._saved_ms
        if done is not None:
            self.journal.release(done)

    def reload(self, path: Path | None, *, log_level_fixed: bool) -> None:
        """SIGHUP: re-read ``path`` and take its SLA rules and log level (nothing else)."""
        if path is None:
            log.warning("SIGHUP: no configuration file to re-read; nothing reloaded")
            return
        try:
            new = load_aggregator_config(path)
        except ConfigError as exc:
            for p in exc.problems:
                log.error("SIGHUP: %s", p)
            log.error("SIGHUP: %s not reloaded; the running configuration stays", path)
            return
        done = []
        if new.sla != self.cfg.sla:
            cfg = self.cfg
            refused = rules_not_computed(new.sla, cfg.percentiles, cfg.confidence_level)
            if refused is not None:
                log.error("SIGHUP: %s", refused)
            else:
                done.append(self.alerts.replace_rules(new.sla))
                self.cfg = dataclasses.replace(cfg, sla=new.sla)
        if new.log_level and not log_level_fixed:
            logging.getLogger().setLevel(new.log_level.upper())
        elif new.log_level:
            done.append("log_level kept (set by --log-level)")
        self.snapshot = self._build()
        log.info(
            "SIGHUP: reloaded %s (the root takes only its SLA rules and log level): %s",
            path,
            "; ".join(done) if done else "no changes",
        )

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
        expected = self.merger.expected
        return with_root(
            snap,
            cells_up=len([c for c in live if c in expected] if expected else live),
            cells_expected=len(expected),
            cell_up={c: c in live for c in self.merger.cells},
            rows=m.rows,
            invalid=m.invalid,
            closed_by_lateness=m.closed_by_lateness,
            messages=m.messages,
        )

    def close(self, timeout_s: float = GRACE_S) -> None:
        """Write what was closed, save the mark, close the journal, unlock the directory.

        Open quanta are not closed here: with a ``state_dir`` their partials stay in the
        journal for the next start; without one they are lost (``flush`` closes them).
        """
        if self.writer is not None and not self.writer.close(timeout_s):
            self.problem("quanta-file-write", f"the disk did not finish in {timeout_s:g} s")
        self._save_mark()
        self._release()
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
    config_path: Path | None = None,
    log_level_fixed: bool = False,
) -> None:
    """Run the root until SIGTERM/SIGINT (or ``stop``).

    Args:
        cfg: the configuration.
        stop: set it to stop (tests); signals set it too.
        ready: called with the service once it is serving.
        final: close every open quantum when stopping (the end of a run).
        config_path: the file SIGHUP re-reads (SLA rules and log level only; None:
            SIGHUP is logged and ignored).
        log_level_fixed: the command line fixed the log level (the file's is ignored).
    """
    stop = stop or asyncio.Event()
    svc = RootService(cfg)
    if cfg.log_level and not log_level_fixed:
        logging.getLogger().setLevel(cfg.log_level.upper())
    addr, port = cfg.listen_addr

    def restarted() -> None:
        svc.counts.metrics_server_restarts += 1

    try:
        metrics = MetricsProcess(
            addr,
            port,
            lambda: svc.snapshot,
            certfile=cfg.tls_cert,
            keyfile=cfg.tls_key,
            on_restart=restarted,
        )
        metrics.start()
    except BaseException:
        svc.close()
        raise
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
    ignored = root_ignored_keys(cfg)
    if ignored:
        log.warning(
            "the root ignores %s in its configuration (it sends no alerts itself: alert "
            "from Prometheus on fiomon_sla_breach)",
            ", ".join(ignored),
        )
    steps = _Steps()
    main = asyncio.current_task()

    def cut_short(signame: str) -> None:
        log.warning("%s again: not waiting any longer", signame)
        steps.forced = True
        if main is not None:
            main.cancel()

    def reload() -> None:
        svc.reload(config_path, log_level_fixed=log_level_fixed)
        metrics.poke()

    closed = False
    try:
        with stop_on_signals(
            stop,
            again=cut_short,
            reload=reload,
            logger=log,
            stopping="stopping (open quanta close now: --final)"
            if final
            else "stopping (open quanta stay in the journal)"
            if cfg.state_dir is not None
            else "stopping (open quanta are dropped: no state_dir)",
        ):
            if ready is not None:
                ready(svc)  # the signal handlers are in place
            async with asyncio.TaskGroup() as tg:
                mqtt = tg.create_task(_mqtt_loop(svc, stop, steps), name="fiomon.root.mqtt")
                closer = tg.create_task(_close_loop(svc, stop, metrics), name="fiomon.root.close")
                await stop.wait()
                closed = True  # _shutdown closes the service, whatever happens in it
                await _shutdown(svc, steps, final=final, mqtt=mqtt, closer=closer)
    finally:
        if not closed:  # a task failed, or the stop was cut short before the sequence
            svc.close(0.5 if steps.forced else GRACE_S)
        metrics.close()
        m = svc.merger.counts
        log.info(
            "stopped: %d quanta closed (%d by lateness), rows %s, %d refused messages",
            m.quanta_closed,
            m.closed_by_lateness,
            dict(m.rows),
            sum(m.invalid.values()),
        )


@dataclasses.dataclass(slots=True)
class _Steps:
    """The stop sequence's hand-offs between the root's tasks (:func:`_shutdown`)."""

    intake_stopped: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    disconnect: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    forced: bool = False  # a second signal: wait for nothing more


async def _shutdown(
    svc: RootService,
    steps: _Steps,
    *,
    final: bool,
    mqtt: asyncio.Task[None],
    closer: asyncio.Task[None],
) -> None:
    """The root's stop, in this order, all within ``GRACE_S`` (``stop`` is set).

    1. Intake stops: the MQTT task stops reading but stays connected; what it has not
       taken stays unacknowledged, the broker's to redeliver at the next start (every
       message taken was journaled and acknowledged).
    2. The close loop ends; with ``final`` every open quantum closes (written, evaluated
       and exported like any other); without, open quanta stay in the journal (with a
       ``state_dir``) for the next start.
    3. Flush: the quanta file is written, the closed-through mark saved, the journal
       closed and the state directory unlocked (:meth:`RootService.close`, in a thread:
       it waits for the disk, for what is left of the grace time).
    4. Disconnect, for what is left of the grace time (then the MQTT task is cancelled).

    ``run_root`` then ends the ``/metrics`` process.
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + GRACE_S

    def left() -> float:
        return max(0.0, end - loop.time())

    try:
        intake = asyncio.ensure_future(steps.intake_stopped.wait())  # step 1
        try:
            done, _ = await asyncio.wait(
                {intake, mqtt}, timeout=left(), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            intake.cancel()
        if not done:  # still connecting or subscribing: nothing was taken there
            log.warning("the MQTT task did not stop within the grace time: cancelled")
            await cancel_and_wait(mqtt)
        await closer  # step 2
        if final and not steps.forced:
            rows = svc.flush()
            log.info("final stop: closed %d open rows", len(rows))
    finally:
        # Step 3, even when cut short: what was closed is written and the directory unlocked.
        timeout = 0.5 if steps.forced else max(0.5, left())
        await asyncio.shield(asyncio.to_thread(svc.close, timeout))
    steps.disconnect.set()  # step 4
    await asyncio.wait({mqtt}, timeout=left())
    if not mqtt.done():
        log.warning("the broker did not take the disconnect within the grace time")
        await cancel_and_wait(mqtt)


async def _close_loop(svc: RootService, stop: asyncio.Event, metrics: MetricsProcess) -> None:
    period = min(0.25, svc.cfg.quantum_ms / 4000)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)
        svc.tick()
        metrics.poke()


async def _mqtt_loop(svc: RootService, stop: asyncio.Event, steps: _Steps) -> None:
    """Receive until ``stop``; reconnect on errors.

    At ``stop`` it takes no more messages (``steps.intake_stopped``) but keeps a
    connection that is up until ``steps.disconnect`` (:func:`_shutdown`).
    """
    try:
        await _receive(svc, stop, steps)
    finally:
        steps.intake_stopped.set()


async def _receive(svc: RootService, stop: asyncio.Event, steps: _Steps) -> None:
    cfg = svc.cfg
    topic = Topics(cfg.topic_prefix).all_partials
    client = make_client(
        cfg.broker,
        identifier=cfg.client_id,
        persistent_session_s=max(1, cfg.session_expiry_ms // 1000),
        receive_maximum=cfg.max_inflight,
        queue_type=cast("type[asyncio.Queue[aiomqtt.Message]]", IncomingQueue),
    )
    queue = IncomingQueue.made[-1]
    # Acknowledge only after journaling (aiomqtt has no manual-ack API: paho's switch).
    paho = client._client
    paho.manual_ack_set(True)
    backoff = Backoff(base_s=0.25, cap_s=5.0)
    while not stop.is_set():
        # What the last connection left unread must not be acknowledged on this one.
        drop_stale(queue, log)
        try:
            async with client:
                await client.subscribe(topic, qos=1, timeout=SUBSCRIBE_TIMEOUT_S)
                svc.broker_connected = True
                backoff.reset()
                log.info("subscribed to %s on %s:%d", topic, cfg.broker.host, cfg.broker.port)
                reader = asyncio.create_task(_read(svc, client), name="fiomon.root.read")
                stopper = asyncio.ensure_future(stop.wait())
                try:
                    # The reader ends only with the connection (or a bug): then reconnect.
                    await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopper.cancel()
                    await cancel_and_wait(reader)
                if stop.is_set():
                    steps.intake_stopped.set()
                    await steps.disconnect.wait()
                else:
                    exc = reader.exception() if not reader.cancelled() else None
                    if isinstance(exc, aiomqtt.MqttError):
                        raise exc
                    log.error("the root's reader ended (%r): reconnecting", exc)
        except aiomqtt.MqttError as exc:
            log.warning("broker %s:%d: %s", cfg.broker.host, cfg.broker.port, exc)
        svc.broker_connected = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff.next())


async def _read(svc: RootService, client: aiomqtt.Client) -> None:
    paho = client._client
    async for m in client.messages:
        topic = str(m.topic)
        try:
            svc.on_message(topic.rsplit("/", 1)[-1], bytes(m.payload))
        except Exception:  # a bug must not stop intake: say so, count it, go on
            svc.merger.counts.invalid["internal"] += 1
            log.exception("cannot handle a partials message on %s", topic)
        if m.qos > 0:
            paho.ack(m.mid, m.qos)
