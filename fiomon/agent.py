"""The per-host agent: follow fio's output, publish records over MQTT, lose nothing.

Three tasks in one TaskGroup:

* **read**: every ``flush_interval`` the :class:`~fiomon.follow.Follower` reads what is new
  (in a worker thread; every ``poll_interval`` it also looks for new files) and appends the
  encoded messages to the on-disk :class:`~fiomon.spool.Spool`;
* **publish**: one connection loop (capped, jittered backoff) that publishes the spool
  oldest first at QoS 1, and pops a message only after its PUBACK; it also keeps the
  retained status topic (``online`` with counters, as a heartbeat; the Will says
  ``offline``);
* **checkpoint**: saves the acknowledged positions atomically.

Stopping (SIGTERM/SIGINT): reading stops, the spool is published for up to
``grace_s``, a retained ``offline`` status is published, and the positions are saved.
What is still unacknowledged is read again from the files at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import aiomqtt

from fiomon import __version__
from fiomon.config import AgentConfig
from fiomon.follow import Follower, Outgoing
from fiomon.mqtt import Backoff, Topics, make_client
from fiomon.runtime import keep_alive, sd_notify
from fiomon.spool import Spool, load_positions, save_positions

log = logging.getLogger("fiomon.agent")


@dataclass(slots=True)
class AgentCounters:
    """What the agent has done (published in every heartbeat)."""

    messages_sent: int = 0
    records_sent: int = 0
    publish_failures: int = 0
    connects: int = 0
    dropped: dict[str, int] = field(default_factory=dict)


class Agent:
    """One agent process's state; :meth:`run` until ``stop`` is set.

    Args:
        cfg: the validated configuration.
        grace_s: how long a stop may spend publishing what is spooled.
        now_ms: wall clock in epoch ms (injected for tests).
    """

    def __init__(
        self,
        cfg: AgentConfig,
        *,
        grace_s: float = 5.0,
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.grace_s = grace_s
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self.topics = Topics(cfg.topic_prefix)
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self.positions_path = cfg.state_dir / "positions.json"
        resume, problems = load_positions(self.positions_path)
        for p in problems:
            log.warning("%s", p)
        self.follower = Follower(
            cfg.watch,
            agent=cfg.host,
            max_message_bytes=cfg.max_message_bytes,
            resume=resume,
            log_hist_msec=cfg.log_hist_msec,
        )
        self.spool = Spool(cfg.state_dir / "spool", cfg.spool_bytes)
        self.acked: dict[str, int] = {}
        self.counters = AgentCounters()
        self.instance = uuid.uuid4().hex[:12]  # tells two agents claiming one id apart
        self._wake = asyncio.Event()
        self._reading_done = asyncio.Event()
        self._saved: dict[str, dict[str, object]] | None = None

    # -- tasks -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Follow, publish and checkpoint until ``stop`` is set, then shut down in order."""
        log.info(
            "fiomon agent %s for host %s: watching %s, broker %s:%d",
            __version__,
            self.cfg.host,
            ", ".join(self.cfg.watch),
            self.cfg.broker.host,
            self.cfg.broker.port,
        )
        name = f"fiomon[{self.cfg.host}]"
        try:
            async with asyncio.TaskGroup() as tg:
                reader = tg.create_task(self._read_loop(stop), name=f"{name}.read")
                publisher = tg.create_task(self._publish_loop(stop), name=f"{name}.publish")
                tg.create_task(self._checkpoint_loop(stop), name=f"{name}.save")
                tg.create_task(keep_alive(stop, self._status_line), name=f"{name}.systemd")
                sd_notify("READY=1", f"STATUS={self._status_line()}")
                await stop.wait()
                await reader
                # The publisher ends by itself once the spool is empty; a broker that is
                # down or slow gets grace_s, then what is left is read again next start.
                done, _ = await asyncio.wait({publisher}, timeout=self.grace_s)
                if not done:
                    log.warning(
                        "stopping with %d messages unpublished; they are read again from "
                        "the files at the next start",
                        len(self.spool),
                    )
                    publisher.cancel()
        finally:
            await asyncio.to_thread(self._save_positions)
            self.follower.close()
            self.spool.close()
            log.info("stopped: %s", json.dumps(self.status("offline")["counters"]))

    async def _read_loop(self, stop: asyncio.Event) -> None:
        """Read followed files every flush interval; look for new files every poll interval."""
        loop = asyncio.get_running_loop()
        flush = self.cfg.flush_interval_ms / 1000
        poll = self.cfg.poll_interval_ms / 1000
        next_read = next_look = loop.time()
        try:
            while not stop.is_set():
                now = loop.time()
                look = now >= next_look
                if look or now >= next_read:
                    messages = await asyncio.to_thread(self._poll_files, look)
                    self._enqueue(messages)
                    next_read = now + flush
                    if look:
                        next_look = now + poll
                wait = max(0.0, min(next_read, next_look) - loop.time())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
        finally:
            self._reading_done.set()
            self._wake.set()

    def _status_line(self) -> str:
        f = self.follower.stats
        return (
            f"following {f.files_followed} files; {self.counters.records_sent} records sent, "
            f"{len(self.spool)} messages spooled"
        )

    def _poll_files(self, discover: bool) -> list[Outgoing]:
        return list(self.follower.poll(discover=discover))

    def _enqueue(self, messages: list[Outgoing]) -> None:
        for m in messages:
            for old in self.spool.push(m):
                self._count_drop("spool_full", old.records)
                log.warning(
                    "spool full (%d bytes): dropped %d records of %s (seq %d..%d)",
                    self.spool.max_bytes,
                    old.records,
                    old.stream,
                    old.first_seq,
                    old.first_seq + old.records - 1,
                )
        if messages:
            self._wake.set()

    def _count_drop(self, reason: str, records: int) -> None:
        self.counters.dropped[reason] = self.counters.dropped.get(reason, 0) + records

    async def _publish_loop(self, stop: asyncio.Event) -> None:
        """Connect, publish the spool in order, reconnect with backoff, until done."""
        host = self.cfg.host
        offline = json.dumps({"state": "offline", "agent": host}).encode()
        client = make_client(
            self.cfg.broker,
            identifier=self.cfg.broker.client_id or f"fiomon-agent-{host}",
            will=aiomqtt.Will(self.topics.status(host), offline, qos=1, retain=True),
        )
        backoff = Backoff()
        while True:
            try:
                async with client:
                    self.counters.connects += 1
                    backoff.reset()
                    log.info("connected to %s:%d", self.cfg.broker.host, self.cfg.broker.port)
                    await self._send_status(client, "online")
                    await self._drain(client)
                    await self._send_status(client, "offline")
                    return
            except aiomqtt.MqttError as exc:
                self.counters.publish_failures += 1
                log.warning("broker %s:%d: %s", self.cfg.broker.host, self.cfg.broker.port, exc)
            delay = backoff.next()
            if stop.is_set():
                await asyncio.sleep(delay)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)

    async def _drain(self, client: aiomqtt.Client) -> None:
        """Publish the spool as it fills; return once it is empty and reading has stopped."""
        loop = asyncio.get_running_loop()
        heartbeat = self.cfg.heartbeat_interval_ms / 1000
        next_beat = loop.time() + heartbeat
        topic = self.topics.records(self.cfg.host)
        while True:
            msg = self.spool.peek()
            if msg is not None:
                await client.publish(topic, msg.payload, qos=1)
                self.spool.pop()
                self.acked[msg.stream] = max(
                    self.acked.get(msg.stream, 0), msg.first_seq + msg.records
                )
                self.counters.messages_sent += 1
                self.counters.records_sent += msg.records
            elif self._reading_done.is_set():
                return
            else:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.0, next_beat - loop.time()))
            if loop.time() >= next_beat:
                await self._send_status(client, "online")
                next_beat = loop.time() + heartbeat

    async def _send_status(self, client: aiomqtt.Client, state: str) -> None:
        payload = json.dumps(self.status(state)).encode()
        await client.publish(self.topics.status(self.cfg.host), payload, qos=1, retain=True)

    def status(self, state: str) -> dict[str, object]:
        """The status document: state and every counter."""
        f = self.follower.stats
        counters = asdict(self.counters)
        counters.update(
            records_read=f.records_read,
            bytes_read=f.bytes_read,
            files_followed=f.files_followed,
            streams=f.generations,
            records_skipped_replay=f.records_skipped_replay,
            bad_input=dict(f.problems),
            spooled_messages=len(self.spool),
            spooled_bytes=self.spool.bytes,
        )
        return {
            "state": state,
            "agent": self.cfg.host,
            "instance": self.instance,
            "version": __version__,
            "time_ms": self._now_ms(),
            "counters": counters,
        }

    async def _checkpoint_loop(self, stop: asyncio.Event) -> None:
        interval = max(1.0, self.cfg.flush_interval_ms / 1000)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            await asyncio.to_thread(self._save_positions)

    def _save_positions(self) -> None:
        positions = self.follower.positions(self.acked)
        doc = {p: r.to_json() for p, r in positions.items()}
        if doc == self._saved:
            return
        try:
            save_positions(self.positions_path, positions)
        except OSError as exc:
            log.error("cannot save positions to %s: %s", self.positions_path, exc)
            return
        self._saved = doc


async def run_agent(cfg: AgentConfig, *, stop: asyncio.Event | None = None) -> None:
    """Run an agent until SIGTERM/SIGINT (or ``stop``); a second SIGINT exits at once."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set() and sig == signal.SIGINT:
            raise KeyboardInterrupt
        log.info("%s: stopping", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await Agent(cfg).run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
