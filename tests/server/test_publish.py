"""Publisher.revise: what Prometheus and the SLA rules make of revision rows (issue 25).

Rows are the engine's own (real fio histograms, lognormal latencies); a revision row is the
engine's row of the same quantum with the late I/Os added, marked as the engine marks
revisions (``revision``, ``revised_at``). Everything is read back from the exposition the
``/metrics`` child would serve, and checked by promtool.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import subprocess
from collections import Counter

import numpy as np
import numpy.typing as npt
import pytest

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum, Scope
from fiomon.config import AggregatorConfig, SlaRule
from fiomon.engine import QuantumEngine
from fiomon.histogram import HistStats
from fiomon.server.alerts import Phase, Verdict
from fiomon.server.exporter import render
from fiomon.server.metrics import Counts, Health
from fiomon.server.publish import Publisher
from tests.clock import T0
from tests.latencydists import batch_of_quanta, fio_quanta, lognormal_cdf
from tests.metricskit import Samples, parse_samples

F64 = npt.NDArray[np.float64]
RULE = SlaRule("p99-read", "read", 99.0, 5e6, for_quanta=1, min_samples=100)
HIST = "fiomon_cluster_io_latency_seconds"
READ = (("direction", "read"), ("latency", "clat"))
CLAT = (("latency", "clat"),)


def config(*rules: SlaRule, revise_within_ms: int = 600_000) -> AggregatorConfig:
    return AggregatorConfig(percentiles=(50.0, 99.0), sla=rules, revise_within_ms=revise_within_ms)


def publisher(cfg: AggregatorConfig, name: str = "test.publish") -> Publisher:
    return Publisher(cfg, logging.getLogger(name), fit_tail=False)


def engine_rows(hists: F64, t0_ms: int = T0) -> list[ClosedQuantum]:
    """The engine's cluster read rows, one quantum per histogram row (hists kept)."""
    engine = QuantumEngine(
        layout=BinLayout(),
        quantum_ms=1000,
        percentiles=(50, 99),
        directions=("read",),
        keep_hists=True,
    )
    engine.add(batch_of_quanta(hists, t0_ms=t0_ms))
    rows = engine.flush()
    assert len(rows) == len(hists)
    return rows


def revision(row: ClosedQuantum, extra: F64, at_ms: int, n: int = 1) -> ClosedQuantum:
    """The engine's row of ``row``'s quantum with ``extra`` I/Os merged: revision ``n``."""
    assert row.hist is not None
    (again,) = engine_rows((row.hist + extra)[None, :], row.start_ms)
    assert again.key == row.key
    return dataclasses.replace(again, revision=n, revised_at=at_ms, late_records=int(extra.sum()))


def scrape(pub: Publisher, counts: Counts | None = None) -> tuple[str, Samples]:
    text = render(pub.snapshot(counts or Counts(), Health(active=True))).decode()
    return text, parse_samples(text)


def promtool_clean(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run .ci/run or apt-get install prometheus")
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def fast_and_slow(rng: np.random.Generator) -> tuple[F64, F64]:
    """Three quanta of 2000 reads around 1 ms; 200 late reads around 20 ms."""
    fast = fio_quanta(lognormal_cdf(1e6), 2000, rng, 3)
    slow = fio_quanta(lognormal_cdf(20e6), 200, rng, 1)[0]
    return fast, slow


def test_gauges_show_the_latest_quantums_revision_and_buckets_count_every_io() -> None:
    fast, slow = fast_and_slow(np.random.default_rng(25))
    pub = publisher(config(RULE))
    first = engine_rows(fast)
    pub.observe(first, first[-1].end_ms + 5000)
    _, before = scrape(pub)
    p99 = (
        "fiomon_cluster_latency_percentile_seconds",
        (("direction", "read"), *CLAT, ("percentile", "99")),
    )
    end = ("fiomon_quantum_end_timestamp_seconds", ())
    assert before[end] == first[-1].end_ms / 1000
    assert before[p99] == pytest.approx(first[-1].stats.percentiles_ns["99"] / 1e9)

    # A revision of an older quantum: no gauge moves (Prometheus cannot rewrite the past),
    # but the buckets count its I/Os.
    old = revision(first[0], slow, T0 + 60_000)
    pub.revise([old], T0 + 60_000, {"read": slow})
    _, m = scrape(pub)
    assert m[p99] == before[p99]
    assert m[end] == before[end]
    assert m[(f"{HIST}_count", READ)] == fast.sum() + slow.sum()

    # A revision of the quantum the gauges show replaces its values.
    latest = revision(first[-1], slow, T0 + 61_000)
    pub.revise([latest], T0 + 61_000, {"read": slow})
    text, m = scrape(pub)
    assert latest.stats.percentiles_ns["99"] > 2 * first[-1].stats.percentiles_ns["99"]
    assert m[p99] == pytest.approx(latest.stats.percentiles_ns["99"] / 1e9)
    assert m[end] == before[end]
    rate = ("fiomon_cluster_iops", (("direction", "read"),))
    assert m[rate] == pytest.approx(latest.iops)
    # _count is every I/O, first publications and revisions; _sum the latest rows' sums,
    # exactly (each revision adds its row's sum less the one published before).
    assert m[(f"{HIST}_count", READ)] == fast.sum() + 2 * slow.sum()
    rows = [old, first[1], latest]
    assert m[(f"{HIST}_sum", READ)] == pytest.approx(
        sum(r.stats.samples * r.stats.mean_ns for r in rows) / 1e9, rel=1e-9
    )
    buckets = {
        dict(k[1])["le"]: v
        for k, v in m.items()
        if k[0] == f"{HIST}_bucket" and dict(k[1])["direction"] == "read"
    }
    assert buckets["+Inf"] == m[(f"{HIST}_count", READ)]
    promtool_clean(text)


def test_revisions_before_this_process_add_their_sum_at_the_bins_midpoints() -> None:
    # After a restart the quantum's first publication is not known here: the sum of what
    # was added is estimated from the bins (fio's are under 2 % wide).
    fast, slow = fast_and_slow(np.random.default_rng(7))
    first = engine_rows(fast)
    pub = publisher(config(RULE))
    pub.observe([first[-1]], first[-1].end_ms + 5000)
    pub.revise([revision(first[0], slow, T0 + 60_000)], T0 + 60_000, {"read": slow})
    _, m = scrape(pub)
    exact = first[-1].stats.samples * first[-1].stats.mean_ns + float(slow @ BinLayout().mids_ns())
    assert m[(f"{HIST}_sum", READ)] == pytest.approx(exact / 1e9, rel=1e-12)
    assert m[(f"{HIST}_count", READ)] == fast[-1].sum() + slow.sum()


def test_a_revision_that_changes_a_verdict_is_logged_and_counted_never_fired(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fast, slow = fast_and_slow(np.random.default_rng(11))
    pub = publisher(config(RULE))
    first = engine_rows(fast)
    assert pub.observe(first, first[-1].end_ms + 5000) == []  # all clear: nothing fires
    late = revision(first[1], slow, T0 + 60_000)
    assert late.stats.percentiles_ns["99"] > RULE.threshold_ns
    with caplog.at_level(logging.WARNING, logger="test.publish"):
        pub.revise([late], T0 + 60_000, {"read": slow})
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("sla verdict revised ")
    got = json.loads(line.removeprefix("sla verdict revised "))
    assert got == {
        "rule": "p99-read",
        "host": None,
        "end_ms": first[1].end_ms,
        "revision": 1,
        "direction": "read",
        "percentile": 99.0,
        "threshold_ns": 5e6,
        "first": "clear",
        "first_value_ns": pytest.approx(first[1].stats.percentiles_ns["99"], rel=1e-6),
        "revised": "breach",
        "revised_value_ns": late.stats.percentiles_ns["99"],
    }
    # The state machine saw first publications only: no page, nothing to withdraw.
    assert pub.alerts.states[("p99-read", None)].phase is Phase.INACTIVE
    assert pub.alerts.breaches == {"p99-read": 0}
    text, m = scrape(pub)
    assert m[("fiomon_sla_revised_verdicts_total", (*CLAT, ("rule", "p99-read")))] == 1
    assert m[("fiomon_sla_breach", (("host", ""), *CLAT, ("rule", "p99-read")))] == 0
    promtool_clean(text)

    # Revision 2 of the same quantum, still breaching: already reported. A revision
    # that leaves the verdict as it was: nothing to report.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="test.publish"):
        pub.revise([revision(first[1], 2 * slow, T0 + 61_000, 2)], T0 + 61_000, {"read": slow})
        few = np.zeros_like(slow)
        few[np.argmax(fast[2])] = 3  # three more reads at the mode: still clear
        pub.revise([revision(first[2], few, T0 + 62_000)], T0 + 62_000, {"read": few})
    assert caplog.records == []
    assert pub.alerts.revised_verdicts == {"p99-read": 1}


def row(end_ms: int, host: str | None, p99_ns: float, samples: float = 1000.0) -> ClosedQuantum:
    stats = HistStats(samples, 1e5, 1e6, 9e7, {"50": 1e6, "99": p99_ns}, ())
    scope: Scope = "cluster" if host is None else "host"
    return ClosedQuantum(end_ms - 1000, end_ms, scope, host, "read", stats, 1e3, 4e6, 1, 0)


def test_verdicts_compared_within_the_horizon_only_and_per_host() -> None:
    host_rule = dataclasses.replace(RULE, name="p99-read-host", scope="host")
    pub = publisher(config(RULE, host_rule, revise_within_ms=10_000))
    book = pub.alerts
    # Quanta 1..20 s, h1 clear throughout, h2 absent from quantum 15 s (its records late).
    for i in range(1, 21):
        end = T0 + i * 1000
        rows = [row(end, None, 1e6), row(end, "h1", 1e6)]
        if i != 15:
            rows.append(row(end, "h2", 1e6))
        pub.observe(rows, end + 5000)
    now = T0 + 30_000

    # Beyond the horizon (20 s - 10 s - 2 quanta): forgotten, not compared.
    old = [dataclasses.replace(r, revision=1, revised_at=now)
           for r in (row(T0 + 7000, None, 9e6), row(T0 + 7000, "h1", 9e6))]  # fmt: skip
    assert book.revise(old) == []
    # Within: the cluster rule and h1's state; h2's first row of quantum 15 s comes
    # with the revision (it had no verdict then: none).
    late = [dataclasses.replace(r, revision=1, revised_at=now)
            for r in (row(T0 + 15_000, None, 9e6), row(T0 + 15_000, "h2", 9e6))]  # fmt: skip
    got = book.revise(late)
    assert [(v.rule.name, v.host, v.first, v.revised) for v in got] == [
        ("p99-read", None, Verdict.CLEAR, Verdict.BREACH),
        ("p99-read-host", "h2", Verdict.NONE, Verdict.BREACH),
    ]
    assert got[1].first_value_ns is None
    assert got[1].revised_value_ns == 9e6
    # Too few I/Os in a revision is no evidence: a verdict of its own (none), reported.
    (thin,) = book.revise([dataclasses.replace(row(T0 + 16_000, "h1", 9e6, samples=50),
                                               revision=1, revised_at=now)])  # fmt: skip
    assert (thin.first, thin.revised) == (Verdict.CLEAR, Verdict.NONE)
    assert book.revised_verdicts == {"p99-read": 1, "p99-read-host": 2}
    # A reload that changes a rule forgets its verdicts (they were another rule's).
    book.replace_rules((RULE, dataclasses.replace(host_rule, threshold_ns=4e6)))
    again = dataclasses.replace(row(T0 + 18_000, "h1", 9e6), revision=1, revised_at=now)
    assert book.revise([again]) == []
    assert book.revised_verdicts == {"p99-read": 1, "p99-read-host": 0}


def test_revisions_off_remember_nothing() -> None:
    pub = publisher(config(RULE, revise_within_ms=0))
    pub.observe([row(T0 + 1000, None, 1e6)], T0 + 6000)
    assert pub.alerts.revise([dataclasses.replace(row(T0 + 1000, None, 9e6), revision=1)]) == []


def test_revise_refuses_counts_of_another_layout_and_changes_nothing() -> None:
    fast, slow = fast_and_slow(np.random.default_rng(3))
    pub = publisher(config(RULE))
    first = engine_rows(fast)
    pub.observe(first, first[-1].end_ms + 5000)
    _, before = scrape(pub)
    with pytest.raises(ValueError, match="shape"):
        pub.revise([revision(first[-1], slow, T0 + 60_000)], T0 + 60_000, {"read": slow[:-1]})
    _, after = scrape(pub)
    assert after == before


def test_revision_counters_are_exported_with_a_zero_per_host() -> None:
    pub = publisher(config(RULE))
    counts = Counts(quanta_revised=3, late_merged=Counter({"h1": 2850}), late=Counter({"h2": 32}))
    counts.host_labels |= {"h1", "h2"}
    text, m = scrape(pub, counts)
    assert m[("fiomon_quanta_revised_total", ())] == 3
    assert m[("fiomon_late_records_merged_total", (("host", "h1"),))] == 2850
    assert m[("fiomon_late_records_merged_total", (("host", "h2"),))] == 0
    assert m[("fiomon_late_records_total", (("host", "h1"),))] == 0
    assert m[("fiomon_late_records_total", (("host", "h2"),))] == 32
    assert m[("fiomon_sla_revised_verdicts_total", (*CLAT, ("rule", "p99-read")))] == 0
    assert "beyond the revision horizon" in text
    promtool_clean(text)


def test_a_revision_completes_the_latest_quantum_and_replaces_only_its_own_series() -> None:
    pub = publisher(config(RULE))
    end = T0 + 1000
    first = [dataclasses.replace(row(end, None, 1e6), complete=False),
             row(end, "h1", 1e6), row(end, "h2", 2e6)]  # fmt: skip
    pub.observe(first, end + 5000)
    held = pub.gauges.hosts  # a snapshot may hold it: replaced, never changed in place
    # h1's records were late: h1 and the cluster are revised, h2 is not.
    late = [dataclasses.replace(r, revision=1, revised_at=end + 9000)
            for r in (row(end, None, 3e6), row(end, "h1", 4e6))]  # fmt: skip
    pub.revise(late, end + 9000, {})
    text, m = scrape(pub)
    host = "fiomon_host_latency_percentile_seconds"
    p99 = (("percentile", "99"),)
    assert m[(host, (("direction", "read"), ("host", "h1"), *CLAT, *p99))] == 4e-3
    assert m[(host, (("direction", "read"), ("host", "h2"), *CLAT, *p99))] == 2e-3
    assert held[("h1", "read", "99")] == 1e-3
    assert (
        m[("fiomon_cluster_latency_percentile_seconds", (("direction", "read"), *CLAT, *p99))]
        == 3e-3
    )
    assert m[("fiomon_quantum_complete", ())] == 1
    assert m[("fiomon_quanta_incomplete_total", ())] == 1  # it closed incomplete: counted
    promtool_clean(text)


def test_the_engines_revisions_bring_the_buckets_to_an_in_time_run() -> None:
    # The engine's own revisions (late records within revise_within) and take_added():
    # the buckets then equal those of a run that had every record in time.
    fast, slow = fast_and_slow(np.random.default_rng(2025))

    def engine() -> QuantumEngine:
        return QuantumEngine(
            layout=BinLayout(),
            quantum_ms=1000,
            percentiles=(50, 99),
            directions=("read",),
            keep_hists=True,
            revise_within_ms=600_000,
        )

    through = T0 + 3000
    live = engine()
    live.add(batch_of_quanta(fast, t0_ms=T0))
    first = live.close_through(through)
    live.add(batch_of_quanta(slow[None, :], t0_ms=T0 + 1000))  # quantum 2's late reads
    revised = live.close_through(through, now_ms=through + 20_000)
    assert [(r.end_ms, r.revision, r.revised_at) for r in revised] == [
        (T0 + 2000, 1, through + 20_000)
    ]
    pub = publisher(config(RULE))
    pub.observe(first, through + 5000)
    pub.revise(revised, through + 20_000, live.take_added())

    in_time = engine()
    in_time.add(batch_of_quanta(fast + np.stack([np.zeros_like(slow), slow, np.zeros_like(slow)])))
    exact = publisher(config(RULE), "test.publish.exact")
    exact.observe(in_time.close_through(through), through + 5000)

    _, m = scrape(pub)
    _, want = scrape(exact)
    hist = {k: v for k, v in m.items() if k[0].startswith(HIST)}
    assert hist.keys() == {k for k in want if k[0].startswith(HIST)}
    for k, v in hist.items():
        if k[0] == f"{HIST}_sum":
            assert v == pytest.approx(want[k], rel=1e-12)
        else:
            assert v == want[k], k
    assert m[(f"{HIST}_count", READ)] == fast.sum() + slow.sum()
