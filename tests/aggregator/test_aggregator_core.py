"""The aggregator's logic on a fake clock: dedup, closing, alerts, exporter, bad input."""

from __future__ import annotations

import io
import itertools
import json
import random
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from fiomon.aggregator.alerts import AlertState, Phase, evaluate
from fiomon.aggregator.core import AggregatorCore
from fiomon.aggregator.dedup import SeqTracker
from fiomon.aggregator.exporter import Snapshot, bucket_edges_s
from fiomon.aggregator.metrics import CELL_INFO
from fiomon.aggregator.quantafile import QuantaFile
from fiomon.aggregator.watermark import Watermark
from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.config import AggregatorConfig, ExportConfig, SlaRule
from fiomon.histogram import HistStats, cumulative_at
from fiomon.model import RecordBatch
from fiomon.offline.output import JsonlWriter
from fiomon.wire import encode
from tests.batches import batch as make_batch
from tests.clock import T0, FakeClock
from tests.metricskit import FiomonCollector

LAY = BinLayout()


def batch(
    ends: list[int], *, direction: int = 0, bin_: int = 700, count: int = 200, label: str = "j"
) -> RecordBatch:
    return make_batch([(e - 1000, e, direction, {bin_: count}) for e in ends], "", label, LAY)


@dataclass(frozen=True)
class Delays:
    """The exported ``fiomon_quantum_close_delay_seconds`` histogram."""

    edges_s: tuple[float, ...]
    cumulative: tuple[float, ...]
    n: float

    def at_most(self, s: float) -> float:
        """Closes that came at most ``s`` after their quantum's end (``s`` an edge)."""
        return self.cumulative[self.edges_s.index(s)]


def close_delays(c: AggregatorCore) -> Delays:
    """The close-delay histogram of ``c``'s current snapshot (what /metrics serves)."""
    ((edges, cumulative, n, _),) = [
        v for k, v in c.snapshot.histograms.items() if k[0] == "fiomon_quantum_close_delay_seconds"
    ]
    return Delays(edges, cumulative, n)


def core(clock: FakeClock[int], **kw: object) -> AggregatorCore:
    cfg = AggregatorConfig(align="epoch", lateness_ms=5000, **kw)  # type: ignore[arg-type]
    return AggregatorCore(cfg, now_ms=clock)


# -- dedup ------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.randoms(use_true_random=False), st.integers(0, 5))
def test_every_record_is_new_exactly_once_whatever_the_redelivery(
    total: int, rnd: random.Random, drops: int
) -> None:
    # Cut 0..total-1 into messages, deliver each once or more, out of order at times.
    cuts = (
        sorted(rnd.sample(range(1, total), min(total - 1, rnd.randint(0, 6)))) if total > 1 else []
    )
    bounds = [0, *cuts, total]
    msgs = [(a, b - a) for a, b in itertools.pairwise(bounds)]
    deliveries = msgs + [rnd.choice(msgs) for _ in range(drops)]
    tail = deliveries[1:]
    rnd.shuffle(tail)
    deliveries = deliveries[:1] + tail
    t = SeqTracker()
    seen: list[int] = []
    for first, n in deliveries:
        v = t.judge("a", "s", first, n)
        seen += [first + i for i in range(n) if v.new[i]]
    assert len(seen) == len(set(seen)), "no record is new twice"
    first = deliveries[0][0]
    # Everything from the first message's start on arrives, and once.
    assert set(range(first, total)) <= set(seen) | set(range(first))


def test_gap_is_counted_lost_and_late_arrival_recovered() -> None:
    t = SeqTracker()
    assert t.judge("a", "s", 0, 5).new.all()
    v = t.judge("a", "s", 8, 2)  # 5, 6, 7 skipped
    assert v.lost == 3 and v.new.all()
    v = t.judge("a", "s", 4, 4)  # 4 is a duplicate, 5-7 arrive late
    assert list(v.new) == [False, True, True, True]
    assert (v.duplicates, v.recovered) == (1, 3)
    assert t.judge("a", "s", 5, 3).duplicates == 3


def test_stream_cap_refuses_and_says_so() -> None:
    t = SeqTracker(max_streams=2)
    t.judge("a", "1", 0, 1)
    t.judge("a", "2", 0, 1)
    assert t.judge("a", "3", 0, 1).refused


# -- watermark --------------------------------------------------------------------------------


def test_watermark_early_close_live_streams_and_lateness() -> None:
    # time (s)   0    1    2    3 ...      lateness 5 s
    # stream a   |----a ends 12 s
    # stream b   |----b ends 10 s, then silent
    w = Watermark(lateness_ms=5000)
    w.observe("h1", "a", T0 + 12_000, now_ms=T0)
    w.observe("h2", "b", T0 + 10_000, now_ms=T0)
    assert w.close_through(T0) == T0 - 5000  # warm-up: only the clock bound
    w.observe("h1", "a", T0 + 13_000, now_ms=T0 + 5000)
    w.observe("h2", "b", T0 + 11_000, now_ms=T0 + 5000)
    assert w.close_through(T0 + 5000) == T0 + 11_000  # both reported past 11 s
    w.set_online("h2", online=False)  # b's agent went offline: a alone decides
    assert w.close_through(T0 + 5000) == T0 + 13_000
    w.set_online("h2", online=True)
    w.observe("h1", "a", T0 + 20_000, now_ms=T0 + 11_000)
    # b has been silent 6 s (> idle = lateness): it no longer holds quanta open.
    assert w.close_through(T0 + 11_000) == T0 + 20_000
    assert w.close_through(T0 + 1000) == T0 + 20_000  # never moves back


# -- alerts -----------------------------------------------------------------------------------


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


# -- exporter ---------------------------------------------------------------------------------


def test_bucket_counts_equal_the_histogram_at_each_edge() -> None:
    rng = np.random.default_rng(1)
    hist = np.zeros(LAY.nbins)
    hist[rng.integers(200, 1200, 300)] += rng.random(300) * 10
    edges = bucket_edges_s(LAY, [5e6])
    assert 0.005 in edges.tolist()
    got = cumulative_at(hist, LAY, edges)
    lower, upper = LAY.edges_ns()
    for e, g in zip(edges * 1e9, got, strict=True):
        frac = np.clip((e - lower) / (upper - lower), 0, 1)
        assert g == pytest.approx(float((hist * frac).sum()), rel=1e-12, abs=1e-9)
    assert np.all(np.diff(got) >= -1e-9)


@pytest.mark.parametrize(("per_octave", "widest"), [(4, 0.197), (16, 0.046)])
def test_bucket_resolution_and_its_error_bound(per_octave: int, widest: float) -> None:
    # The bound docs/metrics.md and deploy/README.md state for histogram_quantile: one
    # bucket's width, 2**(1/k) - 1 plus the rounding of the le labels.
    edges = bucket_edges_s(LAY, [5e6, 1.234e6], per_octave)
    assert {0.005, 0.001234} <= set(edges.tolist())  # SLA thresholds are exact edges
    widths = edges[1:] / edges[:-1] - 1
    assert widths.max() <= widest
    assert widths.max() >= 2 ** (1 / per_octave) - 1 - 1e-9  # the bound is not loose
    assert edges[0] == 1e-6
    assert edges[-1] < LAY.edges_ns()[1][-1] / 1e9
    assert len(edges) == 24 * per_octave + 2 + 1  # 24 octaves from 1 us, the thresholds


def test_default_bucket_edges_are_unchanged() -> None:
    # Dashboards and recorded series key on le labels: the default stays what it was.
    edges = bucket_edges_s(LAY, [5e6])
    assert len(edges) == 98
    assert edges[:4].tolist() == [1e-06, 1.19e-06, 1.41e-06, 1.68e-06]


def test_bucket_histogram_is_exported_at_zero_from_the_start_with_the_cell() -> None:
    # rate() counts a series' growth from its first scrape: born with the first quantum's
    # counts, it would lose that quantum (in each cell of a cross-cell sum differently).
    clock = FakeClock(T0)
    c = core(clock, cell="cell-a", export=ExportConfig(buckets_per_octave=16))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: c.snapshot))
    for d in ("read", "write", "trim", "all"):
        labels = {"direction": d}
        assert registry.get_sample_value("fiomon_cluster_io_latency_seconds_count", labels) == 0
        labels["le"] = "+Inf"
        assert registry.get_sample_value("fiomon_cluster_io_latency_seconds_bucket", labels) == 0
    assert len(c.snapshot.edges_s) == 24 * 16 + 1
    assert registry.get_sample_value("fiomon_cell_info", {"name": "cell-a"}) == 1.0
    # ... and the records' counts then add to those same series.
    c.on_records("h1", encode("h1", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 4)])))
    clock.advance(10_000)
    assert c.tick()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: c.snapshot))
    count = registry.get_sample_value(
        "fiomon_cluster_io_latency_seconds_count", {"direction": "read"}
    )
    assert count == pytest.approx(3 * 200)
    assert registry.get_sample_value("fiomon_cell_info", {"name": "cell-a"}) == 1.0
    assert core(clock).snapshot.gauges.get(CELL_INFO) is None  # no cell: no series


def test_metrics_text_passes_promtool(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    c = core(clock, sla=(SlaRule("p99-read", "read", 99.0, 5e6, for_quanta=1, min_samples=1),))
    clock.advance(20_000)
    c.on_records("h1", encode("h1", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 8)])))
    c.on_records(
        "h2", encode("h2", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 8)], bin_=1400))
    )
    clock.advance(5001)  # no more records: the wall clock decides
    rows = c.tick()
    assert rows, "quanta older than the lateness close on the clock"
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: c.snapshot))
    text = generate_latest(registry).decode()
    assert 'fiomon_cluster_latency_percentile_seconds{direction="read",percentile="99"}' in text
    assert 'fiomon_cluster_io_latency_seconds_bucket{direction="read",le="0.005"}' in text
    assert registry.get_sample_value("fiomon_sla_breach", {"rule": "p99-read", "host": ""}) == 1.0
    assert registry.get_sample_value("fiomon_quantum_end_timestamp_seconds") == (T0 + 7000) / 1000
    count = registry.get_sample_value(
        "fiomon_cluster_io_latency_seconds_count", {"direction": "read"}
    )
    assert count == pytest.approx(2 * 7 * 200)
    threshold = {"rule": "p99-read", "direction": "read", "percentile": "99"}
    assert registry.get_sample_value("fiomon_sla_threshold_seconds", threshold) == 0.005
    assert registry.get_sample_value("fiomon_benchmark_active") == 1.0
    assert registry.get_sample_value("fiomon_broker_connected") == 0.0
    assert registry.get_sample_value(
        "fiomon_host_last_seen_timestamp_seconds", {"host": "h2"}
    ) == pytest.approx((T0 + 20_000) / 1000)
    assert "fiomon_build_info{" in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run .ci/run or apt-get install prometheus")
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    # Prometheus' conventions hold: promtool has no finding at all.
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (res.stdout + res.stderr).strip(), res.stdout + res.stderr
    # The confidence bounds bracket the percentile; a side the data cannot bound is absent.
    bound = {"direction": "read", "percentile": "99"}
    value = registry.get_sample_value("fiomon_cluster_latency_percentile_seconds", bound)
    low = registry.get_sample_value("fiomon_cluster_latency_percentile_lower_seconds", bound)
    high = registry.get_sample_value("fiomon_cluster_latency_percentile_upper_seconds", bound)
    assert value is not None and low is not None and high is not None
    assert low <= value <= high
    # 400 I/Os a quantum cannot bound p99.9 from above: that series is absent, not NaN.
    top = {"direction": "read", "percentile": "99.9"}
    assert registry.get_sample_value("fiomon_cluster_latency_percentile_upper_seconds", top) is None
    assert registry.get_sample_value("fiomon_cluster_latency_percentile_lower_seconds", top)


def test_idle_withdraws_the_per_quantum_series_and_settles_the_alert() -> None:
    # records ......... 7 s of them, then silence
    # lateness 5 s:     the last quantum closes at +5 s, the alert fires (for: 1)
    # idle at 2 x lateness after the last record: series gone, alert resolved
    clock = FakeClock(T0)
    c = core(clock, sla=(SlaRule("p99-read", "read", 99.0, 5e6, for_quanta=1, min_samples=1),))
    clock.advance(8_000)
    c.on_records(
        "h1", encode("h1", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 8)], bin_=1400))
    )
    clock.advance(5001)
    assert c.tick()
    snap = c.snapshot
    assert c.active and snap.cluster and snap.hosts
    assert snap.sla_breach[("p99-read", "")] == 1
    clock.advance(c.idle_after_ms - 5001 - 1)
    c.tick()
    assert c.active, "still within the idle time"
    clock.advance(1)
    c.tick()
    assert not _active(c)
    snap = c.snapshot
    assert not snap.cluster and not snap.hosts, "per-quantum gauges are withdrawn"
    names = {k[0] for k in snap.gauges}
    assert "fiomon_cluster_iops" not in names
    assert "fiomon_cluster_latency_percentile_saturated" not in names
    assert snap.gauges[("fiomon_benchmark_active", *_help(snap, "fiomon_benchmark_active"))] == {
        (): 0.0
    }
    assert snap.sla_breach[("p99-read", "")] == 0, "a run that ended is no breach"
    assert [(t.old, t.new, t.idle) for t in c.transitions[-1:]] == [
        (Phase.FIRING, Phase.RESOLVED, True)
    ]
    # Records again: active, and the next quanta bring the series back.
    c.on_records("h1", encode("h1", "s@1", 7, batch([clock.t + 1000 * i for i in range(1, 3)])))
    c.tick()
    assert c.active
    assert c.snapshot.gauges[("fiomon_benchmark_active", *_help(snap, "fiomon_benchmark_active"))]


def _active(c: AggregatorCore) -> bool:
    return c.active  # read through a call: mypy would keep an earlier assert's narrowing


def _help(snap: Snapshot, name: str) -> tuple[str, tuple[str, ...]]:
    ((_, text, labels),) = [k for k in snap.gauges if k[0] == name]
    return text, labels


def test_skipped_tail_fits_are_counted_on_metrics() -> None:
    # One occupied bin per quantum: nothing to fit a distribution to. The operator sees
    # the skipped fits on /metrics instead of tail gauges that never come.
    clock = FakeClock(T0 + 20_000)
    c = core(clock, fit_tail=True)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: c.snapshot))
    assert registry.get_sample_value("fiomon_tail_fits_skipped_total") == 0.0
    c.on_records("h1", encode("h1", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 4)])))
    clock.advance(5001)
    assert c.tick()
    text = generate_latest(registry).decode()
    assert "fiomon_cluster_tail_share{" not in text
    # One close: its newest quantum is fitted per direction with I/O (read, all).
    skipped = registry.get_sample_value("fiomon_tail_fits_skipped_total")
    assert skipped == 2


def test_quanta_file_rotates_and_keeps(tmp_path: Path) -> None:
    clock = FakeClock(T0 + 60_000)
    c = core(clock)
    c.on_records("h1", encode("h1", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 40)])))
    rows = c.tick()
    qf = QuantaFile(tmp_path / "q.jsonl", max_bytes=4096, keep=2)
    for r in rows:
        qf.write([r])
    qf.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["q.jsonl", "q.jsonl.1", "q.jsonl.2"]
    for p in tmp_path.iterdir():
        for line in p.read_text().splitlines():
            assert json.loads(line)["scope"] in ("cluster", "host")


# -- bad input and faults -----------------------------------------------------------------------


def test_bad_payloads_are_counted_by_reason_and_nothing_else_changes() -> None:
    clock = FakeClock(T0 + 20_000)
    c = core(clock, max_message_bytes=64 * 1024)
    good = encode("h1", "s@1", 0, batch([T0 + 1000, T0 + 2000]))
    c.on_records("h1", b"\x00garbage" * 10)
    c.on_records("h1", good[:30])
    c.on_records("h1", good[:4] + b"\x09" + good[5:])  # another version
    c.on_records("h1", good + b"\0" * 70_000)  # oversized
    c.on_records("h2", good)  # published under another host's topic
    coarse = batch([T0 + 1000])
    c.on_records("h1", good)
    c.on_records("h1", good)  # a redelivery
    wrong = encode(
        "h1",
        "s@2",
        0,
        RecordBatch(
            layout=BinLayout(19, 0, "us"),
            streams=coarse.streams,
            stream_idx=coarse.stream_idx,
            direction=coarse.direction,
            start_ms=coarse.start_ms,
            end_ms=coarse.end_ms,
            nbytes=coarse.nbytes,
            indptr=coarse.indptr,
            bins=coarse.bins,
            counts=coarse.counts,
        ),
    )
    c.on_records("h1", wrong)
    future = encode("h1", "s@3", 0, batch([T0 + 3_600_000]))
    c.on_records("h1", future)
    assert dict(c.invalid) == {
        "not-fiomon": 1,
        "truncated": 1,
        "version": 1,
        "oversized": 1,
        "agent-mismatch": 1,
        "layout": 1,
        "future": 1,
    }
    assert c.records["received"] == 2
    assert c.records["duplicate"] == 2
    assert c.records["invalid-future"] == 1


def test_a_silent_agent_does_not_hold_quanta_open() -> None:
    clock = FakeClock(T0)
    c = core(clock)
    c.on_status("h1", json.dumps({"state": "online", "instance": "x"}).encode())
    c.on_status("h2", json.dumps({"state": "online", "instance": "y"}).encode())
    before = close_delays(c)
    for s in range(1, 30):
        before = close_delays(c)
        clock.t = T0 + 1000 * s + 300
        c.on_records("h1", encode("h1", "a@1", s - 1, batch([T0 + 1000 * s])))
        if s < 8:  # h2 falls silent after 7 s
            c.on_records("h2", encode("h2", "b@1", s - 1, batch([T0 + 1000 * s])))
        c.tick()
    # With lateness 5 s and h2 silent, quanta still close about 1 s behind h1.
    assert c.engine is not None
    after = close_delays(c)
    assert after.n > before.n, "the last tick closed a quantum"
    assert after.at_most(1.5) - before.at_most(1.5) == after.n - before.n
    assert sum(c.engine.late_records.values()) == 0


def test_host_flood_is_capped_and_two_agents_with_one_id_are_noticed() -> None:
    clock = FakeClock(T0 + 20_000)
    c = core(clock, max_hosts=5)
    for h in range(40):
        name = f"h{h}"
        c.on_records(name, encode(name, "s@1", 0, batch([T0 + 1000])))
    clock.advance(5001)  # no more records: the wall clock decides
    rows = c.tick()
    assert c.engine is not None and c.engine.hosts_over_cap == 35
    hosts = {r.host for r in rows if r.scope == "host"}
    assert len(hosts) == 5
    cluster = [r for r in rows if r.scope == "cluster" and r.direction == "read"]
    assert cluster[0].stats.samples == 40 * 200  # every host still counts in the cluster
    assert c.lost == {} and set(c.duplicates) <= {f"h{i}" for i in range(5)} | {"_other"}
    c.on_status("h1", json.dumps({"state": "online", "instance": "one"}).encode())
    c.on_status("h1", json.dumps({"state": "online", "instance": "two"}).encode())
    assert c.id_conflicts["h1"] == 1


def test_a_stream_has_reported_only_as_far_as_its_slowest_part() -> None:
    # A hist log's write records are stamped ~7 ms after its reads; the next write record
    # starts where the last one ended, so the stream has reported up to that, not further.
    w = Watermark(lateness_ms=5000, warmup_ms=0)
    w.observe("h", "s", T0 + 1007, T0, {("j", 0): T0 + 1000, ("j", 1): T0 + 1007})
    w.observe("h", "s", T0 + 2000, T0 + 100, {("j", 0): T0 + 2000})  # the read came first
    assert w.close_through(T0 + 100) == T0 + 1007
    w.observe("h", "s", T0 + 2007, T0 + 200, {("j", 1): T0 + 2007})
    assert w.close_through(T0 + 200) == T0 + 2000


_EDGE_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, 2.0**53, 2.0**53 + 2, 1 / 3, 123456.5, 1e21]),
    st.integers(min_value=0, max_value=2**62).map(float),
)


@st.composite
def _closed_rows(draw: st.DrawFn) -> ClosedQuantum:
    keys = draw(st.lists(st.sampled_from(["50", "90", "99", "99.9"]), unique=True, max_size=4))
    opt = st.one_of(st.none(), _EDGE_FLOATS)
    end = draw(st.integers(min_value=-(2**40), max_value=2**45))
    return ClosedQuantum(
        start_ms=end - draw(st.integers(min_value=1, max_value=10**6)),
        end_ms=end,
        scope=draw(st.sampled_from(["cluster", "host"])),
        host=draw(st.one_of(st.none(), st.text(max_size=8))),
        direction=draw(st.sampled_from(["read", "write", "trim", "all"])),
        stats=HistStats(
            samples=draw(_EDGE_FLOATS),
            min_ns=draw(_EDGE_FLOATS),
            mean_ns=draw(_EDGE_FLOATS),
            max_ns=draw(_EDGE_FLOATS),
            percentiles_ns={k: draw(_EDGE_FLOATS) for k in keys},
            saturated=tuple(draw(st.lists(st.sampled_from(keys), unique=True))) if keys else (),
        ),
        iops=draw(opt),
        bytes_per_second=draw(opt),
        streams=draw(st.integers(min_value=0, max_value=10**6)),
        late_records=draw(st.integers(min_value=0, max_value=10**6)),
        ci_ns=draw(st.one_of(st.none(), st.just({k: (draw(opt), draw(opt)) for k in keys}))),
        target_met=draw(st.one_of(st.none(), st.booleans())),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(_closed_rows(), min_size=1, max_size=20))
def test_quanta_file_and_report_write_the_identical_line(rows: list[ClosedQuantum]) -> None:
    # DESIGN's report == aggregator contract: the quanta file and `fiomon report --format
    # jsonl` hold the same bytes for the same rows, NaN, infinities, None and huge or tiny
    # floats included; and that line is the compact json.dumps of to_json().
    with tempfile.TemporaryDirectory() as tmp:
        qf = QuantaFile(Path(tmp) / "q.jsonl")
        qf.write(rows)
        qf.close()
        written = (Path(tmp) / "q.jsonl").read_text(encoding="utf-8")
    out = io.StringIO()
    JsonlWriter(out).write(rows)
    assert written == out.getvalue()
    assert written == "".join(json.dumps(r.to_json(), separators=(",", ":")) + "\n" for r in rows)
    assert len(written.splitlines()) == len(rows)
