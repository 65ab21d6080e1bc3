"""Which hosts hold the cluster's tail: the shares, their bound, the metric and the alert."""

from __future__ import annotations

from fiomon.aggregator.merger import AggregatorCore
from fiomon.bins import BinLayout
from fiomon.config import AggregatorConfig, SlaRule
from fiomon.server.alerts import AlertBook, AlertState, Phase, Transition, alertmanager_payload
from fiomon.server.exporter import render
from fiomon.server.tailshare import TOP_K, shares_text
from fiomon.wire import encode
from tests.aggregator.corekit import batch
from tests.clock import T0, FakeClock
from tests.metricskit import parse_samples

LAY = BinLayout()
FAST, SLOW = 700, 1100  # 64 us and 5.0 ms bins


def _core(clock: FakeClock[int], *rules: SlaRule) -> AggregatorCore:
    cfg = AggregatorConfig(align="epoch", lateness_ms=5000, sla=rules)
    return AggregatorCore(cfg, now_ms=clock)


def _feed(c: AggregatorCore, clock: FakeClock[int], hosts: dict[str, dict[int, int]]) -> None:
    """Seven quanta of each host's ``{bin: count}`` reads, then close them."""
    ends = [T0 + 1000 * i for i in range(1, 8)]
    clock.advance(8_000)
    for h, bins in hosts.items():
        for n, (b, count) in enumerate(bins.items()):
            c.on_records(h, encode(h, f"s{n}@1", 0, batch(ends, bin_=b, count=count)))
    clock.advance(5001)
    c.tick()


def test_the_slow_host_holds_the_tail_and_the_metric_names_it() -> None:
    clock = FakeClock(T0)
    rule = SlaRule("p99-read", "read", 99.0, 1e6, for_quanta=2, min_samples=1)
    c = _core(clock, rule)
    # 20 fast hosts of 100 I/Os at 64 us; "slow" has 60 of its 100 at 5 ms: the cluster
    # p99 (of 2100 I/Os: the 21 slowest) lies in the 5 ms bin, which only "slow" holds.
    hosts = {f"fast-{i:02d}": {FAST: 100} for i in range(20)}
    hosts["slow"] = {FAST: 40, SLOW: 60}
    _feed(c, clock, hosts)
    samples = parse_samples(render(c.snapshot).decode())
    shares = {k: v for k, v in samples.items() if k[0] == "fiomon_tail_share"}
    labels = (("direction", "read"), ("host", "slow"), ("latency", "clat"), ("percentile", "99"))
    key = ("fiomon_tail_share", labels)
    assert shares == {key: 1.0}
    # The alert fired with the slow host named, with its share of the breaching quanta.
    (t,) = [t for t in c.transitions if t.new is Phase.FIRING]
    assert t.worst == (("slow", 1.0),)
    assert t.to_json()["worst_hosts"] == [["slow", 1.0]]
    assert c.publisher.alerts.worst_hosts("p99-read") == (("slow", 1.0),)


def test_shares_split_across_hosts_and_only_the_top_k_are_exported() -> None:
    clock = FakeClock(T0)
    c = _core(clock, SlaRule("p50-read", "read", 50.0, 1e6, min_samples=1))
    # Eight hosts all slow, host i with i+1 slow I/Os: the tail (the 5 ms bin up) holds
    # 36 I/Os; only the five largest shares are exported, largest first in the alert.
    _feed(c, clock, {f"h{i}": {SLOW: i + 1} for i in range(8)})
    samples = parse_samples(render(c.snapshot).decode())
    shares = {dict(k[1])["host"]: v for k, v in samples.items() if k[0] == "fiomon_tail_share"}
    assert len(shares) == TOP_K
    assert shares == {f"h{i}": (i + 1) / 36 for i in range(3, 8)}
    worst = c.publisher.alerts.worst_hosts("p50-read")
    assert [h for h, _ in worst] == ["h7", "h6", "h5", "h4", "h3"]
    assert shares_text(worst[:2]) == "h7 22%, h6 19%"


def test_no_sla_rules_no_tail_share_and_no_host_histograms() -> None:
    clock = FakeClock(T0)
    c = _core(clock)
    _feed(c, clock, {"a": {SLOW: 10}, "b": {FAST: 10}})
    text = render(c.snapshot).decode()
    assert "fiomon_tail_share" not in text
    assert c.engine is not None
    assert not c.engine.keep_host_hists


def test_the_alert_topic_names_the_worst_hosts_and_says_ended_when_the_run_stops() -> None:
    clock = FakeClock(T0)
    c = _core(clock, SlaRule("p99-read", "read", 99.0, 1e6, for_quanta=2, min_samples=1))
    _feed(c, clock, {"fast": {FAST: 100}, "slow": {FAST: 40, SLOW: 60}})
    (firing,) = c.publisher.alerts.snapshot()
    assert (firing["state"], firing["worst_hosts"]) == ("firing", [["slow", 1.0]])
    assert "ended" not in firing
    clock.advance(c.idle_after_ms)
    c.tick()  # no records: idle, the alert settles
    (t,) = c.transitions[-1:]
    assert (t.new, t.idle, t.to_json()["ended"]) == (Phase.RESOLVED, True, True)
    (ended,) = c.publisher.alerts.snapshot()
    assert (ended["state"], ended["ended"], ended["worst_hosts"]) == (
        "resolved",
        True,
        [["slow", 1.0]],
    )


def test_a_resolution_during_the_run_says_recovered_one_at_idle_says_ended() -> None:
    rule = SlaRule("p99-read", "read", 99.0, 5e6, clear_for=3)
    book = AlertBook((rule,))
    state = AlertState(Phase.RESOLVED, value_ns=2.5e6, fired_ms=T0)
    for idle, summary, resolution in (
        (False, "recovered: p99 lat read 2.5 ms < 4.5 ms", "recovered: p99 lat read below 4.5 ms"),
        (
            True,
            "ended (the benchmark stopped): p99 lat read last 2.5 ms, threshold 5 ms (cluster)",
            "ended: the benchmark",
        ),
    ):
        t = Transition(rule, None, Phase.FIRING, Phase.RESOLVED, state, T0 + 9000, idle)
        (alert,) = alertmanager_payload(book, [t], T0 + 9000, "lat")
        assert alert["labels"]["latency"] == "lat"  # the kind the rule holds for (issue 27)
        assert alert["annotations"]["summary"].startswith(summary), alert
        assert alert["annotations"]["resolution"].startswith(resolution), alert
        assert "endsAt" in alert
