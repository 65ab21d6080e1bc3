"""The one service shell, ``Server(merger, ...).run()``: ``fiomon aggregator`` and ``fiomon root``.

uvicorn's habit (one ``Server``, protocol variants): the shell owns everything a service
does around its merge, the merger (:class:`Merger`) only what it merges.

The shell:

* serves ``/metrics`` from a child process (:class:`~fiomon.server.metrics_server.MetricsProcess`:
  each new snapshot is pickled to it; rendering and HTTP stay off this interpreter's lock);
* turns SIGTERM/SIGINT into a stop and SIGHUP into a reload (:func:`fiomon.runtime.stop_on_signals`;
  a second stop signal cuts the waiting short);
* runs, on one event loop, the MQTT intake (:class:`~fiomon.server.intake.Intake`:
  journal before acknowledge), the close loop (the merger's tick a few times per
  quantum), the reload loop (one loader, :mod:`fiomon.server.reload`), ``STATUS=`` and
  watchdog keep-alives, and whatever tasks the merger adds (:meth:`Merger.start`);
* stops in one written order under one ``GRACE_S`` (:meth:`Server._shutdown`).

The merger's state directory, journal and publication are its own objects; the shell
calls :meth:`Merger.close` to write what was closed and unlock the directory.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiomqtt

from fiomon.closed import ClosedQuantum
from fiomon.config import AggregatorConfig, Overrides
from fiomon.runtime import (
    GRACE_S,
    cancel_and_wait,
    keep_alive,
    sd_notify,
    stop_on_signals,
    wait_event,
)
from fiomon.server.exporter import Snapshot
from fiomon.server.intake import Intake
from fiomon.server.link import Link
from fiomon.server.metrics import Counts
from fiomon.server.metrics_server import MetricsProcess
from fiomon.server.reload import apply_log_level, reread

STALL_TOLERANCE_MS = 1000  # ticks further apart than the period plus this: a stall


class Merger(Protocol):
    """What a merger gives the shell; :class:`Hooks` has the optional part as no-ops.

    The merger is driven from one event loop: nothing here may block on the network.
    ``close`` may wait for the disk (the shell runs it in a thread).
    """

    name: str  # "aggregator" or "root": the log's and the tasks' names
    log: logging.Logger
    link: Link  # the shell's read-out of the broker connection (the merger only reads it)

    @property
    def cfg(self) -> AggregatorConfig:
        """The running configuration (a reload replaces it)."""
        ...

    @property
    def snapshot(self) -> Snapshot:
        """The newest metrics snapshot, for ``/metrics``."""
        ...

    @property
    def counts(self) -> Counts:
        """The service's counters (the shell counts ``/metrics`` child restarts there)."""
        ...

    def now_ms(self) -> int:
        """The wall clock, epoch ms."""
        ...

    def subscriptions(self) -> list[str]:
        """The topic filters to subscribe to (QoS 1) on every connection."""
        ...

    def handle(self, batch: Sequence[aiomqtt.Message]) -> None:
        """Take a batch of messages: journaled before this returns (then acknowledged)."""
        ...

    def tick(self) -> list[ClosedQuantum]:
        """Merge and close what may close, publishing it; returns the rows closed.

        A new :attr:`snapshot` (a new object) is what ``/metrics`` is told about.
        """
        ...

    def flush(self) -> list[ClosedQuantum]:
        """Close everything open (a final stop), published as a tick; returns the rows."""
        ...

    def reload(self, new: AggregatorConfig) -> list[str]:
        """Take what can change while running from ``new``; returns what changed (log)."""
        ...

    def close(self, timeout_s: float) -> None:
        """Write what was closed, close the journal, unlock the state directory.

        Open quanta stay in the journal (a graceful stop leaves what ``kill -9`` leaves).
        """
        ...

    # The optional part (Hooks): no-ops unless a merger needs them.

    def start(self, tg: asyncio.TaskGroup, server: Server) -> None:
        """Start the merger's own tasks (alert sinks, a cell's partials)."""
        ...

    def connected(self, now_ms: int) -> None:
        """The session is up and subscribed (reading starts now)."""
        ...

    def disconnected(self, now_ms: int) -> None:
        """The session ended."""
        ...

    def session(self, client: aiomqtt.Client) -> list[Coroutine[Any, Any, None]]:
        """Tasks for the life of one connection (cancelled when it ends)."""
        ...

    async def after_batch(self, client: aiomqtt.Client) -> bool:
        """After a batch was acknowledged; True: stop reading for good."""
        ...

    async def not_reading(self, stop: asyncio.Event) -> None:
        """Until ``stop``, once reading stopped for good (say why, now and then)."""
        ...

    def stalled(self, ms: int) -> None:
        """The process could not run for ``ms`` (measured between ticks)."""
        ...

    def after_tick(self) -> None:
        """After each tick and the final flush (hand alerts to their sinks)."""
        ...

    async def before_close(self, left: Callable[[], float]) -> None:
        """Stop step 2: after the close loop (a cell's partials drain)."""
        ...

    async def after_close(self, left: Callable[[], float], intake: asyncio.Task[None]) -> None:
        """Stop step 4: after the state is written, while the connection is up."""
        ...

    def release(self) -> None:
        """After every task ended (close what the merger's tasks held)."""
        ...

    def banner(self) -> str:
        """The start-up log line."""
        ...

    def status(self) -> str:
        """Systemd's ``STATUS=`` line."""
        ...

    def stopping(self, *, final: bool) -> str:
        """What the first stop signal logs."""
        ...

    def summary(self) -> str:
        """The counters an operator checks after a stop, as one line."""
        ...


class Hooks:
    """The optional part of :class:`Merger`, as no-ops (mergers inherit what they skip)."""

    def start(self, tg: asyncio.TaskGroup, server: Server) -> None:
        """No tasks of its own."""

    def connected(self, now_ms: int) -> None:
        """Nothing to do."""

    def disconnected(self, now_ms: int) -> None:
        """Nothing to do."""

    def session(self, client: aiomqtt.Client) -> list[Coroutine[Any, Any, None]]:
        """No tasks per connection."""
        return []

    async def after_batch(self, client: aiomqtt.Client) -> bool:
        """Never stops reading."""
        return False

    async def not_reading(self, stop: asyncio.Event) -> None:
        """Nothing to say."""

    def stalled(self, ms: int) -> None:
        """A stall changes nothing."""

    def after_tick(self) -> None:
        """Nothing to hand over."""

    async def before_close(self, left: Callable[[], float]) -> None:
        """Nothing to wait for."""

    async def after_close(self, left: Callable[[], float], intake: asyncio.Task[None]) -> None:
        """Nothing to send."""

    def release(self) -> None:
        """Nothing held."""


class Server:
    """One running service around a merger.

    Args:
        merger: the aggregator's or the root's merger, restored.
        stop: set it to stop (tests); signals set it too.
        final: close every open quantum when stopping (the end of a run); otherwise open
            quanta stay in the journal for the next start.
        config_path: the file SIGHUP re-reads (None: SIGHUP is logged and ignored).
        overrides: the command line's settings over the file (the merger's ``cfg`` has
            them already): a reload applies them again, so they never read as a change.
    """

    def __init__(
        self,
        merger: Merger,
        *,
        stop: asyncio.Event | None = None,
        final: bool = False,
        config_path: Path | None = None,
        overrides: Overrides | None = None,
    ) -> None:
        self.merger = merger
        self.log = merger.log
        self.stop = stop or asyncio.Event()
        self.final = final
        self.config_path = config_path
        self.overrides = overrides
        self.forced = False  # a second stop signal: wait for nothing more
        self.reloading = asyncio.Event()
        self.closed = asyncio.Event()  # the close loop is done (a final close included)
        # The stop sequence's hand-offs (_shutdown): the intake takes no more messages;
        # the intake may close the connection.
        self.intake_stopped = asyncio.Event()
        self.disconnect = asyncio.Event()
        self.metrics: MetricsProcess | None = None  # set once serving
        self.intake = Intake(merger, self)

    async def run(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM/SIGINT (or ``stop``), then stop in order.

        Args:
            ready: called once serving, with the signal handlers in place.

        Raises:
            OSError: ``/metrics`` cannot listen (the merger is closed first).
        """
        merger, log = self.merger, self.log
        cfg = merger.cfg
        apply_log_level(cfg)
        addr, port = cfg.listen_addr

        def restarted() -> None:
            merger.counts.metrics_server_restarts += 1

        try:
            metrics = MetricsProcess(
                addr,
                port,
                lambda: merger.snapshot,
                certfile=cfg.tls_cert,
                keyfile=cfg.tls_key,
                on_restart=restarted,
                not_ready=self.not_ready,
            )
            metrics.start()
        except BaseException:
            merger.close(GRACE_S)
            merger.release()
            raise
        self.metrics = metrics
        log.info("%s", merger.banner())
        main = asyncio.current_task()

        def cut_short(signame: str) -> None:
            log.warning("%s again: not waiting any longer", signame)
            self.forced = True
            if main is not None:
                main.cancel()

        closed = False
        try:
            with stop_on_signals(
                self.stop,
                again=cut_short,
                reload=self.reloading.set,
                logger=log,
                stopping=merger.stopping(final=self.final),
            ):
                if ready is not None:
                    ready()
                name = f"fiomon.{merger.name}"
                async with asyncio.TaskGroup() as tg:
                    intake = tg.create_task(self.intake.run(), name=f"{name}.mqtt")
                    closer = tg.create_task(self._close_loop(), name=f"{name}.close")
                    tg.create_task(self._reload_loop(), name=f"{name}.reload")
                    # READY=1 comes from the intake once the first session is subscribed;
                    # until then STATUS= says what it waits for (systemctl status shows it).
                    tg.create_task(keep_alive(self.stop, merger.status), name=f"{name}.systemd")
                    merger.start(tg, self)
                    await self.stop.wait()
                    closed = True  # _shutdown closes the merger, whatever happens in it
                    await self._shutdown(intake, closer)
        finally:
            if not closed:  # a task failed, or the stop was cut short before the sequence
                merger.close(0.5 if self.forced else GRACE_S)
            merger.release()
            metrics.close()
            log.info("stopped: %s", merger.summary())

    def not_ready(self) -> str | None:
        """Why ``/-/ready`` says 503 now (None: ready); read from the ``/metrics`` thread."""
        link = self.merger.link
        if self.stop.is_set():
            return "stopping"
        if link.taken_over:
            return "another instance took this MQTT session (see the log)"
        if not link.ready:
            return "starting: state restored, not yet subscribed on the broker"
        if not link.connected:
            return "not connected to the MQTT broker (reconnecting)"
        return None

    async def _shutdown(self, intake: asyncio.Task[None], closer: asyncio.Task[None]) -> None:
        """The stop, in this order, all within ``GRACE_S`` (``stop`` is set).

        1. Intake stops: the MQTT task takes no more messages but stays connected; what
           it has not taken stays unacknowledged, the broker's to redeliver at the next
           start (every message taken was journaled and acknowledged). Still connecting
           or subscribing after the grace time: cancelled (nothing was taken there).
        2. The close loop ends; with ``final`` every open quantum closes (written,
           evaluated and exported like any other). The merger's own step follows (a
           cell's partials: the final close reaches the root's broker, or what is left
           waits in the outbox for the next start).
        3. Flush: what was closed is written, the journal closed and the state directory
           unlocked (:meth:`Merger.close`, in a thread: it waits for the disk).
        4. The merger's last words while the connection is up (the aggregator: the final
           alert state to Alertmanager and the broker).
        5. Disconnect, for what is left of the grace time (then the intake is cancelled).
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + GRACE_S

        def left() -> float:
            return max(0.0, end - loop.time())

        log = self.log
        try:
            stopped = asyncio.ensure_future(self.intake_stopped.wait())  # step 1
            try:
                done, _ = await asyncio.wait(
                    {stopped, intake}, timeout=left(), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                stopped.cancel()
            if not done:
                log.warning("the MQTT task did not stop within the grace time: cancelled")
                await cancel_and_wait(intake)
            await closer  # step 2
            await self.merger.before_close(left)
        finally:
            # Step 3, even when cut short: what was closed is written and the directory
            # unlocked.
            timeout = 0.5 if self.forced else max(0.5, left())
            await asyncio.shield(asyncio.to_thread(functools.partial(self.merger.close, timeout)))
        await self.merger.after_close(left, intake)  # step 4
        self.disconnect.set()  # step 5
        await asyncio.wait({intake}, timeout=left())
        if not intake.done():
            log.warning("the broker did not take the disconnect within the grace time")
            await cancel_and_wait(intake)

    async def _close_loop(self) -> None:
        """Tick the merger until stop; on a final stop, close what is open.

        Ticks come every ``period``; a gap much longer than that means the process could
        not run (a long step, CPU starvation, SIGSTOP or a VM pause) and so could not read
        its input either: the merger is told, so the pause is not taken for silence.
        """
        merger = self.merger
        period = min(0.25, merger.cfg.quantum_ms / 4000)
        last: int | None = None
        while not self.stop.is_set():
            await wait_event(self.stop, period)
            if self.stop.is_set():
                break
            now = merger.now_ms()
            if last is not None:
                merger.stalled(now - last - int(period * 1000) - STALL_TOLERANCE_MS)
            last = now
            snap = merger.snapshot
            merger.tick()
            merger.after_tick()
            if merger.snapshot is not snap and self.metrics is not None:
                self.metrics.poke()
        if self.final and not self.forced:
            rows = merger.flush()
            self.log.info("final stop: closed %d open rows", len(rows))
            merger.after_tick()
        elif not self.forced:
            # One last tick: what became closable since the last one is written now (a
            # root without a state directory would otherwise lose it with the process).
            merger.tick()
            merger.after_tick()
        self.closed.set()

    async def _reload_loop(self) -> None:
        """Apply SIGHUP: the file plus the overrides, what can change, logged."""
        while not self.stop.is_set():
            await wait_event(self.reloading, 1.0)
            if not self.reloading.is_set():
                continue
            self.reloading.clear()
            sd_notify("RELOADING=1")
            try:
                self._reload()
            except Exception:  # a reload's bug must not stop the service: keep the old config
                self.log.exception("reload failed; the running configuration stays")
            sd_notify("READY=1")

    def _reload(self) -> None:
        new = reread(self.config_path, self.overrides, self.log)
        if new is None:
            return
        done = self.merger.reload(new)
        apply_log_level(new)
        if self.metrics is not None:
            self.metrics.poke()
        self.log.info(
            "SIGHUP: reloaded %s: %s", self.config_path, "; ".join(done) if done else "no changes"
        )
