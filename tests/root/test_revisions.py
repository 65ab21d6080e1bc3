"""The root's revisions (issue 25): a cell's rows after the root closed their quantum.

The truth is always a second :class:`RootMerger` fed every row in time: the latest
revision of each of the late root's keys must equal that root's row of the key, and say
``complete`` when nothing is missing any more.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fiomon.closed import ClosedQuantum
from fiomon.config import AggregatorConfig, RootConfig
from fiomon.model import RecordBatch
from fiomon.partials import PartialRow, PartialsMessage, RawPartial, encode, rows_of
from fiomon.root.merger import RootMerger
from fiomon.root.service import RootService
from tests.clock import T0, FakeClock
from tests.root.test_merger import LAY, Q, assert_same, engine, records

NOW = T0 + 60_000  # the root's clock when it closes: every record's quantum is 5 s old
HORIZON = 600_000
Key = tuple[int, str, str | None, str]


def _root(
    cells: Sequence[str],
    *,
    revise_within_ms: int = HORIZON,
    cell_timeout_ms: int = 30_000,
    closed_ms: int | None = None,
) -> RootMerger:
    """A root on 1 s quanta, lateness 5 s, started at T0 (its cells gone by ``NOW``)."""
    return RootMerger(
        quantum_ms=Q,
        lateness_ms=5000,
        percentiles=(50, 99, 99.9),
        confidence_level=0.95,
        per_host=True,
        cells=cells,
        cell_timeout_ms=cell_timeout_ms,
        now_ms=T0,
        closed_ms=closed_ms,
        revise_within_ms=revise_within_ms,
    )


def _cell_rows(batch: RecordBatch) -> list[PartialRow]:
    """A cell's partial rows of ``batch`` (one engine, flushed: every quantum closed)."""
    cell = engine(partials=True)
    cell.add(batch)
    rows = cell.flush()
    late: dict[Key, int] = {
        (r.start_ms, r.scope, r.host, r.direction): r.late_records for r in rows
    }
    return rows_of(cell.partials, late)


def _message(cell: str, seq: int, rows: Iterable[PartialRow], through: int = NOW) -> bytes:
    return encode(PartialsMessage(cell, seq, LAY, through, tuple(rows)))


def _split(batch: RecordBatch, ncells: int) -> list[RecordBatch]:
    """``batch`` by cell: host ``h<i>`` belongs to cell ``i % ncells``."""
    out = []
    for c in range(ncells):
        sel = np.array([int(batch.streams[s].host[1:]) % ncells == c for s in batch.stream_idx])
        out.append(batch.select(sel))
    return out


def latest(rows: Iterable[ClosedQuantum]) -> dict[Key, ClosedQuantum]:
    """The highest revision per key (on equal revision the later row: the readers' rule)."""
    out: dict[Key, ClosedQuantum] = {}
    for r in rows:
        have = out.get(r.key)
        if have is None or r.revision >= have.revision:
            out[r.key] = r
    return out


def _measured(r: ClosedQuantum) -> dict[str, object]:
    """A row's JSON without what says how it was made (revision, when, late counts)."""
    d = r.to_json()
    for f in ("revision", "revised_at", "late_records"):
        d.pop(f, None)
    return d


def assert_exact(got: dict[Key, ClosedQuantum], want: list[ClosedQuantum]) -> None:
    """Every key of ``want`` in ``got`` with the same JSON (bit for bit), nothing more."""
    w = {r.key: r for r in want}
    assert got.keys() == w.keys()
    for k, r in w.items():
        assert _measured(got[k]) == _measured(r), k
        mine = got[k].hist
        if r.hist is not None:
            assert mine is not None and np.array_equal(mine, r.hist), k


@settings(max_examples=20, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(2, 3), st.integers(1, 300))
def test_a_cells_late_rows_revise_to_what_an_in_time_root_publishes(
    rnd: random.Random, ncells: int, n: int
) -> None:
    """The last cell's rows come after the root closed every quantum without it."""
    cells = [f"c{i}" for i in range(ncells)]
    parts = _split(records(rnd, [f"h{i}" for i in range(3 * ncells)], n), ncells)
    payloads = [_message(c, 0, _cell_rows(b)) for c, b in zip(cells, parts, strict=True)]
    on_time = _root(cells)
    for c, p in zip(cells, payloads, strict=True):
        on_time.receive(p, NOW, cell=c)
    want = on_time.close(NOW)
    late = _root(cells)
    for c, p in zip(cells[:-1], payloads[:-1], strict=True):
        late.receive(p, NOW, cell=c)
    first = late.close(NOW)  # the last cell, expected, is live but silent: on lateness
    assert all(r.revision == 0 and r.revised_at is None for r in first)
    assert all(not r.complete and r.cells_missing == (cells[-1],) for r in first)
    late.receive(payloads[-1], NOW + 7000, cell=cells[-1])
    revised = late.close(NOW + 7000)
    assert late.counts.rows["late"] == 0
    assert late.counts.rows["revised"] == on_time.counts.rows["merged"] - late.counts.rows["merged"]
    assert late.counts.quanta_revised == len({r.end_ms for r in revised})
    published = {r.key: r.revision for r in first}
    for r in revised:
        assert r.revised_at == NOW + 7000
        assert r.revision == published.get(r.key, -1) + 1  # 0: first published now
    final = latest([*first, *revised])
    assert_exact(final, want)
    assert all(r.complete and r.cells_missing == () for r in final.values())
    # Resends of the late rows are duplicates: no second revision.
    late.receive(payloads[-1], NOW + 8000, cell=cells[-1])
    assert late.close(NOW + 8000) == []
    assert late.counts.rows["duplicate"] == late.counts.rows["revised"]


def _delta(parts: list[PartialRow], revision: int) -> list[PartialRow]:
    return [
        dataclasses.replace(r, part=dataclasses.replace(r.part, revision=revision)) for r in parts
    ]


def _by_job(batch: RecordBatch, jobs: set[int]) -> RecordBatch:
    sel = np.array(
        [int(batch.streams[s].stream.rsplit(":", 1)[1]) in jobs for s in batch.stream_idx]
    )
    return batch.select(sel)


@pytest.mark.parametrize("closed_first", [True, False])
def test_a_cells_own_revision_adds_its_delta_open_or_closed(closed_first: bool) -> None:
    """A cell's revision 1 rows (what its late records added: here the second job of each
    host, new streams) merge as deltas, whether the root's quantum is still open or not;
    the result is the in-time root's fed the cell's whole rows."""
    batch = records(random.Random(7), ["h0", "h1", "h2", "h3"], 300)
    c0, c1 = _split(batch, 2)
    whole = _cell_rows(c0)
    base, added = _cell_rows(_by_job(c0, {0})), _cell_rows(_by_job(c0, {1}))
    other = _cell_rows(c1)
    on_time = _root(["c0", "c1"])
    on_time.receive(_message("c0", 0, whole), NOW, cell="c0")
    on_time.receive(_message("c1", 0, other), NOW, cell="c1")
    want = on_time.close(NOW)
    root = _root(["c0", "c1"])
    root.receive(_message("c0", 0, base), NOW, cell="c0")
    root.receive(_message("c1", 0, other), NOW, cell="c1")
    out = []
    if closed_first:
        out += root.close(NOW)
    root.receive(_message("c0", 1, _delta(added, 1)), NOW, cell="c0")
    out += root.close(NOW)
    final = latest(out)
    # Sums in another order than one engine's over every record: equal to rounding.
    assert_same(list(final.values()), want)
    assert all(r.complete for r in final.values())
    if closed_first:
        assert root.counts.rows["revised"] == len(added)
        assert {r.revision for r in out if r.revised_at is not None} <= {0, 1}
    else:
        assert root.counts.rows["revised"] == 0 and all(r.revision == 0 for r in out)
    # The same delta again is a resend; the next revision of the cell is not.
    root.receive(_message("c0", 1, _delta(added, 1)), NOW, cell="c0")
    assert root.close(NOW) == []
    assert root.counts.rows["duplicate"] == len(added)


def _row(cell_end: int, *, revision: int = 0, complete: bool = True, samples: float = 10.0,
         host: str | None = None) -> PartialRow:  # fmt: skip
    hist = np.zeros(LAY.nbins)
    hist[700] = samples
    part = RawPartial(
        start_ms=cell_end - Q,
        end_ms=cell_end,
        scope="cluster" if host is None else "host",
        host=host,
        direction="read",
        hist=hist,
        lo_ms=cell_end - Q,
        hi_ms=cell_end,
        nbytes=4096.0,
        streams=1 if revision == 0 else 0,
        revision=revision,
    )
    return PartialRow(part, late_records=3 if revision else 0, complete=complete)


def test_an_incomplete_row_becomes_complete_in_its_revision() -> None:
    """A cell's own incomplete flag is replaced by its newer row's word; a missing cell
    that sends its rows turns every row of the quantum complete, its own and the rows it
    had no part in (republished with their statistics unchanged)."""
    end = T0 + Q
    root = _root(["c1", "c2", "c3"])
    root.receive(
        _message("c1", 0, [_row(end, complete=False), _row(end, host="a")]), NOW, cell="c1"
    )
    root.receive(_message("c2", 0, [_row(end), _row(end, host="b")]), NOW, cell="c2")
    first = {r.key: r for r in root.close(NOW)}
    assert {(r.complete, r.cells_missing) for r in first.values()} == {(False, ("c3",))}
    # c3's rows: its own host's row is new (revision 0), the others' next revision.
    root.receive(_message("c3", 0, [_row(end), _row(end, host="c")]), NOW + 1, cell="c3")
    second = {r.key: r for r in root.close(NOW + 1)}
    assert set(second) == {*first, (end, "host", "c", "read")}
    assert second[(end, "host", "c", "read")].revision == 0
    assert all(second[k].revision == 1 for k in first)
    assert second[(end, "host", "a", "read")].stats == first[(end, "host", "a", "read")].stats
    cluster = (end, "cluster", None, "read")
    assert second[cluster].stats.samples == 30
    # No cell missing now, but c1's own row of the cluster group said incomplete.
    assert (second[cluster].complete, second[cluster].cells_missing) == (False, ())
    assert all(r.complete for k, r in second.items() if k != cluster)
    # c1's revision of that group says complete: the root's revision turns complete.
    root.receive(_message("c1", 1, [_row(end, revision=1, samples=2.0)]), NOW + 2, cell="c1")
    (third,) = root.close(NOW + 2)
    assert (third.key, third.revision, third.complete) == (cluster, 2, True)
    assert (third.stats.samples, third.late_records, third.revised_at) == (32, 3, NOW + 2)


def test_rows_beyond_the_horizon_are_late_and_the_kept_state_is_forgotten() -> None:
    """Closed quanta are kept (packed) while within ``revise_within`` of the closed-through
    point; older ones are forgotten and their rows counted late, as before issue 25."""
    root = _root(["c1", "c2"], revise_within_ms=3000, cell_timeout_ms=10**9)
    for t in range(1, 11):
        root.receive(_message("c1", t, [_row(T0 + t * Q), _row(T0 + t * Q, host="a")],
                              through=T0 + t * Q), T0 + t * Q, cell="c1")  # fmt: skip
    root.close(T0 + 10 * Q + 5000)  # closed through T0 + 10 s: kept those ending after 7 s
    assert root.closed_ms == T0 + 10 * Q
    assert root.kept_quanta == 3
    # Kept sparse: two groups with one bin each, not 2 x 1856 float64 per quantum.
    assert root.kept_bytes() < 3 * 400
    # (c2's mark says nothing of the kept quanta: 9 and 10 stay as they are)
    late = [_row(T0 + 7 * Q), _row(T0 + 8 * Q)]
    root.receive(_message("c2", 0, late, through=T0 + 6 * Q), NOW, cell="c2")
    assert root.counts.rows["late"] == 1 and root.counts.rows["revised"] == 1
    # c2 no longer missing there: both rows of that quantum say so, the cluster's with
    # c2's samples.
    row, host = root.close(T0 + 10 * Q + 5000)
    assert (row.end_ms, row.revision, row.stats.samples, row.complete) == (T0 + 8 * Q, 1, 20, True)
    assert (host.host, host.revision, host.stats.samples, host.complete) == ("a", 1, 10, True)
    # Ten quanta later nothing is kept; a row of a quantum in the old horizon is late.
    root.close(T0 + 20 * Q + 5000)
    assert root.kept_quanta == 0
    root.receive(_message("c2", 1, [_row(T0 + 9 * Q)], through=T0 + 6 * Q), NOW, cell="c2")
    assert root.counts.rows["late"] == 2
    assert root.close(T0 + 20 * Q + 5000) == []
    # Resends of rows merged long ago are still told apart from late ones (the row
    # identities are kept at least over the horizon).
    root.receive(_message("c2", 0, [_row(T0 + 8 * Q)], through=T0 + 6 * Q), NOW, cell="c2")
    assert root.counts.rows["duplicate"] == 1


def test_kept_quanta_are_bounded_by_revise_memory_and_the_forgotten_counted() -> None:
    """Past ``revise_memory_bytes`` the oldest kept quanta go before the horizon: counted,
    and their rows are late, as past the horizon."""
    root = _root(["c1", "c2"], cell_timeout_ms=10**9)
    root.revise_memory_bytes = 1000  # about two quanta of two one-bin groups
    for t in range(1, 11):
        root.receive(_message("c1", t, [_row(T0 + t * Q), _row(T0 + t * Q, host="a")],
                              through=T0 + t * Q), T0 + t * Q, cell="c1")  # fmt: skip
    root.close(T0 + 10 * Q + 5000)
    kept = root.kept_quanta
    assert 1 <= kept < 10
    assert root.kept_bytes() <= 1000
    assert root.counts.kept_forgotten == 10 - kept
    root.receive(_message("c2", 0, [_row(T0 + Q), _row(T0 + 10 * Q)], through=T0), NOW, cell="c2")
    assert (root.counts.rows["late"], root.counts.rows["revised"]) == (1, 1)


def test_no_revisions_without_a_horizon_nor_of_quanta_closed_before_the_start() -> None:
    """``revise_within_ms=0`` is the root before issue 25; a restarted root (``closed_ms``
    from its quanta file) never revises what the previous run closed: it kept no groups
    of them, and a revision from part of a quantum would be wrong."""
    off = _root(["c1", "c2"], revise_within_ms=0)
    off.receive(_message("c1", 0, [_row(T0 + Q)]), NOW, cell="c1")
    assert len(off.close(NOW)) == 1
    off.receive(_message("c2", 0, [_row(T0 + Q)]), NOW, cell="c2")
    assert off.close(NOW) == [] and off.counts.rows["late"] == 1 and off.kept_quanta == 0
    restarted = _root(["c1", "c2"], closed_ms=T0 + 2 * Q)
    restarted.receive(_message("c2", 0, [_row(T0 + Q), _row(T0 + 3 * Q)]), NOW, cell="c2")
    restarted.receive(_message("c1", 0, [_row(T0 + 3 * Q)]), NOW, cell="c1")
    (row,) = restarted.close(NOW)
    assert (row.end_ms, row.stats.samples, row.revision) == (T0 + 3 * Q, 20, 0)
    assert restarted.counts.rows["late"] == 1
    # A quantum the restarted root closed itself (with no rows) is revised: first published.
    restarted.receive(_message("c2", 1, [_row(T0 + 5 * Q)], through=T0 + 5 * Q), NOW, cell="c2")
    (row,) = restarted.close(NOW)
    assert (row.end_ms, row.revision, row.revised_at) == (T0 + 5 * Q, 0, NOW)
    assert (row.complete, row.cells_missing) == (True, ())  # c1's mark: closed it empty


def test_take_added_is_the_cluster_bins_revisions_merged() -> None:
    """For the bucket histogram: the cluster rows' counts merged into revisions only."""
    root = _root(["c1", "c2"])
    root.receive(_message("c1", 0, [_row(T0 + Q), _row(T0 + Q, host="a")]), NOW, cell="c1")
    root.close(NOW)
    assert root.take_added() == {}
    root.receive(_message("c2", 0, [_row(T0 + Q, samples=4.0), _row(T0 + Q, host="b")]), NOW,
                 cell="c2")  # fmt: skip
    root.close(NOW)
    added = root.take_added()
    assert list(added) == ["read"] and added["read"].sum() == 4.0 and added["read"][700] == 4.0
    assert root.take_added() == {}


# -- the service: the quanta file, the publisher, a restart -----------------------------------


def _service_cfg(tmp: Path) -> AggregatorConfig:
    return AggregatorConfig(
        align="epoch",
        lateness_ms=5000,
        state_dir=tmp / "s",
        quanta_file=tmp / "q.jsonl",
        root=RootConfig(cells=("c1", "c2"), cell_timeout_ms=5000),
        revise_within_ms=HORIZON,
    )


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _identity(d: dict[str, object]) -> tuple[object, ...]:
    return (d["end_ms"], d["scope"], d["host"], d["direction"], d["revision"])


def test_the_service_appends_revisions_and_a_restart_writes_no_key_at_a_revision_twice(
    tmp_path: Path,
) -> None:
    """Revisions go to the quanta file after the first publications (append-only) and to
    ``Publisher.revise`` when it exists; a restarted root counts rows of quanta its
    previous run closed as late, even after a write of revisions only (the file's last
    line then a revision of an older quantum), and publishes none of them again."""
    clock = FakeClock(T0)
    cfg = _service_cfg(tmp_path)
    svc = RootService(cfg, now_ms=clock)
    calls: list[tuple[list[ClosedQuantum], int, dict[str, np.ndarray]]] = []
    setattr(svc.publisher, "revise", lambda rows, now, added: calls.append((rows, now, added)))  # noqa: B010 -- the publisher may not have it yet
    c1 = [_message("c1", i, [_row(T0 + i * Q)], through=T0 + i * Q) for i in range(1, 6)]
    first = []
    for i, payload in enumerate(c1, start=1):
        svc.on_message("c1", payload)
        clock.t = T0 + i * Q + 10
        first += svc.tick()
    clock.t = T0 + 5 * Q + 6000  # c2 is gone: quanta close without it
    first += svc.tick()
    assert [r.end_ms for r in first] == [T0 + i * Q for i in range(1, 6)]
    assert all(r.cells_missing == ("c2",) for r in first)
    # c2 comes back with quantum 2 only: a revision, the one write of this tick.
    svc.on_message("c2", _message("c2", 0, [_row(T0 + 2 * Q, samples=5.0)], through=T0))
    (rev,) = svc.tick()
    assert (rev.end_ms, rev.revision, rev.revised_at, rev.stats.samples) == (
        T0 + 2 * Q, 1, clock.t, 15)  # fmt: skip
    assert len(calls) == 1 and calls[0][0] == [rev] and calls[0][1] == clock.t
    assert calls[0][2]["read"].sum() == 5.0
    svc.close()
    lines = _lines(tmp_path / "q.jsonl")
    assert [(d["end_ms"], d["revision"]) for d in lines[-2:]] == [(T0 + 5 * Q, 0), (T0 + 2 * Q, 1)]
    assert lines[-1]["revised_at"] == clock.t and lines[-1]["complete"] is True
    # A restart: c1 resends everything (its outbox lost the acknowledgements), c2 a row of
    # quantum 3 (within the horizon, but closed by the previous run).
    again = RootService(cfg, now_ms=clock)
    for payload in c1:
        again.on_message("c1", payload)
    again.on_message("c2", _message("c2", 1, [_row(T0 + 3 * Q)], through=T0 + 3 * Q))
    clock.t += 10_000
    assert again.tick() == []
    assert again.merger.counts.rows["late"] == 6
    # (the previous run closed through T0 + 6 s on its clock: quantum 20 is new)
    again.on_message("c1", _message("c1", 6, [_row(T0 + 20 * Q)], through=T0 + 20 * Q))
    again.on_message("c2", _message("c2", 2, [_row(T0 + 20 * Q)], through=T0 + 20 * Q))
    (row,) = again.tick()
    assert (row.end_ms, row.revision, row.complete) == (T0 + 20 * Q, 0, True)
    again.close()
    ids = [_identity(d) for d in _lines(tmp_path / "q.jsonl")]
    assert len(ids) == len(set(ids)) == 7


def test_a_final_flush_publishes_the_pending_revisions_at_its_clock() -> None:
    root = _root(["c1", "c2"])
    root.receive(_message("c1", 0, [_row(T0 + Q)]), NOW, cell="c1")
    root.receive(_message("c1", 1, [_row(T0 + 9 * Q)], through=T0 + 2 * Q), NOW, cell="c1")
    assert [r.end_ms for r in root.close(NOW)] == [T0 + Q, T0 + 9 * Q]
    root.receive(_message("c2", 0, [_row(T0 + Q)], through=T0 + Q), NOW, cell="c2")
    root.receive(_message("c1", 2, [_row(T0 + 70 * Q)], through=T0 + 2 * Q), NOW, cell="c1")
    opened, revised = root.flush(NOW + 5)
    assert (opened.end_ms, opened.revised_at) == (T0 + 70 * Q, None)  # (closed through NOW)
    assert (revised.end_ms, revised.revision, revised.revised_at) == (T0 + Q, 1, NOW + 5)
    assert revised.complete and root.kept_quanta == 0


def test_a_restarted_cells_revisions_numbered_again_are_merged_and_resends_are_not() -> None:
    """A cell that restarted without its quanta file numbers its revisions from 1 again:
    a delta under a number seen before with other contents is new data; the same bytes
    again are a resend."""
    end = T0 + Q
    root = _root(["c1"])
    root.receive(_message("c1", 0, [_row(end)]), NOW, cell="c1")
    root.close(NOW)
    root.receive(_message("c1", 1, [_row(end, revision=1, samples=2.0)]), NOW + 1, cell="c1")
    (first,) = root.close(NOW + 1)
    assert (first.revision, first.stats.samples) == (1, 12)
    # The restarted cell's first revision: number 1 again, other records.
    root.receive(_message("c1", 0, [_row(end, revision=1, samples=5.0)]), NOW + 2, cell="c1")
    (second,) = root.close(NOW + 2)
    assert (second.revision, second.stats.samples) == (2, 17)
    # Its outbox resends that message: nothing changes.
    root.receive(_message("c1", 0, [_row(end, revision=1, samples=5.0)]), NOW + 3, cell="c1")
    assert root.close(NOW + 3) == []
    assert root.counts.rows["duplicate"] == 1
