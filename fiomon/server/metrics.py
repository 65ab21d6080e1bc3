"""Every ``fiomon_*`` series the aggregator exports, built into one immutable snapshot.

The aggregator core keeps plain counters (:class:`Counts`); :class:`QuantumGauges` keeps
what the last closed quantum said. :func:`build_snapshot` turns both into a
:class:`~fiomon.server.exporter.Snapshot` once per close (and at most once a second between
closes, for the counters), never per scrape: the exporter renders a snapshot to bytes once
and serves those bytes to every scraper.

Counters start from 0 in every process (a restart resets them, which ``rate()`` and
``increase()`` handle); every label value that can occur is present from the start, at 0,
so alerts see a series before its first increment.

Names and meanings: ``docs/metrics.md`` (the contract; the README's migration note lists
the names before issue 12)::

    # TYPE fiomon_records_total counter
    fiomon_records_total{result="received"} 1.2e+06
    # TYPE fiomon_late_records_total counter
    fiomon_late_records_total{host="_other"} 5.0
    # TYPE fiomon_hosts_up gauge
    fiomon_hosts_up 1000.0
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fiomon.closed import ClosedQuantum
from fiomon.histogram import pct_key
from fiomon.model import LatencyKind
from fiomon.server.alerts import AlertBook
from fiomon.server.exporter import BucketHistogram, Snapshot
from fiomon.wire import REASONS

OTHER_HOST = "_other"  # label of per-host counters beyond the host cap
CLOSE_DELAY_EDGES_S = np.array([0.25, 0.5, 1, 1.5, 2, 3, 4, 5, 5.5, 6, 7, 8, 10, 15, 30, 60])

# The families that describe latencies (percentiles, their bounds and saturation, the
# tail, SLA rules) carry ``latency``: the kind the aggregator merges (its ``latency``
# setting, issue 27); so do the exporter's own (Snapshot.latency).
# Every label value that can occur; each series exists from the start, at 0.
RESULTS = (
    "received",
    "duplicate",
    "refused",
    "invalid-future",
    "invalid-span",
    "replayed",
    "wrong_latency",  # of another latency kind than the aggregator's (issue 27)
)
INVALID_REASONS = (
    *REASONS,
    "agent-mismatch",
    "streams-over-cap",
    "future",
    "span",
    "status",
    "status-oversized",
    "internal",
)
STATE_ERRORS = (
    "lock",
    "state-unreadable",
    "state-lost",
    "state-write",
    "journal-unreadable",
    "journal-torn",
    "journal-corrupt",
    "journal-write",
    "quanta-file-torn",
    "quanta-file-write",
    "quanta-file-dropped",
)
ALERT_SINKS = (("webhook", "sent"), ("webhook", "failed"), ("webhook", "dropped"))
ALERT_SINKS_MQTT = (("mqtt", "queued"), ("mqtt", "dropped"), ("mqtt", "failed"))

Key = tuple[str, str, tuple[str, ...]]  # (metric name, help, label names)
Table = dict[tuple[str, ...], float]

SATURATED = (
    "fiomon_cluster_latency_percentile_saturated",
    "1 if the percentile fell in fio's last bin (the value is a lower bound).",
    ("direction", "percentile", "latency"),
)
BUILD_INFO = (
    "fiomon_build_info",
    "Always 1; the labels say which fiomon (version, git revision) and Python run.",
    ("version", "revision", "python"),
)
# The configured cell name. Not ``cell``: Prometheus' target label of the multi-cell
# config is ``cell``, and a clash would rename this one ``exported_cell``; the rules
# compare the two (FiomonCellMislabelled).
CELL_INFO = (
    "fiomon_cell_info",
    "Always 1; the cell this aggregator serves (its cell setting).",
    ("name",),
)
SLA_THRESHOLD = (
    "fiomon_sla_threshold_seconds",
    "The SLA rule's threshold (the aggregator's configuration, for dashboards).",
    ("rule", "direction", "percentile", "latency"),
)
# Confidence intervals of the cluster percentiles (issue 15). New families, so the latency
# gauges keep their names; ``percentile`` ("99", "99.9") rather than ``quantile``, which
# promtool reserves for summaries. A side the data cannot bound has no sample.
CI_LOWER = (
    "fiomon_cluster_latency_percentile_lower_seconds",
    "Lower confidence bound (confidence_level) of the last closed quantum's percentile.",
    ("direction", "percentile", "latency"),
)
CI_UPPER = (
    "fiomon_cluster_latency_percentile_upper_seconds",
    "Upper confidence bound (confidence_level) of the last closed quantum's percentile.",
    ("direction", "percentile", "latency"),
)
TAIL_SHARE = (
    "fiomon_cluster_tail_share",
    "Share of the last closed quantum's I/Os in the power-law tail (fit_tail).",
    ("direction", "latency"),
)
TAIL_ALPHA = (
    "fiomon_cluster_tail_exponent",
    "Density exponent alpha of the power-law tail, p(x) ~ x**-alpha (fit_tail).",
    ("direction", "latency"),
)
# Which hosts hold the cluster's tail (fiomon.server.tailshare): only the top hosts of
# each SLA'd direction and percentile, so its series are bounded whatever the hosts.
TAIL_HOSTS = (
    "fiomon_tail_share",
    "Share (0..1) of the last closed quantum's cluster I/Os above the cluster percentile "
    "(its fio bin and up) that the host holds; the top 5 hosts per SLA rule's direction "
    "and percentile.",
    ("direction", "percentile", "host", "latency"),
)
IOPS = (
    "fiomon_cluster_iops",
    "I/Os per second of the last closed quantum, cluster-wide.",
    ("direction",),
)
THROUGHPUT = (
    "fiomon_cluster_throughput_bytes_per_second",
    "Bytes per second of the last closed quantum, cluster-wide.",
    ("direction",),
)

# Run identity (issue 26): the run labels of the newest closed quantum's cluster rows (the
# agents' ``run``). Few at a time, and withdrawn when idle, like the percentiles.
RUN_INFO = (
    "fiomon_run_info",
    "Always 1; a run (agents' run label) with I/Os in the last closed quantum.",
    ("run",),
)

# Completeness (issue 24), fed from the rows by the Publisher, so the aggregator and the
# root export them alike. A quantum is incomplete when a host the aggregator expected
# sent nothing for it, or a cell the root expected is missing from it.
QUANTA_INCOMPLETE = (
    "fiomon_quanta_incomplete",
    "Quanta closed with complete: false (a host or cell that was expected is missing).",
    (),
)
QUANTUM_COMPLETE = (
    "fiomon_quantum_complete",
    "1 if the last closed quantum (the one the percentile gauges describe) held every host "
    "or cell expected, 0 if one was missing.",
    (),
)

# Revisions (issue 25): late records within revise_within are merged into a revision of
# their quantum; only those beyond it are late in the old sense (counted, not merged).
LATE_RECORDS = (
    "fiomon_late_records",
    "Records that reached a closed quantum beyond the revision horizon (revise_within): "
    "counted, not merged (missing from the quanta file).",
    ("host",),
)
LATE_MERGED = (
    "fiomon_late_records_merged",
    "Late records merged into a revision of their quantum (within revise_within).",
    ("host",),
)
QUANTA_REVISED = (
    "fiomon_quanta_revised",
    "Quanta republished with a revision (late records merged in; the quanta file has it).",
    (),
)
SLA_REVISED_VERDICTS = (
    "fiomon_sla_revised_verdicts",
    "Revision rows on which an SLA rule's verdict differs from the first publication's "
    "(logged; alerts evaluate first publications only).",
    ("rule", "latency"),
)

# A cell's partials outbox (issue 16; only with a ``partials`` section).
PARTIALS_BACKLOG = (
    "fiomon_partials_backlog_bytes",
    "Partials in the outbox the root has not acknowledged (journaled) yet.",
    (),
)
PARTIALS_BACKLOG_MESSAGES = (
    "fiomon_partials_backlog_messages",
    "Partials messages in the outbox the root has not acknowledged (journaled) yet.",
    (),
)
PARTIALS_MESSAGES = (
    "fiomon_partials_messages",
    "Partials messages to the root: sent (PUBACKed), resent (after a rewind to the "
    "root's acknowledgement), dropped unacknowledged, or refused by the root's broker.",
    ("result",),
)
# The root's own families (``fiomon root``). With root.cells given, only listed cells
# count in cells_up (an unlisted one shows in cell_up), so cells_up < cells_expected
# means a listed cell is missing.
ROOT_CELLS_UP = (
    "fiomon_root_cells_up",
    "Cells heard from within root.cell_timeout (only those in root.cells, if given).",
    (),
)
ROOT_CELLS_EXPECTED = ("fiomon_root_cells_expected", "Cells listed in root.cells.", ())
ROOT_CELL_UP = ("fiomon_root_cell_up", "1 while the cell is heard from, else 0.", ("cell",))
ROOT_ROW_OUTCOMES = ("merged", "revised", "duplicate", "late", "future")
ROOT_PARTIAL_ROWS = (
    "fiomon_root_partial_rows",
    "Partial rows by outcome (merged, revised: merged into a revision of a closed quantum, "
    "duplicate, late: beyond revise_within, future).",
    ("outcome",),
)
ROOT_INVALID_PARTIALS = (
    "fiomon_root_invalid_partials",
    "Partials messages refused, by reason.",
    ("reason",),
)
ROOT_PARTIALS_MESSAGES = (
    "fiomon_root_partials_messages",
    "Partials messages taken from each cell (refused ones not counted).",
    ("cell",),
)
ROOT_PARTIALS_GAPS = (
    "fiomon_root_partials_gaps",
    "Holes in a cell's partials message numbers (each asked of the cell again).",
    ("cell",),
)
ROOT_PARTIALS_LOST = (
    "fiomon_root_partials_lost_messages",
    "A cell's partials messages given up on: a hole that never filled.",
    ("cell",),
)
ROOT_CLOSED_BY_LATENESS = (
    "fiomon_root_quanta_closed_by_lateness",
    "Quanta the root closed while a listed cell had not closed them.",
    (),
)
ROOT_QUANTA_MISSING_CELL = (
    "fiomon_root_quanta_missing_cell",
    "Quanta the root closed without the cell (it is in their cells_missing).",
    ("cell",),
)
ROOT_CELL_MARK_LAG = (
    "fiomon_root_cell_mark_lag_seconds",
    "Root clock minus the cell's latest closed mark, at its receipt.",
    ("cell",),
)


@dataclass(slots=True)
class Counts:
    """The aggregator core's counters, as plain numbers (read on the event loop only).

    Args:
        records: records by result (:data:`RESULTS`).
        invalid: refused payloads by reason (:data:`INVALID_REASONS`).
        lost: records never received (sequence gaps), by host label.
        recovered: records received after being counted lost, by host label.
        duplicates: records received again and dropped, by host label.
        late: records that reached a closed quantum beyond the revision horizon
            (``revise_within``; every closed quantum when it is 0): counted, not merged,
            by host label (over-cap hosts summed into :data:`OTHER_HOST`).
        late_merged: late records merged into revisions (within the horizon), by host
            label, capped like ``late`` (the aggregator fills it from the engine's
            ``revised_records``; the root leaves it empty).
        id_conflicts: two agents seen with one id, by host.
        state_errors: problems with the state directory or quanta file, by kind.
        alert_deliveries: alert notifications by ``(sink, result)``.
        quanta_closed: quanta closed.
        quanta_revised: quanta republished with a revision: each distinct quantum end
            among the rows of one :meth:`~fiomon.server.publish.Publisher.revise` call
            counts once. The caller increments it, beside ``quanta_closed`` (both
            services count their own closes): ``len({r.end_ms for r in rows})``.
        kept_forgotten: closed quanta forgotten before the revision horizon because the
            kept quanta's memory reached its bound (late records for them are late).
        hosts_over_cap: hosts beyond ``max_hosts``.
        forced_closes: quanta closed early by ``max_open_quanta``.
        fits_skipped: tail fits (``fit_tail``) that failed on a quantum's histogram.
        session_takeovers: times the broker handed our MQTT session to another client.
        metrics_server_restarts: times the ``/metrics`` server process died and was
            replaced (written by its feeding thread only).
        host_labels: every host label in use (counters get a 0 series for each).
    """

    records: Counter[str] = field(default_factory=Counter)
    invalid: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)
    recovered: Counter[str] = field(default_factory=Counter)
    duplicates: Counter[str] = field(default_factory=Counter)
    late: Counter[str] = field(default_factory=Counter)
    late_merged: Counter[str] = field(default_factory=Counter)
    id_conflicts: Counter[str] = field(default_factory=Counter)
    state_errors: Counter[str] = field(default_factory=Counter)
    alert_deliveries: Counter[tuple[str, str]] = field(default_factory=Counter)
    quanta_closed: int = 0
    quanta_revised: int = 0
    kept_forgotten: int = 0
    hosts_over_cap: int = 0
    forced_closes: int = 0
    fits_skipped: int = 0
    session_takeovers: int = 0
    metrics_server_restarts: int = 0
    host_labels: set[str] = field(default_factory=set)
    # A 0 series per host label, built again only when labels were added (labels are
    # never removed, so the count tells): a snapshot a second copies it, not rebuilds it.
    _host_zeros: tuple[int, Table] = field(default=(0, {}), init=False, repr=False, compare=False)

    def host_zeros(self) -> Table:
        """``{(host,): 0.0}`` for every host label (shared: copy before changing it)."""
        if self._host_zeros[0] != len(self.host_labels):
            zeros: Table = dict.fromkeys(((h,) for h in self.host_labels), 0.0)
            self._host_zeros = (len(self.host_labels), zeros)
        return self._host_zeros[1]


@dataclass(frozen=True, slots=True)
class Health:
    """Gauges about the aggregator itself, sampled when a snapshot is built.

    Args:
        hosts_up: hosts that sent records, or a fresh online status, recently.
        streams: streams tracked for dedup.
        open_quanta: quanta open now (None before the engine exists).
        kept_quanta: closed quanta kept for revisions (``revise_within``); None: none
            kept (no engine yet, or revisions off).
        kept_bytes: the memory they hold, bytes.
        session_taken_over: 1 while another client holds our MQTT session.
        broker_connected: whether the MQTT session is up now.
        backlog_max: the most MQTT messages that waited in the aggregator unprocessed at
            once since it started (bounded by ``max_inflight``).
        active: records arrived within the idle time (``2 x lateness``); while False
            the per-quantum series are left out (Prometheus marks them stale).
        last_seen_s: host label -> when its last records or online status came (epoch s).
        version: fiomon's version (``fiomon_build_info``).
        revision: the git commit fiomon was built from (:func:`fiomon.build.revision`).
        python: the interpreter's version.
        cell: the cell this aggregator serves (``fiomon_cell_info``), "" for none.
    """

    hosts_up: int = 0
    streams: int = 0
    open_quanta: int | None = None
    kept_quanta: int | None = None
    kept_bytes: int = 0
    session_taken_over: bool = False
    broker_connected: bool = False
    backlog_max: int = 0
    active: bool = False
    last_seen_s: Mapping[str, float] = field(default_factory=dict)
    version: str = ""
    revision: str = ""
    python: str = ""
    cell: str = ""


@dataclass(slots=True)
class QuantumGauges:
    """What the last closed quantum said, kept between closes (the latency gauges).

    Args:
        percentiles: the configured percentiles.
        fit_tail: whether tail-fit gauges are exported.
    """

    percentiles: tuple[float, ...]
    fit_tail: bool = False
    quantum_end_s: float | None = None
    end_ms: int | None = None  # the same quantum's end, exact (revisions match on it)
    cluster: dict[tuple[str, str], float] = field(default_factory=dict)
    hosts: dict[tuple[str, str, str], float] = field(default_factory=dict)
    saturated: Table = field(default_factory=dict)
    iops: Table = field(default_factory=dict)
    throughput: Table = field(default_factory=dict)
    tail_share: Table = field(default_factory=dict)
    tail_alpha: Table = field(default_factory=dict)
    tail_hosts: Table = field(default_factory=dict)  # set by the Publisher (TAIL_HOSTS)
    ci_lower: Table = field(default_factory=dict)
    ci_upper: Table = field(default_factory=dict)
    buckets: BucketHistogram | None = None
    delay_counts: npt.NDArray[np.float64] = field(
        default_factory=lambda: np.zeros(len(CLOSE_DELAY_EDGES_S))
    )
    delay_n: int = 0
    delay_sum_s: float = 0.0
    incomplete: int = 0  # quanta closed with a row saying complete: false
    complete: bool | None = None  # whether the last closed quantum was complete
    runs: tuple[str, ...] = ()  # run labels of the last closed quantum's cluster rows

    def observe(
        self,
        rows: list[ClosedQuantum],
        now_ms: int,
        tails: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        """Take the rows of one close (quanta oldest first).

        Args:
            rows: the closed rows.
            now_ms: wall clock at the close (for the close delay).
            tails: direction -> (tail share, exponent) of the newest quantum (fit_tail).
        """
        ends = sorted({r.end_ms for r in rows})
        delays = np.array([now_ms - e for e in ends], dtype=np.float64) / 1000.0
        self.delay_counts += (delays[:, None] <= CLOSE_DELAY_EDGES_S[None, :]).sum(axis=0)
        self.delay_n += len(delays)
        self.delay_sum_s += float(delays.sum())
        if self.buckets is not None:
            for r in rows:
                if r.scope == "cluster" and r.hist is not None:
                    self.buckets.add(r.direction, r.hist, r.stats.mean_ns)
        last = ends[-1]
        self.end_ms = last
        self.quantum_end_s = last / 1000.0
        # A quantum is incomplete when any of its rows says so (a host the aggregator
        # expected, a cell the root expected, missing): its cluster rows do.
        partial = {r.end_ms for r in rows if not r.complete}
        self.incomplete += len(partial)
        self.complete = last not in partial
        t = self._tables([r for r in rows if r.end_ms == last])
        self.runs = _runs(r for r in rows if r.end_ms == last)
        self.cluster, self.hosts, self.iops, self.throughput = t.cluster, t.hosts, t.iops, t.put
        self.ci_lower, self.ci_upper = t.ci_lower, t.ci_upper
        if t.saturated:
            self.saturated = t.saturated
        for d, (share, alpha) in (tails or {}).items():
            self.tail_share[(d,)] = share
            self.tail_alpha[(d,)] = alpha

    def revise(self, rows: list[ClosedQuantum]) -> None:
        """Take revision rows: those of the quantum the gauges show replace its values.

        The gauges describe the latest closed quantum only. Revisions of older quanta
        change nothing here: Prometheus keeps the samples it scraped and has no way to
        rewrite them (the quanta file and ``/api/v1/quanta`` are the record). A revised
        key replaces its own series (a cluster direction's percentiles, bounds, rates;
        one host and direction's percentiles); the others stay. The close delay, the
        incomplete count and the tail fit (``fit_tail``) describe first publications
        and stay too. ``complete`` follows the revision's cluster rows: a host or cell
        that arrives late makes the quantum complete.
        """
        mine = [r for r in rows if self.end_ms is not None and r.end_ms == self.end_ms]
        if not mine:
            return
        t = self._tables(mine)
        dirs = {r.direction for r in mine if r.scope == "cluster"}
        keys = {(r.host, r.direction) for r in mine if r.scope == "host" and r.host is not None}
        # New dicts, never changed in place: a snapshot may hold the old ones (hosts).
        self.cluster = {k: v for k, v in self.cluster.items() if k[0] not in dirs} | t.cluster
        self.saturated = {k: v for k, v in self.saturated.items() if k[0] not in dirs}
        self.saturated |= t.saturated
        self.iops = {k: v for k, v in self.iops.items() if k[0] not in dirs} | t.iops
        self.throughput = {k: v for k, v in self.throughput.items() if k[0] not in dirs} | t.put
        self.ci_lower = {k: v for k, v in self.ci_lower.items() if k[0] not in dirs}
        self.ci_lower |= t.ci_lower
        self.ci_upper = {k: v for k, v in self.ci_upper.items() if k[0] not in dirs}
        self.ci_upper |= t.ci_upper
        if keys:
            self.hosts = {k: v for k, v in self.hosts.items() if k[:2] not in keys} | t.hosts
        cluster = [r for r in mine if r.scope == "cluster"]
        if cluster:
            self.complete = all(r.complete for r in cluster)
            self.runs = tuple(sorted({*self.runs, *_runs(cluster)}))

    def _tables(self, rows: list[ClosedQuantum]) -> _Tables:
        """The gauges' tables of one quantum's rows (seconds; labels as exported)."""
        # The percentile label is the quanta file's key ("99", "99.9"): legends read p99.
        labels = [(pct_key(q), pct_key(q)) for q in self.percentiles]
        t = _Tables()
        for r in rows:
            pct = r.stats.percentiles_ns
            if r.scope == "cluster":
                t.iops[(r.direction,)] = r.iops or 0.0
                t.put[(r.direction,)] = r.bytes_per_second or 0.0
                for key, ql in labels:
                    v = pct.get(key)
                    if v is not None:
                        t.cluster[(r.direction, ql)] = v / 1e9
                        t.saturated[(r.direction, ql)] = float(key in r.stats.saturated)
                    low, high = (r.ci_ns or {}).get(key, (None, None))
                    if low is not None:
                        t.ci_lower[(r.direction, key)] = low / 1e9
                    if high is not None:
                        t.ci_upper[(r.direction, key)] = high / 1e9
            elif r.host is not None:
                for key, ql in labels:
                    v = pct.get(key)
                    if v is not None:
                        t.hosts[(r.host, r.direction, ql)] = v / 1e9
        return t


@dataclass(slots=True)
class _Tables:
    """One quantum's gauge values, as :class:`QuantumGauges` holds them."""

    cluster: dict[tuple[str, str], float] = field(default_factory=dict)
    hosts: dict[tuple[str, str, str], float] = field(default_factory=dict)
    saturated: Table = field(default_factory=dict)
    iops: Table = field(default_factory=dict)
    put: Table = field(default_factory=dict)  # throughput, bytes per second
    ci_lower: Table = field(default_factory=dict)
    ci_upper: Table = field(default_factory=dict)


def _runs(rows: Iterable[ClosedQuantum]) -> tuple[str, ...]:
    """The sorted run labels of the cluster rows among ``rows``."""
    return tuple(sorted({run for r in rows if r.scope == "cluster" for run in r.runs}))


def _with_zeros(counts: Mapping[str, int], keys: Iterable[str] | Table) -> Table:
    """``counts`` as a table, with a 0 for every key (or every key of a zero table)."""
    out: Table = dict(keys) if isinstance(keys, dict) else dict.fromkeys(((k,) for k in keys), 0.0)
    out.update({(k,): float(v) for k, v in counts.items()})
    return out


def _kind(table: Mapping[tuple[str, ...], float], latency: str) -> Table:
    """``table`` with the ``latency`` label's value after each key's others."""
    return {(*k, latency): v for k, v in table.items()}


def build_snapshot(
    counts: Counts,
    gauges: QuantumGauges,
    health: Health,
    alerts: AlertBook,
    latency: LatencyKind = "clat",
) -> Snapshot:
    """Everything ``/metrics`` shows now, as an immutable snapshot (copies, not views).

    ``latency`` is the kind the latency and SLA families are labelled with.
    """
    hosts = counts.host_zeros()
    counters: dict[Key, Table] = {
        (
            "fiomon_records",
            "Records by result (received, duplicate, refused, invalid-*, replayed, wrong_latency).",
            ("result",),
        ): _with_zeros(counts.records, RESULTS),
        ("fiomon_invalid_messages", "Payloads refused, by reason.", ("reason",)): _with_zeros(
            counts.invalid, INVALID_REASONS
        ),
        (
            "fiomon_lost_records",
            "Records never received (sequence gaps), by host.",
            ("host",),
        ): _with_zeros(counts.lost, hosts),
        (
            "fiomon_recovered_records",
            "Records received after being counted lost.",
            ("host",),
        ): _with_zeros(counts.recovered, hosts),
        ("fiomon_duplicate_records", "Records received again and dropped.", ("host",)): (
            _with_zeros(counts.duplicates, hosts)
        ),
        LATE_RECORDS: _with_zeros(counts.late, hosts),
        LATE_MERGED: _with_zeros(counts.late_merged, hosts),
        ("fiomon_quanta_closed", "Quanta closed.", ()): {(): float(counts.quanta_closed)},
        QUANTA_REVISED: {(): float(counts.quanta_revised)},
        SLA_REVISED_VERDICTS: {
            (k, latency): float(v) for k, v in sorted(alerts.revised_verdicts.items())
        },
        QUANTA_INCOMPLETE: {(): float(gauges.incomplete)},
        ("fiomon_agent_id_conflicts", "Two agents seen with one id.", ("host",)): {
            (k,): float(v) for k, v in counts.id_conflicts.items()
        },
        ("fiomon_hosts_over_cap", "Hosts beyond max_hosts (cluster only).", ()): {
            (): float(counts.hosts_over_cap)
        },
        ("fiomon_forced_closes", "Quanta closed early by max_open_quanta.", ()): {
            (): float(counts.forced_closes)
        },
        (
            "fiomon_revision_quanta_forgotten",
            "Closed quanta forgotten before revise_within: their kept histograms reached "
            "the memory bound (late records for them are counted late).",
            (),
        ): {(): float(counts.kept_forgotten)},
        (
            "fiomon_tail_fits_skipped",
            "Tail fits (fit_tail) that failed on a quantum's histogram (too few I/Os, ...).",
            (),
        ): {(): float(counts.fits_skipped)},
        (
            "fiomon_state_errors",
            "Problems with the state directory, journal or quanta file, by kind.",
            ("kind",),
        ): _with_zeros(counts.state_errors, STATE_ERRORS),
        (
            "fiomon_alert_notifications",
            "Alert notifications by sink and result (sent, failed, dropped).",
            ("sink", "result"),
        ): {
            **dict.fromkeys((*ALERT_SINKS, *ALERT_SINKS_MQTT), 0.0),
            **{k: float(v) for k, v in counts.alert_deliveries.items()},
        },
        (
            "fiomon_mqtt_session_takeovers",
            "Times another client with our client_id took our MQTT session.",
            (),
        ): {(): float(counts.session_takeovers)},
        (
            "fiomon_metrics_server_restarts",
            "Times the /metrics server process died and was replaced.",
            (),
        ): {(): float(counts.metrics_server_restarts)},
    }
    gauges_out: dict[Key, Table] = {
        (
            "fiomon_hosts_up",
            "Hosts that sent records or a fresh online status within host_timeout.",
            (),
        ): {(): float(health.hosts_up)},
        ("fiomon_streams", "Streams tracked for dedup.", ()): {(): float(health.streams)},
        (
            "fiomon_mqtt_session_taken_over",
            "1 while another client holds our MQTT session (this aggregator stopped reading).",
            (),
        ): {(): float(health.session_taken_over)},
        (
            "fiomon_broker_connected",
            "1 while the aggregator's MQTT session with the broker is up.",
            (),
        ): {(): float(health.broker_connected)},
        (
            "fiomon_intake_backlog_messages_max",
            "Most MQTT messages waiting unprocessed in the aggregator at once since start"
            " (at most max_inflight; the broker holds the rest).",
            (),
        ): {(): float(health.backlog_max)},
        (
            "fiomon_benchmark_active",
            "1 while records arrive (within 2 x lateness); 0 when idle between runs.",
            (),
        ): {(): float(health.active)},
        BUILD_INFO: {(health.version, health.revision, health.python): 1.0},
        (
            "fiomon_host_last_seen_timestamp_seconds",
            "When the host's last records or online status arrived (Unix time; max_hosts).",
            ("host",),
        ): {(h,): t for h, t in health.last_seen_s.items()},
        SLA_THRESHOLD: {
            (r.name, r.direction, pct_key(r.percentile), latency): r.threshold_ns / 1e9
            for r in alerts.rules
        },
    }
    if health.cell:
        gauges_out[CELL_INFO] = {(health.cell,): 1.0}
    if gauges.complete is not None:
        # Beside fiomon_quantum_end_timestamp_seconds: it describes the same quantum.
        gauges_out[QUANTUM_COMPLETE] = {(): float(gauges.complete)}
    if health.active:
        # Idle withdraws these: a benchmark that ended has no "current" percentile.
        gauges_out[SATURATED] = _kind(gauges.saturated, latency)
        gauges_out[IOPS] = dict(gauges.iops)
        gauges_out[THROUGHPUT] = dict(gauges.throughput)
        if gauges.runs:
            gauges_out[RUN_INFO] = {(run,): 1.0 for run in gauges.runs}
        if gauges.ci_lower or gauges.ci_upper:
            gauges_out[CI_LOWER] = _kind(gauges.ci_lower, latency)
            gauges_out[CI_UPPER] = _kind(gauges.ci_upper, latency)
        if gauges.tail_hosts:
            gauges_out[TAIL_HOSTS] = _kind(gauges.tail_hosts, latency)
        if gauges.fit_tail:
            gauges_out[TAIL_SHARE] = _kind(gauges.tail_share, latency)
            gauges_out[TAIL_ALPHA] = _kind(gauges.tail_alpha, latency)
    if health.open_quanta is not None:
        gauges_out[("fiomon_open_quanta", "Quanta open now.", ())] = {(): float(health.open_quanta)}
    if health.kept_quanta is not None:
        gauges_out[
            ("fiomon_revision_kept_quanta", "Closed quanta kept for revisions (revise_within).", ())
        ] = {(): float(health.kept_quanta)}
        gauges_out[
            (
                "fiomon_revision_kept_bytes",
                "Memory of the closed quanta kept for revisions (their histograms).",
                (),
            )
        ] = {(): float(health.kept_bytes)}
    firing = {(r.name, h or ""): 1 for r, h, _ in alerts.firing()}
    breach = {(name, host or ""): firing.get((name, host or ""), 0) for name, host in alerts.states}
    # Every rule has its cluster-scope series from the start (0): an alert sees it at once.
    for r in alerts.rules:
        if r.scope == "cluster":
            breach.setdefault((r.name, ""), 0)
    histograms = {
        (
            "fiomon_quantum_close_delay_seconds",
            "Wall-clock delay from a quantum's end to its close.",
        ): (
            tuple(CLOSE_DELAY_EDGES_S.tolist()),
            tuple(gauges.delay_counts.tolist()),
            float(gauges.delay_n),
            gauges.delay_sum_s,
        )
    }
    b = gauges.buckets
    return Snapshot(
        latency=latency,
        histograms=histograms,
        quantum_end_s=gauges.quantum_end_s,
        cluster=dict(gauges.cluster) if health.active else {},
        hosts=gauges.hosts if health.active else {},  # replaced, never changed, at each close
        edges_s=tuple(b.edges_s.tolist()) if b else (),
        buckets=b.frozen() if b else {},
        sla_breach=breach,
        sla_breaches=dict(alerts.breaches),
        counters=counters,
        gauges=gauges_out,
    )


def with_outbox(
    snap: Snapshot,
    *,
    backlog_bytes: int,
    sent: int,
    dropped: int,
    refused: int,
    backlog_messages: int = 0,
    resent: int = 0,
) -> Snapshot:
    """``snap`` plus a cell's partials outbox (issue 16): backlog, and messages by result.

    Args:
        snap: the cell's snapshot.
        backlog_bytes: partials the root has not acknowledged (bytes; issue 24).
        sent: messages the root's broker acknowledged (PUBACK), first time.
        dropped: messages dropped unacknowledged (outbox over its bound).
        refused: messages the root's broker refused (kept and retried).
        backlog_messages: messages the root has not acknowledged.
        resent: messages sent again after a rewind to the root's acknowledgement.
    """
    gauges = dict(snap.gauges)
    gauges[PARTIALS_BACKLOG] = {(): float(backlog_bytes)}
    gauges[PARTIALS_BACKLOG_MESSAGES] = {(): float(backlog_messages)}
    counters = dict(snap.counters)
    counters[PARTIALS_MESSAGES] = {
        ("sent",): float(sent),
        ("resent",): float(resent),
        ("dropped",): float(dropped),
        ("refused",): float(refused),
    }
    return dataclasses.replace(snap, gauges=gauges, counters=counters)


def with_root(
    snap: Snapshot,
    *,
    cells_up: int,
    cells_expected: int,
    cell_up: Mapping[str, bool],
    rows: Mapping[str, int],
    invalid: Mapping[str, int],
    closed_by_lateness: int,
    messages: Mapping[str, int] | None = None,
    missing: Mapping[str, int] | None = None,
    mark_lag_s: Mapping[str, float] | None = None,
    gaps: Mapping[str, int] | None = None,
    lost: Mapping[str, int] | None = None,
) -> Snapshot:
    """``snap`` plus the root's own families (``fiomon root``, issue 16).

    Args:
        snap: the root's snapshot.
        cells_up: live cells (only those in ``root.cells``, if given).
        cells_expected: cells listed in ``root.cells``.
        cell_up: every cell the root knows -> heard from within ``root.cell_timeout``.
        rows: partial rows by outcome (merged, duplicate, late, future).
        invalid: partials messages refused, by reason.
        closed_by_lateness: quanta closed on the root's lateness.
        messages: partials messages taken, by cell (``RootCounts.messages``); None
            leaves the family out.
        missing: quanta closed without each listed cell (``RootCounts.missing``); None
            leaves the family out.
        mark_lag_s: per cell with a mark, the root's clock minus its latest closed mark
            at receipt, s; None leaves the family out.
        gaps: holes in each cell's message numbers (issue 24); None leaves it out.
        lost: each cell's messages given up on (issue 24); None leaves it out.
    """
    gauges = dict(snap.gauges)
    gauges[ROOT_CELLS_UP] = {(): float(cells_up)}
    gauges[ROOT_CELLS_EXPECTED] = {(): float(cells_expected)}
    gauges[ROOT_CELL_UP] = {(c,): float(up) for c, up in sorted(cell_up.items())}
    counters = dict(snap.counters)
    counters[ROOT_PARTIAL_ROWS] = {(k,): float(rows.get(k, 0)) for k in ROOT_ROW_OUTCOMES}
    counters[ROOT_INVALID_PARTIALS] = {(k,): float(v) for k, v in invalid.items()}
    counters[ROOT_CLOSED_BY_LATENESS] = {(): float(closed_by_lateness)}
    if messages is not None:
        counters[ROOT_PARTIALS_MESSAGES] = {(c,): float(n) for c, n in sorted(messages.items())}
    if missing is not None:
        counters[ROOT_QUANTA_MISSING_CELL] = {(c,): float(n) for c, n in sorted(missing.items())}
    if mark_lag_s is not None:
        gauges[ROOT_CELL_MARK_LAG] = {(c,): lag for c, lag in sorted(mark_lag_s.items())}
    if gaps is not None:
        counters[ROOT_PARTIALS_GAPS] = {(c,): float(n) for c, n in sorted(gaps.items())}
    if lost is not None:
        counters[ROOT_PARTIALS_LOST] = {(c,): float(n) for c, n in sorted(lost.items())}
    return dataclasses.replace(snap, gauges=gauges, counters=counters)
