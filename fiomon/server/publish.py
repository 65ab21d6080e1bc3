"""Publication of closed quanta, the same for both services: SLA alerts, gauges, buckets.

Every closed row goes to the alert book (SLA rules evaluated on each closed quantum) and
to the per-quantum gauges and the cumulative bucket histogram that ``/metrics`` exports;
:meth:`Publisher.snapshot` turns them and the service's counters into the immutable
:class:`~fiomon.server.exporter.Snapshot` the ``/metrics`` child renders. The quanta file
and what only one service shows (the aggregator's live page, the root's cells) stay with
the merger.

Revisions (issue 25) go through :meth:`Publisher.revise`: the gauges take a revision of
the quantum they show (older quanta's samples are not rewritten: Prometheus cannot), the
bucket histogram adds what the revisions added (its ``_count`` converges to every I/O),
and the alert book logs, without acting on it, a revision that changes a rule's verdict.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.config import AggregatorConfig
from fiomon.histogram import pct_key
from fiomon.server.alerts import AlertBook, Transition
from fiomon.server.exporter import BucketHistogram, Snapshot
from fiomon.server.metrics import Counts, Health, QuantumGauges, build_snapshot
from fiomon.server.tailshare import tail_shares


class Publisher:
    """The alert book, the gauges and the bucket histogram of one service.

    Args:
        cfg: the configuration (SLA rules, percentiles, the buckets' resolution).
        log: where alert transitions are logged (``sla ...``).
        fit_tail: export the tail fit's gauges (the aggregator's ``fit_tail``).
    """

    def __init__(self, cfg: AggregatorConfig, log: logging.Logger, *, fit_tail: bool) -> None:
        self.log = log
        self.latency = cfg.latency  # the label of the latency and SLA families
        self.buckets_per_octave = cfg.export.buckets_per_octave
        # Remembered a little past the horizon: the engine measures it from its newest
        # close, the book from the newest quantum it observed (at most a quantum apart).
        self.remember_ms = (
            cfg.revise_within_ms + 2 * cfg.quantum_ms if cfg.revise_within_ms > 0 else 0
        )
        self.alerts = AlertBook(cfg.sla, cfg.max_hosts, remember_ms=self.remember_ms)
        self.gauges = QuantumGauges(cfg.percentiles, fit_tail)
        # Exported at 0 from the start, with fio's standard bins (records with other bins
        # replace it once known): rate() and increase() see a series' growth only from its
        # first scrape on, so a series born with the first quantum's counts would lose
        # that quantum, a different share in every cell of a cross-cell sum.
        self.buckets = self._new_buckets(BinLayout())
        self.gauges.buckets = self.buckets
        # Per (quantum end, direction), the latest published cluster row's latency sum
        # (samples x mean, ns), for the horizon: a revision adds its difference to the
        # histogram's _sum exactly. Ends from _sums_from on are known (absent: the key
        # was not published, 0); earlier ones (before this process, or forgotten) are not.
        self._sums: dict[tuple[int, str], float] = {}
        self._sums_from: int | None = None

    def _new_buckets(self, layout: BinLayout) -> BucketHistogram:
        """A bucket histogram with an edge at each rule's threshold, every direction at 0."""
        return BucketHistogram.for_rules(
            layout, [r.threshold_ns for r in self.alerts.rules], self.buckets_per_octave
        )

    def use_layout(self, layout: BinLayout) -> None:
        """Export buckets of ``layout`` from now on (a new histogram if it differs)."""
        if layout != self.buckets.layout:
            self.buckets = self._new_buckets(layout)
            self.gauges.buckets = self.buckets

    def observe(
        self,
        rows: list[ClosedQuantum],
        now_ms: int,
        tails: Mapping[str, tuple[float, float]] | None = None,
    ) -> list[Transition]:
        """Closed rows into the gauges, the buckets and the alert book.

        Args:
            rows: rows of closed quanta.
            now_ms: the wall clock (epoch ms): the gauges' age.
            tails: per direction, the newest quantum's tail share and exponent (fit_tail).

        Returns:
            The alert transitions, each also logged.
        """
        self.gauges.observe(rows, now_ms, tails)
        if self.remember_ms > 0 and rows:
            self._keep_sums(rows)
        # Which hosts hold the tail above each SLA'd cluster percentile (host rows with
        # their histograms: the aggregator keeps them while it has SLA rules).
        wanted = {(r.direction, pct_key(r.percentile)) for r in self.alerts.rules}
        shares = tail_shares(rows, self.buckets.layout, wanted) if wanted and rows else []
        if rows:
            newest = max(r.end_ms for r in rows)
            self.gauges.tail_hosts = {
                (t.direction, t.percentile, h): share
                for t in shares
                if t.end_ms == newest
                for h, share in t.shares()
            }
        transitions = self.alerts.observe(rows, shares)
        for t in transitions:
            self.log.info("sla %s", t.log_text())
        return transitions

    def _keep_sums(self, rows: list[ClosedQuantum]) -> None:
        """Remember the cluster rows' latency sums; forget those beyond the horizon."""
        newest = max(r.end_ms for r in rows)
        if self._sums_from is None:
            self._sums_from = min(r.end_ms for r in rows)
        for r in rows:
            if r.scope == "cluster":
                self._sums[(r.end_ms, r.direction)] = r.stats.samples * r.stats.mean_ns
        cutoff = newest - self.remember_ms
        if self._sums_from < cutoff:
            self._sums_from = cutoff
            for k in [k for k in self._sums if k[0] < cutoff]:
                del self._sums[k]

    def revise(
        self,
        rows: list[ClosedQuantum],
        now_ms: int,
        added: Mapping[str, npt.NDArray[np.float64]],
    ) -> None:
        """Revision rows (``revised_at`` set) into the gauges, the buckets and the alert book.

        Args:
            rows: revision rows, each the full statistics of its revised quantum (not a
                delta), quanta oldest first.
            now_ms: the wall clock (epoch ms); unused by the gauges (a revision is no
                close: the close delay describes first publications).
            added: per cluster direction label, the bin counts (the engine's layout, the
                one :meth:`use_layout` was given) that these revisions added to their
                quanta: ``engine.take_added()``.

        What each part does with them:

        * gauges: only revision rows of the quantum they show (the latest closed) update
          them; revisions of older quanta leave every gauge as it is (Prometheus cannot
          rewrite the samples it scraped; the quanta file and the API are the record);
        * bucket histogram: ``added`` is added, so its ``_count`` counts every I/O, late
          ones merged included; its ``_sum`` grows by each revised cluster row's
          latency sum minus the one published before (exact), or, for a quantum this
          process did not publish within the horizon, by ``added`` at its bins' midpoints;
        * alert book: no state changes (a page is not withdrawn, nothing fires again); a
          rule whose verdict on the quantum differs from the first publication's is
          logged as a warning (``sla verdict revised {...}``: rule, host, quantum end,
          both values and the threshold) and counted
          (``fiomon_sla_revised_verdicts_total{rule}``).

        The caller counts the revised quanta (``Counts.quanta_revised``).

        Raises:
            ValueError: a direction's counts do not have the buckets' layout's bins.
        """
        del now_ms  # the signature matches observe(); nothing here depends on the clock
        nbins = self.buckets.layout.nbins
        for d, counts in added.items():  # checked first: nothing changes on a bad call
            if np.shape(counts) != (nbins,):
                msg = f"revision counts of {d} have shape {np.shape(counts)}, not ({nbins},)"
                raise ValueError(msg)
        self.gauges.revise(rows)
        self._add_buckets(rows, added)
        for v in self.alerts.revise(rows):
            self.log.warning("sla verdict revised %s", v.log_text())

    def _add_buckets(
        self, rows: list[ClosedQuantum], added: Mapping[str, npt.NDArray[np.float64]]
    ) -> None:
        """Add the revisions' bin counts, with their latency sum, to the bucket histogram."""
        layout = self.buckets.layout
        # The latency sum each direction's revisions added: exact where the previous
        # publication's sum is known (absent within the known range: first published now).
        delta: dict[str, float] = {}
        exact: dict[str, bool] = {}
        for r in rows:
            if r.scope != "cluster":
                continue
            k = (r.end_ms, r.direction)
            total = r.stats.samples * r.stats.mean_ns
            known = self._sums_from is not None and r.end_ms >= self._sums_from
            delta[r.direction] = delta.get(r.direction, 0.0) + total - self._sums.get(k, 0.0)
            exact[r.direction] = exact.get(r.direction, True) and known
            if known:
                self._sums[k] = total
        for d, counts in added.items():
            hist = np.asarray(counts, dtype=np.float64)
            n = float(hist.sum())
            if n <= 0:
                continue
            # Not published here within the horizon: at the bins' midpoints (fio's bins are
            # under 2 % wide, and these are a revision's few I/Os).
            sum_ns = delta[d] if exact.get(d, False) else float(hist @ layout.mids_ns())
            self.buckets.add(d, hist, sum_ns / n)

    def snapshot(self, counts: Counts, health: Health) -> Snapshot:
        """What ``/metrics`` serves now (counters, health, gauges, buckets, alerts)."""
        return build_snapshot(counts, self.gauges, health, self.alerts, self.latency)
