"""Revisions under faults (found by trying to break issue 25): crashes around a late
record, replays longer than max_open_quanta, a cell restarting, a lost state file with
rotated quanta files, a revision of a quantum that still lacks a host, reading a rotated
family back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fiomon.aggregator.merger import AggregatorCore
from fiomon.closed import ClosedQuantum
from fiomon.config import PartialsConfig
from fiomon.root.merger import RootMerger
from fiomon.server.quantafile import QuantaFile
from tests.aggregator.test_aggregator_faults import (
    HOSTS,
    SECONDS,
    config,
    crash,
    feed,
    finish,
    message,
    reference,  # noqa: F401 -- the fixture
    rows,
)
from tests.aggregator.test_revisions import (
    LATE,
    LATE_HOST,
    assert_converged,
    latest,
    run_without_late,
)
from tests.clock import T0, FakeClock
from tests.fiorun import fiomon
from tests.root.test_merger import _outbox_messages

Reference = dict[tuple[object, ...], dict[str, object]]


def test_a_late_record_journaled_just_before_a_crash_still_revises_its_quantum(
    tmp_path: Path,
    reference: Reference,  # noqa: F811 -- the fixture
) -> None:
    """kill -9 between journaling (acknowledging) late records and the next tick.

    The grid state's journal position says which records the published rows hold: the
    replay re-forms the kept quanta from those only, and takes the late ones after it
    as new, so they revise their quanta after the restart.
    """
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    run_without_late(core, clock, range(1, 15))
    # the late host's records of 5..10 arrive; journaled (acknowledged); crash before a tick
    core.receive([message(LATE_HOST, s) for s in LATE])
    crash(core)
    core2 = AggregatorCore(config(tmp_path), now_ms=clock)
    core2.restore()
    run_without_late(core2, clock, range(15, SECONDS + 1))
    finish(core2)
    _assert_cluster_samples(tmp_path / "quanta.jsonl", reference)
    assert_converged(tmp_path / "quanta.jsonl", reference)


def _assert_cluster_samples(path: Path, want_rows: Reference) -> None:
    """The latest cluster/all samples per quantum equal the reference (numbers in the message)."""
    res = latest(rows(path))
    want = {k[0]: r["samples"] for k, r in want_rows.items() if k[1:] == ("cluster", "", "all")}
    got = {k[0]: r["samples"] for k, r in res.items() if k[1:] == ("cluster", "", "all")}
    diff = {(int(e) - T0) // 1000: (got.get(e), n)  # type: ignore[call-overload]
            for e, n in want.items() if got.get(e) != n}  # fmt: skip
    assert not diff, f"second: (latest samples, reference samples) {diff}"


def test_a_replay_longer_than_max_open_quanta_publishes_nothing_again(
    tmp_path: Path,
) -> None:
    """revise_within 700 s (allowed up to 24 h) with the default max_open_quanta (600).

    The replay folds each commit's records of closed quanta into the kept ones at once
    (the engine's ``absorbing``), so the max_open_quanta bound never force-closes them
    as revisions: nothing is written again, nothing counted as revised or merged.
    """
    clock = FakeClock(T0)
    cfg = config(tmp_path, revise_within_ms=700_000)
    core = AggregatorCore(cfg, now_ms=clock)
    core.restore()
    for s in range(1, 761):
        clock.t = T0 + 1000 * s + 300
        core.receive([message(h, s) for h in range(2)])
        core.tick()
        clock.t += 500
        core.tick()
    crash(core)
    before = len(rows(tmp_path / "quanta.jsonl"))
    core2 = AggregatorCore(config(tmp_path, revise_within_ms=700_000), now_ms=clock)
    core2.restore()
    clock.t += 1000
    core2.tick()
    finish(core2)
    got = rows(tmp_path / "quanta.jsonl")
    again = got[before:]
    pairs = [(r["end_ms"], r["scope"], r["host"], r["direction"], r["revision"]) for r in got]
    dup = len(pairs) - len(set(pairs))
    assert (dup, len(again), core2.counts.quanta_revised) == (0, 0, 0), (
        f"{dup} keys written twice at one revision; the restart wrote {len(again)} rows "
        f"(revised_at set on {sum(1 for r in again if r.get('revised_at'))}) and counted "
        f"{core2.counts.quanta_revised} quanta revised, with nothing late"
    )


def test_a_lost_state_file_finds_the_last_quantum_past_rotated_files_of_revisions(
    tmp_path: Path,
) -> None:
    """quanta_file_max_size 4096 (the smallest allowed): the late host's revisions after
    the run fill quanta.jsonl.1 and .2 (and the empty new quanta.jsonl); state.json is
    then lost. The tail is looked for through every rotated file, past revision rows,
    so the restart knows what was published and writes nothing twice.
    """
    kw: dict[str, Any] = {"quanta_file_max_bytes": 4096, "quanta_file_keep": 20}
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path, **kw), now_ms=clock)
    core.restore()
    run_without_late(core, clock, range(1, 15))
    for s in LATE:
        core.receive([message(LATE_HOST, s)])
        clock.t += 250
        core.tick()
    crash(core)
    before = [r for p in tmp_path.glob("quanta.jsonl*") for r in rows(p)]
    last_first = max(int(r["end_ms"]) for r in before if "revised_at" not in r)  # type: ignore[call-overload]
    (tmp_path / "state" / "state.json").unlink()
    core2 = AggregatorCore(config(tmp_path, **kw), now_ms=clock)
    core2.restore()
    published = core2.published_ms
    clock.t += 6000
    core2.tick()
    finish(core2)
    got = [r for p in tmp_path.glob("quanta.jsonl*") for r in rows(p)]
    pairs = [(r["end_ms"], r["scope"], r["host"], r["direction"], r["revision"]) for r in got]
    dup = len(pairs) - len(set(pairs))
    assert (published, dup) == (last_first, 0), (
        f"published_ms after the restart: {published}; {dup} rows written twice at one "
        f"revision; state errors {dict(core2.counts.state_errors)}"
    )


def test_a_cell_restart_sends_the_root_nothing_twice(
    tmp_path: Path,
) -> None:
    """A cell (partials) restarts with a small max_open_quanta; nothing is late. Its
    replay re-forms the closed quanta without revising them, so the root's rows equal
    the cell's (a forced revision would send the whole quantum again as a delta)."""
    kw: dict[str, Any] = {"max_open_quanta": 10, "partials": PartialsConfig(cell="c1")}
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path, **kw), now_ms=clock)
    core.restore()
    run_without_late(core, clock, range(1, 5))  # (LATE starts at 5: all in time)
    feed(core, clock, range(5, 13))
    crash(core)
    assert core.outbox is not None
    core.outbox.close()  # (kill -9: the kernel closes it)
    core2 = AggregatorCore(config(tmp_path, **kw), now_ms=clock)
    core2.restore()
    feed(core2, clock, range(13, 20))
    finish(core2)
    cfg = core2.cfg
    root = RootMerger(
        quantum_ms=1000, lateness_ms=5000, percentiles=cfg.percentiles,
        confidence_level=cfg.confidence_level, per_host=True, cells=["c1"],
        cell_timeout_ms=600_000, now_ms=T0, revise_within_ms=600_000,
    )  # fmt: skip
    out: list[ClosedQuantum] = []
    for m in _outbox_messages(tmp_path / "state"):
        root.take(m, clock(), cell="c1")
        out += root.close(clock())
    out += root.flush(clock())
    at_root: dict[tuple[int, str, str | None, str], ClosedQuantum] = {}
    for r in out:
        if r.key not in at_root or r.revision >= at_root[r.key].revision:
            at_root[r.key] = r
    cell = latest(rows(tmp_path / "quanta.jsonl"))
    diff = {
        (r.end_ms - T0) // 1000: (r.stats.samples, cell[k]["samples"])
        for r in at_root.values()
        if r.scope == "cluster" and r.direction == "all"
        and (k := (r.end_ms, "cluster", "", "all")) in cell
        and r.stats.samples != cell[k]["samples"]
    }  # fmt: skip
    assert not diff, f"second: (root samples, cell samples) {diff}"


def test_report_of_a_rotated_quanta_file_family_right_after_a_rotation(tmp_path: Path) -> None:
    """`fiomon report --per-host quanta.jsonl*` (reading a rotated family back, revisions
    resolved across files) works while the current file was just rotated and is empty
    (an idle aggregator leaves it so): an empty file is neither kind of input.
    """
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    run_without_late(core, clock, range(1, 15))
    core.receive([message(LATE_HOST, s) for s in LATE])
    clock.t += 300
    core.tick()
    finish(core)
    qf = QuantaFile(tmp_path / "quanta.jsonl", max_bytes=4096, keep=5)
    qf._rotate()  # what the writer does once the file passed quanta_file_max_size
    qf.close()
    files = sorted(tmp_path.glob("quanta.jsonl*"))
    assert (tmp_path / "quanta.jsonl").stat().st_size == 0
    r = fiomon("report", "--per-host", "--format", "jsonl", *files)
    assert r.returncode == 0, r.stderr


def _gap_run(tmp: Path, *, late: bool) -> Reference:
    """h3 sends nothing for seconds 5..10 (its records are gone for good); with ``late``
    h1's records of second 7 arrive at second 15 (within the horizon)."""
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp), now_ms=clock)
    core.restore()
    for s in range(1, SECONDS + 1):
        clock.t = T0 + 1000 * s + 300
        b = [
            message(h, s)
            for h in range(len(HOSTS))
            if not (h == LATE_HOST and s in LATE) and not (late and h == 0 and s == 7)
        ]
        if late and s == 15:
            b.append(message(0, 7))
        core.receive(b)
        for _ in range(4):
            core.tick()
            clock.t += 175
    finish(core)
    return latest(rows(tmp / "quanta.jsonl"))


def test_a_revision_by_another_host_keeps_a_quantum_incomplete_that_still_lacks_a_host(
    tmp_path: Path,
) -> None:
    """Quantum 7 first closes complete: false (h3 silent, its records never come). h1's
    late record of second 7 revises it at second 15, when h3 sends again: the revision is
    judged against the first close's silent hosts less those whose records came (not on
    h3's progress now, past the quantum), so it still says complete: false, as an
    aggregator fed h1's record in time does.
    """
    want = _gap_run(tmp_path / "ref", late=False)
    got = _gap_run(tmp_path / "late", late=True)
    k = (T0 + 7000, "cluster", "", "all")
    assert want[k]["complete"] is False
    assert got[k]["samples"] == want[k]["samples"]
    assert (got[k]["revision"], got[k]["complete"]) == (1, False), got[k]
