"""SLA rules that weigh evidence: ``confidence`` fires on the interval, not the estimate.

Quanta are real closed quanta of the engine, over fio histograms drawn from lognormal
latencies whose true p99 is known (tests/latencydists.py).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.config import SlaRule
from fiomon.engine import QuantumEngine
from fiomon.histogram import HistStats
from fiomon.server.alerts import AlertBook, AlertState, Phase, alertmanager_payload, evaluate
from tests.clock import T0
from tests.latencydists import batch_of_quanta, fio_quanta, lognormal_cdf

THRESHOLD_NS = 5e6
Z99 = NormalDist().inv_cdf(0.99)


def median_for_p99(p99_ns: float, sigma: float = 0.5) -> float:
    """The lognormal median whose true p99 is ``p99_ns``."""
    return p99_ns / math.exp(sigma * Z99)


def closed_quanta(hists: np.ndarray, *, level: float | None = 0.95) -> list[ClosedQuantum]:
    """The engine's cluster read rows of one quantum per histogram row, in time order."""
    engine = QuantumEngine(
        layout=BinLayout(),
        quantum_ms=1000,
        percentiles=(50, 99),
        directions=("read",),
        confidence_level=level,
    )
    engine.add(batch_of_quanta(hists))
    rows = engine.flush()
    assert len(rows) == len(hists)
    return rows


def rule(*, confidence: float | None, for_quanta: int = 1) -> SlaRule:
    return SlaRule(
        "p99-read" if confidence is None else "p99-read-sure",
        "read",
        99.0,
        THRESHOLD_NS,
        for_quanta=for_quanta,
        min_samples=100,
        confidence=confidence,
    )


def breaching(r: SlaRule, rows: list[ClosedQuantum]) -> list[bool]:
    """Per quantum, alone (from inactive): does it breach?"""
    out = []
    for row in rows:
        ci = (row.ci_ns or {}).get("99", (None, None))
        s = evaluate(
            r, row.stats.percentiles_ns["99"], row.stats.samples, AlertState(), 0, bounds_ns=ci
        )
        out.append(s.phase is not Phase.INACTIVE)
    return out


def test_a_p99_of_100_ios_above_the_threshold_by_chance_does_not_fire() -> None:
    # The true p99 is 10 % below the threshold; of 2000 quanta of 100 I/Os, many estimate
    # a p99 above it (100 I/Os: the p99 is about the 2nd slowest I/O).
    rng = np.random.default_rng(3)
    hists = fio_quanta(lognormal_cdf(median_for_p99(0.9 * THRESHOLD_NS)), 100, rng, 2000)
    rows = closed_quanta(hists)
    plain = breaching(rule(confidence=None), rows)
    sure = breaching(rule(confidence=0.95), rows)
    print(f"100 I/Os a quantum: {sum(plain)} of 2000 quanta breach without confidence")
    assert sum(plain) >= 100  # the noise is real: a rule without confidence pages on it
    print(f"... and {sum(sure)} with confidence 0.95")
    # The lower bound exceeds the true p99 in at most (1 - level) / 2 of the quanta: the
    # one-sided guarantee, and here far less (the bounds are conservative).
    assert sum(sure) <= 0.025 * len(rows)
    assert 20 * sum(sure) <= sum(plain)
    # 100 I/Os bound the p99 only from below.
    assert all(row.ci_ns is not None and row.ci_ns["99"][1] is None for row in rows)


def test_two_slow_ios_in_a_quantum_of_100_page_only_without_confidence() -> None:
    lay = BinLayout()
    lower, _ = lay.edges_ns()
    h = np.zeros((1, lay.nbins))
    h[0, np.searchsorted(lower, 1e6)] = 98  # 98 I/Os at about 1 ms
    h[0, np.searchsorted(lower, 10e6)] = 2  # 2 at 10 ms: the p99 is the 2nd slowest
    (row,) = closed_quanta(h)
    assert row.stats.percentiles_ns["99"] > THRESHOLD_NS
    assert breaching(rule(confidence=None), [row]) == [True]
    assert breaching(rule(confidence=0.95), [row]) == [False]
    assert row.ci_ns is not None
    low, high = row.ci_ns["99"]
    assert low is not None and low < THRESHOLD_NS
    assert high is None


def fire_quantum(r: SlaRule, rows: list[ClosedQuantum]) -> int | None:
    """Index of the quantum at which the rule starts firing (AlertBook, in order)."""
    book = AlertBook((r,))
    for i, row in enumerate(rows):
        for t in book.observe([row]):
            if t.new is Phase.FIRING:
                return i
    return None


def test_a_sustained_breach_at_10k_ios_fires_at_most_one_quantum_later() -> None:
    # 10 quanta with the true p99 at half the threshold, then 20 at 1.1 times it, then 10
    # at half again; 10,000 I/Os a quantum.
    rng = np.random.default_rng(8)
    good = lognormal_cdf(median_for_p99(0.5 * THRESHOLD_NS))
    bad = lognormal_cdf(median_for_p99(1.1 * THRESHOLD_NS))
    hists = np.concatenate(
        [
            fio_quanta(good, 10_000, rng, 10),
            fio_quanta(bad, 10_000, rng, 20),
            fio_quanta(good, 10_000, rng, 10),
        ]
    )
    rows = closed_quanta(hists)
    for for_quanta in (1, 3):
        plain = fire_quantum(rule(confidence=None, for_quanta=for_quanta), rows)
        sure = fire_quantum(rule(confidence=0.95, for_quanta=for_quanta), rows)
        print(f"for {for_quanta}: fires at quantum {plain} without confidence, {sure} with")
        assert plain is not None and plain >= 10
        assert sure is not None and sure <= plain + 1

    # The alert says why: at firing the lower bound decided, and it is above the threshold;
    # it resolves once the upper bound falls below the threshold.
    r = rule(confidence=0.95, for_quanta=3)
    book = AlertBook((r,))
    phases = []
    for row in rows:
        transitions = book.observe([row])
        for t in transitions:
            phases.append((t.new, t.state))
            if t.new is Phase.FIRING:
                (alert,) = alertmanager_payload(book, transitions, row.end_ms)
                notes = alert["annotations"]
                assert notes["decided_by"] == "lower"
                assert float(notes["lower_bound_ms"]) > THRESHOLD_NS / 1e6
                assert notes["confidence"] == "0.95"
                assert t.to_json()["decided_by"] == "lower"
            if t.new is Phase.RESOLVED:
                assert t.state.decided_by == "upper"
                assert t.state.upper_ns is not None and t.state.upper_ns < THRESHOLD_NS
    assert [p for p, _ in phases] == [
        Phase.PENDING,
        Phase.FIRING,
        Phase.RESOLVED,
        Phase.INACTIVE,
    ]
    (state,) = book.snapshot()
    assert state["decided_by"] == "lower"  # inactive again: breaching is asked next


def test_unbounded_sides_are_never_evidence() -> None:
    r = rule(confidence=0.95)
    s = evaluate(r, 9e6, 1000, AlertState(), 0, bounds_ns=(None, 9.5e6))
    assert s.phase is Phase.INACTIVE
    firing = AlertState(Phase.FIRING, 1, 0, 9e6, 0, 0)
    s = evaluate(r, 1e6, 1000, firing, 1000, bounds_ns=(5e5, None))
    assert s.phase is Phase.FIRING
    assert s.clearing == 0
    assert (s.lower_ns, s.upper_ns, s.decided_by) == (5e5, None, "upper")


# -- phases: pending, firing, resolved ---------------------------------------------------------


RULE = SlaRule("p99-read", "read", 99.0, 5e6, for_quanta=3, min_samples=100)


def run(values: list[float | None], samples: float = 1000) -> list[Phase]:
    s = AlertState()
    out = []
    for i, v in enumerate(values):
        s = evaluate(RULE, v, samples, s, T0 + 1000 * i)
        out.append(s.phase)
    return out


def test_alert_fires_after_for_quanta_and_resolves_with_hysteresis() -> None:
    off, pend, fire, res = Phase.INACTIVE, Phase.PENDING, Phase.FIRING, Phase.RESOLVED
    assert run([1e6, 6e6, 6e6, 6e6, 6e6]) == [off, pend, pend, fire, fire]
    # 4.8 ms is below the threshold but above the clear level (4.5 ms): still firing.
    assert run([6e6, 6e6, 6e6, 4.8e6, 4e6, 4e6, 4e6, 1e6]) == [
        pend,
        pend,
        fire,
        fire,
        fire,
        fire,
        res,
        off,
    ]
    assert run([6e6, 1e6, 6e6]) == [pend, off, pend]  # a good quantum resets pending


def test_quanta_without_enough_samples_are_no_evidence() -> None:
    s = AlertState()
    for _ in range(5):
        s = evaluate(RULE, 9e6, 10, s, T0)
    assert s.phase is Phase.INACTIVE
    s = evaluate(RULE, None, 0, AlertState(Phase.FIRING), T0)
    assert s.phase is Phase.FIRING


def _row(end_s: int, p99_ns: float, *, complete: bool = True) -> ClosedQuantum:
    """A cluster read row of the quantum ending ``end_s`` s after T0, with 1000 I/Os."""
    stats = HistStats(1000.0, 1e5, p99_ns / 3, p99_ns * 2, {"50": p99_ns / 3, "99": p99_ns}, ())
    end = T0 + 1000 * end_s
    return ClosedQuantum(end - 1000, end, "cluster", None, "read", stats, 1000.0, 4e6, 2, 0,
                         complete=complete)  # fmt: skip


def _phases(book: AlertBook, rows: list[ClosedQuantum]) -> list[Phase]:
    out = []
    for r in rows:
        book.observe([r])
        out.append(book.states[("p99-read", None)].phase)
    return out


def test_incomplete_quanta_neither_fire_nor_resolve_a_rule_that_holds() -> None:
    off, pend, fire, res = Phase.INACTIVE, Phase.PENDING, Phase.FIRING, Phase.RESOLVED
    hold = SlaRule("p99-read", "read", 99.0, THRESHOLD_NS, for_quanta=2, min_samples=100)
    assert hold.incomplete == "hold"
    book = AlertBook((hold,))
    # Breach, then an incomplete breaching quantum: pending holds at 1 (not 2) ...
    rows = [_row(1, 9e6), _row(2, 9e6, complete=False)]
    assert _phases(book, rows) == [pend, pend]
    assert book.states[("p99-read", None)].breaching == 1
    # ... a complete one fires; incomplete clear quanta do not count towards clear_for.
    rows = [_row(3, 9e6), *[_row(s, 1e6, complete=False) for s in range(4, 9)]]
    assert _phases(book, rows) == [fire] + [fire] * 5
    assert book.states[("p99-read", None)].clearing == 0
    assert _phases(book, [_row(9, 1e6), _row(10, 1e6), _row(11, 1e6)]) == [fire, res, off]
    # An incomplete quantum never starts an alert either, nor leaves a transition.
    assert book.observe([_row(12, 9e6, complete=False)]) == []
    assert book.states[("p99-read", None)].phase is off


def test_a_rule_with_incomplete_evaluate_takes_incomplete_quanta() -> None:
    rule = SlaRule(
        "p99-read", "read", 99.0, THRESHOLD_NS, for_quanta=2, min_samples=100,
        incomplete="evaluate",
    )  # fmt: skip
    book = AlertBook((rule,))
    rows = [_row(1, 9e6, complete=False), _row(2, 9e6, complete=False)]
    assert _phases(book, rows) == [Phase.PENDING, Phase.FIRING]
