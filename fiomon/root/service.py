"""``fiomon root``: the exact root as a service (cells' partials over MQTT in, quanta out).

Reads an aggregator configuration (its ``broker``, ``topic_prefix``, ``client_id``,
``quantum``, ``lateness``, ``percentiles``, ``confidence_level``, ``per_host``,
``listen``, ``quanta_file``, ``sla``, ``max_message_size``) plus its ``root`` section
(expected ``cells``, ``cell_timeout``), subscribes to ``<prefix>/v1/_partials/+`` with a
persistent session, merges with :class:`~fiomon.root.merger.RootMerger`, writes the
closed quanta with the aggregators' quanta file writer, evaluates the SLA rules (cluster
scope: the whole cluster) and serves ``/metrics`` like an aggregator (the same latency
families, plus ``fiomon_root_*``: cells up, rows merged/duplicate/late, refused
messages).

It runs in the one service shell (:class:`fiomon.server.app.Server`), as the aggregator
does: :class:`RootService` is the merger the shell drives. With a ``state_dir``
(:class:`~fiomon.server.state.StateDir`), every message is journaled before it is
acknowledged to the broker (manual PUBACK), and a restart replays the journal, so the quanta
open when the root stopped (or was ``kill -9``-ed) are re-formed; a segment goes once the
quanta file confirms every quantum its rows touch and the closed-through mark (the grid
state, ``<state_dir>/state.json``, as the aggregator's, written after the quanta file) is
past them, so a restart never closes a quantum twice. Without one, partials of open
quanta die with the process.

Delivery (issue 24): a cell keeps its partials until the root has journaled them. Per
cell, :class:`~fiomon.root.delivery.DeliveryTracker` keeps the contiguous ``next_seq`` of
its journaled messages (and the holes); a task of each MQTT connection publishes it,
retained, on ``<prefix>/v1/_partials_ack/<cell>`` (every cell's on connecting, then what
changed, at most every :data:`ACK_EVERY_S`), after saving the positions in
``<state_dir>/partials-acked.json`` (a restart continues from them; without it each cell's
first message tells where it stands).

Revisions (issue 25, ``revise_within``): a cell's rows that reach a quantum the root
closed within that horizon revise its rows (:class:`~fiomon.root.merger.RootMerger`).
They are appended to the quanta file (the rows a close returns with ``revised_at`` set;
earlier lines never change) and handed to ``Publisher.revise``
(first publications go to ``observe`` as before). A restart keeps what was published
exact but not what could still be revised: the journal holds partials only until their
quanta are written, so the groups of quanta closed before the restart are gone, and
rows of them that come after it are counted late, not merged (the restarted merger
never revises a quantum it did not close itself: a revision from part of a quantum
would be wrong, and its revision numbers would repeat the previous run's). Quanta
closed after the start are revised as usual. Within a write, revision rows go before
the first publications, and the start takes the later of the quanta file's last
quantum and the saved mark, so a last line that is a revision of an older quantum never
makes a restart publish a quantum again.

Stopping goes in the shell's written order under one ``GRACE_S``: intake stops, the
open quanta close (``final``) or stay in the journal, what was closed is written and the
state directory unlocked, then the connection closes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import platform
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import aiomqtt

from fiomon import __version__
from fiomon.align import phase_for
from fiomon.build import revision
from fiomon.closed import ClosedQuantum
from fiomon.config import (
    ROOT_IGNORED,
    AggregatorConfig,
    Overrides,
    RootConfig,
    root_ignored_keys,
    root_problems,
)
from fiomon.errors import ConfigError
from fiomon.partials import peek
from fiomon.root.delivery import DeliveryTracker
from fiomon.root.merger import RootMerger
from fiomon.runtime import GRACE_S, write_atomic
from fiomon.server.alerts import rules_not_computed
from fiomon.server.app import Hooks, Server
from fiomon.server.exporter import Snapshot
from fiomon.server.journal import GridState
from fiomon.server.link import Link
from fiomon.server.metrics import Counts, Health, with_root
from fiomon.server.publish import Publisher
from fiomon.server.reload import warn_restart_only
from fiomon.server.state import StateDir
from fiomon.topics import Topics

log = logging.getLogger("fiomon.root")

# Where an earlier version kept the closed-through mark (read once, at an upgrade).
LEGACY_MARK_FILE = "root-state.json"
ACKED_FILE = "partials-acked.json"  # each cell's journaled next_seq (issue 24)
ACK_EVERY_S = 0.25  # a cell's acknowledgement is published at most this often


def _now() -> int:
    return time.time_ns() // 1_000_000


class RootService(Hooks):
    """The root as the server's merger: partials journaled, merged, closed and published.

    Args:
        cfg: the configuration.
        now_ms: the wall clock (epoch ms).

    Raises:
        fiomon.errors.StateLockedError: another root holds the state directory.
    """

    name = "root"
    log = log

    def __init__(self, cfg: AggregatorConfig, now_ms: Callable[[], int] = _now) -> None:
        self.cfg = cfg
        self._now = now_ms
        # The server's read-out of its broker connection (the snapshot shows it).
        self.link = Link()
        self.rc = cfg.root or RootConfig()
        problems = root_problems(cfg)
        phase = phase_for(cfg.align, cfg.quantum_ms)
        if not self.rc.cells or phase is None:  # (fiomon root and check-config say so first)
            raise ConfigError([p for p in problems if p.startswith(("root.cells", "align"))])
        self.topics = Topics(cfg.topic_prefix)
        self.counts = Counts()
        # The state directory (lock, journal, the closed-through mark in the grid state)
        # and the quanta file's writer.
        self.state = StateDir(cfg, service="root", counts=self.counts, log=log, grid_state=True)
        new_dir = cfg.state_dir is not None and not (cfg.state_dir / "journal").exists()
        self.state.open()
        # What was closed before: the quanta file's last quantum (the record of
        # publication), else the mark in the state directory.
        quanta = self.state.quanta
        tail = quanta.tail() if quanta is not None else None
        closed = tail.end_ms if tail is not None else self._load_mark()
        if tail is not None:
            # The file's last line may be a revision of an older quantum (a write of
            # revisions only): the mark saved after every write then knows better.
            saved = self._saved_mark()
            if saved is not None and saved > tail.end_ms:
                closed = saved
        path = self.state.state_path
        lost = path is not None and not (path.exists() or path.with_name(LEGACY_MARK_FILE).exists())
        # Evidence of a previous run whose state is gone: its received rows may be lost.
        evidence = lost and (tail is not None or not new_dir)
        self._marked_ms = closed  # the last mark handed to the writer
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
            phase_ms=phase,
            max_skew_ms=self.rc.max_skew_ms,
            state_lost=evidence,
            revise_within_ms=cfg.revise_within_ms,
            revise_memory_bytes=cfg.revise_memory_bytes,
            latency=cfg.latency,
        )
        if path is not None and lost:
            self._lost_state(path, closed, tail is not None, new_dir=new_dir)
        # Closed rows to SLA alerts, gauges and the bucket histogram (/metrics).
        self.publisher = Publisher(cfg, log, fit_tail=False)
        # What each cell's acknowledgement says (issue 24); the ack task is woken on news.
        self._acked_path = None if cfg.state_dir is None else cfg.state_dir / ACKED_FILE
        self.delivery = DeliveryTracker(self._load_acked())
        self._ack_wake = asyncio.Event()
        if self.state.journal is not None:
            self._replay()
        self.snapshot = self._build()

    @property
    def broker_connected(self) -> bool:
        """The server's MQTT session is up (read from :attr:`link`)."""
        return self.link.connected

    def now_ms(self) -> int:
        """The wall clock, epoch ms."""
        return self._now()

    def _load_mark(self) -> int | None:
        """The closed-through mark a previous run saved (None: none, or not usable).

        It is in the grid state (``state.json``, as the aggregator's); a root of an earlier
        version kept it in ``root-state.json``, read only when there is no ``state.json``.
        """
        path = self.state.state_path
        if path is None:
            return None
        grid, why = GridState.load(path)
        if why is not None:
            self.problem("state-unreadable", why)
            return None
        if grid is not None:
            quantum, closed = grid.quantum_ms, grid.closed_ms
        else:
            path = path.with_name(LEGACY_MARK_FILE)
            legacy = self._legacy_mark(path)
            if legacy is None:
                return None
            quantum, closed = legacy
        if quantum != self.cfg.quantum_ms:
            log.warning(
                "quantum changed since the last run (%d ms, now %d ms): %s is ignored",
                quantum,
                self.cfg.quantum_ms,
                path,
            )
            return None
        return closed

    def _saved_mark(self) -> int | None:
        """The grid state's closed-through mark, quietly.

        None: none, unreadable or of another quantum (:meth:`_load_mark` reports those
        when the mark is all there is).
        """
        path = self.state.state_path
        if path is None:
            return None
        grid, _ = GridState.load(path)
        if grid is None or grid.quantum_ms != self.cfg.quantum_ms:
            return None
        return grid.closed_ms

    def _lost_state(self, path: Path, closed: int | None, tail: bool, *, new_dir: bool) -> None:
        """Say what a start without its state assumes and what may be missing.

        Counted (``state-lost``, as the aggregator's) when something says a previous run
        was there (a quanta file, a journal folder); a new directory is taken as a first
        start, which the root cannot tell from a directory removed whole: logged only.
        """
        missing = (
            "quanta that were open when the previous run stopped may lack the rows it had "
            "received (the cells do not send them again): their rows name such cells in "
            "cells_missing"
        )
        if tail:
            self.problem(
                "state-lost",
                f"{path} is missing: quanta through {closed} are taken as published (the "
                f"quanta file {self.cfg.quanta_file} says so); {missing}",
            )
        elif not new_dir:
            self.problem(
                "state-lost",
                f"{path} is missing while the journal folder exists: nothing is taken as "
                f"published, so quanta the previous run published may be written again; "
                f"{missing}",
            )
        else:
            log.warning(
                "no state in %s (no %s, no quanta file tail, a new journal): taken as a first "
                "start; if a previous run's state directory was removed, %s",
                self.cfg.state_dir,
                path.name,
                missing,
            )

    def _legacy_mark(self, path: Path) -> tuple[int, int | None] | None:
        """``(quantum_ms, closed_ms)`` of an earlier version's ``root-state.json``."""
        try:
            d = json.loads(path.read_bytes())
            quantum, closed = int(d["quantum_ms"]), d["closed_ms"]
            return quantum, None if closed is None else int(closed)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            self.problem("state-unreadable", f"{path}: {exc}")
            return None

    def _write(self, rows: list[ClosedQuantum]) -> None:
        """Hand closed rows and the closed-through mark to the writer.

        The mark goes once it passed a quantum end, into the grid state after the rows
        are in the quanta file (the writer's order), as the aggregator's does.
        """
        writer = self.state.writer
        if writer is None:
            return
        m = self.merger
        grid = None
        lay = m.layout
        if self.state.state_path is not None and m.closed_ms is not None and lay is not None:
            q = m.quantum_ms
            mark = m.closed_ms - (m.closed_ms - m.phase_ms) % q  # the last quantum end <= it
            if self._marked_ms is None or mark > self._marked_ms:
                grid = GridState(q, m.phase_ms, (lay.group_nr, lay.coarseness, lay.unit), mark)
                self._marked_ms = mark
        if rows or grid is not None:
            # Revisions first: a write cut short then ends on a first publication, so
            # the file's last quantum (what a restart takes as published) stays right.
            ordered = [r for r in rows if r.revised_at is not None]
            ordered += [r for r in rows if r.revised_at is None]
            writer.submit(ordered, m.closed_ms or 0, grid)

    def _replay(self) -> None:
        """Re-form the open quanta from the journal (rows of closed quanta are skipped)."""
        assert self.state.journal is not None  # noqa: S101 -- only called with a journal
        n = 0
        for segment, cell, payload in self.state.journal.replay():
            # As on_message: a mark behind a hole waits; the journaled numbers count.
            now = self.now_ms()
            head = None if cell is None else self._numbered(cell, payload)
            held = cell is not None and head is not None and self.delivery.holds_back(cell, head[0])
            end = self.merger.receive(payload, now, cell=cell, replay=True, mark=not held)
            self.state.journal.note(segment, end if end is not None else -(2**62))
            if cell is not None and head is not None:
                self._delivered(cell, *head, now)
            n += 1
        if n:
            merged = self.merger.counts.rows["merged"]
            self.merger.counts.rows.clear()  # replays are neither late nor duplicates
            log.info(
                "re-formed %d partial rows of open quanta from %d journaled messages", merged, n
            )
        self._release()

    # -- what the server drives ------------------------------------------------------------

    def subscriptions(self) -> list[str]:
        """Every cell's partials."""
        return [self.topics.all_partials]

    def handle(self, batch: Sequence[aiomqtt.Message]) -> None:
        """Each message journaled, then merged (the server acknowledges the batch after)."""
        for m in batch:
            topic = m.topic.value
            try:
                kind, cell = self.topics.parse(topic) or ("", "")
                if kind != "partials":  # (the subscription sends nothing else)
                    self.merger.counts.invalid["topic"] += 1
                    continue
                self.on_message(cell, bytes(m.payload))
            except Exception:  # a bug must not stop intake: say so, count it, go on
                self.merger.counts.invalid["internal"] += 1
                log.exception("cannot handle a partials message on %s", topic)

    def banner(self) -> str:
        """The start-up line."""
        cfg = self.cfg
        return (
            f"fiomon root {__version__}: /metrics on {cfg.listen}, broker "
            f"{cfg.broker.host}:{cfg.broker.port}, cells {','.join(self.rc.cells)}, "
            f"quantum {cfg.quantum_ms} ms, lateness {cfg.lateness_ms} ms, latency {cfg.latency}"
        )

    def stopping(self, *, final: bool) -> str:
        """What the first stop signal logs."""
        if final:
            return "stopping (open quanta close now: --final)"
        if self.cfg.state_dir is not None:
            return "stopping (open quanta stay in the journal)"
        return "stopping (open quanta are dropped: no state_dir)"

    def status(self) -> str:
        """Systemd's ``STATUS=`` line."""
        cfg = self.cfg
        if not self.link.ready:
            b = cfg.broker
            return f"waiting for the broker at {b.host}:{b.port} (/metrics on {cfg.listen})"
        m = self.merger
        live = m.live_cells(self.now_ms())
        return f"{m.counts.quanta_closed} quanta closed, {len(live)} cells up"

    def summary(self) -> str:
        """The counters an operator checks after a stop, as one line."""
        m = self.merger.counts
        return (
            f"{m.quanta_closed} quanta closed ({m.closed_by_lateness} by lateness), "
            f"rows {dict(m.rows)}, {sum(m.invalid.values())} refused messages"
        )

    def on_message(self, cell: str, payload: bytes) -> None:
        """One message from the broker: journaled, then merged (the caller acknowledges).

        A cell not in ``root.cells`` is refused without being journaled (a flood of
        them costs no disk).
        """
        journal = self.state.journal if cell in self.merger.expected else None
        segment = journal.append([(cell, payload)]) if journal is not None else -1
        now = self.now_ms()
        head = self._numbered(cell, payload)
        # A message behind a hole in the cell's numbers: its closed-through mark waits
        # until the missing ones are in (it would close quanta without their rows).
        held = head is not None and self.delivery.holds_back(cell, head[0])
        end = self.merger.receive(
            payload, now, cell=cell, max_bytes=self.cfg.max_message_bytes, mark=not held
        )
        if journal is not None and end is not None:
            journal.note(segment, end)
        if head is not None and (self.state.journal is None or segment >= 0):  # journaled
            self._delivered(cell, *head, now)

    # -- delivery to the cells (issue 24) ----------------------------------------------------

    def _numbered(self, cell: str, payload: bytes) -> tuple[int, int] | None:
        """``(seq, closed_through_ms)`` of a message that counts for ``cell``'s delivery.

        Only a message whose header names the topic's cell, and a listed cell when
        ``root.cells`` is given: no acknowledgement for a name nobody configured, and a
        message under another's name does not move that cell's position.
        """
        head = peek(payload)
        expected = self.merger.expected
        if head is None or head[0] != cell or (expected and cell not in expected):
            return None
        return head[1], head[2]

    def _delivered(self, cell: str, seq: int, through_ms: int, now_ms: int) -> None:
        """A journaled message's number counts towards ``cell``'s acknowledgement.

        The closed-through marks it makes contiguous go to the merger.
        """
        _, mark = self.delivery.seen(cell, seq, now_ms, through_ms)
        if mark is not None:
            self.merger.take_mark(cell, mark, now_ms)
        self._ack_wake.set()

    def _load_acked(self) -> dict[str, int]:
        """Each cell's ``next_seq`` saved by the previous run ({}: none, or unusable)."""
        path = self._acked_path
        if path is None:
            return {}
        try:
            d = json.loads(path.read_bytes())
            return {str(c): int(n) for c, n in d["next_seq"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            self.problem(
                "state-unreadable",
                f"{path}: {exc}; each cell's first message tells where it stands",
            )
            return {}

    def _acked_body(self) -> bytes:
        """What :meth:`_save_acked` writes (made on the event loop)."""
        return json.dumps({"next_seq": self.delivery.positions()}).encode()

    def _save_acked(self, body: bytes) -> None:
        """Save each cell's ``next_seq`` (before an acknowledgement says it; any thread)."""
        if self._acked_path is None:
            return
        try:
            write_atomic(self._acked_path, body)
        except OSError as exc:
            self.problem("partials-acked", f"{self._acked_path}: {exc.strerror or exc}")

    def session(self, client: aiomqtt.Client) -> list[Coroutine[Any, Any, None]]:
        """The cells' acknowledgements, for this connection."""
        return [self._send_acks(client)]

    async def _send_acks(self, client: aiomqtt.Client) -> None:
        """Publish each cell's acknowledgement (retained, QoS 1) while connected.

        Every known cell's at once (the broker may have lost the retained ones with its
        state), then a cell's whenever it changed, at most every :data:`ACK_EVERY_S`. The
        positions are saved first: an acknowledgement never says more than a restarted
        root would know. The handling of messages only marks cells; this task does the
        disk and the network.
        """
        pending = set(self.delivery.positions())
        while True:
            pending.update(self.delivery.take_dirty())
            if not pending:
                self._ack_wake.clear()
                await self._ack_wake.wait()
                continue
            await asyncio.to_thread(self._save_acked, self._acked_body())
            for cell in sorted(pending):
                body = self.delivery.ack(cell, self.now_ms())
                if body is not None:
                    await client.publish(
                        self.topics.partials_ack(cell),
                        json.dumps(body).encode(),
                        qos=1,
                        retain=True,
                    )
            pending.clear()
            await asyncio.sleep(ACK_EVERY_S)

    def problem(self, kind: str, text: str) -> None:
        """A disk problem: logged and counted."""
        self.state.problem(kind, text)

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
        rows = self.merger.flush(now)
        self._closed(rows, now)
        self.snapshot = self._build()
        return rows

    def _closed(self, rows: list[ClosedQuantum], now: int) -> None:
        """Closed rows to the publisher and the writer.

        First publications (``revised_at`` None) go to ``observe``; revisions to
        ``Publisher.revise`` with the cluster bins they added.
        """
        first = [r for r in rows if r.revised_at is None]
        revised = [r for r in rows if r.revised_at is not None]
        added = self.merger.take_added()  # (taken every time: it must not pile up)
        if rows:
            self.counts.quanta_closed = self.merger.counts.quanta_closed
            self.counts.quanta_revised = self.merger.counts.quanta_revised
            self.counts.kept_forgotten = self.merger.counts.kept_forgotten
            if self.merger.layout is not None:
                self.publisher.use_layout(self.merger.layout)
        if first:
            self.publisher.observe(first, now)
        if revised:
            self.publisher.revise(revised, now, added)
        self._write(rows)
        self._release()

    def _release(self) -> None:
        """Let the journal drop what the writer confirmed (rows and mark on disk)."""
        self.state.release(self._marked_ms)

    def reload(self, new: AggregatorConfig) -> list[str]:
        """SIGHUP: take the SLA rules and log level of ``new``; returns what changed.

        Everything else the root uses waits for the next start and is named in the log;
        what the root ignores (:data:`fiomon.config.ROOT_IGNORED`) is not.
        """
        done = []
        cfg = self.cfg
        if new.sla != cfg.sla:
            refused = rules_not_computed(new.sla, cfg.percentiles, cfg.confidence_level)
            if refused is not None:
                log.error("SIGHUP: %s", refused)
            else:
                done.append(self.publisher.alerts.replace_rules(new.sla))
                cfg = dataclasses.replace(cfg, sla=new.sla)
        if new.log_level != cfg.log_level:
            done.append(f"log_level {cfg.log_level} -> {new.log_level}")
            cfg = dataclasses.replace(cfg, log_level=new.log_level)
        self.cfg = cfg
        warn_restart_only(cfg, dataclasses.replace(new, sla=cfg.sla), log, ROOT_IGNORED)
        self.snapshot = self._build()
        return done

    def _build(self) -> Snapshot:
        now = self.now_ms()
        live = self.merger.live_cells(now)
        m = self.merger.counts
        health = Health(
            open_quanta=self.merger.open_quanta,
            broker_connected=self.link.connected,
            active=bool(live),
            version=__version__,
            revision=revision(),
            python=platform.python_version(),
        )
        snap = self.publisher.snapshot(self.counts, health)
        cells = self.merger.cells
        return with_root(
            snap,
            cells_up=len(live),
            cells_expected=len(self.merger.expected),
            cell_up={c: c in live for c in cells},
            rows=m.rows,
            invalid=m.invalid,
            closed_by_lateness=m.closed_by_lateness,
            messages=m.messages,
            missing=m.missing,
            mark_lag_s={
                c: s.mark_lag_ms / 1000 for c, s in cells.items() if s.mark_lag_ms is not None
            },
            gaps={c: d.gaps for c, d in self.delivery.cells.items()},
            lost={c: d.lost for c, d in self.delivery.cells.items()},
        )

    def close(self, timeout_s: float = GRACE_S) -> None:
        """Write what was closed, save the mark, close the journal, unlock the directory.

        Open quanta are not closed here: with a ``state_dir`` their partials stay in the
        journal for the next start; without one they are lost (``flush`` closes them).
        """
        self._write([])
        self._save_acked(self._acked_body())
        self.state.finish(timeout_s)
        self._release()
        self.state.close()


async def run_root(
    cfg: AggregatorConfig,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[RootService], None] | None = None,
    final: bool = False,
    config_path: Path | None = None,
    overrides: Overrides | None = None,
) -> None:
    """The root until SIGTERM/SIGINT (or ``stop``), in the server shell.

    ``cfg`` is the configuration (a reload changes only the SLA rules and the log level);
    ``ready`` is called with the service once it is serving; the other arguments are
    :class:`~fiomon.server.app.Server`'s.

    Raises:
        fiomon.errors.StateLockedError: another root holds the state directory.
    """
    svc = RootService(cfg)
    ignored = root_ignored_keys(cfg)
    if ignored:
        log.warning(
            "the root ignores %s in its configuration (it sends no alerts itself: alert "
            "from Prometheus on fiomon_sla_breach)",
            ", ".join(ignored),
        )
    server = Server(svc, stop=stop, final=final, config_path=config_path, overrides=overrides)
    await server.run(None if ready is None else lambda: ready(svc))
