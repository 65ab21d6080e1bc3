"""Attempts to break issue 25 (revisions): each test names a problem found."""

from __future__ import annotations

from pathlib import Path

from fiomon.aggregator.merger import AggregatorCore
from tests.aggregator.test_aggregator_faults import (
    HOSTS,
    SECONDS,
    config,
    crash,
    finish,
    message,
    reference,  # noqa: F401 -- the fixture
    rows,
)
from tests.aggregator.test_revisions import LATE, LATE_HOST, assert_converged, latest
from tests.clock import T0, FakeClock


def _run_missing_late_host(core: AggregatorCore, clock: FakeClock[int], seconds: range) -> None:
    for s in seconds:
        clock.t = T0 + 1000 * s + 300
        core.receive([message(h, s) for h in range(len(HOSTS)) if h != LATE_HOST or s not in LATE])
        for _ in range(4):
            core.tick()
            clock.t += 175


def test_crash_after_a_late_record_is_journaled_but_before_its_revision_loses_it(
    tmp_path: Path,
    reference: dict,  # noqa: F811
) -> None:
    """kill -9 between journaling (acknowledging) a late record and the next tick.

    The replay folds every journaled record of a closed quantum into the kept state as
    if it had been published (engine.absorb), so the late record is never published:
    the quanta file's latest revision lacks it for good.
    """
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    _run_missing_late_host(core, clock, range(1, 15))
    # the late host's records of 5..10 arrive; journaled (acknowledged); crash before a tick
    core.receive([message(LATE_HOST, s) for s in LATE])
    crash(core)
    core2 = AggregatorCore(config(tmp_path), now_ms=clock)
    core2.restore()
    _run_missing_late_host(core2, clock, range(15, SECONDS + 1))
    finish(core2)
    _assert_cluster_samples(tmp_path / "quanta.jsonl", reference)
    assert_converged(tmp_path / "quanta.jsonl", reference)


def _assert_cluster_samples(path: Path, reference: dict) -> None:
    """The latest cluster/all samples per quantum equal the reference (numbers in the message)."""
    res = latest(rows(path))
    want = {k[0]: r["samples"] for k, r in reference.items() if k[1:] == ("cluster", "", "all")}
    got = {k[0]: r["samples"] for k, r in res.items() if k[1:] == ("cluster", "", "all")}
    diff = {(e - T0) // 1000: (got.get(e), n) for e, n in want.items() if got.get(e) != n}
    assert not diff, f"second: (latest samples, reference samples) {diff}"
