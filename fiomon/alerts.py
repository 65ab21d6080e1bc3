"""SLA alerts: a pure state machine per rule and scope, evaluated on every closed quantum.

States follow Prometheus' alerting rules: ``inactive`` -> ``pending`` (breaching, fewer
than ``for`` quanta in a row) -> ``firing`` -> ``resolved`` (clear for ``clear_for``
quanta: below ``clear_below``, the hysteresis) -> ``inactive``. A quantum with fewer than
``min_samples`` I/Os (or none) is no evidence: the state holds. A value of a saturated
percentile is a lower bound at fio's cap, which is above any threshold, so it breaches.

:func:`evaluate` is pure; :class:`AlertBook` keeps the states of every rule and host and
returns the transitions, which the aggregator logs, counts, publishes and posts.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, replace

from fiomon.config import SlaRule
from fiomon.histogram import pct_key
from fiomon.windows import ClosedQuantum


class Phase(enum.StrEnum):
    """Where an alert is."""

    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class AlertState:
    """One alert's state.

    Args:
        phase: see :class:`Phase`.
        breaching: consecutive breaching quanta.
        clearing: consecutive clear quanta while firing.
        value_ns: the percentile of the last quantum with evidence.
        since_ms: when the current phase began (quantum end, ms).
        fired_ms: when it last started firing.
    """

    phase: Phase = Phase.INACTIVE
    breaching: int = 0
    clearing: int = 0
    value_ns: float | None = None
    since_ms: int = 0
    fired_ms: int | None = None


def evaluate(
    rule: SlaRule, value_ns: float | None, samples: float, state: AlertState, at_ms: int
) -> AlertState:
    """The state after a quantum ending at ``at_ms`` with percentile ``value_ns``."""
    if value_ns is None or samples < rule.min_samples:
        if state.phase is Phase.RESOLVED:
            return replace(state, phase=Phase.INACTIVE, since_ms=at_ms)
        return state
    over = value_ns > rule.threshold_ns
    if state.phase in (Phase.INACTIVE, Phase.RESOLVED):
        if not over:
            if state.phase is Phase.RESOLVED:
                return AlertState(Phase.INACTIVE, value_ns=value_ns, since_ms=at_ms)
            return replace(state, value_ns=value_ns)
        phase = Phase.FIRING if rule.for_quanta <= 1 else Phase.PENDING
        return AlertState(
            phase,
            breaching=1,
            value_ns=value_ns,
            since_ms=at_ms,
            fired_ms=at_ms if phase is Phase.FIRING else None,
        )
    if state.phase is Phase.PENDING:
        if not over:
            return AlertState(Phase.INACTIVE, value_ns=value_ns, since_ms=at_ms)
        n = state.breaching + 1
        if n >= rule.for_quanta:
            return AlertState(Phase.FIRING, n, 0, value_ns, at_ms, at_ms)
        return replace(state, breaching=n, value_ns=value_ns)
    # Firing: it resolves only after clear_for quanta below the clear level.
    if value_ns < rule.clear_ns:
        n = state.clearing + 1
        if n >= rule.clear_for:
            return AlertState(Phase.RESOLVED, 0, n, value_ns, at_ms, state.fired_ms)
        return replace(state, clearing=n, value_ns=value_ns)
    return replace(
        state, clearing=0, breaching=state.breaching + (1 if over else 0), value_ns=value_ns
    )


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of phase, to log, count, publish and post.

    Args:
        rule: the rule.
        host: the host for host-scope rules, else None.
        old: phase before.
        new: phase after.
        state: the new state.
        at_ms: end of the quantum that caused it.
    """

    rule: SlaRule
    host: str | None
    old: Phase
    new: Phase
    state: AlertState
    at_ms: int

    def to_json(self) -> dict[str, object]:
        """A structured log / MQTT object."""
        return {
            "rule": self.rule.name,
            "host": self.host,
            "from": self.old.value,
            "to": self.new.value,
            "direction": self.rule.direction,
            "percentile": self.rule.percentile,
            "threshold_ns": self.rule.threshold_ns,
            "value_ns": self.state.value_ns,
            "at_ms": self.at_ms,
        }


class AlertBook:
    """States of every rule (and host, for host-scope rules).

    Args:
        rules: the SLA rules.
        max_hosts: host-scope states kept per rule (more hosts are not evaluated and are
            counted in ``hosts_over_cap``).
    """

    def __init__(self, rules: tuple[SlaRule, ...], max_hosts: int = 1000) -> None:
        self.rules = rules
        self.max_hosts = max_hosts
        self.states: dict[tuple[str, str | None], AlertState] = {}
        self.breaches: dict[str, int] = {r.name: 0 for r in rules}
        self.hosts_over_cap = 0
        self._hosts: Counter[str] = Counter()

    def observe(self, rows: list[ClosedQuantum]) -> list[Transition]:
        """Evaluate every rule on one close's rows (quanta oldest first)."""
        out: list[Transition] = []
        by_end: dict[int, list[ClosedQuantum]] = {}
        for r in rows:
            by_end.setdefault(r.end_ms, []).append(r)
        for end in sorted(by_end):
            for rule in self.rules:
                out.extend(self._rule(rule, by_end[end], end))
        return out

    def _rule(self, rule: SlaRule, rows: list[ClosedQuantum], end_ms: int) -> list[Transition]:
        key = pct_key(rule.percentile)
        out: list[Transition] = []
        for r in rows:
            if r.direction != rule.direction or r.scope != rule.scope:
                continue
            state_key = (rule.name, r.host)
            old = self.states.get(state_key)
            if old is None:
                if r.host is not None:
                    if self._hosts[rule.name] >= self.max_hosts:
                        self.hosts_over_cap += 1
                        continue
                    self._hosts[rule.name] += 1
                old = AlertState()
            value = r.stats.percentiles_ns.get(key)
            new = evaluate(rule, value, r.stats.samples, old, end_ms)
            self.states[state_key] = new
            if new.phase is not old.phase:
                if new.phase is Phase.FIRING:
                    self.breaches[rule.name] += 1
                out.append(Transition(rule, r.host, old.phase, new.phase, new, end_ms))
        return out

    def firing(self) -> list[tuple[SlaRule, str | None, AlertState]]:
        """Alerts firing now."""
        rules = {r.name: r for r in self.rules}
        return [
            (rules[name], host, st)
            for (name, host), st in self.states.items()
            if st.phase is Phase.FIRING
        ]

    def snapshot(self) -> list[dict[str, object]]:
        """Every alert's state, for the retained MQTT topic."""
        return [
            {
                "rule": name,
                "host": host,
                "state": st.phase.value,
                "value_ns": st.value_ns,
                "since_ms": st.since_ms,
            }
            for (name, host), st in sorted(self.states.items(), key=lambda kv: str(kv[0]))
        ]
