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


def test_a_restart_with_revise_within_longer_than_max_open_quanta_republishes_at_revision_0(
    tmp_path: Path,
) -> None:
    """revise_within 700 s (allowed up to 24 h) with the default max_open_quanta (600).

    The replay opens a row in every journaled closed quantum (700 of them) before absorb()
    folds them in; the engine's max_open_quanta bound counts those as open quanta and
    force-closes the oldest, which _revise publishes again -- as revision 0 with
    revised_at set (the kept state is still empty), so the quanta file holds the same
    key twice at revision 0, and the replayed records count as late records merged.
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


def test_a_lost_state_file_with_the_two_newest_quanta_files_holding_only_revisions(
    tmp_path: Path,
) -> None:
    """quanta_file_max_size 4096 (the smallest allowed): the late host's revisions after
    the run fill quanta.jsonl.1 and .2 (and the empty new quanta.jsonl). state.json is
    then lost. QuantaFile.tail() looks at quanta.jsonl and .1 only and skips revision
    rows, so it finds no quantum: the restart takes nothing as published (and does not
    even report state-lost), and the journal's quanta are written again at revision 0.
    """
    kw = {"quanta_file_max_bytes": 4096, "quanta_file_keep": 20}
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path, **kw), now_ms=clock)
    core.restore()
    _run_missing_late_host(core, clock, range(1, 15))
    for s in LATE:
        core.receive([message(LATE_HOST, s)])
        clock.t += 250
        core.tick()
    crash(core)
    before = [r for p in tmp_path.glob("quanta.jsonl*") for r in rows(p)]
    last_first = max(r["end_ms"] for r in before if "revised_at" not in r)
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


def test_a_cell_restart_whose_replay_force_closes_doubles_those_quanta_at_the_root(
    tmp_path: Path,
) -> None:
    """A cell (partials) restarts; nothing is late. Its replay opens rows in the journaled
    closed quanta, max_open_quanta force-closes them, and _revise sends each as a revision
    *delta* (revision 1, a new digest) holding the whole quantum again: the root adds it
    to the rev-0 partial it already has. (Same with the default max_open_quanta and
    revise_within 700 s: 100 quanta x 9 rows doubled at the root.)
    """
    from fiomon.config import PartialsConfig
    from fiomon.root.merger import RootMerger
    from tests.root.test_merger import _outbox_messages

    kw = {"max_open_quanta": 10, "partials": PartialsConfig(cell="c1")}
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path, **kw), now_ms=clock)
    core.restore()
    _run_missing_late_host(core, clock, range(1, 5))  # (LATE starts at 5: all in time)
    for s in range(5, 13):
        clock.t = T0 + 1000 * s + 300
        core.receive([message(h, s) for h in range(len(HOSTS))])
        for _ in range(4):
            core.tick()
            clock.t += 175
    crash(core)
    assert core.outbox is not None
    core.outbox.close()  # (kill -9: the kernel closes it)
    core2 = AggregatorCore(config(tmp_path, **kw), now_ms=clock)
    core2.restore()
    for s in range(13, 20):
        clock.t = T0 + 1000 * s + 300
        core2.receive([message(h, s) for h in range(len(HOSTS))])
        for _ in range(4):
            core2.tick()
            clock.t += 175
    finish(core2)
    cfg = core2.cfg
    root = RootMerger(
        quantum_ms=1000, lateness_ms=5000, percentiles=cfg.percentiles,
        confidence_level=cfg.confidence_level, per_host=True, cells=["c1"],
        cell_timeout_ms=600_000, now_ms=T0, revise_within_ms=600_000,
    )  # fmt: skip
    out = []
    for m in _outbox_messages(tmp_path / "state"):
        root.take(m, clock(), cell="c1")
        out += root.close(clock())
    out += root.flush(clock())
    at_root: dict = {}
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
    """`fiomon report --per-host quanta.jsonl*` (the README's way of reading a rotated
    family back, revisions resolved across files) fails with exit 2 whenever the current
    file was just rotated and is still empty: is_quanta_file() takes the empty file for
    fio output ("cannot mix a quanta file ... with fio output (quanta.jsonl)"). An idle
    aggregator leaves it empty indefinitely.
    """
    from fiomon.server.quantafile import QuantaFile
    from tests.fiorun import fiomon

    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    _run_missing_late_host(core, clock, range(1, 15))
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


def _gap_run(tmp: Path, late: bool) -> dict:
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


def test_a_revision_by_another_host_marks_a_quantum_complete_that_still_lacks_a_silent_host(
    tmp_path: Path,
) -> None:
    """Quantum 7 first closes complete: false (h3 silent, its records never come). h1's
    late record of second 7 revises it at second 15, when h3 sends again: _completeness
    judges the revision with the watermark's *current* progress (h3 is past the quantum
    now), so the latest revision says complete: true -- though h3 is still missing from
    it, and an aggregator fed h1's record in time says false.
    """
    want = _gap_run(tmp_path / "ref", late=False)
    got = _gap_run(tmp_path / "late", late=True)
    k = (T0 + 7000, "cluster", "", "all")
    assert want[k]["complete"] is False
    assert got[k]["samples"] == want[k]["samples"]
    assert (got[k]["revision"], got[k]["complete"]) == (1, False), got[k]
