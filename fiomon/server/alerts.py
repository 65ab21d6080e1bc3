"""SLA alerts: a pure state machine per rule and scope, evaluated on every closed quantum.

States follow Prometheus' alerting rules: ``inactive`` -> ``pending`` (breaching, fewer
than ``for`` quanta in a row) -> ``firing`` -> ``resolved`` (clear for ``clear_for``
quanta: below ``clear_below``, the hysteresis) -> ``inactive``. A quantum with fewer than
``min_samples`` I/Os (or none) is no evidence: the state holds. So is, unless the rule
says ``incomplete: evaluate``, a row with ``complete: false`` (a host the aggregator
expected, or a cell the root expected, is missing from it): the rule neither fires nor
resolves on it, and its ``for``/``clear_for`` counts stay where they were. A value of a saturated
percentile is a lower bound at fio's cap, which is above any threshold, so it breaches.

A rule with ``confidence`` weighs the evidence with the percentile's confidence interval
(:mod:`fiomon.confidence`): a quantum breaches only when the interval's *lower* bound is
above the threshold, and counts as clear only when its *upper* bound is below
``clear_ns``; a side the data cannot bound (``None``: too few I/Os) is never evidence. So
a p99 of 100 I/Os that lands above the threshold by chance never fires (its lower bound
sits well below the estimate), while at thousands of I/Os a quantum the interval is tight
and a real breach fires as soon as without confidence, or one quantum later. The state
keeps both bounds and which one decided (``decided_by``), for the alert's annotations.

:func:`evaluate` is pure; :class:`AlertBook` keeps the states of every rule and host and
returns the transitions, which the aggregator logs, counts, publishes and posts.

Revisions (issue 25): the state machine runs on first publications only, so a page is
never withdrawn and nothing fires twice. The book remembers, for the revision horizon,
the verdict each rule gave on each quantum (:class:`Verdict`: breach, no breach, no
evidence); :meth:`AlertBook.revise` returns a :class:`RevisedVerdict` for each revision
row whose verdict differs from that first one, which the services log as a warning and
count (``fiomon_sla_revised_verdicts_total{rule}``).

:class:`AlertDispatcher` delivers to Alertmanager apart from closing: the close path only
hands it the current alerts (never blocks), and a task of its own posts them, one request
at a time, each bounded by the configured timeout. A receiver that hangs costs that task
its timeout, never a quantum; what cannot be delivered is counted, and the newest state
of each alert is what is sent next.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from fiomon.closed import ClosedQuantum
from fiomon.config import SlaRule, WebhookConfig
from fiomon.histogram import pct_key
from fiomon.runtime import wait_event
from fiomon.server.tailshare import TOP_K, TailShare, shares_text

log = logging.getLogger("fiomon.aggregator")


def rules_not_computed(
    rules: Sequence[SlaRule], percentiles: Sequence[float], confidence_level: float | None
) -> str | None:
    """Why a running service cannot take ``rules`` at a reload (None: it can).

    A rule needs its percentile among ``percentiles`` and, with a ``confidence``, bounds
    at the running ``confidence_level``: both are fixed at start (a restart changes
    them), so a rule asking for others would never have what it evaluates.
    """
    unsure = [
        r.name for r in rules if r.confidence is not None and r.confidence != confidence_level
    ]
    if unsure:
        return (
            f"SLA rules {', '.join(unsure)} need confidence bounds at a level this run does "
            f"not compute (confidence_level {confidence_level}); the rules are unchanged "
            "(confidence_level changes with a restart)"
        )
    missing = [r.name for r in rules if r.percentile not in percentiles]
    if missing:
        return (
            f"SLA rules {', '.join(missing)} need percentiles that are not computed "
            f"({', '.join(f'{q:g}' for q in percentiles)}); the rules are unchanged "
            "(percentiles change with a restart)"
        )
    return None


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
        lower_ns: the confidence interval's lower bound of that quantum (rules with
            ``confidence``; None: unbounded or not weighed).
        upper_ns: its upper bound.
        decided_by: ``lower`` (is it breaching?) or ``upper`` (is it clear? asked while
            firing) for rules with ``confidence``, else None.
    """

    phase: Phase = Phase.INACTIVE
    breaching: int = 0
    clearing: int = 0
    value_ns: float | None = None
    since_ms: int = 0
    fired_ms: int | None = None
    lower_ns: float | None = None
    upper_ns: float | None = None
    decided_by: str | None = None


Bounds = tuple[float | None, float | None]


def evaluate(
    rule: SlaRule,
    value_ns: float | None,
    samples: float,
    state: AlertState,
    at_ms: int,
    *,
    bounds_ns: Bounds = (None, None),
) -> AlertState:
    """The state after a quantum ending at ``at_ms`` with percentile ``value_ns``.

    ``bounds_ns`` is the percentile's confidence interval (``None`` for an unbounded
    side); only rules with ``confidence`` read it.
    """
    if value_ns is None or samples < rule.min_samples:
        if state.phase is Phase.RESOLVED:
            return replace(state, phase=Phase.INACTIVE, since_ms=at_ms)
        return state
    if rule.confidence is None:
        over = value_ns > rule.threshold_ns
        clear = value_ns < rule.clear_ns
        return _step(rule, value_ns, state, at_ms, over=over, clear=clear)
    low, high = bounds_ns
    over = low is not None and low > rule.threshold_ns
    clear = high is not None and high < rule.clear_ns
    new = _step(rule, value_ns, state, at_ms, over=over, clear=clear)
    decided_by = "upper" if state.phase is Phase.FIRING else "lower"
    return replace(new, lower_ns=low, upper_ns=high, decided_by=decided_by)


def _step(
    rule: SlaRule, value_ns: float, state: AlertState, at_ms: int, *, over: bool, clear: bool
) -> AlertState:
    """One step of the state machine, given whether the quantum breaches and is clear."""
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
    if clear:
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
        at_ms: end of the quantum that caused it (the wall clock for an idle settle).
        idle: caused by the input going idle (:meth:`AlertBook.settle`), not a quantum:
            a firing alert that resolves so *ended* (the benchmark stopped), it did not
            recover.
        worst: cluster rules: ``(host, share)`` of the hosts holding the most I/Os above
            the cluster percentile over the incident's breaching quanta, largest first
            (:mod:`fiomon.server.tailshare`); empty for host rules or without host rows.
    """

    rule: SlaRule
    host: str | None
    old: Phase
    new: Phase
    state: AlertState
    at_ms: int
    idle: bool = False
    worst: tuple[tuple[str, float], ...] = ()

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
            "idle": self.idle,
            **({"ended": self.idle} if self.new is Phase.RESOLVED else {}),
            **({"worst_hosts": [[h, round(s, 4)] for h, s in self.worst]} if self.worst else {}),
            **_evidence(self.rule, self.state),
        }

    def log_text(self) -> str:
        """:meth:`to_json` as one compact line, for the services' ``sla ...`` log lines."""
        return json.dumps(self.to_json(), separators=(",", ":"))


class Verdict(enum.IntEnum):
    """What one quantum says to a rule, before the state machine: its evidence alone.

    Stored as int8 (the book keeps one per rule, host and quantum of the horizon).
    """

    NONE = 0  # no evidence: no value, fewer than min_samples I/Os, or incomplete (hold)
    CLEAR = 1  # evidence, not a breach
    BREACH = 2  # the percentile (with confidence: its lower bound) above the threshold


def verdict_of(rule: SlaRule, row: ClosedQuantum) -> tuple[Verdict, float | None, float | None]:
    """The rule's verdict on ``row``, with the row's percentile and lower bound (ns).

    The same evidence :meth:`AlertBook.observe` gives :func:`evaluate`: an incomplete row
    under ``incomplete: hold`` and a row below ``min_samples`` are no evidence; with
    ``confidence`` the lower bound decides (an unbounded side is no breach).
    """
    key = pct_key(rule.percentile)
    value = row.stats.percentiles_ns.get(key)
    low = (row.ci_ns or {}).get(key, (None, None))[0]
    if not row.complete and rule.incomplete == "hold":
        return Verdict.NONE, value, low
    if value is None or row.stats.samples < rule.min_samples:
        return Verdict.NONE, value, low
    if rule.confidence is None:
        over = value > rule.threshold_ns
    else:
        over = low is not None and low > rule.threshold_ns
    return (Verdict.BREACH if over else Verdict.CLEAR), value, low


@dataclass(frozen=True, slots=True)
class RevisedVerdict:
    """A revision row on which a rule's verdict differs from the first publication's.

    Nothing fires or resolves for it (the state machine saw the first publication only):
    it is logged and counted, so a reader knows a page (or its absence) rested on data
    that was incomplete at the time.

    Args:
        rule: the rule.
        host: the host for host-scope rules, else None.
        end_ms: the quantum's end (epoch ms).
        revision: the revision row's ``revision``.
        first: the verdict on the first publication (:attr:`Verdict.NONE` when the key
            was first published by late records: the rule saw no row then).
        first_value_ns: the first publication's percentile (None: no row or no value).
        first_lower_ns: its lower confidence bound (rules with ``confidence``).
        revised: the verdict on the revision.
        revised_value_ns: the revision's percentile.
        revised_lower_ns: its lower confidence bound.
    """

    rule: SlaRule
    host: str | None
    end_ms: int
    revision: int
    first: Verdict
    first_value_ns: float | None
    first_lower_ns: float | None
    revised: Verdict
    revised_value_ns: float | None
    revised_lower_ns: float | None

    def to_json(self) -> dict[str, object]:
        """A structured log object (times epoch ms, latencies ns)."""
        out: dict[str, object] = {
            "rule": self.rule.name,
            "host": self.host,
            "end_ms": self.end_ms,
            "revision": self.revision,
            "direction": self.rule.direction,
            "percentile": self.rule.percentile,
            "threshold_ns": self.rule.threshold_ns,
            "first": self.first.name.lower(),
            "first_value_ns": self.first_value_ns,
            "revised": self.revised.name.lower(),
            "revised_value_ns": self.revised_value_ns,
        }
        if self.rule.confidence is not None:  # the lower bound decided, not the value
            out["first_lower_ns"] = self.first_lower_ns
            out["revised_lower_ns"] = self.revised_lower_ns
        return out

    def log_text(self) -> str:
        """:meth:`to_json` as one compact line (the ``sla verdict revised ...`` warning)."""
        return json.dumps(self.to_json(), separators=(",", ":"))


_UNSEEN = -1  # a verdict slot of a host the rule had not seen yet when the quantum closed


@dataclass(slots=True)
class _EndVerdicts:
    """One rule's verdicts on one quantum, one slot per host (slot 0: the cluster).

    Arrays rather than a dict per host: 1000 hosts over a 10-minute horizon of 1 s
    quanta are 600,000 verdicts per host-scope rule, 6 MB here, about 100 MB as tuples.
    """

    first: npt.NDArray[np.int8]
    last: npt.NDArray[np.int8]  # the latest publication's verdict (logged once per change)
    value: npt.NDArray[np.float32]  # first publication's percentile, ns (nan: none)
    low: npt.NDArray[np.float32]  # its lower bound, ns (nan: none)

    @classmethod
    def empty(cls, n: int) -> _EndVerdicts:
        return cls(
            np.full(n, _UNSEEN, np.int8),
            np.full(n, _UNSEEN, np.int8),
            np.full(n, np.nan, np.float32),
            np.full(n, np.nan, np.float32),
        )

    def fit(self, slot: int) -> None:
        """Grow the arrays to hold ``slot`` (a host first seen after this quantum)."""
        n = len(self.first)
        if slot < n:
            return
        more = _EndVerdicts.empty(max(slot + 1, 2 * n) - n)
        self.first = np.concatenate([self.first, more.first])
        self.last = np.concatenate([self.last, more.last])
        self.value = np.concatenate([self.value, more.value])
        self.low = np.concatenate([self.low, more.low])


@dataclass(slots=True)
class _RuleMemory:
    """What one rule said on every quantum of the horizon (first publications)."""

    slots: dict[str | None, int] = field(default_factory=lambda: {None: 0})
    ends: dict[int, _EndVerdicts] = field(default_factory=dict)  # oldest first
    since_ms: int | None = None  # the first quantum end this rule was evaluated on

    def slot(self, host: str | None) -> int:
        s = self.slots.get(host)
        if s is None:
            s = self.slots[host] = len(self.slots)
        return s


@dataclass(slots=True)
class _Worst:
    """One cluster rule's incident: I/Os above its percentile, in all and per top host."""

    above: float = 0.0
    counts: dict[str, float] = field(default_factory=dict)


def _f(x: float | None) -> float:
    return np.nan if x is None else x


def _opt(x: np.float32) -> float | None:
    return None if np.isnan(x) else float(x)


class AlertBook:
    """States of every rule (and host, for host-scope rules).

    Args:
        rules: the SLA rules.
        max_hosts: host-scope states kept per rule (more hosts are not evaluated; the
            aggregator's engine has the same cap and counts the hosts beyond it in
            ``fiomon_hosts_over_cap_total``).
        remember_ms: how far back (ms of quantum ends before the newest one observed)
            the first verdicts are kept for :meth:`revise`: the revision horizon plus a
            margin. 0 keeps none (revisions off): :meth:`revise` then reports nothing.
    """

    def __init__(
        self, rules: tuple[SlaRule, ...], max_hosts: int = 1000, *, remember_ms: int = 0
    ) -> None:
        self.rules = rules
        self.max_hosts = max_hosts
        self.remember_ms = remember_ms
        self.states: dict[tuple[str, str | None], AlertState] = {}
        self.breaches: dict[str, int] = {r.name: 0 for r in rules}
        # Revision rows whose verdict differed from the first publication's, per rule.
        self.revised_verdicts: dict[str, int] = {r.name: 0 for r in rules}
        self._hosts: Counter[str] = Counter()
        self._memory: dict[str, _RuleMemory] = {r.name: _RuleMemory() for r in rules}
        self._cutoff_ms: int | None = None  # quanta ending before it are forgotten
        # Cluster rules' incidents (pending or firing, kept after): the hosts' tail counts
        # over the breaching quanta, for worst_hosts().
        self._worst: dict[str, _Worst] = {}
        # Alerts resolved because the input went idle (settle): the benchmark stopped.
        self._ended: set[tuple[str, str | None]] = set()
        self._tails: dict[tuple[int, str, str], TailShare] = {}

    def observe(
        self, rows: list[ClosedQuantum], tails: Sequence[TailShare] = ()
    ) -> list[Transition]:
        """Evaluate every rule on one close's rows (quanta oldest first).

        ``rows`` are first publications (a quantum's revisions go to :meth:`revise`):
        each rule's verdict on them is remembered for ``remember_ms``. ``tails`` are
        the same quanta's tail shares (:func:`fiomon.server.tailshare.tail_shares`):
        a cluster rule adds those of its breaching quanta to its incident's worst hosts.
        """
        out: list[Transition] = []
        self._tails = {(t.end_ms, t.direction, t.percentile): t for t in tails}
        by_end: dict[int, list[ClosedQuantum]] = {}
        for r in rows:
            by_end.setdefault(r.end_ms, []).append(r)
        if not by_end:
            return out
        if self.remember_ms > 0:
            first = min(by_end)
            for mem in self._memory.values():
                if mem.since_ms is None:
                    mem.since_ms = first
        for end in sorted(by_end):
            for rule in self.rules:
                out.extend(self._rule(rule, by_end[end], end))
        if self.remember_ms > 0:
            self._forget(max(by_end) - self.remember_ms)
        return out

    def _forget(self, cutoff_ms: int) -> None:
        """Drop the verdicts on quanta ending before ``cutoff_ms`` (beyond the horizon)."""
        if self._cutoff_ms is not None and cutoff_ms <= self._cutoff_ms:
            return
        self._cutoff_ms = cutoff_ms
        for mem in self._memory.values():
            # A scan, not a pop from the front: revise() may add an older quantum last.
            for end in [e for e in mem.ends if e < cutoff_ms]:
                del mem.ends[end]

    def _remember(self, rule: SlaRule, row: ClosedQuantum) -> None:
        """Keep ``rule``'s verdict on a first publication, for :meth:`revise`."""
        mem = self._memory.get(rule.name)
        if mem is None:
            return
        slot = mem.slot(row.host)
        ev = mem.ends.get(row.end_ms)
        if ev is None:
            ev = mem.ends[row.end_ms] = _EndVerdicts.empty(len(mem.slots))
        ev.fit(slot)
        v, value, low = verdict_of(rule, row)
        ev.first[slot] = ev.last[slot] = v
        ev.value[slot] = _f(value)
        ev.low[slot] = _f(low)

    def revise(self, rows: list[ClosedQuantum]) -> list[RevisedVerdict]:
        """Revision rows: the verdicts that differ from the first publication's.

        Nothing else changes: no state, no transition, no breach count (a page is not
        withdrawn and nothing fires again). Each returned verdict is counted in
        :attr:`revised_verdicts`; a key's later revisions are reported again only when
        their verdict differs from both the first and the last one reported.

        A revision is compared only when the book saw the quantum's close: quanta older
        than ``remember_ms`` before the newest one, or closed before this book (or the
        rule, after a reload) existed, are skipped. A host-scope key the first
        publication lacked (first published by late records) had no verdict:
        :attr:`Verdict.NONE`.
        """
        out: list[RevisedVerdict] = []
        if self.remember_ms <= 0 or self._cutoff_ms is None:
            return out
        for r in rows:
            for rule in self.rules:
                if r.direction != rule.direction or r.scope != rule.scope:
                    continue
                mem = self._memory.get(rule.name)
                if mem is None or mem.since_ms is None:
                    continue
                if r.end_ms < mem.since_ms or r.end_ms < self._cutoff_ms:
                    continue  # its first verdict is not known (before us, or forgotten)
                if (
                    r.host is not None
                    and (rule.name, r.host) not in self.states
                    and self._hosts[rule.name] >= self.max_hosts
                ):
                    continue  # a host beyond the cap: the rule never evaluates it
                found = self._revised(rule, mem, r)
                if found is not None:
                    self.revised_verdicts[rule.name] = self.revised_verdicts.get(rule.name, 0) + 1
                    out.append(found)
        return out

    def _revised(
        self, rule: SlaRule, mem: _RuleMemory, row: ClosedQuantum
    ) -> RevisedVerdict | None:
        """Compare one revision row with the remembered verdicts; remember it as the last."""
        slot = mem.slot(row.host)
        ev = mem.ends.get(row.end_ms)
        if ev is None:
            ev = mem.ends[row.end_ms] = _EndVerdicts.empty(len(mem.slots))
        ev.fit(slot)
        seen = int(ev.first[slot]) != _UNSEEN
        first = Verdict(int(ev.first[slot])) if seen else Verdict.NONE
        last = Verdict(int(ev.last[slot])) if int(ev.last[slot]) != _UNSEEN else first
        new, value, low = verdict_of(rule, row)
        ev.last[slot] = new
        if new is first or new is last:
            return None
        return RevisedVerdict(
            rule,
            row.host,
            row.end_ms,
            row.revision,
            first,
            _opt(ev.value[slot]) if seen else None,
            _opt(ev.low[slot]) if seen else None,
            new,
            value,
            low,
        )

    def _rule(self, rule: SlaRule, rows: list[ClosedQuantum], end_ms: int) -> list[Transition]:
        key = pct_key(rule.percentile)
        out: list[Transition] = []
        for r in rows:
            if r.direction != rule.direction or r.scope != rule.scope:
                continue
            if not r.complete and rule.incomplete == "hold":
                # A quantum missing a host or cell is no evidence either way. Its verdict
                # (none) is kept with its value, for the log of a revision that completes
                # it; a host not evaluated yet gets no slot here (the cap counts hosts
                # evaluated), and reads as none anyway.
                if self.remember_ms > 0 and (r.host is None or (rule.name, r.host) in self.states):
                    self._remember(rule, r)
                continue
            state_key = (rule.name, r.host)
            old = self.states.get(state_key)
            if old is None:
                if r.host is not None:
                    if self._hosts[rule.name] >= self.max_hosts:
                        continue
                    self._hosts[rule.name] += 1
                old = AlertState()
            value = r.stats.percentiles_ns.get(key)
            ci = (r.ci_ns or {}).get(key, (None, None))
            new = evaluate(rule, value, r.stats.samples, old, end_ms, bounds_ns=ci)
            self.states[state_key] = new
            if new.phase is not Phase.RESOLVED:
                self._ended.discard(state_key)
            if self.remember_ms > 0:
                self._remember(rule, r)
            if r.host is None:
                self._note_tail(rule, r, old, new)
            if new.phase is not old.phase:
                if new.phase is Phase.FIRING:
                    self.breaches[rule.name] += 1
                worst = self.worst_hosts(rule.name) if r.host is None else ()
                out.append(
                    Transition(rule, r.host, old.phase, new.phase, new, end_ms, False, worst)
                )
        return out

    def _note_tail(
        self, rule: SlaRule, row: ClosedQuantum, old: AlertState, new: AlertState
    ) -> None:
        """Add a breaching quantum's tail counts to the cluster rule's incident."""
        active = (Phase.PENDING, Phase.FIRING)
        if new.phase not in active:
            return
        if old.phase not in active:
            self._worst[rule.name] = _Worst()  # a new incident
        if verdict_of(rule, row)[0] is not Verdict.BREACH:
            return
        tail = self._tails.get((row.end_ms, rule.direction, pct_key(rule.percentile)))
        if tail is None:
            return
        w = self._worst.setdefault(rule.name, _Worst())
        w.above += tail.above
        for h, n in tail.top:
            w.counts[h] = w.counts.get(h, 0.0) + n

    def worst_hosts(self, rule: str, k: int = TOP_K) -> tuple[tuple[str, float], ...]:
        """``(host, share)`` of the cluster rule's current (or last) incident, largest first.

        The share is of the cluster's I/Os above its percentile, summed over the
        incident's breaching quanta (each quantum's top hosts only: a host outside a
        quantum's top counts 0 there).
        """
        w = self._worst.get(rule)
        if w is None or w.above <= 0:
            return ()
        top = sorted(w.counts.items(), key=lambda hn: -hn[1])[:k]
        return tuple((h, n / w.above) for h, n in top)

    def settle(self, at_ms: int) -> list[Transition]:
        """The input went idle: firing alerts resolve, pending ones drop (no evidence left).

        Returns the transitions (firing -> resolved, pending -> inactive).
        """
        out: list[Transition] = []
        rules = {r.name: r for r in self.rules}
        for key, st in list(self.states.items()):
            rule = rules.get(key[0])
            if rule is None:
                continue
            if st.phase is Phase.FIRING:
                new = replace(st, phase=Phase.RESOLVED, breaching=0, since_ms=at_ms)
            elif st.phase is Phase.PENDING:
                new = replace(st, phase=Phase.INACTIVE, breaching=0, since_ms=at_ms)
            else:
                continue
            self.states[key] = new
            if new.phase is Phase.RESOLVED:
                self._ended.add(key)
            worst = self.worst_hosts(rule.name) if key[1] is None else ()
            out.append(Transition(rule, key[1], st.phase, new.phase, new, at_ms, True, worst))
        return out

    def replace_rules(self, rules: tuple[SlaRule, ...]) -> str:
        """Take new rules (a reload): unchanged rules keep their states, others start over.

        Returns what changed, for the log.
        """
        old = {r.name: r for r in self.rules}
        new = {r.name: r for r in rules}
        kept = [n for n in new if old.get(n) == new[n]]
        changed = [n for n in new if n in old and old[n] != new[n]]
        added = [n for n in new if n not in old]
        removed = [n for n in old if n not in new]
        self.states = {k: v for k, v in self.states.items() if k[0] in kept}
        self.breaches = {n: self.breaches.get(n, 0) if n in kept else 0 for n in new}
        # A changed rule's earlier verdicts were another rule's: it compares revisions of
        # the quanta it evaluates from now on only.
        self._memory = {n: self._memory[n] if n in kept else _RuleMemory() for n in new}
        self.revised_verdicts = {
            n: self.revised_verdicts.get(n, 0) if n in kept else 0 for n in new
        }
        self._hosts = Counter({n: c for n, c in self._hosts.items() if n in kept})
        self._worst = {n: w for n, w in self._worst.items() if n in kept}
        self._ended = {k for k in self._ended if k[0] in kept}
        self.rules = rules
        parts = [f"{len(kept)} kept"]
        for what, names in (("changed", changed), ("added", added), ("removed", removed)):
            if names:
                parts.append(f"{what} {', '.join(names)}")
        return "sla rules: " + "; ".join(parts)

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
        rules = {r.name: r for r in self.rules}
        return [
            {
                "rule": name,
                "host": host,
                "state": st.phase.value,
                "value_ns": st.value_ns,
                "since_ms": st.since_ms,
                **({"ended": (name, host) in self._ended} if st.phase is Phase.RESOLVED else {}),
                **(
                    {"worst_hosts": [[h, round(s, 4)] for h, s in self.worst_hosts(name)]}
                    if host is None and st.phase is not Phase.INACTIVE
                    else {}
                ),
                **(_evidence(rules[name], st) if name in rules else {}),
            }
            for (name, host), st in sorted(self.states.items(), key=lambda kv: str(kv[0]))
        ]


# The runbook (one anchored section per alert), where the wheel installs the docs
# (share/fiomon/docs under the venv; deploy/README.md, "Runbook URLs", says how to point
# it, and the Prometheus rules' runbook_url, at a site's own copy).
RUNBOOK_BASE = "file:///opt/fiomon/share/fiomon/docs/runbook.md"
RUNBOOK = RUNBOOK_BASE + "#fiomonslabreach"
SEVERITY = "page"  # an SLA breach pages, as the shipped Prometheus rule does


def _evidence(rule: SlaRule, state: AlertState) -> dict[str, object]:
    """The confidence interval and the bound that decided, for rules with ``confidence``."""
    if rule.confidence is None:
        return {}
    return {
        "confidence": rule.confidence,
        "lower_ns": state.lower_ns,
        "upper_ns": state.upper_ns,
        "decided_by": state.decided_by,
    }


def _labels(rule: SlaRule, host: str | None, latency: str) -> dict[str, str]:
    # The name and labels of the Prometheus rule on fiomon_sla_breach, so the two paths
    # (use one: deploy/README.md) name one incident alike.
    labels = {
        "alertname": "FiomonSLABreach",
        "rule": rule.name,
        "direction": rule.direction,
        "percentile": pct_key(rule.percentile),
        "latency": latency,
        "severity": SEVERITY,
    }
    if host:
        labels["host"] = host
    return labels


def _ms(ns: float | None) -> str:
    return "none" if ns is None else f"{ns / 1e6:.3f}"


def human_ns(ns: float) -> str:
    """A latency for people: ``7.3 ms``, ``850 us``, ``1.2 s`` (3 significant digits)."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def _what(rule: SlaRule, latency: str) -> str:
    return f"p{rule.percentile:g} {latency} {rule.direction}"


def _annotations(
    rule: SlaRule,
    state: AlertState,
    host: str | None,
    worst: tuple[tuple[str, float], ...],
    latency: str,
) -> dict[str, str]:
    """What a person reading the alert needs: value vs threshold, where, the runbook."""
    scope = f"host {host}" if host else "cluster"
    value = "no value" if state.value_ns is None else human_ns(state.value_ns)
    threshold = human_ns(rule.threshold_ns)
    out = {
        "summary": f"{_what(rule, latency)} {value} > {threshold} ({scope})",
        "description": f"fiomon SLA rule {rule.name}: the {scope} {_what(rule, latency)} latency "
        f"stayed above {threshold} for {rule.for_quanta} quanta (latest {value}); it "
        f"recovers after {rule.clear_for} quanta below {human_ns(rule.clear_ns)}",
        "runbook_url": RUNBOOK,
        "value": value,
        "threshold": threshold,
        "value_ms": _ms(state.value_ns or 0.0),
    }
    if host is None:
        out["worst_hosts"] = shares_text(worst)
        if worst:
            out["description"] += (
                f"; hosts holding the I/Os above the cluster p{rule.percentile:g}: "
                f"{shares_text(worst)}"
            )
    if rule.confidence is not None:
        # Annotation values are strings (Alertmanager v2); "none": the data bound no side.
        out["confidence"] = f"{rule.confidence:g}"
        out["lower_bound_ms"] = _ms(state.lower_ns)
        out["upper_bound_ms"] = _ms(state.upper_ns)
        out["decided_by"] = state.decided_by or "none"
        out["description"] += (
            f"; {rule.confidence * 100:g}% interval of p{rule.percentile:g}: "
            f"[{_ms(state.lower_ns)}, {_ms(state.upper_ns)}] ms; fires while the lower bound "
            f"is above the threshold, resolves when the upper bound is below "
            f"{rule.clear_ns / 1e6:g} ms"
        )
    return out


def _resolution(t: Transition, latency: str) -> dict[str, str]:
    """A resolved alert's annotations: *ended* (the benchmark stopped) or *recovered*."""
    out = _annotations(t.rule, t.state, t.host, t.worst, latency)
    what = _what(t.rule, latency)
    if t.idle:
        out["resolution"] = "ended: the benchmark stopped (no records arrive), not recovered"
        scope = f"host {t.host}" if t.host else "cluster"
        out["summary"] = (
            f"ended (the benchmark stopped): {what} last {out['value']}, threshold "
            f"{out['threshold']} ({scope})"
        )
    else:
        out["resolution"] = (
            f"recovered: {what} below {human_ns(t.rule.clear_ns)} for {t.rule.clear_for} quanta"
        )
        out["summary"] = f"recovered: {what} {out['value']} < {human_ns(t.rule.clear_ns)}"
    return out


def alertmanager_payload(
    book: AlertBook, transitions: list[Transition], now_ms: int, latency: str = "clat"
) -> list[dict[str, Any]]:
    """Alertmanager v2 alerts: every firing alert, plus the ones that just resolved.

    A resolved alert carries its annotations again, with ``resolution`` saying whether it
    ended (the benchmark stopped) or recovered: Alertmanager's resolved notification
    shows the annotations it received last. ``latency`` is the kind the rules hold for
    (the aggregator's ``latency``): a label, and in the texts (``p99 lat read``).
    """
    now = datetime.fromtimestamp(now_ms / 1000, UTC).isoformat()
    out: list[dict[str, Any]] = []
    for rule, host, state in book.firing():
        worst = book.worst_hosts(rule.name) if host is None else ()
        out.append(
            {
                "labels": _labels(rule, host, latency),
                "annotations": _annotations(rule, state, host, worst, latency),
                "startsAt": datetime.fromtimestamp((state.fired_ms or 0) / 1000, UTC).isoformat(),
            }
        )
    for t in transitions:
        if t.new is Phase.RESOLVED:
            out.append(
                {
                    "labels": _labels(t.rule, t.host, latency),
                    "annotations": _resolution(t, latency),
                    "endsAt": now,
                }
            )
    return out


def site_alert(alert: dict[str, Any], hook: WebhookConfig) -> None:
    """Give ``alert`` the site's labels (``webhook.labels``) and runbook (``webhook.runbook``).

    fiomon's own labels win over a site label of the same name (the config refuses those).
    """
    alert["labels"] = {**dict(hook.labels), **alert["labels"]}
    notes = alert.get("annotations")
    if isinstance(notes, dict) and "runbook_url" in notes:
        notes["runbook_url"] = hook.runbook + "#" + notes["runbook_url"].rsplit("#", 1)[-1]


def post_alerts(hook: WebhookConfig, alerts: list[dict[str, Any]]) -> None:
    """POST ``alerts`` to Alertmanager (blocking, bounded by ``hook.timeout_ms``).

    Raises:
        OSError: the request failed (``urllib.error.URLError`` is one).
    """
    req = urllib.request.Request(  # noqa: S310 -- the configured http(s) URL (checked)
        hook.url.rstrip("/") + "/api/v2/alerts",
        data=json.dumps(alerts).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=hook.timeout_ms / 1000):  # noqa: S310
        pass


class AlertDispatcher:
    """Posts alerts to Alertmanager from a task of its own, never from the close path.

    :meth:`offer` (on the close path) merges the current alerts into a pending set keyed
    by labels, the newest state of each alert winning, and returns at once. :meth:`run`
    sends the pending set when there is one, and every ``resend`` while alerts fire
    (Alertmanager forgets alerts that are not re-sent). One request at a time, each in a
    worker thread bounded by the webhook's timeout; while a request that outlived its
    timeout still holds its thread, nothing more is started (the alerts stay pending).
    Failures and alerts dropped by the pending bound are counted in ``deliveries``.

    Args:
        webhook: the Alertmanager to notify, or None.
        deliveries: counts by ``(sink, result)``: ``("webhook", "sent" | "failed" |
            "dropped")`` (alerts, not requests).
        now_ms: the wall clock.
        post: the blocking POST (tests inject their own).
        max_pending: alerts kept waiting at most; the oldest are dropped beyond.
        latency: the latency kind the SLA rules hold for (the aggregator's ``latency``):
            each alert's ``latency`` label and its texts (``p99 lat read``).
    """

    def __init__(
        self,
        webhook: WebhookConfig | None,
        deliveries: Counter[tuple[str, str]],
        now_ms: Callable[[], int],
        *,
        post: Callable[[WebhookConfig, list[dict[str, Any]]], None] = post_alerts,
        max_pending: int = 10_000,
        latency: str = "clat",
    ) -> None:
        self.webhook = webhook
        self.latency = latency
        self.deliveries = deliveries
        self.now_ms = now_ms
        self.post = post
        self.max_pending = max_pending
        self._pending: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        self._wake = asyncio.Event()
        self._last_sent_ms: int | None = None
        self._busy: asyncio.Future[None] | None = None

    def reconfigure(self, webhook: WebhookConfig | None) -> None:
        """A reload changed the webhook (pending alerts go to the new one)."""
        self.webhook = webhook
        self._wake.set()

    def wake(self) -> None:
        """Deliver now, not at the next second (the stop sequence's last delivery)."""
        self._wake.set()

    def offer(self, book: AlertBook, transitions: list[Transition]) -> None:
        """Queue the current alerts when something changed, or when a resend is due."""
        hook = self.webhook
        if hook is None:
            return
        now = self.now_ms()
        due = self._last_sent_ms is None or now - self._last_sent_ms >= hook.resend_ms
        if not transitions and not (due and book.firing()):
            return
        for alert in alertmanager_payload(book, transitions, now, self.latency):
            site_alert(alert, hook)
            key = tuple(sorted(alert["labels"].items()))
            self._pending.pop(key, None)  # re-insert: newest last
            self._pending[key] = alert
        over = len(self._pending) - self.max_pending
        if over > 0:
            for key in list(self._pending)[:over]:
                del self._pending[key]
            self.deliveries[("webhook", "dropped")] += over
        self._last_sent_ms = now
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` (then one last attempt, bounded by the timeout)."""
        while not stop.is_set():
            await wait_event(self._wake, 1.0)
            self._wake.clear()
            await self._send()
        await self._send()

    async def _send(self) -> None:
        hook = self.webhook
        if hook is None or not self._pending:
            return
        if self._busy is not None and not self._busy.done():
            return  # a request that outlived its timeout still holds its thread
        alerts = list(self._pending.values())
        self._pending.clear()
        self._busy = asyncio.ensure_future(asyncio.to_thread(self.post, hook, alerts))
        # A request abandoned at its timeout may still fail later: its error is read
        # here, not left to the event loop's "never retrieved" report.
        self._busy.add_done_callback(lambda f: f.cancelled() or f.exception())
        done, _ = await asyncio.wait({self._busy}, timeout=hook.timeout_ms / 1000 + 0.5)
        exc = self._busy.exception() if done else TimeoutError("no answer")
        if exc is None:
            self.deliveries[("webhook", "sent")] += len(alerts)
            return
        self.deliveries[("webhook", "failed")] += len(alerts)
        log.warning(
            "alertmanager %s: %s (%d alerts not delivered; the newest state is re-sent)",
            hook.url,
            exc,
            len(alerts),
        )
        for alert in alerts:  # keep them for the next attempt, unless a newer state came
            self._pending.setdefault(tuple(sorted(alert["labels"].items())), alert)
