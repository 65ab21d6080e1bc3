"""The aggregator core: received payloads in, quanta closed on time, published exactly once.

:class:`AggregatorCore` is driven by ``now_ms`` (tests use a fake clock) and does no
network I/O; its disk I/O is the journal append on receipt and, on a thread of its own,
the quanta file (:class:`~fiomon.server.quantafile.QuantaWriter`).

Two steps, so that intake costs little per message and the rest is batched:

* :meth:`~AggregatorCore.receive` takes a batch of ``(topic host, payload)`` as they come
  from the broker: it refuses what is oversized or not a fiomon message, appends the rest
  to the journal with one write, and queues them. The caller acknowledges the messages to
  the broker only after it returns, so every message is either journaled or still the
  broker's.
* :meth:`~AggregatorCore.tick` (a few times per quantum) decodes everything queued at
  once (:meth:`fiomon.wire.Decoder.decode_many`), drops duplicates and counts gaps by
  ``(agent, stream, seq)``, refuses records from the far future or with absurd spans,
  moves the watermark, merges the rest into the shared
  :class:`~fiomon.engine.QuantumEngine` (the report's engine, so the same logs give the
  same numbers), closes what the :class:`~fiomon.aggregator.watermark.Watermark` allows
  and hands the closed rows to the quanta writer, the alert book and a fresh metrics
  snapshot.

Restart (:meth:`~AggregatorCore.restore`): the quanta file says what was published, the
journal re-forms what was open. A graceful stop closes nothing early, so it leaves exactly
what ``kill -9`` leaves; :meth:`~AggregatorCore.flush` closes everything for a final stop.
:func:`fiomon.aggregator.service.run_aggregator` runs the core in the server shell
(:class:`fiomon.server.app.Server`: MQTT, ``/metrics``, signals) with its alert sinks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import time
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from fiomon import __version__
from fiomon.aggregator.dedup import SeqTracker
from fiomon.aggregator.outbox import Outbox
from fiomon.aggregator.watermark import KnownStreams, Watermark
from fiomon.align import phase_for, phase_from
from fiomon.bins import BinLayout, merged_layout
from fiomon.build import revision
from fiomon.closed import ClosedQuantum, mark_incomplete
from fiomon.config import AggregatorConfig
from fiomon.engine import QuantumEngine
from fiomon.errors import FitError, LayoutError
from fiomon.fit import fit_histogram
from fiomon.model import DIRECTIONS, RecordBatch, StreamInfo
from fiomon.partials import rows_of
from fiomon.server.alerts import Transition, rules_not_computed
from fiomon.server.exporter import Snapshot
from fiomon.server.journal import GridState
from fiomon.server.link import Link
from fiomon.server.live import LiveFeed, status_of
from fiomon.server.metrics import (
    OTHER_HOST,
    Counts,
    Health,
    with_outbox,
)
from fiomon.server.publish import Publisher
from fiomon.server.quantafile import RowKey, Tail, recent_revisions
from fiomon.server.reload import warn_restart_only
from fiomon.server.state import StateDir
from fiomon.wire import MAGIC, VERSION, DecodedGroup, Decoder

log = logging.getLogger("fiomon.aggregator")

MAX_FUTURE_MS = 10 * 60_000  # records ending further ahead of our clock are refused
MAX_SPAN_MS = 3_600_000  # a record spanning more than this is refused
MAX_STATUS_BYTES = 64 * 1024  # an agent's status is a few hundred bytes
SNAPSHOT_EVERY_MS = 1000  # counters on /metrics are at most this old between closes
# The watermark's known streams go into the grid state at most this often: 25,000 streams
# cost ~25 ms to collect and ~45 ms to encode, 7 % of a core if done at every close. An
# older copy only makes a restart wait a little more conservatively (a stream's saved end
# is older; its next record, replayed from the journal or sent again, replaces it).
KNOWN_EVERY_MS = 10_000
OPEN_BYTES = 1 << 30  # open quanta's histograms at most (more close the oldest early)
REPLAY_CHUNK = 2000  # journaled messages merged at once at a restart
_FAR = 2**62
_PREFIX = MAGIC + bytes([VERSION])


class AggregatorCore:
    """Everything between received payloads and published results.

    Args:
        cfg: the configuration.
        now_ms: wall clock in epoch ms.
    """

    def __init__(self, cfg: AggregatorConfig, now_ms: Callable[[], int] | None = None) -> None:
        self.cfg = cfg
        self.now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self.decoder = Decoder(max_bytes=cfg.max_message_bytes)
        self.tracker = SeqTracker(cfg.max_streams)
        self.watermark = Watermark(
            cfg.lateness_ms, warmup_ms=min(cfg.lateness_ms, max(2 * cfg.quantum_ms, 2000))
        )
        # Closed rows to SLA alerts, gauges and the bucket histogram (/metrics).
        self.publisher = Publisher(cfg, log, fit_tail=cfg.fit_tail)
        self.engine: QuantumEngine | None = None
        self.counts = Counts()
        self.online: dict[str, bool] = {}
        self.instances: dict[str, tuple[str, int]] = {}
        self.transitions: list[Transition] = []
        # The server's read-out of its broker connection (the snapshot shows it; the
        # core never writes it).
        self.link = Link()
        self.last_record_ms: int | None = None  # wall ms of the newest record received
        self.active = False  # records within idle_after_ms (else the gauges are withdrawn)
        self.last_seen: dict[str, int] = {}  # host label (capped) -> wall ms of life
        self.replayed = 0
        self.published_ms: int | None = None  # every quantum ending by then is published
        self._alive: dict[str, int] = {}  # host -> wall ms of its last records or status
        self._wrong_latency: set[str] = set()  # agents told of sending another latency kind
        self._queue: list[tuple[str | None, bytes, int, bool]] = []  # host, payload, seg, replay
        self._queued_bytes = 0
        self._pending: list[RecordBatch] = []  # accepted before the engine exists
        self._pending_since: int | None = None
        self._first_layout: BinLayout | None = None
        self._phase_ms: int | None = None  # the grid's phase, when a previous run fixed it
        self._skip: tuple[int, frozenset[RowKey]] | None = None
        # After a restart: quanta starting at or after this are whole in the journal
        # (revisable); None: none of the previous run's.
        self._kept_ms: int | None = None
        # The saved journal position (records before it were published) and the replay's
        # phase before it (their records of closed quanta re-form the kept ones).
        self._journal_pos: tuple[int, int] | None = None
        self._absorbing = False
        # The journal position when the queue was last drained (everything before it is
        # merged): saved with the grid state.
        self._drained_pos: tuple[int, int] | None = None
        self._snapshot_ms = -_FAR
        self._late_logged: tuple[float, int, int] = (0.0, -_FAR, 0)  # samples, when, records
        self._revised_logged: tuple[int, int] = (-_FAR, 0)  # when, quanta revised then
        # The state directory and quanta file (opened by restore()).
        self.state = StateDir(
            cfg, service="aggregator", counts=self.counts, log=log, grid_state=True
        )
        # A cell's partials for the root (cfg.partials), on disk before the state says
        # they were published; the last quantum whose closing it has recorded.
        self.outbox: Outbox | None = None
        self._known: KnownStreams | None = None  # the last known streams saved (_grid)
        self._known_at = -_FAR
        self._marker_q: int | None = None
        self._silent_logged: tuple[str, ...] = ()  # the silent hosts logged last
        # Per quantum this process closed with hosts silent, which (for its revisions);
        # quanta ending at or before _silent_known_ms were first closed by an earlier run.
        self._first_silent: dict[int, tuple[str, ...]] = {}
        self._silent_known_ms = -_FAR
        # The live page's recent quanta, encoded once here and served by the /metrics child.
        self.live = LiveFeed(cfg.percentiles, cfg.sla, cfg.quantum_ms, latency=cfg.latency)
        self.snapshot = self._build()

    @property
    def broker_connected(self) -> bool:
        """The server's MQTT session is up (read from :attr:`link`)."""
        return self.link.connected

    # -- problems ---------------------------------------------------------------------------

    def problem(self, kind: str, text: str) -> None:
        """A problem with the state directory or quanta file: logged and counted."""
        self.state.problem(kind, text)

    def _invalid(self, reason: str, detail: str) -> None:
        self.counts.invalid[reason] += 1
        # The first few of each reason are logged; the counters say the rest.
        if self.counts.invalid[reason] <= 5 or self.counts.invalid[reason] % 1000 == 0:
            log.warning("refused (%s, %d so far): %s", reason, self.counts.invalid[reason], detail)

    # -- start ------------------------------------------------------------------------------

    def restore(self) -> None:
        """Lock the state directory, learn what was published, re-form what was open.

        The quanta file's last quantum is the record of publication: nothing at or before
        it is written again. If the grid state confirms it, it is complete; if not (the
        previous run died between writing it and confirming it) its rows are re-formed
        from the journal and only the missing ones are written. A lost or garbled state
        file is reported, counted, and then read from the quanta file.

        Raises:
            StateLockedError: another aggregator holds the state directory.
            OSError: the state directory cannot be created.
        """
        cfg = self.cfg
        self.state.open()
        if cfg.state_dir is not None and cfg.partials is not None:
            self.outbox = Outbox(
                cfg.state_dir,
                cfg.partials.cell,
                cfg.partials.max_message_bytes,
                self.problem,
                latency=cfg.latency,
            )
        grid, why = (
            GridState.load(self.state.state_path, KnownStreams.from_json)
            if self.state.state_path
            else (None, None)
        )
        if why:
            self.problem("state-unreadable", why)
        tail = self.state.quanta.tail() if self.state.quanta is not None else None
        if self.state.quanta is not None:
            # The live page starts with the file's last window (the /metrics child reads it).
            self.live.history = tuple(str(p) for p in self.state.quanta.files())
        self._learn_published(grid, tail)
        known = grid.known if grid is not None else None
        if isinstance(known, KnownStreams):
            # Hosts whose records all lie in confirmed quanta are not in the journal:
            # without this the first hosts to come back could close a quantum without them.
            self.watermark.restore_known(known)
            log.info("the previous run knew %d live streams", len(known.streams))
        if grid is not None and grid.quantum_ms == cfg.quantum_ms:
            g, c, unit = grid.layout
            self._first_layout = BinLayout.from_codes(g, c, unit)
            self._phase_ms = grid.phase_ms
            # Quanta the journal holds in full can be revised after the restart.
            self._kept_ms = grid.kept_ms
            self._journal_pos = grid.journal_pos
            self._create_engine(self._first_layout, grid.phase_ms)
        elif grid is not None:
            log.warning("quantum changed since the last run: its journal starts a new grid")
        elif tail is not None and tail.end_ms - tail.start_ms == cfg.quantum_ms:
            self._phase_ms = tail.end_ms % cfg.quantum_ms  # keep the published grid
        if self.state.journal is not None:
            self._replay()

    def _learn_published(self, grid: GridState | None, tail: Tail | None) -> None:
        """Set :attr:`published_ms` (and which rows of the last quantum exist)."""
        confirmed = grid.closed_ms if grid is not None else None
        lost_state = self.state.state_path is not None and grid is None
        if tail is None or (confirmed is not None and confirmed >= tail.end_ms):
            self.published_ms = confirmed
        elif not lost_state and self.state.journal is not None:
            # Written, not confirmed: the journal still holds that quantum's records.
            self.published_ms = tail.start_ms
            self._skip = (tail.end_ms, tail.keys)
            log.info(
                "the last quantum in %s (ending %d, %d rows) may be incomplete: its missing "
                "rows are written again from the journal",
                self.cfg.quanta_file,
                tail.end_ms,
                len(tail.keys),
            )
        else:
            self.published_ms = tail.end_ms
        if lost_state and tail is not None:
            self.problem(
                "state-lost",
                f"{self.state.state_path} is missing or unreadable: quanta through "
                f"{self.published_ms} are taken as published (the quanta file says so); "
                "quanta that were open when the previous run stopped may miss what it had "
                "received",
            )

    def _replay(self) -> None:
        """Re-form the open and kept quanta from the journal, then go on as before.

        Records before the saved journal position were merged when the last confirmed
        rows were published: those of closed quanta re-form their kept state (no
        revision, not late). Later ones (received after that, up to the crash) are new:
        a late one among them revises its quantum at the next close, as it would have.
        """
        journal = self.state.journal
        assert journal is not None  # noqa: S101 -- only called with a journal
        pos = self._journal_pos
        self._absorbing = True
        if self.engine is not None:
            self.engine.absorbing = True
        n = 0
        started = time.monotonic()
        for segment, host, payload in journal.replay():
            if self._absorbing and pos is not None and (segment, journal.replay_offset) > pos:
                self._replay_chunk()  # what came before the position, absorbed
                self._end_absorbing()
            self._queue.append((host, payload, segment, True))
            n += 1
            if n % REPLAY_CHUNK == 0:
                # In chunks: the journal holds the revision horizon (minutes of every
                # host's records); open rows stay bounded.
                self._replay_chunk()
                if n % (20 * REPLAY_CHUNK) == 0:
                    log.info(
                        "replaying the journal: %d messages, %d records so far (%.0f s)",
                        n,
                        self.counts.records["replayed"],
                        time.monotonic() - started,
                    )
        if n:
            self._replay_chunk()
        self._end_absorbing()
        if pos is not None:
            journal.floor(pos[0])
        if not n:
            return
        self.replayed = self.counts.records["replayed"]
        if self.engine is not None:
            self._note_published()
        log.info(
            "re-formed the open and kept quanta from %d journaled records (%d messages, %.1f s)",
            self.replayed,
            n,
            time.monotonic() - started,
        )

    def _end_absorbing(self) -> None:
        """The replay passed the saved position: later records are new (revisions)."""
        if not self._absorbing:
            return
        self._absorbing = False
        if self.engine is not None:
            self.engine.absorb()
            self.engine.absorbing = False
            self.engine.reset_late_counts()

    def _replay_chunk(self) -> None:
        """Merge what replay queued (while absorbing, the engine folds it into kept quanta)."""
        self._drain(self.now_ms(), force=True)

    def _note_published(self) -> None:
        """Tell the engine the revisions the quanta file holds for the kept quanta."""
        engine, quanta = self.engine, self.state.quanta
        if engine is None or quanta is None or not engine.kept_quanta:
            return
        since = (self.published_ms or 0) - self.cfg.revise_within_ms - self.cfg.quantum_ms
        for end, host, direction, _, rev in recent_revisions(quanta.files(), since):
            engine.note_published(end, host, direction, rev)

    # -- intake -----------------------------------------------------------------------------

    def receive(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Messages from ``<prefix>/v1/<host>/records``, in arrival order.

        Journaled (one write) and queued for the next :meth:`tick`; refused at once when
        oversized or not a fiomon message (those are not journaled).
        """
        ok: list[tuple[str, bytes]] = []
        limit = self.cfg.max_message_bytes
        for host, payload in items:
            if len(payload) > limit or not payload.startswith(_PREFIX):
                out = self.decoder.decode_many([payload])
                for _, exc in out.errors:
                    self._invalid(exc.reason, f"from {host}: {exc}")
                continue
            ok.append((host, payload))
        if not ok:
            return
        segment = self.state.journal.append(ok) if self.state.journal is not None else -1
        for host, payload in ok:
            self._queue.append((host, payload, segment, False))
            self._queued_bytes += len(payload)

    @property
    def queued_bytes(self) -> int:
        """Bytes received and not yet merged (the caller may :meth:`tick` early)."""
        return self._queued_bytes

    def on_records(self, topic_host: str, payload: bytes) -> None:
        """One message from ``<prefix>/v1/<topic_host>/records``, merged now."""
        self.receive([(topic_host, payload)])
        self._drain(self.now_ms(), force=False)

    def _drain(self, now: int, *, force: bool) -> None:
        """Decode and judge everything queued; merge what is kept."""
        if self.state.journal is not None and not self._absorbing:
            # Everything journaled so far is queued (receive() does both at once): once
            # merged, it lies before this position.
            self._drained_pos = self.state.journal.position()
        queued, self._queue = self._queue, []
        self._queued_bytes = 0
        if queued:
            decoded = self.decoder.decode_many([q[1] for q in queued])
            for i, exc in decoded.errors:
                self._invalid(exc.reason, f"from {queued[i][0]}: {exc}")
            for group in decoded.groups:
                self._accept(group, queued, now)
        if self.engine is None and self._pending:
            self._start_engine(now, force=force)

    def _accept(
        self, g: DecodedGroup, queued: list[tuple[str | None, bytes, int, bool]], now: int
    ) -> None:
        """Dedup, sanity-check and merge one decoded group of messages."""
        batch = g.batch
        target = self._layout(batch.layout)
        if target is None:
            for k in range(len(g)):
                self._invalid(
                    "layout", f"from {g.agents[k]}: layout {batch.layout.describe()} cannot merge"
                )
            return
        offs = g.offsets.tolist()
        first = g.first_seq.tolist()
        keep: npt.NDArray[np.bool_] | None = None
        any_replay = False
        for k, i in enumerate(g.index.tolist()):
            host, _, _, replay = queued[i]
            any_replay |= replay
            agent = g.agents[k]
            lo, hi = offs[k], offs[k + 1]
            if host is not None and agent != host:
                self._invalid("agent-mismatch", f"agent {agent!r} published as {host!r}")
                keep = _drop(keep, len(batch), lo, hi)
                continue
            kind = g.latency(k)
            if kind != self.cfg.latency:
                self._wrong_kind(agent, kind, hi - lo, replay=replay)
                keep = _drop(keep, len(batch), lo, hi)
                continue
            verdict = self.tracker.judge_new(agent, g.streams[k], first[k], hi - lo)
            label = self._host_label(agent)
            if not replay:
                self._alive[agent] = now
                self.last_record_ms = now
                if label != OTHER_HOST:
                    self.last_seen[label] = now
            if verdict is None:
                continue
            if verdict.refused:
                self._invalid("streams-over-cap", f"stream {g.streams[k]!r} of {agent}")
                self.counts.records["refused"] += hi - lo
                keep = _drop(keep, len(batch), lo, hi)
                continue
            # Counters stay sparse (a zero entry per host would cost every snapshot).
            if verdict.duplicates:
                self.counts.records["duplicate"] += verdict.duplicates
                self.counts.duplicates[label] += verdict.duplicates
            if verdict.lost:
                self.counts.lost[label] += verdict.lost
                log.warning(
                    "%s: %d records of %s lost (seq gap before %d)",
                    agent,
                    verdict.lost,
                    g.streams[k],
                    first[k] + int(np.argmax(verdict.new)),
                )
            if verdict.recovered:
                self.counts.recovered[label] += verdict.recovered
            if not verdict.new.all():
                keep = _drop(keep, len(batch), lo, hi, verdict.new)
        keep = self._sane(batch, keep, g, now)
        kept = batch if keep is None else batch.select(keep)
        if not len(kept):
            return
        # Progress per part (job label, direction): their stamps differ by a few ms.
        slots = np.concatenate(
            [self.watermark.slots(g.agents[k], g.streams[k], g.labels[k]) for k in range(len(g))]
        )
        self.watermark.observe_parts(
            slots[kept.stream_idx] + kept.direction.astype(np.int64), kept.end_ms, now
        )
        if self.state.journal is not None:
            ends = batch.end_ms if keep is None else np.where(keep, batch.end_ms, -_FAR)
            top = np.maximum.reduceat(ends, g.offsets[:-1]).tolist()
            for k, i in enumerate(g.index.tolist()):
                self.state.journal.note(queued[i][2], top[k])
        if any_replay:
            replays = np.array([queued[i][3] for i in g.index.tolist()], dtype=np.bool_)
            rows = np.repeat(replays, np.diff(g.offsets))
            n_replay = int(rows.sum() if keep is None else (rows & keep).sum())
            self.counts.records["replayed"] += n_replay
            self.counts.records["received"] += len(kept) - n_replay
        else:
            self.counts.records["received"] += len(kept)
        if self.engine is not None:
            self._merge(kept, g.labels)
        else:
            self._pending.append(kept)
            if self._pending_since is None:
                self._pending_since = now

    def _wrong_kind(self, agent: str, kind: str, n: int, *, replay: bool) -> None:
        """Records of another latency kind than ours: refused, counted, logged once per agent.

        A journal replay refuses them again without counting them twice.
        """
        if not replay:
            self.counts.records["wrong_latency"] += n
        if agent not in self._wrong_latency and len(self._wrong_latency) < 10_000:
            self._wrong_latency.add(agent)
            log.warning(
                "refused records of %s: they hold %s latency, this aggregator merges %s "
                "(set latency: %s on the agent, or run an aggregator with latency: %s); "
                'counted in fiomon_records_total{result="wrong_latency"}, logged once per agent',
                agent,
                kind,
                self.cfg.latency,
                self.cfg.latency,
                kind,
            )

    def _sane(
        self,
        batch: RecordBatch,
        keep: npt.NDArray[np.bool_] | None,
        g: DecodedGroup,
        now: int,
    ) -> npt.NDArray[np.bool_] | None:
        """Refuse records ending far in the future or spanning absurd times (counted)."""
        future = batch.end_ms > now + MAX_FUTURE_MS
        span = (batch.end_ms - batch.start_ms) > MAX_SPAN_MS
        if not (future.any() or span.any()):
            return keep
        keep = np.ones(len(batch), dtype=np.bool_) if keep is None else keep
        msg_of = np.repeat(np.arange(len(g)), np.diff(g.offsets))
        for mask, reason in ((future, "future"), (span, "span")):
            bad = keep & mask
            if bad.any():
                self.counts.records[f"invalid-{reason}"] += int(bad.sum())
                for k in np.unique(msg_of[bad]).tolist():
                    n = int((msg_of[bad] == k).sum())
                    self._invalid(reason, f"{n} records of {g.streams[k]} from {g.agents[k]}")
                keep = keep & ~mask
        return keep

    def _merge(
        self, batch: RecordBatch, groups: Sequence[tuple[StreamInfo, ...]] | None = None
    ) -> None:
        assert self.engine is not None  # noqa: S101 -- only called once it exists
        try:
            self.engine.add(batch.coarsened(self.engine.layout), groups)
        except LayoutError as exc:  # a layout change within one agent's stream
            self._invalid("layout", str(exc))

    def on_status(self, topic_host: str, payload: bytes, *, retained: bool = False) -> None:
        """An agent's status (online with counters, or offline), maybe a retained copy.

        Anything may arrive here (any client can write a status topic the broker lets
        it): the size is checked before parsing, and every parse failure, recursion
        included, is counted and ignored. A retained "online" is evidence of life only if
        its own ``time_ms`` is fresh.
        """
        if len(payload) > MAX_STATUS_BYTES:
            self._invalid("status-oversized", f"status of {topic_host}: {len(payload)} bytes")
            return
        try:
            doc = json.loads(payload)
            state = doc["state"] if isinstance(doc, dict) else None
        except Exception as exc:  # hostile input: RecursionError, MemoryError, anything
            self._invalid("status", f"unreadable status of {topic_host}: {type(exc).__name__}")
            return
        if state not in ("online", "offline"):
            self._invalid("status", f"status of {topic_host} has no state online/offline")
            return
        now = self.now_ms()
        online = state == "online"
        was = self.online.get(topic_host)
        self.online[topic_host] = online
        self.watermark.set_online(topic_host, online)
        if was is not None and was != online:
            log.info("agent %s is %s", topic_host, state)
        if not online:
            self._alive.pop(topic_host, None)
            # The instance that went offline (a clean stop, or its Will after a crash) is
            # not a second agent when a new one comes online under the id within 30 s.
            self.instances.pop(topic_host, None)
            return
        stamp = now
        if retained:
            t = doc.get("time_ms")
            if not isinstance(t, int) or isinstance(t, bool):
                return
            stamp = min(t, now)
        if was is not True and now - stamp <= self.cfg.host_timeout_ms:
            # Online and (maybe) no record yet: its first records may come later than the
            # others' (a slow start, a slow link); closing early would leave it out.
            self.watermark.announced(topic_host)
        if stamp > self._alive.get(topic_host, -_FAR):
            self._alive[topic_host] = stamp
        label = self._host_label(topic_host)
        if label != OTHER_HOST and stamp > self.last_seen.get(label, -_FAR):
            self.last_seen[label] = stamp
        instance = doc.get("instance")
        if isinstance(instance, str) and not retained:
            prev = self.instances.get(topic_host)
            if prev is not None and prev[0] != instance and now - prev[1] < 30_000:
                self.counts.id_conflicts[topic_host] += 1
                log.warning(
                    "two agents claim the id %r (instances %s and %s): give each host its own "
                    "`host` name; their records cannot be told apart",
                    topic_host,
                    prev[0],
                    instance,
                )
            self.instances[topic_host] = (instance, now)

    def hosts_up(self, now_ms: int | None = None) -> int:
        """Hosts that sent records, or a fresh online status, within ``host_timeout``."""
        now = self.now_ms() if now_ms is None else now_ms
        window = self.cfg.host_timeout_ms
        stale = [h for h, t in self._alive.items() if now - t > 10 * window]
        for h in stale:
            del self._alive[h]
        return sum(1 for t in self._alive.values() if now - t <= window)

    def _layout(self, layout: BinLayout) -> BinLayout | None:
        """The engine layout this batch can merge into, or None."""
        base = self.engine.layout if self.engine is not None else self._first_layout
        if base is None:
            self._first_layout = layout
            return layout
        try:
            merged = merged_layout(base, layout)
        except LayoutError:
            return None
        # The engine's layout is fixed once it runs: a coarser batch cannot merge into it.
        return base if merged == base else None

    def _host_label(self, host: str) -> str:
        labels = self.counts.host_labels
        if host in labels:
            return host
        if len(labels) < self.cfg.max_hosts:
            labels.add(host)
            return host
        return OTHER_HOST

    def stalled(self, ms: int) -> None:
        """The process could not run for ``ms`` (the service measures it between ticks).

        Not input silence: see :meth:`fiomon.aggregator.watermark.Watermark.stalled`. Logged as a
        warning from half the lateness on (close delays show it too).
        """
        if ms <= 0:
            return
        self.watermark.stalled(ms)
        level = logging.WARNING if 2 * ms >= self.cfg.lateness_ms else logging.DEBUG
        log.log(
            level,
            "the aggregator did not run for %d ms (CPU starvation, a pause or a long step); "
            "not taken as silence of the input",
            ms,
        )

    # -- closing ----------------------------------------------------------------------------

    @property
    def idle_after_ms(self) -> int:
        """No records for this long (``2 x lateness``, ms) is idle.

        The last quanta closed ``lateness`` after the last record and were shown for
        another ``lateness``; then the per-quantum series go.
        """
        return 2 * self.cfg.lateness_ms

    def tick(self) -> list[ClosedQuantum]:
        """Merge what is queued and close what may close; returns the closed rows."""
        now = self.now_ms()
        self._drain(now, force=False)
        rows: list[ClosedQuantum] = []
        if self.engine is not None:
            mark = self.watermark.close_through(now)
            rows = self._completeness(self.engine.close_through(mark, now))
            if rows:
                log.debug(
                    "closing %d quanta through %d (%d ms ago) by %s",
                    len({r.end_ms for r in rows}),
                    mark,
                    now - mark,
                    self.watermark.reason,
                )
                self._closed(rows, now, mark)
            else:
                self._send_partials([], mark)  # the closed marker (and heartbeat)
            self._release()
            self._report_late(now)
        elif self.outbox is not None:
            self._idle_marker(now)
        self._idle_check(now)
        return rows

    def _idle_marker(self, now: int) -> None:
        """Before its first record, a cell still tells the root the quanta it closed empty.

        Without it, a cell whose hosts have not run since the root started counts as
        missing from every quantum of the other cells' runs (their rows marked, the
        missing-cell alert firing for a healthy cell). A cell's grid is fixed (its
        ``partials`` refuse ``align: auto``); a message without rows carries no bins, so
        fio 3's layout stands in. Those quanta count as published here too, so records
        that come later for them are late at the cell as they are at the root.
        """
        q = self.cfg.quantum_ms
        phase = phase_for(self.cfg.align, q)
        if phase is None:
            return
        # The watermark's bound: lateness, held while the broker may hold records for us
        # (at the start, after a disconnection) as for any close.
        through = self.watermark.close_through(now)
        through -= (through - phase) % q  # the last quantum end at or before it
        if self.published_ms is not None and through <= self.published_ms:
            return
        assert self.outbox is not None  # noqa: S101 -- only called for a cell
        self.outbox.add(BinLayout(), through, [])
        self.published_ms = through

    def _report_late(self, now: int) -> None:
        """Say in the log when records reached closed quanta (at most every 10 s)."""
        engine = self.engine
        if engine is None or engine.late_samples == self._late_logged[0]:
            return
        if now - self._late_logged[1] < 10_000:
            return
        total = sum(engine.late_records.values())
        log.warning(
            "%d records (%d so far) reached quanta closed more than revise_within (%d ms) "
            "ago: counted late and left out of the quanta file; quanta are closed through %d",
            total - self._late_logged[2],
            total,
            self.cfg.revise_within_ms,
            self.published_ms or 0,
        )
        self._late_logged = (engine.late_samples, now, total)

    def _idle_check(self, now: int) -> None:
        """Idle is a state: entering it withdraws the per-quantum gauges and settles alerts.

        A benchmark that stopped is no breach in progress: firing SLA alerts resolve
        (and pending ones drop) when the input goes idle, as Prometheus resolves an alert
        whose series went away.
        """
        last = self.last_record_ms
        active = last is not None and now - last < self.idle_after_ms
        if active == self.active:
            return
        self.active = active
        if active:
            log.info("records arrive: active")
        else:
            settled = self.publisher.alerts.settle(now)
            self.transitions.extend(settled)
            for t in settled:
                log.info("sla %s", t.log_text())
            log.info(
                "no records for %d ms: idle (per-quantum series withdrawn from /metrics%s)",
                self.idle_after_ms,
                f", {len(settled)} SLA alerts settled" if settled else "",
            )
        self.snapshot = self._build(now)

    def _start_engine(self, now: int, *, force: bool = False) -> bool:
        """Create the engine once the phase is known (auto: from the first records)."""
        if not self._pending or self._first_layout is None:
            return False
        phase = self._phase_ms
        if phase is None:
            phase = phase_for(self.cfg.align, self.cfg.quantum_ms)
        if phase is None:
            # auto: wait one lateness for records from many streams, then choose.
            waited = self._pending_since is not None and now - self._pending_since >= (
                self.cfg.lateness_ms
            )
            if not (waited or force):
                return False
            phase = phase_from(self._pending, self.cfg.quantum_ms)
            log.info("align auto: quanta end at %d ms past each quantum", phase)
        self._create_engine(self._first_layout, phase)
        pending, self._pending = self._pending, []
        self._pending_since = None
        for b in pending:
            self._merge(b)
        return True

    def _create_engine(self, layout: BinLayout, phase: int) -> None:
        self.engine = QuantumEngine(
            layout=layout,
            quantum_ms=self.cfg.quantum_ms,
            phase_ms=phase,
            percentiles=self.cfg.percentiles,
            confidence_level=self.cfg.confidence_level,
            directions=DIRECTIONS,
            per_host=self.cfg.per_host,
            max_hosts=self.cfg.max_hosts,
            max_open_quanta=self.cfg.max_open_quanta,
            # Memory: open quanta (a float64 row of bins per host and direction) are
            # bounded by bytes, not only by count: a lagging intake holds quanta open.
            max_open_rows=max(4096, OPEN_BYTES // (8 * layout.nbins)),
            keep_hists=True,
            # Host rows' histograms: the SLA rules' tail shares (which hosts hold the
            # I/Os above the cluster percentile) are computed from them at each close.
            keep_host_hists=sla_directions(self.cfg),
            keep_partials=self.cfg.partials is not None,
            revise_within_ms=self.cfg.revise_within_ms,
            kept_max_bytes=self.cfg.revise_memory_bytes,
            # Room for every host's rows over the lateness, without copies as it fills.
            capacity_rows=min(
                1 << 17,
                self.cfg.max_hosts * 2 * (self.cfg.lateness_ms // self.cfg.quantum_ms + 3),
            ),
        )
        self.engine.absorbing = self._absorbing
        if self.published_ms is not None:
            self._silent_known_ms = max(self._silent_known_ms, self.published_ms)
            # Records for published quanta are late, or (within the revision horizon, for
            # the quanta the journal holds whole) revisions: never published twice.
            self.engine.kept_from_ms = self.published_ms if self._kept_ms is None else self._kept_ms
            self.engine.close_through(self.published_ms)
        if self.state.writer is not None and self.state.state_path is not None:
            # The grid is on disk as soon as it exists (a restart keeps its phase).
            self.state.writer.submit((), self.published_ms or -_FAR, self._grid(self.published_ms))
        self.publisher.use_layout(layout)

    def flush(self) -> list[ClosedQuantum]:
        """Merge what is queued and close everything still open (a final stop)."""
        now = self.now_ms()
        self._drain(now, force=True)
        if self.engine is None:
            return []
        rows = self._completeness(self.engine.flush())
        if rows:
            self._closed(rows, now, max(r.end_ms for r in rows))
        return rows

    def _completeness(self, rows: list[ClosedQuantum]) -> list[ClosedQuantum]:
        """Mark the rows of quanta closed while a host expected in them was silent.

        :meth:`Watermark.silent` says which hosts (what the aggregator can know:
        README, "the quanta file"); :func:`mark_incomplete` sets ``complete`` false on
        those quanta's cluster rows. Each new set of silent hosts is logged once.

        A revision (``revised_at`` set) is judged against its quantum's first close: the
        hosts silent then, less those whose late records are now merged into it (a host
        that went on sending later quanta but never this one's records still lacks).
        Quanta first closed before this process started are judged on the progress now.
        """
        if not rows or self.engine is None:
            return rows
        first = [r for r in rows if r.revised_at is None]
        revised = [r for r in rows if r.revised_at is not None]
        spans = sorted({(r.start_ms, r.end_ms) for r in first}, key=lambda se: se[1])
        ends = [e for _, e in spans]
        silent = dict(zip(ends, self.watermark.silent(spans), strict=True))
        for end in ends:
            if silent[end]:
                self._first_silent[end] = silent[end]
            hosts = silent[end]
            if hosts and hosts != self._silent_logged:
                log.warning(
                    "quantum ending %d closed without %d host(s) that reported within %d ms "
                    "before it: %s (its rows say complete: false)",
                    end,
                    len(hosts),
                    self.watermark.idle_ms,
                    ", ".join(hosts[:10]) + (" ..." if len(hosts) > 10 else ""),
                )
            if hosts or self._silent_logged:
                self._silent_logged = hosts
        if revised:
            rspans = sorted({(r.start_ms, r.end_ms) for r in revised}, key=lambda se: se[1])
            now_silent = self.watermark.silent(rspans)
            for (_, end), hosts in zip(rspans, now_silent, strict=True):
                if end > self._silent_known_ms:
                    came = self.engine.late_hosts(end)
                    silent[end] = tuple(h for h in self._first_silent.get(end, ()) if h not in came)
                else:
                    silent[end] = hosts
        if self._first_silent and self.published_ms is not None:
            horizon = self.published_ms - self.cfg.revise_within_ms
            for end in [e for e in self._first_silent if e <= horizon]:
                del self._first_silent[end]
        return mark_incomplete(rows, silent)

    def _closed(self, rows: list[ClosedQuantum], now: int, mark: int) -> None:
        """Publish a close: first publications, then revisions (``revised_at`` set)."""
        first = [r for r in rows if r.revised_at is None]
        revised = [r for r in rows if r.revised_at is not None]
        ends = sorted({r.end_ms for r in first})
        self.counts.quanta_closed += len(ends)
        through = max(mark, ends[-1]) if ends else mark
        if self.published_ms is not None:
            through = max(through, self.published_ms)
        self._send_partials(rows, through)  # before the state can say "published"
        if self.state.writer is not None:
            skip = None
            if self._skip is not None and ends and self._skip[0] <= ends[-1]:
                skip, self._skip = self._skip, None
            self.state.writer.submit(rows, through, self._grid(through), skip)
        self.published_ms = through
        if first:
            tails = self._tails(first, ends[-1]) if self.cfg.fit_tail else None
            self.transitions += self.publisher.observe(first, now, tails)
        if revised:
            self._revised(revised, now)
        self.live.add(rows, self.engine.layout if self.engine is not None else None)
        self.snapshot = self._build(now)

    def _revised(self, rows: list[ClosedQuantum], now: int) -> None:
        """Revisions to the publisher (gauges of the newest quantum, buckets, SLA log)."""
        added = self.engine.take_added() if self.engine is not None else {}
        self.counts.quanta_revised += len({r.end_ms for r in rows})
        self.publisher.revise(rows, now, added)
        # Said at most every 10 s (a host catching up revises at every tick).
        when, before = self._revised_logged
        if now - when >= 10_000:
            log.info(
                "revised %d closed quanta with late records (within revise_within, %d ms; "
                "newest revised quantum ends %d, %d ms before the newest close): the "
                "quanta file has their new revisions",
                self.counts.quanta_revised - before,
                self.cfg.revise_within_ms,
                max(r.end_ms for r in rows),
                (self.published_ms or 0) - max(r.end_ms for r in rows),
            )
            self._revised_logged = (now, self.counts.quanta_revised)

    def _send_partials(self, rows: list[ClosedQuantum], through: int) -> None:
        """Put what the engine closed (and the closed marker) in the cell's outbox.

        ``rows`` are the closed-quantum rows of the same close (their late counts go on
        the matching partial rows). A close with no groups is recorded only when it
        passes a quantum boundary: the root learns those quanta are closed (empty here).
        """
        engine = self.engine
        if self.outbox is None or engine is None:
            return
        parts, engine.partials = engine.partials, []
        if self.cfg.partials is not None and not self.cfg.partials.host_rows:
            parts = [p for p in parts if p.scope == "cluster"]
        last_q = int(engine.quantum_of(np.array([through + 1], dtype=np.int64))[0]) - 1
        if not parts and last_q == self._marker_q:
            return
        self._marker_q = last_q
        late: dict[tuple[int, str, str | None, str], int] = {
            (r.start_ms, r.scope, r.host, r.direction): r.late_records
            for r in rows
            if r.late_records
        }
        incomplete = {(r.start_ms, r.scope, r.host, r.direction) for r in rows if not r.complete}
        parts.sort(key=lambda p: p.start_ms)
        self.outbox.add(engine.layout, through, rows_of(parts, late, incomplete))

    def _grid(self, closed_ms: int | None, *, fresh: bool = False) -> GridState | None:
        """The grid state to save after the quanta file (None without a state directory).

        The known streams are collected anew every ``KNOWN_EVERY_MS`` (or when ``fresh``);
        in between the same object goes again, and its encoding is reused
        (:meth:`GridState.save`).
        """
        if self.state.state_path is None or self.engine is None:
            return None
        now = self.now_ms()
        if fresh or self._known is None or now - self._known_at >= KNOWN_EVERY_MS:
            self._known, self._known_at = self.watermark.known(), now
        lay = self.engine.layout
        kept = None
        if closed_ms is not None and self.cfg.revise_within_ms:
            # What the journal still holds whole (it releases behind the writer's
            # confirmation, which is at most closed_ms): a restart may revise from there.
            kept = max(
                closed_ms - self.cfg.revise_within_ms,
                self.engine.kept_from_ms,
                self.state.journal_cut_ms,
            )
        return GridState(
            self.cfg.quantum_ms,
            self.engine.phase_ms,
            (lay.group_nr, lay.coarseness, lay.unit),
            closed_ms,
            self._known,
            kept_ms=kept,
            journal_pos=self._drained_pos,
        )

    def _release(self) -> None:
        """Let the journal drop what the quanta file has confirmed."""
        self.state.release(self.published_ms, self.cfg.revise_within_ms)

    def _tails(self, rows: list[ClosedQuantum], end: int) -> dict[str, tuple[float, float]]:
        """Head + tail fit of the newest quantum's cluster rows (fit_tail)."""
        out: dict[str, tuple[float, float]] = {}
        if self.engine is None:
            return out
        for r in rows:
            if r.end_ms != end or r.scope != "cluster" or r.hist is None:
                continue
            try:
                fitted = fit_histogram(r.hist, self.engine.layout)
            except FitError as exc:
                log.debug("tail fit skipped: %s", exc)
                self.counts.fits_skipped += 1
                continue
            out[r.direction] = (fitted.tail_share, fitted.alpha)
        return out

    # -- metrics ------------------------------------------------------------------------------

    def _build(self, now: int | None = None) -> Snapshot:
        now = self.now_ms() if now is None else now
        self._snapshot_ms = now
        engine = self.engine
        if engine is not None:
            late: Counter[str] = Counter()
            for h, n in engine.late_records.items():
                late[self._host_label(h)] += n  # over-cap hosts add up in "_other"
            self.counts.late = late
            merged: Counter[str] = Counter()
            for h, n in engine.revised_records.items():
                merged[self._host_label(h)] += n
            self.counts.late_merged = merged
            self.counts.hosts_over_cap = engine.hosts_over_cap
            self.counts.forced_closes = engine.forced_closes
            if engine.kept_dropped > self.counts.kept_forgotten:
                log.warning(
                    "%d closed quanta (%d so far) forgotten before revise_within (%d ms): "
                    "the kept quanta reached revise_memory (%d MiB); late records for them "
                    "are counted late: raise revise_memory or shorten revise_within",
                    engine.kept_dropped - self.counts.kept_forgotten,
                    engine.kept_dropped,
                    self.cfg.revise_within_ms,
                    engine.kept_max_bytes >> 20,
                )
            self.counts.kept_forgotten = engine.kept_dropped
        health = Health(
            hosts_up=self.hosts_up(now),
            streams=len(self.tracker),
            open_quanta=engine.open_quanta if engine is not None else None,
            kept_quanta=(
                engine.kept_quanta if engine is not None and engine.revise_within_ms else None
            ),
            kept_bytes=engine.kept_bytes if engine is not None else 0,
            session_taken_over=self.link.taken_over,
            broker_connected=self.link.connected,
            backlog_max=self.link.backlog_max,
            active=self.active,
            last_seen_s={h: t / 1000 for h, t in self.last_seen.items()},
            version=__version__,
            revision=revision(),
            python=platform.python_version(),
            cell=self.cfg.cell or "",
        )
        snap = self.publisher.snapshot(self.counts, health)
        status = status_of(
            now_ms=now,
            hosts_up=health.hosts_up,
            received=self.counts.records["received"],
            late=sum(self.counts.late.values()),
            lost=sum(self.counts.lost.values()),
            rules=self.cfg.sla,
            alerts=self.publisher.alerts.snapshot(),
            silent=self._silent_logged,
        )
        snap = dataclasses.replace(snap, live=self.live.view(status))
        if self.outbox is None:
            return snap
        ob = self.outbox
        return with_outbox(
            snap,
            backlog_bytes=ob.backlog_bytes,
            sent=ob.sent,
            dropped=ob.dropped,
            refused=ob.refused,
            backlog_messages=ob.backlog_messages,
            resent=ob.resent,
        )

    def refresh_snapshot(self, *, min_age_ms: int = 0) -> bool:
        """Rebuild the snapshot's counters between closes if the last is ``min_age_ms`` old."""
        now = self.now_ms()
        if now - self._snapshot_ms < min_age_ms:
            return False
        self.snapshot = self._build(now)
        return True

    # -- reload and stop ------------------------------------------------------------------------

    def reload(self, new: AggregatorConfig) -> list[str]:
        """Take what can change while running (SLA rules, webhook, log level, host_timeout).

        Returns what changed, for the log. Everything else needs a restart; a rule on a
        percentile that is not computed is refused (the old rules stay).
        """
        done: list[str] = []
        cfg = self.cfg
        if new.sla != cfg.sla:
            refused = rules_not_computed(new.sla, cfg.percentiles, cfg.confidence_level)
            if refused is not None:
                log.error("reload: %s", refused)
                new = dataclasses.replace(new, sla=cfg.sla)
            else:
                done.append(self.publisher.alerts.replace_rules(new.sla))
                if self.engine is not None:  # tail shares need the host rows' histograms
                    self.engine.keep_host_hists = sla_directions(new)
                edges = set(self.publisher.buckets.edges_s.tolist())
                for r in new.sla:
                    if r.threshold_ns / 1e9 not in edges:
                        log.warning(
                            "reload: rule %s's threshold %g ms is not a bucket edge of "
                            "fiomon_cluster_io_latency_seconds until the next start "
                            "(buckets cannot change in a running counter)",
                            r.name,
                            r.threshold_ns / 1e6,
                        )
        if new.webhook != cfg.webhook:
            done.append(f"webhook {_hook(cfg.webhook)} -> {_hook(new.webhook)}")
        if new.log_level != cfg.log_level:
            done.append(f"log_level {cfg.log_level} -> {new.log_level}")
        if new.host_timeout_ms != cfg.host_timeout_ms:
            done.append(f"host_timeout {cfg.host_timeout_ms} ms -> {new.host_timeout_ms} ms")
        self.cfg = dataclasses.replace(
            cfg,
            sla=new.sla,
            webhook=new.webhook,
            log_level=new.log_level,
            host_timeout_ms=new.host_timeout_ms,
        )
        self.live.set_rules(self.cfg.sla)
        warn_restart_only(self.cfg, new, log)
        self.snapshot = self._build()
        return done

    def close(self, timeout_s: float = 10.0, *, outbox: bool = True) -> None:
        """Stop: write what was closed, save the grid, close the journal, unlock.

        Nothing open is closed (records are in the journal): the next start continues
        where this one stopped. ``outbox=False`` leaves a cell's partials outbox open for
        a task that may still be sending from it (its owner closes it after).
        """
        writer = self.state.writer
        if writer is not None and self.engine is not None:
            through = self.published_ms if self.published_ms is not None else -_FAR
            writer.submit((), through, self._grid(self.published_ms, fresh=True))
        self.state.finish(timeout_s)
        if outbox and self.outbox is not None:
            self.outbox.close()
        self.state.close()


def _drop(
    keep: npt.NDArray[np.bool_] | None,
    n: int,
    lo: int,
    hi: int,
    new: npt.NDArray[np.bool_] | None = None,
) -> npt.NDArray[np.bool_]:
    """``keep`` with records ``lo:hi`` dropped (or only the ones ``new`` says are not new)."""
    out = np.ones(n, dtype=np.bool_) if keep is None else keep
    if new is None:
        out[lo:hi] = False
    else:
        out[lo:hi] &= new
    return out


def sla_directions(cfg: AggregatorConfig) -> frozenset[str]:
    """The directions whose host rows keep their histograms: the SLA rules' (tail shares)."""
    return frozenset(r.direction for r in cfg.sla) if cfg.per_host else frozenset()


def _hook(h: object) -> str:
    url = getattr(h, "url", None)
    return str(url) if url else "none"
