"""Publication of closed quanta, the same for both services: SLA alerts, gauges, buckets.

Every closed row goes to the alert book (SLA rules evaluated on each closed quantum) and
to the per-quantum gauges and the cumulative bucket histogram that ``/metrics`` exports;
:meth:`Publisher.snapshot` turns them and the service's counters into the immutable
:class:`~fiomon.server.exporter.Snapshot` the ``/metrics`` child renders. The quanta file
and what only one service shows (the aggregator's live page, the root's cells) stay with
the merger.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.config import AggregatorConfig
from fiomon.server.alerts import AlertBook, Transition
from fiomon.server.exporter import BucketHistogram, Snapshot
from fiomon.server.metrics import Counts, Health, QuantumGauges, build_snapshot


class Publisher:
    """The alert book, the gauges and the bucket histogram of one service.

    Args:
        cfg: the configuration (SLA rules, percentiles, the buckets' resolution).
        log: where alert transitions are logged (``sla ...``).
        fit_tail: export the tail fit's gauges (the aggregator's ``fit_tail``).
    """

    def __init__(self, cfg: AggregatorConfig, log: logging.Logger, *, fit_tail: bool) -> None:
        self.log = log
        self.buckets_per_octave = cfg.export.buckets_per_octave
        self.alerts = AlertBook(cfg.sla, cfg.max_hosts)
        self.gauges = QuantumGauges(cfg.percentiles, fit_tail)
        # Exported at 0 from the start, with fio's standard bins (records with other bins
        # replace it once known): rate() and increase() see a series' growth only from its
        # first scrape on, so a series born with the first quantum's counts would lose
        # that quantum, a different share in every cell of a cross-cell sum.
        self.buckets = self._new_buckets(BinLayout())
        self.gauges.buckets = self.buckets

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
        transitions = self.alerts.observe(rows)
        for t in transitions:
            self.log.info("sla %s", t.log_text())
        return transitions

    def snapshot(self, counts: Counts, health: Health) -> Snapshot:
        """What ``/metrics`` serves now (counters, health, gauges, buckets, alerts)."""
        return build_snapshot(counts, self.gauges, health, self.alerts)
