"""The per-host agent: follow fio's output, publish records over MQTT, lose nothing.

Three tasks in one TaskGroup:

* **read**: every ``flush_interval`` the :class:`~fiomon.agent.follow.Follower` reads what is new
  (in a worker thread; every ``poll_interval`` it also looks for new files) and appends the
  encoded messages to the on-disk :class:`~fiomon.agent.spool.Spool` (reading pauses while the
  spool is full because its disk refuses writes);
* **publish**: one :class:`~fiomon.mqtt.MqttSession` (its reconnect loop: capped, jittered
  backoff) that publishes the spool oldest first at QoS 1, and pops a message only after
  its PUBACK; it also keeps the retained status topic (``online`` with counters, as a
  heartbeat; the Will says ``offline``);
* **checkpoint**: saves the acknowledged positions atomically, at most every
  ``CHECKPOINT_S`` and only when they changed. When the state directory refuses the
  write (full, read-only, I/O error) the agent keeps running on the last positions that
  were durable, logs the episode once, counts it and flags it in the status topic.

After ``kill -9`` the next start re-sends what had not been acknowledged plus what was
acknowledged since the last checkpoint (at most ``CHECKPOINT_S`` of publishing, or
``LARGE_CHECKPOINT_S`` when the positions file is large); the aggregator drops those as
duplicates.

Stopping (SIGTERM/SIGINT): reading stops, the spool is published for up to
``grace_s``, a retained ``offline`` status is published, and the positions are saved.
What is still unacknowledged is read again from the files at the next start.

SIGHUP re-reads the configuration file (with the command line's overrides, as at start):
``watch``, the intervals, ``log_hist_msec``, the line and document caps, ``rename_grace``,
``log_level`` and ``run`` (for streams that start afterwards) take effect at once
(:data:`RELOADABLE`); any other key that changed is named in the log as waiting for the
next start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiomqtt

from fiomon import __version__
from fiomon.agent.follow import Follower
from fiomon.agent.metrics import serve_metrics
from fiomon.agent.positions import load_positions, save_positions
from fiomon.agent.spool import Outgoing, Spool
from fiomon.config import AgentConfig, Overrides, load_agent_config, watch_warnings
from fiomon.errors import ConfigError
from fiomon.mqtt import MqttSession, Topics
from fiomon.runtime import cancel_and_wait, keep_alive, sd_notify, stop_on_signals, wait_event

log = logging.getLogger("fiomon.agent")

CHECKPOINT_S = 0.25  # positions are saved this often at most (and only when they changed)
LARGE_POSITIONS = 256 * 1024  # a positions file this large (thousands of files) ...
LARGE_CHECKPOINT_S = 2.0  # ... is saved this often at most
MAX_PEER_STATUS_BYTES = 64 * 1024  # a status is ~1 kB; anything larger is not an agent's
TAKEOVER_MEMORY_S = 120.0  # a status seen this long after a takeover names the taker
# What SIGHUP changes in a running agent; every other key waits for the next start.
RELOADABLE = (
    "watch",
    "flush_interval_ms",
    "poll_interval_ms",
    "heartbeat_interval_ms",
    "log_hist_msec",
    "max_line_bytes",
    "max_document_bytes",
    "rename_grace_ms",
    "log_level",
    "run",  # for streams that start from now on; a stream keeps its label
)


@dataclass(slots=True)
class AgentCounters:
    """What the agent has done (published in every heartbeat)."""

    messages_sent: int = 0
    records_sent: int = 0
    publish_failures: int = 0
    connects: int = 0
    state_write_errors: int = 0
    read_pauses: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    session_takeovers: int = 0
    host_conflicts: int = 0


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
        state, problems = load_positions(self.positions_path)
        for p in problems:
            log.warning("%s", p)
        self.follower = Follower(
            cfg.watch,
            agent=cfg.host,
            max_message_bytes=cfg.max_message_bytes,
            state=state,
            log_hist_msec=cfg.log_hist_msec,
            max_open_files=cfg.max_open_files,
            max_line_bytes=cfg.max_line_bytes,
            max_document_bytes=cfg.max_document_bytes,
            rename_grace_s=cfg.rename_grace_ms / 1000,
            exclude=(str(cfg.state_dir),),
            run=cfg.run,
            latency=cfg.latency,
        )
        self.spool = Spool(cfg.state_dir / "spool", cfg.spool_bytes)
        self.acked: dict[str, int] = {}
        self.counters = AgentCounters()
        self.instance = uuid.uuid4().hex[:12]  # tells two agents claiming one id apart
        self.client_id = cfg.broker.client_id or f"fiomon-agent-{cfg.host}"
        self.connected = False  # to the broker, now
        self._rivals: set[str] = set()  # other instances named in the log (once each)
        self._cut_at = -TAKEOVER_MEMORY_S  # monotonic s: the broker last cut our connection
        self._wake = asyncio.Event()
        self._reading_done = asyncio.Event()
        self._saved: tuple[int, int] | None = None  # (follower changes, acks) last saved
        self._next_save = 0.0  # monotonic s: no routine save before
        self._acks = 0  # bumped with every acknowledgement
        # Streams the positions file on disk knows: a stream's first record goes out only
        # once it is listed there, so a crash right after can never give its file a new
        # stream id at the next start (which would count its records twice).
        self._durable = set(state.streams)
        self.state_error: str | None = None  # the state directory refuses writes
        # Reading and checkpointing run in worker threads; the follower is not thread-safe.
        self._follow_lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._paused = False

    # -- tasks -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Follow, publish and checkpoint until ``stop`` is set, then shut down in order."""
        log.info(
            "fiomon agent %s for host %s (instance %s, client id %s): watching %s, broker %s:%d, "
            "latency %s",
            __version__,
            self.cfg.host,
            self.instance,
            self.client_id,
            ", ".join(self.cfg.watch),
            self.cfg.broker.host,
            self.cfg.broker.port,
            self.cfg.latency,
        )
        for warning in watch_warnings(self.cfg):
            log.warning("%s", warning)
        name = f"fiomon[{self.cfg.host}]"
        server = None
        try:
            if self.cfg.metrics_listen is not None:  # opt-in; a taken port fails the start
                host, _, port = self.cfg.metrics_listen.rpartition(":")
                server = await serve_metrics(self, host.strip("[]"), int(port), stop.is_set)
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
                    await cancel_and_wait(publisher)
        finally:
            if server is not None:
                server.close()
            await asyncio.to_thread(self._save_positions)
            self.follower.close()
            self.spool.close()
            log.info("stopped: %s", json.dumps(self.status("offline")["counters"]))

    async def _read_loop(self, stop: asyncio.Event) -> None:
        """Read followed files every flush interval; look for new files every poll interval."""
        loop = asyncio.get_running_loop()
        next_read = next_look = loop.time()
        try:
            while not stop.is_set():
                flush = self.cfg.flush_interval_ms / 1000  # (SIGHUP may change them)
                poll = self.cfg.poll_interval_ms / 1000
                now = loop.time()
                look = now >= next_look
                if (look or now >= next_read) and not self._pause_for_spool():
                    messages = await asyncio.to_thread(self._poll_files, look)
                    self._enqueue(messages)
                    next_read = now + flush
                    if look:
                        next_look = now + poll
                elif self._paused:
                    next_read = now + flush
                wait = max(0.0, min(next_read, next_look) - loop.time())
                await wait_event(stop, wait)
        finally:
            self._reading_done.set()
            self._wake.set()

    def _pause_for_spool(self) -> bool:
        """Whether reading waits: the spool's disk fails and its memory fallback is full."""
        full = self.spool.full
        if full and not self._paused:
            self.counters.read_pauses += 1
            log.warning(
                "reading paused: the spool cannot write to disk (%s) and holds %d bytes in "
                "memory; it resumes as messages are published (nothing is lost: positions "
                "advance only on acknowledgement)",
                self.spool.disk_error,
                self.spool.memory_bytes,
            )
        elif not full and self._paused:
            log.info("reading resumed")
        self._paused = full
        return full

    def metrics_counts(self) -> tuple[int, int]:
        """(records sent since the start, messages spooled now), for ``/metrics``."""
        return self.counters.records_sent, len(self.spool)

    def _status_line(self) -> str:
        f = self.follower.stats
        return (
            f"following {f.files_followed} files; {self.counters.records_sent} records sent, "
            f"{len(self.spool)} messages spooled"
        )

    def _poll_files(self, discover: bool) -> list[Outgoing]:
        with self._follow_lock:
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
        offline = json.dumps({"state": "offline", **self._identity(), "will": True}).encode()
        session = MqttSession(
            self.cfg.broker,
            identifier=self.client_id,
            logger=log,
            will=aiomqtt.Will(self.topics.status(host), offline, qos=1, retain=True),
        )

        async def connected() -> bool:
            self.counters.connects += 1
            self.connected = True
            log.info(
                "connected to %s:%d%s",
                self.cfg.broker.host,
                self.cfg.broker.port,
                f" (cell {self.cfg.cell})" if self.cfg.cell else "",
            )
            subscribed = asyncio.Event()
            watch = asyncio.create_task(
                self._watch_status(session, subscribed), name=f"fiomon[{host}].peers"
            )
            try:
                # What the broker retains on our status topic is read before our own
                # status replaces it: that is where another agent shows.
                await wait_event(subscribed, 5.0)
                await self._send_status(session, "online")
                await self._drain(session)
                await self._send_status(session, "offline")
            finally:
                await cancel_and_wait(watch)
            return True  # everything published: no reconnect

        def failed(_: aiomqtt.MqttError) -> None:
            self.counters.publish_failures += 1
            if session.connected:  # the broker cut a connection it had accepted
                self._cut_at = time.monotonic()
                if session.taken_over:  # and said why (MQTT 5 brokers that do)
                    self.counters.session_takeovers += 1

        def down() -> None:
            self.connected = False

        # After stop the loop goes on (the spool gets grace_s), its waits no longer cut.
        await session.run(connected, wake=stop, failed=failed, down=down)

    # -- another agent with our host name or client id -----------------------------------

    def _identity(self) -> dict[str, object]:
        """Who this agent is, in its status and its Will (another agent names us by it)."""
        return {
            "agent": self.cfg.host,
            "instance": self.instance,
            "pid": os.getpid(),
            "machine": socket.gethostname(),
            "client_id": self.client_id,
        }

    async def _watch_status(self, session: MqttSession, subscribed: asyncio.Event) -> None:
        """Read our own status topic: another instance's status there is another agent.

        Best effort: a broker whose ACL lets agents write but not read their topics
        refuses the subscription (logged at debug), and the rest of the agent goes on.
        """
        topic = self.topics.status(self.cfg.host)
        try:
            await session.subscribe(topic)
            subscribed.set()
            async for m in session.client.messages:
                if len(m.payload) <= MAX_PEER_STATUS_BYTES:  # (paho's payload: bytes)
                    self.on_own_status(m.payload, retained=m.retain)
        except aiomqtt.MqttError as exc:
            log.debug("not watching %s: %s", topic, exc)
        finally:
            subscribed.set()

    def on_own_status(self, payload: bytes, *, retained: bool) -> None:
        """A status on our own topic: ours, an earlier instance's, or another agent's.

        Another instance's live ``online`` status means another agent publishes under our
        host name now. Another instance's status (its Will included) found after the
        broker cut our connection names the one that cut it: another client connecting
        with our client id takes our connection (Mosquitto 2.0 only closes the socket,
        saying nothing), and our reconnection took it back. An earlier instance's last
        word found at our first connection (a restart) is neither.
        """
        try:
            doc = json.loads(payload)
        except ValueError:
            return
        if not isinstance(doc, dict):
            return
        inst = doc.get("instance")
        if not isinstance(inst, str) or inst == self.instance or inst in self._rivals:
            return
        live = not retained and doc.get("state") == "online"
        cut = time.monotonic() - self._cut_at < TAKEOVER_MEMORY_S
        if not (live or cut):
            return
        self._rivals.add(inst)
        self.counters.host_conflicts += 1
        who = (
            f"instance {inst}, pid {doc.get('pid', '?')} on {doc.get('machine', '?')}, "
            f"client id {doc.get('client_id', '?')!r}"
        )
        b = self.cfg.broker
        if doc.get("client_id") == self.client_id:
            self.counters.session_takeovers += 1
            log.error(
                "our MQTT client id %r is in use by another connection to %s:%d, another "
                "agent (%s): the broker drops the older connection whenever the other "
                "connects, so the two take turns",
                self.client_id,
                b.host,
                b.port,
                who,
            )
        log.error(
            "another agent with host name %r (%s) is connected to %s:%d: two agents with "
            "one host name mix their records under one name. Give each its own `host`, or "
            "stop one of them.",
            self.cfg.host,
            who,
            b.host,
            b.port,
        )

    async def _drain(self, session: MqttSession) -> None:
        """Publish the spool as it fills; return once it is empty and reading has stopped."""
        loop = asyncio.get_running_loop()
        heartbeat = self.cfg.heartbeat_interval_ms / 1000
        next_beat = loop.time() + heartbeat
        topic = self.topics.records(self.cfg.host)
        while True:
            msg = self.spool.peek()
            if msg is not None and not await self._durable_stream(msg.stream):
                # The state directory cannot record this new stream yet. Publishing it
                # anyway could, after a crash, send its records again under another
                # stream id (counted twice); so new streams wait, the rest of the agent
                # runs on, and the fault is flagged until a save succeeds.
                await wait_event(self._wake, 1.0)
                self._wake.clear()
                msg = None
                if loop.time() >= next_beat:
                    await self._send_status(session, "online")
                    next_beat = loop.time() + self.cfg.heartbeat_interval_ms / 1000
                continue
            if msg is not None:
                await session.publish(topic, msg.payload)
                self.spool.pop()
                self.acked[msg.stream] = max(
                    self.acked.get(msg.stream, 0), msg.first_seq + msg.records
                )
                self._acks += 1
                self.counters.messages_sent += 1
                self.counters.records_sent += msg.records
            elif self._reading_done.is_set():
                return
            else:
                self._wake.clear()
                await wait_event(self._wake, max(0.0, next_beat - loop.time()))
            if loop.time() >= next_beat:
                await self._send_status(session, "online")
                next_beat = loop.time() + self.cfg.heartbeat_interval_ms / 1000

    async def _durable_stream(self, stream: str) -> bool:
        """Whether ``stream`` is in the positions on disk (saving them if need be)."""
        if stream in self._durable:
            return True
        await asyncio.to_thread(self._save_positions)
        if stream in self._durable:
            return True
        with self._follow_lock:
            known = stream in self.follower.streams()
        if not known:
            return True  # finished and forgotten: a restart cannot find its file again
        if self.state_error is None:  # saved, yet not listed: it had read nothing then
            await asyncio.to_thread(self._save_positions, force=True)
        return stream in self._durable

    async def _send_status(self, session: MqttSession, state: str) -> None:
        payload = json.dumps(self.status(state)).encode()
        await session.publish(self.topics.status(self.cfg.host), payload, retain=True)

    def status(self, state: str) -> dict[str, object]:
        """The status document: state, who we are, and every counter."""
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
            spool_disk_errors=self.spool.disk_errors,
            files_closed=f.files_closed,
            files_covered=f.files_covered,
            jobs_skipped=f.jobs_skipped,
            files_copies=f.files_copies,
            copies_diverged=f.copies_diverged,
            files_refused=f.files_refused,
            files_waiting=f.files_waiting,
            logs_held=f.logs_held,
            renames=f.renames,
            rewrites=f.rewrites,
            open_errors=f.open_errors,
            read_errors=f.read_errors,
            patterns_idle=f.patterns_idle,
        )
        return {
            "state": state,
            **self._identity(),
            "version": __version__,
            "latency": self.cfg.latency,
            "time_ms": self._now_ms(),
            "faults": {
                "state_dir": self.state_error,
                "spool_disk": self.spool.disk_error,
                "reading_paused": self._paused,
            },
            "counters": counters,
        }

    # -- SIGHUP ----------------------------------------------------------------------------

    def reload(self, new: AgentConfig) -> tuple[list[str], list[str]]:
        """Take what a running agent can change from ``new``; name what cannot.

        Call it from a worker thread (it waits for a poll under way to finish).

        Returns:
            (changes made, as ``key old -> new``; keys that wait for the next start).
        """
        old = self.cfg
        done = [
            f"{f} {getattr(old, f)!r} -> {getattr(new, f)!r}"
            for f in RELOADABLE
            if getattr(new, f) != getattr(old, f)
        ]
        later = [
            f.name
            for f in dataclasses.fields(AgentConfig)
            if f.name not in RELOADABLE and getattr(new, f.name) != getattr(old, f.name)
        ]
        taken = dataclasses.replace(old, **{f: getattr(new, f) for f in RELOADABLE})
        with self._follow_lock:
            fol = self.follower
            if taken.watch != old.watch:
                fol.set_patterns(taken.watch)
            fol.log_hist_msec = taken.log_hist_msec
            fol.max_line_bytes = taken.max_line_bytes
            fol.max_document_bytes = taken.max_document_bytes
            fol.rename_grace_s = taken.rename_grace_ms / 1000
            fol.run = taken.run
            self.cfg = taken
        apply_log_level(taken.log_level)
        return done, later

    async def reload_file(self, path: Path, overrides: Overrides | None) -> None:
        """SIGHUP: re-read ``path`` (and ``overrides`` over it) and :meth:`reload` it."""
        try:
            new = await asyncio.to_thread(load_agent_config, path)
            if overrides is not None:
                new = overrides.apply_agent(new)
        except ConfigError as exc:
            for p in exc.problems:
                log.error("SIGHUP: %s", p)
            log.error("SIGHUP: %s not reloaded; the running configuration stays", path)
            return
        done, later = await asyncio.to_thread(self.reload, new)
        if done:
            log.info("SIGHUP: reloaded %s: %s", path, "; ".join(done))
        else:
            log.info("SIGHUP: reloaded %s: nothing that takes effect now changed", path)
        if later:
            log.warning(
                "SIGHUP: %s changed but take effect at the next start (restart the agent)",
                ", ".join(later),
            )
        if done:
            for warning in watch_warnings(self.cfg):
                log.warning("%s", warning)
        self._wake.set()

    async def _checkpoint_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_event(stop, CHECKPOINT_S)
            await asyncio.to_thread(self._save_positions)

    def _save_positions(self, *, force: bool = False) -> None:
        """Save the positions if they changed; a refusing state directory is a state.

        Runs in worker threads (the checkpoint loop, and before a new stream's first
        record goes out); one save at a time.
        """
        with self._save_lock:
            self._save_positions_locked(force=force)

    def _save_positions_locked(self, *, force: bool) -> None:
        now = time.monotonic()
        if not force and now < self._next_save:
            return  # a large positions file (thousands of files) is written less often
        with self._follow_lock:
            version = (self.follower.changes, self._acks)
            if version == self._saved and not force:
                return  # nothing read, opened, closed, renamed or acknowledged since
            acked = dict(self.acked)  # one atomic copy: the event loop keeps adding to it
            known = self.follower.streams()
            for stream in [s for s in acked if s not in known]:
                del acked[stream]
                self.acked.pop(stream, None)  # forgotten by the follower: keep it bounded
            state = self.follower.state(acked)
        try:
            size = save_positions(self.positions_path, state)
            self._durable = set(state.streams)
            self._next_save = now + (LARGE_CHECKPOINT_S if size > LARGE_POSITIONS else 0.0)
        except OSError as exc:
            self.counters.state_write_errors += 1
            reason = exc.strerror or str(exc)
            if self.state_error is None:
                log.error(
                    "cannot save positions to %s (%s): running on, a restart would re-send "
                    "from the last saved positions; retrying",
                    self.positions_path,
                    reason,
                )
            self.state_error = reason
            return
        if self.state_error is not None:
            log.warning(
                "positions saved again to %s after %d failed writes",
                self.positions_path,
                self.counters.state_write_errors,
            )
            self.state_error = None
        self._saved = version


def apply_log_level(level: str | None) -> None:
    """Set the root logger's level (``log_level``; None leaves it as it is)."""
    if level:
        logging.getLogger().setLevel(level.upper())


async def run_agent(
    cfg: AgentConfig,
    *,
    stop: asyncio.Event | None = None,
    config_path: Path | None = None,
    overrides: Overrides | None = None,
) -> None:
    """Run an agent until SIGTERM/SIGINT (or ``stop``); a second SIGINT exits at once.

    Args:
        cfg: the configuration (``overrides`` applied).
        stop: set it to stop (the signals set it too).
        config_path: the file SIGHUP re-reads (None: SIGHUP logs that it cannot reload).
        overrides: the command line's settings, put over the file again at each SIGHUP.
    """
    stop = stop or asyncio.Event()
    apply_log_level(cfg.log_level)
    agent = Agent(cfg)
    reloads: set[asyncio.Task[None]] = set()

    def on_hup() -> None:
        if config_path is None:
            log.warning("SIGHUP: no configuration file to re-read; nothing reloaded")
            return
        log.info("SIGHUP: re-reading %s", config_path)
        task = asyncio.create_task(agent.reload_file(config_path, overrides))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    with stop_on_signals(stop, logger=log, reload=on_hup):
        await agent.run(stop)
