"""Revisions at the aggregator core, on a fake clock: late records within the horizon
revise what was published, so the quanta file's latest revisions equal a run without
faults -- also across a crash and restart; past the horizon they are late, as before."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fiomon.aggregator import merger
from fiomon.aggregator.merger import AggregatorCore
from fiomon.server import journal as journal_mod
from fiomon.server import state as state_mod
from fiomon.wire import encode
from tests.aggregator.test_aggregator_faults import (
    HOSTS,
    SECONDS,
    config,
    crash,
    feed,
    finish,
    message,
    records,
    reference,  # noqa: F401 -- the fixture
    rows,
)
from tests.clock import T0, FakeClock

LATE_HOST = 2
LATE = range(5, 11)  # seconds whose records of the late host come 8 s late
IGNORED = ("revision", "revised_at", "late_records")

Row = dict[str, object]
Key = tuple[object, ...]


def key(r: Row) -> Key:
    return (r["end_ms"], r["scope"], r["host"] or "", r["direction"])


def latest(got: list[Row]) -> dict[Key, Row]:
    out: dict[Key, Row] = {}
    for r in got:
        k = key(r)
        if k not in out or int(r["revision"]) >= int(out[k]["revision"]):  # type: ignore[call-overload]
            out[k] = r
    return out


def run_without_late(core: AggregatorCore, clock: FakeClock[int], seconds: range) -> None:
    """Like ``feed``, without the late host's records of LATE (they come later, or never)."""
    for s in seconds:
        clock.t = T0 + 1000 * s + 300
        core.receive([message(h, s) for h in range(len(HOSTS)) if h != LATE_HOST or s not in LATE])
        for _ in range(4):
            core.tick()
            clock.t += 175


def feed_late(core: AggregatorCore, clock: FakeClock[int], seconds: range) -> None:
    """Like ``feed``, but the late host's records of LATE arrive 8 s after they end."""
    held: dict[int, list[tuple[str, bytes]]] = {}
    for s in seconds:
        clock.t = T0 + 1000 * s + 300
        batch = [message(h, s) for h in range(len(HOSTS)) if h != LATE_HOST or s not in LATE]
        if s in LATE:
            held.setdefault(s + 8, []).append(message(LATE_HOST, s))
        batch += held.pop(s, [])
        core.receive(batch)
        for _ in range(4):
            core.tick()
            clock.t += 175
    for s in sorted(held):
        core.receive(held[s])
        core.tick()


def assert_converged(path: Path, want_rows: dict[Key, Row]) -> list[Row]:
    got = rows(path)
    pairs = [(key(r), r["revision"]) for r in got]
    assert len(pairs) == len(set(pairs)), "a key was written twice at one revision"
    res = latest(got)
    assert set(res) == set(want_rows)
    for k, want in want_rows.items():
        have = res[k]
        assert {f: v for f, v in have.items() if f not in IGNORED} == {
            f: v for f, v in want.items() if f not in IGNORED
        }, k
    return got


def test_late_records_within_the_horizon_revise_the_published_quanta(
    tmp_path: Path,
    reference: dict[Key, Row],  # noqa: F811 -- the fixture
) -> None:
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    feed_late(core, clock, range(1, SECONDS + 1))
    assert core.counts.late_merged[HOSTS[LATE_HOST]] == 2 * len(LATE)
    assert sum(core.counts.late.values()) == 0
    assert core.counts.quanta_revised >= len(LATE)
    finish(core)
    got = assert_converged(tmp_path / "quanta.jsonl", reference)
    revised = [r for r in got if r.get("revised_at") is not None]
    assert {r["end_ms"] for r in revised} == {T0 + 1000 * s for s in LATE}
    # The first publications lacked the host (incomplete), the revisions have it.
    firsts = [r for r in got if r.get("revised_at") is None and r["scope"] == "cluster"]
    assert any(not r["complete"] for r in firsts if r["end_ms"] == T0 + 5000)
    cl = [r for r in revised if r["scope"] == "cluster" and r["direction"] == "all"]
    assert all(r["complete"] and r["revision"] == 1 and r["late_records"] == 2 for r in cl)


@pytest.mark.parametrize("chunk", [2000, 3])
def test_a_restart_within_the_horizon_still_revises_and_numbers_after_the_file(
    tmp_path: Path,
    reference: dict[Key, Row],  # noqa: F811 -- the fixture
    monkeypatch: pytest.MonkeyPatch,
    chunk: int,
) -> None:
    """Revisions before a crash, and more late records of those quanta after the restart.

    ``chunk``: the replay merges the journal in chunks of that many messages (3: the
    kept quanta are re-formed piece by piece, never published).
    """
    monkeypatch.setattr(merger, "REPLAY_CHUNK", chunk)
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    # Seconds 1..14 with the late host's read+write of 5..10 missing; its second 5
    # arrives before the crash (a revision), the rest after the restart.
    run_without_late(core, clock, range(1, 15))
    core.receive([message(LATE_HOST, 5)])
    clock.t += 300
    core.tick()
    assert core.counts.quanta_revised == 1
    assert core.state.writer is not None
    core.state.writer.close()  # what was handed to it is on disk
    crash(core)
    core2 = AggregatorCore(config(tmp_path), now_ms=clock)
    core2.restore()
    assert core2.engine is not None and core2.engine.kept_quanta >= 14
    assert core2.tick() == [], "the replay re-forms, it publishes nothing"
    core2.receive([message(LATE_HOST, s) for s in LATE if s != 5])
    clock.t += 300
    core2.tick()
    assert sum(core2.counts.late.values()) == 0
    feed(core2, clock, range(15, SECONDS + 1))
    finish(core2)
    assert_converged(tmp_path / "quanta.jsonl", reference)


def test_without_a_horizon_late_records_are_counted_and_left_out(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path, revise_within_ms=0), now_ms=clock)
    core.restore()
    feed_late(core, clock, range(1, SECONDS + 1))
    finish(core)
    assert core.counts.late[HOSTS[LATE_HOST]] == 2 * len(LATE)
    assert core.counts.quanta_revised == 0
    got = rows(tmp_path / "quanta.jsonl")
    assert all(r["revision"] == 0 and "revised_at" not in r for r in got)
    lacking = [r for r in got if r["host"] == HOSTS[LATE_HOST] and r["end_ms"] == T0 + 5000]
    assert lacking == []


def test_the_journal_kept_for_the_horizon_is_bounded_and_a_restart_says_from_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its byte bound the oldest segments go; the grid state says what a restart
    can still revise, and late records for older quanta are counted late after it."""
    monkeypatch.setattr(journal_mod, "SEGMENT_BYTES", 512)
    monkeypatch.setattr(state_mod, "JOURNAL_KEEP_BYTES", 1500)
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    assert core.state.journal is not None
    core.state.journal.segment_bytes = 512
    run_without_late(core, clock, range(1, 15))
    # Segments of quanta the writer thread has not confirmed are never deleted: wait for
    # it to confirm what closed, then let a tick release and trim.
    writer = core.state.writer
    assert writer is not None
    deadline = time.monotonic() + 30
    while (writer.confirmed_ms or 0) < T0 + 9000 and time.monotonic() < deadline:
        time.sleep(0.01)
    core.tick()
    cut = core.state.journal_cut_ms
    assert T0 < cut < T0 + 14_000
    core.close()
    core2 = AggregatorCore(config(tmp_path), now_ms=clock)
    core2.restore()
    assert core2.engine is not None
    assert core2.engine.kept_from_ms >= cut
    # A stream the restarted aggregator has no history of (so no duplicate filter says
    # anything): its records reach the engine, which revises only what it holds whole.
    name = HOSTS[LATE_HOST]
    core2.receive([(name, encode(name, "other.json@1", s, records(LATE_HOST, s))) for s in LATE])
    clock.t += 300
    core2.tick()
    # Quanta starting before what the journal still holds whole are not revised.
    old = [T0 + 1000 * s for s in LATE if T0 + 1000 * (s - 1) < core2.engine.kept_from_ms]
    assert old, "the bound must have cut into the late quanta"
    assert sum(core2.counts.late.values()) > 0
    finish(core2)
    revised = {r["end_ms"] for r in rows(tmp_path / "quanta.jsonl") if r.get("revised_at")}
    assert not revised & set(old)


def test_a_restart_that_lost_the_quanta_file_never_numbers_a_published_row_0_again(
    tmp_path: Path,
) -> None:
    """The journal re-forms quanta the previous run published: their rows were at
    revision 0 at least, so a revision after the restart is 1 even with no file to say."""
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    run_without_late(core, clock, range(1, 12))
    crash(core)
    (tmp_path / "quanta.jsonl").rename(tmp_path / "before.jsonl")
    core2 = AggregatorCore(config(tmp_path), now_ms=clock)
    core2.restore()
    core2.receive([message(LATE_HOST, 5)])
    clock.t += 300
    core2.tick()
    finish(core2)
    got = [r for r in rows(tmp_path / "quanta.jsonl") if r["end_ms"] == T0 + 5000]
    cl = {r["direction"]: r for r in got if r["scope"] == "cluster"}
    assert cl["all"]["revision"] == 1 and cl["all"]["revised_at"] is not None
    host = {r["direction"]: r["revision"] for r in got if r["host"] == HOSTS[LATE_HOST]}
    assert host == {"read": 0, "write": 0, "all": 0}  # first published by the late records
