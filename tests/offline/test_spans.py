"""Accuracy-driven spans: quanta merged until the chosen percentile is known well enough."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.engine import QuantumEngine
from fiomon.offline.spans import SpanMerger
from fiomon.tools.simulate import write_cluster
from tests.latencydists import batch_of_quanta, fio_quanta, lognormal

LAY = BinLayout()


def quanta(read_ios: int, write_ios: int, count: int, seed: int = 1) -> list[ClosedQuantum]:
    """``count`` closed 1 s quanta: a busy read stream and a slow write stream."""
    rng = np.random.default_rng(seed)
    engine = QuantumEngine(
        layout=LAY, quantum_ms=1000, directions=("read", "write"), keep_hists=True
    )
    engine.add(batch_of_quanta(fio_quanta(lognormal, read_ios, rng, count), direction=0))
    engine.add(batch_of_quanta(fio_quanta(lognormal, write_ios, rng, count), direction=1))
    return engine.flush()


def merger(target: float = 0.05, max_span_ms: int = 60_000) -> SpanMerger:
    return SpanMerger(
        layout=LAY,
        percentiles=(50, 90, 99, 99.9),
        target_percentile=99,
        target=target,
        max_span_ms=max_span_ms,
    )


def half_width(r: ClosedQuantum, key: str = "99") -> float:
    assert r.ci_ns is not None
    low, high = r.ci_ns[key]
    assert low is not None and high is not None
    return (high - low) / 2 / r.stats.percentiles_ns[key]


def test_a_busy_stream_keeps_its_quanta_and_a_slow_one_gets_longer_spans() -> None:
    rows = quanta(read_ios=20_000, write_ios=200, count=120)
    m = merger()
    out = m.add(rows) + m.flush()
    reads = [r for r in out if r.direction == "read"]
    writes = [r for r in out if r.direction == "write"]
    assert len(reads) == 120
    assert all(r.end_ms - r.start_ms == 1000 and r.target_met for r in reads)
    spans = [(r.end_ms - r.start_ms) // 1000 for r in writes]
    print(f"p99 within 5 %: 200 I/Os a second need spans of {spans} s")
    assert min(spans[:-1]) >= 10
    # Every span but the last (the input ended) reached the target, which the single
    # quanta are far from; spans tile the run and conserve every I/O.
    assert all(r.target_met for r in writes[:-1])
    assert all(half_width(r) <= 0.05 for r in writes[:-1])
    # A single quantum of 200 I/Os has no upper bound for its p99 at all.
    assert all(r.ci_ns and r.ci_ns["99"][1] is None for r in rows if r.direction == "write")
    assert [r.start_ms for r in writes[1:]] == [r.end_ms for r in writes[:-1]]
    assert sum(r.stats.samples for r in writes) == pytest.approx(200 * 120)
    assert writes[0].iops == pytest.approx(200)


def test_a_span_that_reaches_the_maximum_is_flagged() -> None:
    rows = quanta(read_ios=100, write_ios=100, count=20)
    m = merger(max_span_ms=5000)
    out = m.add(rows) + m.flush()
    assert {r.end_ms - r.start_ms for r in out} == {5000}
    assert not any(r.target_met for r in out)
    assert all(r.to_json()["target_met"] is False for r in out)


def test_spans_do_not_depend_on_how_quanta_arrive() -> None:
    rows = quanta(read_ios=3000, write_ios=300, count=60, seed=4)
    whole = merger()
    at_once = [r.to_json() for r in whole.add(rows) + whole.flush()]
    one = merger()
    singly = [x.to_json() for r in rows for x in one.add([r])] + [r.to_json() for r in one.flush()]
    assert sorted(at_once, key=str) == sorted(singly, key=str)


def test_report_target_error_on_the_command_line(tmp_path: Path) -> None:
    paths = write_cluster(tmp_path, hosts=1, jobs_per_host=1, seconds=30, iops=300, seed=2)
    run = [sys.executable, "-m", "fiomon", "report", *map(str, paths)]
    r = subprocess.run(
        [*run, "--format", "jsonl", "--directions", "read", "--target-error", "10%"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(rows) < 30
    assert all("target_met" in x and x["end_ms"] - x["start_ms"] >= 1000 for x in rows)
    assert any(x["end_ms"] - x["start_ms"] > 1000 for x in rows)
    t = subprocess.run(
        [*run, "--directions", "read", "--target-error", "10%"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert t.returncode == 0, t.stderr
    assert t.stdout.splitlines()[1].split()[:2] == ["end", "span"]
    bad = subprocess.run(
        [*run, "--format", "fiologparser", "--target-error", "5%"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert "fiologparser" in bad.stderr
