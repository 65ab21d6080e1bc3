"""The central aggregator: MQTT in, quanta closed on time, metrics, quanta file and alerts.

:class:`AggregatorCore` is the logic without I/O, driven by ``now_ms`` (tests use a fake
clock): :meth:`~AggregatorCore.on_records` validates a payload, drops duplicates and
counts gaps by ``(agent, stream, seq)``, refuses records from the far future or with
absurd spans, and queues the rest; :meth:`~AggregatorCore.tick` merges what is queued into
the shared :class:`~fiomon.windows.QuantumEngine` (the report's engine, so the same logs
give the same numbers), closes what the :class:`~fiomon.watermark.Watermark` allows, and
feeds the quanta file, the alert book and a fresh exporter snapshot.

With a ``state_dir`` it journals what it accepts and re-forms the open quanta after a
crash (:mod:`fiomon.journal`). :func:`fiomon.serve.run_aggregator` wires it to MQTT, to
the exporter's HTTP thread and to the alert sinks.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from fiomon.alerts import AlertBook, Transition
from fiomon.align import auto_phase, phase_for
from fiomon.bins import BinLayout
from fiomon.config import AggregatorConfig
from fiomon.dedup import SeqTracker
from fiomon.errors import LayoutError, WireFormatError
from fiomon.exporter import BucketHistogram, Snapshot, bucket_edges_s
from fiomon.fit import Fit, FitError, fit_histogram
from fiomon.histogram import pct_key
from fiomon.journal import GridState, Journal, last_quanta_end
from fiomon.model import RecordBatch
from fiomon.quantafile import QuantaFile
from fiomon.watermark import Watermark
from fiomon.windows import ALL_DIRECTIONS, ClosedQuantum, QuantumEngine
from fiomon.wire import Message, decode

log = logging.getLogger("fiomon.aggregator")

MAX_FUTURE_MS = 10 * 60_000  # records ending further ahead of our clock are refused
MAX_SPAN_MS = 3_600_000  # a record spanning more than this is refused
OTHER_HOST = "_other"  # label of per-host counters beyond the host cap
CLOSE_DELAY_EDGES_S = np.array([0.25, 0.5, 1, 1.5, 2, 3, 4, 5, 5.5, 6, 7, 8, 10, 15, 30, 60])

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
        self.watermark = Watermark(
            cfg.lateness_ms, warmup_ms=min(cfg.lateness_ms, max(2 * cfg.quantum_ms, 2000))
        )
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
        self._delay_counts = np.zeros(len(CLOSE_DELAY_EDGES_S))
        self._delay_n = 0
        self._delay_sum_s = 0.0
        self.quanta_closed = 0
        self.transitions: list[Transition] = []
        self._host_labels: set[str] = set()
        self.journal: Journal | None = None
        self.state_path: Path | None = None
        self.replayed = 0
        if cfg.state_dir is not None:
            self.journal = Journal(cfg.state_dir / "journal")
            self.state_path = cfg.state_dir / "state.json"

    # -- restart -------------------------------------------------------------------------

    def restore(self) -> None:
        """Re-form what the previous run had received but not published (its journal).

        The saved grid keeps the same quanta; quanta it had closed (by the state file or
        the quanta file's last line, whichever is later) are not published again.
        """
        if self.journal is None or self.state_path is None:
            return
        grid = GridState.load(self.state_path)
        if grid is not None and grid.quantum_ms == self.cfg.quantum_ms:
            g, c, unit = grid.layout
            self._first_layout = BinLayout(g, c, unit)  # type: ignore[arg-type]
            self._create_engine(self._first_layout, grid.phase_ms)
            closed = grid.closed_ms
            if self.cfg.quanta_file is not None:
                last = last_quanta_end(self.cfg.quanta_file)
                if last is not None and (closed is None or last > closed):
                    closed = last
            if closed is not None and self.engine is not None:
                self.engine.close_through(closed)
        elif grid is not None:
            log.warning("quantum changed since the last run: its journal starts a new grid")
        ends: dict[int, int] = {}
        for segment, payload in self.journal.replay():
            try:
                msg = decode(payload, max_bytes=self.cfg.max_message_bytes)
            except WireFormatError:
                continue
            self._accept(msg, journal=False)
            ends[segment] = max(ends.get(segment, -(2**62)), int(msg.batch.end_ms.max()))
        for segment, end in ends.items():
            self.journal.adopt(segment, end)
        self.replayed = self.records["received"]
        if self.replayed:
            self._merge(self.now_ms(), force=True)
            if self.engine is not None:
                # Parts of replayed records in quanta published before the crash are not
                # late: they were in those quanta.
                self.engine.reset_late_counts()
            log.info("re-formed the open quanta from %d journaled records", self.replayed)

    # -- intake --------------------------------------------------------------------------

    def on_records(self, topic_host: str, payload: bytes) -> None:
        """One message from ``<prefix>/v1/<topic_host>/records``."""
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
        self._accept(msg, journal=True, payload=payload)

    def _accept(self, msg: Message, *, journal: bool, payload: bytes = b"") -> None:
        """Dedup, sanity-check and queue a decoded message's records."""
        now = self.now_ms()
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
            end = int(batch.end_ms[keep].max())
            if journal and self.journal is not None:
                self.journal.append(payload, end)
            # Progress per part (job label, direction): their stamps differ by a few ms.
            part = batch.stream_idx[keep].astype(np.int64) * 3 + batch.direction[keep]
            ends = batch.end_ms[keep]
            order = np.lexsort((ends, part))
            last = np.r_[part[order][1:] != part[order][:-1], True]
            parts: dict[object, int] = {
                (batch.streams[k // 3].stream, k % 3): e
                for k, e in zip(part[order][last].tolist(), ends[order][last].tolist(), strict=True)
            }
            self.watermark.observe(msg.agent, msg.stream, end, now, parts)
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
        mark = self.watermark.close_through(now)
        rows = self.engine.close_through(mark)
        if rows:
            self._closed(rows, now, mark)
        return rows

    def _merge(self, now: int, *, force: bool) -> bool:
        """Merge the queue into the engine (creating it once the phase is known)."""
        if self.engine is None and not self._start_engine(now, force=force):
            return False
        engine = self.engine
        assert engine is not None  # noqa: S101 -- _start_engine made it
        if self._queue:
            queued, self._queue = self._queue, []
            self._queued_since = None
            batches = []
            for b in queued:
                try:
                    batches.append(b.coarsened(engine.layout))
                except LayoutError as exc:  # a layout change within one agent's stream
                    self._invalid("layout", str(exc))
            # One merge per tick: the engine's cost is per call, not per record.
            if batches:
                engine.add(RecordBatch.concat(batches))
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
        self._create_engine(self._first_layout, phase)
        return True

    def _create_engine(self, layout: BinLayout, phase: int) -> None:
        self.engine = QuantumEngine(
            layout=layout,
            quantum_ms=self.cfg.quantum_ms,
            phase_ms=phase,
            percentiles=self.cfg.percentiles,
            directions=ALL_DIRECTIONS,
            per_host=self.cfg.per_host,
            max_hosts=self.cfg.max_hosts,
            max_open_quanta=self.cfg.max_open_quanta,
            keep_hists=True,
            # Room for every host's rows over the lateness, without copies as it fills.
            capacity_rows=min(
                1 << 17,
                self.cfg.max_hosts * 2 * (self.cfg.lateness_ms // self.cfg.quantum_ms + 3),
            ),
        )
        self.buckets = BucketHistogram(
            layout, bucket_edges_s(layout, [r.threshold_ns for r in self.cfg.sla])
        )

    def flush(self) -> list[ClosedQuantum]:
        """Merge what is queued and close everything still open (shutdown)."""
        if not self._merge(self.now_ms(), force=True) or self.engine is None:
            return []
        rows = self.engine.flush()
        if rows:
            self._closed(rows, self.now_ms(), max(r.end_ms for r in rows))
        return rows

    def _closed(self, rows: list[ClosedQuantum], now: int, mark: int) -> None:
        ends = sorted({r.end_ms for r in rows})
        self.quanta_closed += len(ends)
        delays = np.array([now - e for e in ends], dtype=np.float64) / 1000.0
        self.close_delays_ms.extend(int(d * 1000) for d in delays)
        self._delay_counts += (delays[:, None] <= CLOSE_DELAY_EDGES_S[None, :]).sum(axis=0)
        self._delay_n += len(delays)
        self._delay_sum_s += float(delays.sum())
        if self.quanta is not None:
            self.quanta.write(rows)
        self._save_grid(max(mark, ends[-1]))
        assert self.buckets is not None  # noqa: S101 -- made with the engine
        for r in rows:
            if r.scope == "cluster" and r.hist is not None:
                self.buckets.add(r.direction, r.hist, r.stats.mean_ns)
        for t in self.alerts.observe(rows):
            self.transitions.append(t)
            log.info("sla %s", json.dumps(t.to_json(), separators=(",", ":")))
        self.snapshot = self._build_snapshot(rows)

    def _save_grid(self, closed_ms: int) -> None:
        """After the quanta file: remember the grid and how far it was published."""
        if self.state_path is None or self.engine is None or self.journal is None:
            return
        lay = self.engine.layout
        grid = GridState(
            self.cfg.quantum_ms,
            self.engine.phase_ms,
            (lay.group_nr, lay.coarseness, lay.unit),
            closed_ms,
        )
        try:
            grid.save(self.state_path)
        except OSError as exc:
            log.error("cannot save %s: %s", self.state_path, exc)
        self.journal.release(closed_ms)

    # -- exporter snapshot ----------------------------------------------------------------

    def _build_snapshot(self, rows: list[ClosedQuantum] | None = None) -> Snapshot:
        last_end = max((r.end_ms for r in rows), default=None) if rows else None
        prev = self.snapshot
        cluster = dict(prev.cluster)
        hosts: dict[tuple[str, str, str], float] = dict(prev.hosts) if not rows else {}
        saturated: dict[tuple[str, ...], float] = {}
        tail_share: dict[tuple[str, ...], float] = dict(prev.gauges.get(_TAIL_SHARE_KEY, {}))
        tail_alpha: dict[tuple[str, ...], float] = dict(prev.gauges.get(_TAIL_ALPHA_KEY, {}))
        rates: dict[tuple[str, ...], float] = dict(prev.gauges.get(_IOPS_KEY, {}))
        throughput: dict[tuple[str, ...], float] = dict(prev.gauges.get(_BPS_KEY, {}))
        if rows and last_end is not None:
            cluster = {}
            rates, throughput = {}, {}
            for r in rows:
                if r.end_ms != last_end:
                    continue
                if r.scope == "cluster":
                    rates[(r.direction,)] = r.iops or 0.0
                    throughput[(r.direction,)] = r.bytes_per_second or 0.0
                    if self.cfg.fit_tail and r.hist is not None and self.engine is not None:
                        fitted = self._fit(r.hist)
                        if fitted is not None:
                            tail_share[(r.direction,)] = fitted.tail_share
                            tail_alpha[(r.direction,)] = fitted.alpha
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
            ): _with_zeros(self.records, RESULTS),
            ("fiomon_invalid_messages", "Payloads refused, by reason.", ("reason",)): _with_zeros(
                self.invalid, INVALID_REASONS
            ),
            (
                "fiomon_lost_records",
                "Records never received (sequence gaps), by host.",
                ("host",),
            ): _with_zeros(self.lost, self._host_labels),
            (
                "fiomon_recovered_records",
                "Records received after being counted lost.",
                ("host",),
            ): _with_zeros(self.recovered, self._host_labels),
            ("fiomon_duplicate_records", "Records received again and dropped.", ("host",)): (
                _with_zeros(self.duplicates, self._host_labels)
            ),
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
            _SAT_KEY: saturated or dict(prev.gauges.get(_SAT_KEY, {})),
            _IOPS_KEY: rates,
            _BPS_KEY: throughput,
        }
        if self.cfg.fit_tail:
            gauges[_TAIL_SHARE_KEY] = tail_share
            gauges[_TAIL_ALPHA_KEY] = tail_alpha
        if engine is not None:
            late = Counter({self._host_label(h): n for h, n in engine.late_records.items()})
            counters[
                ("fiomon_late_records", "Records that reached a closed quantum.", ("host",))
            ] = _with_zeros(late, self._host_labels)
            counters[("fiomon_hosts_over_cap", "Hosts beyond max_hosts (cluster only).", ())] = {
                (): float(engine.hosts_over_cap)
            }
            counters[("fiomon_forced_closes", "Quanta closed early by max_open_quanta.", ())] = {
                (): float(engine.forced_closes)
            }
            gauges[("fiomon_open_quanta", "Quanta open now.", ())] = {(): float(engine.open_quanta)}
        firing = {(r.name, h or ""): 1 for r, h, _ in self.alerts.firing()}
        breach = {
            (name, host or ""): firing.get((name, host or ""), 0)
            for name, host in self.alerts.states
        }
        histograms = {
            (
                "fiomon_quantum_close_delay_seconds",
                "Wall-clock delay from a quantum's end to its close.",
            ): (
                tuple(CLOSE_DELAY_EDGES_S.tolist()),
                tuple(self._delay_counts.tolist()),
                float(self._delay_n),
                self._delay_sum_s,
            )
        }
        return Snapshot(
            histograms=histograms,
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

    def _fit(self, hist: npt.NDArray[np.float64]) -> Fit | None:
        """The head + tail fit of one closed quantum (None when it cannot be fitted)."""
        assert self.engine is not None  # noqa: S101 -- only called with closed rows
        try:
            return fit_histogram(hist, self.engine.layout)
        except FitError as exc:
            log.debug("tail fit skipped: %s", exc)
            self.fit_skipped += 1
            return None

    fit_skipped = 0

    def refresh_snapshot(self) -> None:
        """Rebuild the snapshot's counters between closes (scrapes see fresh counts)."""
        self.snapshot = self._build_snapshot(None)


_SAT_KEY = (
    "fiomon_cluster_latency_saturated",
    "1 if the percentile fell in fio's last bin (the value is a lower bound).",
    ("direction", "quantile"),
)


_TAIL_SHARE_KEY = (
    "fiomon_cluster_tail_share",
    "Share of the last closed quantum's I/Os in the power-law tail (fit_tail).",
    ("direction",),
)
_TAIL_ALPHA_KEY = (
    "fiomon_cluster_tail_exponent",
    "Density exponent alpha of the power-law tail, p(x) ~ x**-alpha (fit_tail).",
    ("direction",),
)
_IOPS_KEY = (
    "fiomon_cluster_iops",
    "I/Os per second of the last closed quantum, cluster-wide.",
    ("direction",),
)
_BPS_KEY = (
    "fiomon_cluster_throughput_bytes_per_second",
    "Bytes per second of the last closed quantum, cluster-wide.",
    ("direction",),
)


# Every counter series exists from the start (at 0), so rate() and alerts see it.
RESULTS = ("received", "duplicate", "refused", "invalid-future", "invalid-span")
INVALID_REASONS = (
    *(reason for _, reason in _REASONS),
    "invalid",
    "agent-mismatch",
    "streams-over-cap",
    "future",
    "span",
    "status",
)


def _with_zeros(counts: Counter[str], keys: Iterable[str]) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {(k,): 0.0 for k in keys}
    out.update({(k,): float(v) for k, v in counts.items()})
    return out


def _quantile_label(q: float) -> str:
    """``99`` -> ``0.99``, ``99.9`` -> ``0.999`` (Prometheus' quantile convention)."""
    return f"{q / 100:.6f}".rstrip("0").rstrip(".")
