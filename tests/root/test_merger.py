"""The root's merge: cells' partials give exactly the rows of one engine fed every record."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from fiomon.aggregator.merger import AggregatorCore
from fiomon.aggregator.outbox import Outbox
from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.config import (
    AggregatorConfig,
    PartialsConfig,
    RootConfig,
    SlaRule,
    aggregator_config_from,
    root_problems,
)
from fiomon.engine import QuantumEngine
from fiomon.errors import ConfigError
from fiomon.model import RecordBatch, StreamInfo
from fiomon.partials import PartialRow, PartialsMessage, RawPartial, decode, encode, rows_of
from fiomon.root.merger import RootMerger
from fiomon.root.service import RootService
from fiomon.server.exporter import Snapshot
from fiomon.server.metrics import with_root
from fiomon.wire import encode as encode_records
from tests.clock import T0, FakeClock
from tests.metricskit import FiomonCollector

LAY = BinLayout()
Q = 1000


def records(rnd: random.Random, hosts: list[str], n: int) -> RecordBatch:
    """``n`` random records over ``hosts`` (two jobs each), some spanning quanta."""
    streams = tuple(StreamInfo(h, f"{h}.log:{j}") for h in hosts for j in range(2))
    start: list[int] = []
    bins: list[int] = []
    counts: list[int] = []
    indptr = [0]
    for i in range(n):
        s = T0 + rnd.randrange(0, 20 * Q)
        start.append(s)
        k = rnd.randint(0 if i else 1, 4)  # a record may carry no samples
        b = sorted(rnd.sample(range(400, 1100), k))
        bins.extend(b)
        counts.extend(rnd.randint(1, 5000) for _ in b)
        indptr.append(len(bins))
    s_arr = np.array(start, np.int64)
    return RecordBatch(
        layout=LAY,
        streams=streams,
        stream_idx=np.array([rnd.randrange(len(streams)) for _ in range(n)], np.int32),
        direction=np.array([rnd.randint(0, 2) for _ in range(n)], np.int8),
        start_ms=s_arr,
        end_ms=s_arr + np.array([rnd.choice([0, 250, 1000, 1700]) for _ in range(n)]),
        nbytes=np.array([rnd.randint(0, 10**7) for _ in range(n)], np.int64),
        indptr=np.array(indptr, np.int64),
        bins=np.array(bins, np.int32),
        counts=np.array(counts, np.int64),
    )


def engine(*, partials: bool) -> QuantumEngine:
    return QuantumEngine(
        layout=LAY, quantum_ms=Q, per_host=True, keep_partials=partials, keep_hists=True
    )


def key(r: ClosedQuantum) -> tuple[int, str, str | None, str]:
    return (r.end_ms, r.scope, r.host, r.direction)


def assert_same(got: list[ClosedQuantum], want: list[ClosedQuantum]) -> None:
    g = {key(r): r.to_json() for r in got}
    w = {key(r): r.to_json() for r in want}
    assert g.keys() == w.keys()
    worst = 0.0
    for k, a in w.items():
        b = g[k]
        for f in ("samples", "min_ns", "mean_ns", "max_ns", "iops", "bytes_per_second"):
            if a[f] is None:
                assert b[f] is None
                continue
            worst = max(worst, abs(b[f] - a[f]) / max(abs(a[f]), 1e-300))
        for p, v in a["percentiles_ns"].items():
            worst = max(worst, abs(b["percentiles_ns"][p] - v) / max(abs(v), 1e-300))
        assert (b["streams"], b["late_records"], b["saturated"]) == (
            a["streams"],
            a["late_records"],
            a["saturated"],
        )
        assert b["percentiles_ci_ns"] == a["percentiles_ci_ns"]
    assert worst <= 1e-9, worst


@settings(max_examples=25, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(2, 4), st.integers(1, 400))
def test_cells_merged_at_the_root_equal_one_engine(rnd: random.Random, ncells: int, n: int) -> None:
    hosts = [f"h{i}" for i in range(3 * ncells)]
    batch = records(rnd, hosts, n)
    one = engine(partials=False)
    one.add(batch)
    want = one.flush()
    assert want  # the comparison below is not vacuous
    root = _merger(
        [f"c{i}" for i in range(ncells)],
        percentiles=one.percentiles,
        confidence_level=one.confidence_level,
    )
    for c in range(ncells):
        mine = {h for i, h in enumerate(hosts) if i % ncells == c}
        sel = np.array([batch.streams[s].host in mine for s in batch.stream_idx])
        cell = engine(partials=True)
        cell.add(batch.select(sel))
        rows = cell.flush()
        late: dict[tuple[int, str, str | None, str], int] = {
            (r.start_ms, r.scope, r.host, r.direction): r.late_records for r in rows
        }
        # Closed through past every record (the root's clock there: a mark ahead of it by
        # more than max_skew would be ignored).
        msg = PartialsMessage(f"c{c}", 0, LAY, T0 + 60_000, tuple(rows_of(cell.partials, late)))
        payload = encode(msg)
        root.receive(payload, T0 + 60_000, cell=f"c{c}")
        root.receive(payload, T0 + 60_000, cell=f"c{c}")  # a resend changes nothing
        assert decode(payload).cell == f"c{c}"
    got = root.close(T0 + 60_000)
    assert all(r.complete and r.cells_missing == () for r in got)
    assert root.counts.rows["duplicate"] == root.counts.rows["merged"]
    assert_same(got, want)


COARSE = BinLayout(29, 3)


def _cell_message(name: str, batch: RecordBatch, layout: BinLayout) -> PartialsMessage:
    """One cell's partials of ``batch`` (coarsened to ``layout``), closed through all."""
    cell = QuantumEngine(
        layout=layout, quantum_ms=Q, per_host=True, keep_partials=True, keep_hists=True
    )
    cell.add(batch.coarsened(layout))
    rows = cell.flush()
    late: dict[tuple[int, str, str | None, str], int] = {
        (r.start_ms, r.scope, r.host, r.direction): r.late_records for r in rows
    }
    return PartialsMessage(name, 0, layout, T0 + 60_000, tuple(rows_of(cell.partials, late)))


@pytest.mark.parametrize("fine_first", [True, False])
@settings(max_examples=8, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 300))
def test_a_finer_cell_merges_exactly_into_a_coarser_one_in_either_order(
    fine_first: bool, rnd: random.Random, n: int
) -> None:
    """Cells on different coarseness: the root's rows are one engine's at the coarser bins.

    The truth is one engine fed every record at the coarser layout (what the aggregator
    and ``fiomon report`` do with a finer input); the fine cell's rows are folded into
    the root's bins (:func:`fiomon.bins.coarsen_hist`), whichever cell came first.
    """
    hosts = ["a0", "a1", "b0", "b1"]
    batch = records(rnd, hosts, n)
    one = QuantumEngine(layout=COARSE, quantum_ms=Q, per_host=True, keep_hists=True)
    one.add(batch.coarsened(COARSE))
    want = one.flush()
    assert want
    in_a = np.array([batch.streams[i].host.startswith("a") for i in batch.stream_idx])
    fine = _cell_message("ca", batch.select(in_a), LAY)
    coarse = _cell_message("cb", batch.select(~in_a), COARSE)
    # A message without rows carries no bins to merge (an idle cell's marker): the
    # layouts meet only where both cells have rows.
    assume(fine.rows and coarse.rows)
    root = _merger(["ca", "cb"], percentiles=one.percentiles, confidence_level=one.confidence_level)
    for m in (fine, coarse) if fine_first else (coarse, fine):
        root.receive(encode(m), T0 + 60_000, cell=m.cell)
    assert root.counts.invalid == {}
    assert root.layout == COARSE
    got = root.close(T0 + 60_000)
    assert_same(got, want)
    g = {key(r): r.hist for r in got if r.scope == "cluster"}
    for r in want:
        if r.scope == "cluster":
            mine = g[key(r)]
            assert r.hist is not None and mine is not None
            assert np.allclose(mine, r.hist, rtol=1e-12, atol=1e-9)  # float sums' order


def test_a_coarser_or_other_cell_is_refused_once_the_root_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After its first close the root's bins are fixed: a coarser cell is refused, named."""
    root = _merger(["ca", "cb"])
    root.receive(_one_row_message("ca", T0 + Q, T0 + Q), T0, cell="ca")
    root.receive(_one_row_message("cb", T0 + Q, T0 + Q, layout=BinLayout(29, 1)), T0, cell="cb")
    (row,) = root.close(T0)  # the finer ca folded into cb's bins: 20 samples
    assert (row.stats.samples, root.layout) == (20, BinLayout(29, 1))
    root.receive(_one_row_message("ca", T0 + 2 * Q, T0 + 2 * Q, layout=COARSE), T0, cell="ca")
    root.receive(
        _one_row_message("cb", T0 + 2 * Q, T0 + 2 * Q, layout=BinLayout(19, 0, "us")), T0, cell="cb"
    )
    assert root.counts.invalid["layout"] == 2
    assert root.open_quanta == 0
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "cell ca: bins 232 bins (GROUP_NR 29, coarseness 3, ns) are coarser" in text
    assert "928 bins (GROUP_NR 29, coarseness 1, ns)" in text
    assert "log_hist_coarseness (at least 3)" in text
    assert "cell cb: bin layouts" in text and "GROUP_NR and unit must match" in text


# -- a cell's outbox, from the aggregator core ------------------------------------------


def _merger(
    cells: list[str],
    *,
    lateness_ms: int = 5000,
    percentiles: tuple[float, ...] = (50,),
    confidence_level: float | None = None,
    per_host: bool = True,
    cell_timeout_ms: int = 30_000,
    now_ms: int = T0,
) -> RootMerger:
    """A root on 1 s quanta (the tests' defaults: lateness 5 s, p50, host scope)."""
    return RootMerger(
        quantum_ms=Q,
        lateness_ms=lateness_ms,
        percentiles=percentiles,
        confidence_level=confidence_level,
        per_host=per_host,
        cells=cells,
        cell_timeout_ms=cell_timeout_ms,
        now_ms=now_ms,
    )


def _outbox_messages(folder: Path) -> list[PartialsMessage]:
    raw = (folder / "partials.outbox").read_bytes()
    out, at = [], 0
    while at < len(raw):
        n = int.from_bytes(raw[at : at + 4], "little")
        out.append(decode(raw[at + 4 : at + 4 + n]))
        at += 4 + n
    return out


def test_a_cell_core_puts_each_close_in_its_outbox_before_the_state_and_resends(
    tmp_path: Path,
) -> None:
    clock = FakeClock(T0 + 30 * Q)
    cfg = AggregatorConfig(
        align="epoch",
        lateness_ms=5000,
        state_dir=tmp_path,
        quanta_file=tmp_path / "quanta.jsonl",
        partials=PartialsConfig(cell="c1"),
    )
    rnd = random.Random(7)
    batch = records(rnd, ["a"], 200)
    one = engine(partials=False)
    one.add(batch)
    want = one.flush()
    core = AggregatorCore(cfg, now_ms=clock)
    core.restore()
    core.on_records("a", encode_records("a", "s", 0, batch))
    clock.t = T0 + 60 * Q
    core.tick()  # closes everything on the clock (30 s past the records)
    core.tick()
    clock.t += 2 * Q
    core.tick()  # a quantum boundary with nothing closed: a marker only
    core.close()
    msgs = _outbox_messages(tmp_path)
    assert [m.seq for m in msgs] == list(range(len(msgs)))
    assert msgs[-1].rows == ()
    assert msgs[-1].closed_through_ms > msgs[-2].closed_through_ms
    root = _merger(["c1"], percentiles=cfg.percentiles, confidence_level=cfg.confidence_level)
    now = clock()  # the cell's marks are its clock's: not ahead of the root's
    for m in msgs:
        root.take(m, now, cell="c1")
    assert_same(root.close(now), want)
    # Nothing was acknowledged: a restart resends the whole outbox, in order.
    again = Outbox(tmp_path, "c1", 1 << 20, lambda k, t: None)
    sent = []
    while (nxt := again.peek()) is not None:
        sent.append(decode(nxt[1]).seq)
        again.ack(nxt[0])
    assert sent == [m.seq for m in msgs]
    again.close()
    third = Outbox(tmp_path, "c1", 1 << 20, lambda k, t: None)
    assert third.peek() is None  # all acknowledged: nothing is sent again
    third.close()


# Each cell's message numbers, one after another as its outbox gives them.
_NUMBERS: collections.defaultdict[str, itertools.count[int]] = collections.defaultdict(
    itertools.count
)


def _one_row_message(
    cell: str, end: int, through: int, *, layout: BinLayout = LAY, seq: int | None = None
) -> bytes:
    hist = np.zeros(layout.nbins)
    hist[min(700, layout.nbins - 1)] = 10.0
    part = RawPartial(
        start_ms=end - Q,
        end_ms=end,
        scope="cluster",
        host=None,
        direction="read",
        hist=hist,
        lo_ms=end - Q,
        hi_ms=end,
        nbytes=4096.0,
        streams=1,
    )
    number = next(_NUMBERS[cell]) if seq is None else seq
    return encode(PartialsMessage(cell, number, layout, through, (PartialRow(part),)))


def test_root_waits_for_live_cells_only_and_tells_resends_from_late_rows() -> None:
    now = T0
    root = _merger(
        ["c1", "c2"], lateness_ms=60_000, percentiles=(50, 99), cell_timeout_ms=5000, now_ms=now
    )
    root.receive(_one_row_message("c1", T0 + Q, T0 + Q), now, cell="c1")
    assert root.close(now) == []  # c2 (expected) has said nothing yet
    root.receive(_one_row_message("c2", T0 + Q, T0 + Q), now, cell="c2")
    (row,) = root.close(now)
    assert (row.end_ms, row.stats.samples, row.streams) == (T0 + Q, 20, 2)
    assert (row.complete, row.cells_missing) == (True, ())
    # A resend of a closed quantum is a duplicate.
    root.receive(_one_row_message("c1", T0 + Q, T0 + Q), now, cell="c1")
    assert (root.counts.rows["duplicate"], root.counts.rows["late"]) == (1, 0)
    # c2 goes silent and is not waited for forever; the quanta closed without it say so.
    root.receive(_one_row_message("c1", T0 + 2 * Q, T0 + 2 * Q), now + 1000, cell="c1")
    assert root.close(now + 1000) == []  # c2 is live and has not closed T0 + 2 s
    assert root.live_cells(now + 5500) == ["c1"]
    (row,) = root.close(now + 5500)
    assert (row.end_ms, row.complete, row.cells_missing) == (T0 + 2 * Q, False, ("c2",))
    # Nobody live: quanta close on the root's lateness alone. c1 sent rows of T0 + 3 s
    # (not its mark): it is in the quantum, c2 is not.
    root.receive(_one_row_message("c1", T0 + 3 * Q, T0 + 2 * Q), now + 5500, cell="c1")
    assert root.close(now + 20_000) == []
    (row,) = root.close(T0 + 3 * Q + 60_000)
    assert (row.end_ms, row.cells_missing) == (T0 + 3 * Q, ("c2",))
    # Both closed while c2 had not closed them (c2 no longer live for the first).
    assert root.counts.closed_by_lateness == 2
    assert root.counts.missing == {"c1": 0, "c2": 2}
    # c2 comes back: a row of a closed quantum is late; from then on rows are complete.
    root.receive(_one_row_message("c2", T0 + 2 * Q, T0 + 4 * Q), T0 + 3 * Q + 60_000, cell="c2")
    assert root.counts.rows["late"] == 1
    now = T0 + 3 * Q + 60_000
    root.receive(_one_row_message("c1", T0 + 5 * Q, T0 + 5 * Q), now, cell="c1")
    root.receive(_one_row_message("c2", T0 + 5 * Q, T0 + 5 * Q), now, cell="c2")
    (row,) = root.close(now)
    assert (row.end_ms, row.stats.samples, row.complete, row.cells_missing) == (
        T0 + 5 * Q,
        20,
        True,
        (),
    )


def test_root_refuses_what_does_not_fit_and_keeps_going() -> None:
    root = _merger(["c1"], lateness_ms=60_000, cell_timeout_ms=5000)
    root.receive(b"garbage!" * 8, T0, cell="c1")
    root.receive(_one_row_message("c1", T0 + Q, T0), T0, cell="c1")
    root.receive(_one_row_message("c1", T0 + Q + 10, T0), T0, cell="c1")  # off the grid
    # Other bins (fio 2's): a coarser layout of fio 3 would merge (coarser-layout tests).
    root.receive(
        _one_row_message("c1", T0 + 2 * Q, T0, layout=BinLayout(19, 0, "us")), T0, cell="c1"
    )
    root.receive(_one_row_message("c1", T0 + 3_600_000, T0), T0, cell="c1")  # an hour ahead
    assert dict(root.counts.invalid) == {"not-fiomon": 1, "grid": 1, "layout": 1}
    assert root.counts.rows == {"merged": 1, "future": 1}
    assert root.open_quanta == 1


def test_a_refused_message_sets_neither_bins_nor_grid() -> None:
    """Refused for its grid, a message does not re-bin; refused for its bins, no phase."""
    root = _merger(["ca", "cb"])
    root.receive(_one_row_message("ca", T0 + Q, T0 + Q), T0, cell="ca")
    # Coarser bins (would be taken before the first close) but a 1.5 s quantum: refused,
    # and the root's bins stay ca's.
    bad = decode(_one_row_message("cb", T0 + 2 * Q, T0, layout=COARSE))
    part = bad.rows[0].part
    wide = dataclasses.replace(part, start_ms=part.start_ms - Q // 2)
    root.take(dataclasses.replace(bad, rows=(PartialRow(wide),)), T0, cell="cb")
    assert (root.counts.invalid["grid"], root.layout) == (1, LAY)
    # A heartbeat (no rows) settles no bins (an idle cell sends one before it has any);
    # a fio 2 message 10 ms off is refused (for its grid, before its bins); the phase is
    # the root's own throughout.
    fresh = _merger(["ca"])
    fresh.receive(encode(PartialsMessage("ca", 0, LAY, T0, ())), T0, cell="ca")
    assert fresh.layout is None
    fresh.receive(
        _one_row_message("ca", T0 + Q + 10, T0, layout=BinLayout(19, 0, "us")), T0, cell="ca"
    )
    assert (fresh.counts.invalid["grid"], fresh.layout, fresh.phase_ms) == (1, None, 0)
    fresh.receive(_one_row_message("ca", T0 + Q, T0), T0, cell="ca")  # on the epoch grid: taken
    assert fresh.phase_ms == 0
    assert fresh.counts.rows["merged"] == 1


def test_the_deploy_readme_root_snippets_are_valid_config() -> None:
    text = (Path(__file__).parents[2] / "deploy" / "README.md").read_text()
    section = text.split("Exact cluster percentiles: the root", 1)[1]
    blocks = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
    cell, root, alert = (yaml.safe_load(b) for b in blocks)
    cfg = aggregator_config_from({**cell, "state_dir": "s"})
    assert cfg.partials is not None and cfg.partials.cell == "cell-a"
    assert cfg.partials.broker.host == "root-broker"
    rcfg = aggregator_config_from(root)
    assert rcfg.root is not None and rcfg.root.cells == ("cell-a", "cell-b")
    assert rcfg.root.cell_timeout_ms == 30_000
    assert root_problems(rcfg) == []
    # The alert shown is the shipped one.
    shipped = yaml.safe_load(
        (Path(__file__).parents[2] / "deploy/prometheus/fiomon.rules.yml").read_text()
    )
    rules = {r["alert"]: r for g in shipped["groups"] for r in g["rules"] if "alert" in r}
    (shown,) = alert
    assert shown["expr"] == rules[shown["alert"]]["expr"]
    assert shown["labels"] == rules[shown["alert"]]["labels"]
    # The root closes on its clock only after the cells (their default lateness) did.
    assert rcfg.lateness_ms > AggregatorConfig().lateness_ms
    assert rcfg.state_dir is not None and rcfg.quanta_file is not None
    assert cfg.partials.host_rows
    off = aggregator_config_from(
        {**cell, "state_dir": "s", "partials": {**cell["partials"], "host_rows": False}}
    )
    assert off.partials is not None and not off.partials.host_rows
    with pytest.raises(ConfigError, match="partials: needs state_dir"):
        aggregator_config_from(cell)


def _promtool_clean(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run .ci/run or apt-get install prometheus")
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (res.stdout + res.stderr).strip(), res.stdout + res.stderr


def test_messages_per_cell_are_exported() -> None:
    """``RootCounts.messages`` reaches /metrics as fiomon_root_partials_messages_total{cell}.

    Taken messages count (a resend too: it is a message, its rows are duplicates); a
    refused one counts only as invalid.
    """
    root = _merger(["c1", "c2"])
    root.receive(_one_row_message("c1", T0 + Q, T0 + Q), T0, cell="c1")
    root.receive(_one_row_message("c1", T0 + Q, T0 + Q), T0, cell="c1")  # a resend
    root.receive(_one_row_message("c2", T0 + Q, T0 + Q), T0, cell="c2")
    root.receive(
        _one_row_message("c2", T0 + Q + Q // 2, T0), T0, cell="c2"
    )  # off the grid: refused
    assert root.counts.invalid["grid"] == 1
    snap = with_root(
        Snapshot(),
        cells_up=2,
        cells_expected=2,
        cell_up={"c1": True, "c2": True},
        rows=root.counts.rows,
        invalid=root.counts.invalid,
        closed_by_lateness=0,
        messages=root.counts.messages,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: snap))
    _promtool_clean(generate_latest(registry).decode())
    got = {
        c: registry.get_sample_value("fiomon_root_partials_messages_total", {"cell": c})
        for c in ("c1", "c2")
    }
    assert got == {"c1": 2, "c2": 1}
    assert (
        registry.get_sample_value("fiomon_root_partial_rows_total", {"outcome": "duplicate"}) == 1
    )


def test_root_and_cell_metrics_render_and_pass_promtool(tmp_path: Path) -> None:
    clock = FakeClock(T0 + 5000)
    cfg = AggregatorConfig(
        align="epoch",
        lateness_ms=5000,
        quanta_file=tmp_path / "root.jsonl",
        root=RootConfig(cells=("c1", "c2"), cell_timeout_ms=60_000),
        sla=(SlaRule("p99-read", "read", 99.0, 5e6, for_quanta=1, min_samples=1),),
    )
    svc = RootService(cfg, now_ms=clock)
    svc.merger.receive(_one_row_message("c1", T0 + Q, T0 + Q), clock(), cell="c1")
    clock.t += 11_000  # c2 has said nothing (still waited for): the clock closes the quantum
    (row,) = svc.tick()
    svc.close()
    assert json.loads((tmp_path / "root.jsonl").read_text())["end_ms"] == row.end_ms
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: svc.snapshot))
    text = generate_latest(registry).decode()
    assert registry.get_sample_value("fiomon_root_cells_up") == 2
    assert registry.get_sample_value("fiomon_root_cells_expected") == 2
    assert registry.get_sample_value("fiomon_root_cell_up", {"cell": "c2"}) == 1
    assert registry.get_sample_value("fiomon_root_partial_rows_total", {"outcome": "merged"}) == 1
    assert registry.get_sample_value("fiomon_root_quanta_closed_by_lateness_total") == 1
    assert (row.complete, row.cells_missing) == (False, ("c2",))
    assert registry.get_sample_value("fiomon_root_quanta_missing_cell_total", {"cell": "c2"}) == 1
    assert registry.get_sample_value("fiomon_root_quanta_missing_cell_total", {"cell": "c1"}) == 0
    assert registry.get_sample_value("fiomon_root_cell_mark_lag_seconds", {"cell": "c1"}) == 4
    assert registry.get_sample_value(
        "fiomon_cluster_latency_percentile_seconds",
        {"direction": "read", "percentile": "99", "latency": "clat"},
    )
    _promtool_clean(text)
    # A cell's outbox on its own /metrics.
    cell = AggregatorCore(
        AggregatorConfig(align="epoch", state_dir=tmp_path / "cell", partials=PartialsConfig("c1")),
        now_ms=clock,
    )
    cell.restore()
    cell.on_records("a", encode_records("a", "s", 0, records(random.Random(3), ["a"], 30)))
    clock.t += 60_000
    cell.tick()
    cell.tick()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiomonCollector(lambda: cell.snapshot))
    text = generate_latest(registry).decode()
    assert (registry.get_sample_value("fiomon_partials_backlog_bytes") or 0) > 0
    assert registry.get_sample_value("fiomon_partials_messages_total", {"result": "sent"}) == 0
    cell.close()
    _promtool_clean(text)


def test_a_root_restart_re_forms_open_quanta_from_its_journal(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    cfg = AggregatorConfig(
        align="epoch",
        lateness_ms=5000,
        quanta_file=tmp_path / "root.jsonl",
        state_dir=tmp_path / "state",
        root=RootConfig(cells=("c1", "c2"), cell_timeout_ms=60_000),
    )
    first = RootService(cfg, now_ms=clock)
    first.on_message("c1", _one_row_message("c1", T0 + Q, T0 + Q))
    first.on_message("c2", _one_row_message("c2", T0 + Q, T0 + Q))
    assert [r.end_ms for r in first.tick()] == [T0 + Q]
    first.on_message("c1", _one_row_message("c1", T0 + 2 * Q, T0 + 2 * Q))
    assert first.tick() == []  # c2 has not closed T0 + 2 s
    first.close()  # as after kill -9: the journal holds both messages of c1
    second = RootService(cfg, now_ms=clock)
    assert second.merger.open_quanta == 1  # T0 + 2 s re-formed; T0 + 1 s was published
    second.on_message("c2", _one_row_message("c2", T0 + 2 * Q, T0 + 2 * Q))
    second.on_message("c1", _one_row_message("c1", T0 + 2 * Q, T0 + 2 * Q))  # a resend
    (row,) = second.tick()
    assert (row.end_ms, row.stats.samples, row.streams) == (T0 + 2 * Q, 20, 2)
    assert second.merger.counts.rows["duplicate"] == 1
    second.close()
    lines = (tmp_path / "root.jsonl").read_text().splitlines()
    assert [json.loads(x)["end_ms"] for x in lines] == [T0 + Q, T0 + 2 * Q]
    # Replayed rows of published quanta are not merged again.
    third = RootService(cfg, now_ms=clock)
    assert third.merger.open_quanta == 0
    third.close()


def test_the_outbox_cuts_a_torn_record_and_empties_once_all_is_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fiomon.aggregator.outbox as outbox_mod  # noqa: PLC0415

    problems: list[tuple[str, str]] = []
    box = Outbox(tmp_path, "c1", 1 << 20, lambda k, t: problems.append((k, t)))
    box.add(LAY, T0, [])
    box.add(LAY, T0 + Q, [])
    box.close()
    with (tmp_path / "partials.outbox").open("ab") as fh:
        fh.write(b"\x40\x00\x00\x00torn")  # kill -9 in the middle of a write
    box = Outbox(tmp_path, "c1", 1 << 20, lambda k, t: problems.append((k, t)))
    sent = []
    while (nxt := box.peek()) is not None:
        sent.append(decode(nxt[1]).closed_through_ms)
        box.ack(nxt[0])
    assert sent == [T0, T0 + Q]
    monkeypatch.setattr(outbox_mod, "COMPACT_BYTES", 0)
    box.add(LAY, T0 + 2 * Q, [])
    nxt = box.peek()
    assert nxt is not None
    box.ack(nxt[0])  # everything acknowledged: the file is emptied
    assert (tmp_path / "partials.outbox").stat().st_size == 0
    assert box.backlog_bytes == 0
    box.close()
    again = Outbox(tmp_path, "c1", 1 << 20, lambda k, t: problems.append((k, t)))
    assert again.peek() is None
    again.add(LAY, T0 + 3 * Q, [])
    nxt = again.peek()
    assert nxt is not None and decode(nxt[1]).seq == 3  # numbering goes on
    again.close()
    assert problems == []


def test_a_cell_without_host_rows_sends_cluster_rows_only(tmp_path: Path) -> None:
    clock = FakeClock(T0 + 30 * Q)
    cfg = AggregatorConfig(
        align="epoch",
        lateness_ms=5000,
        state_dir=tmp_path,
        partials=PartialsConfig(cell="c1", host_rows=False),
    )
    batch = records(random.Random(9), ["a", "b"], 100)
    one = engine(partials=False)
    one.add(batch)
    want = [r for r in one.flush() if r.scope == "cluster"]
    core = AggregatorCore(cfg, now_ms=clock)
    core.restore()
    for host in ("a", "b"):
        mine = np.array([batch.streams[s].host == host for s in batch.stream_idx])
        core.on_records(host, encode_records(host, "s", 0, batch.select(mine)))
    clock.t = T0 + 60 * Q
    core.tick()
    core.close()
    msgs = _outbox_messages(tmp_path)
    assert {r.part.scope for m in msgs for r in m.rows} == {"cluster"}
    root = _merger(
        ["c1"], percentiles=cfg.percentiles, confidence_level=cfg.confidence_level, per_host=False
    )
    for m in msgs:
        root.take(m, clock(), cell="c1")
    assert_same(root.close(clock()), want)


def test_rows_the_root_closed_without_are_logged_with_the_likely_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A root whose lateness is not above the cells' closes by its clock first (seen live)."""
    root = _merger(["c1"])
    root.receive(_one_row_message("c1", T0 + Q, T0), T0 + Q, cell="c1")
    assert root.close(T0 + 2 * Q + 5000) != []  # by the root's clock, through T0 + 2 s
    with caplog.at_level("WARNING", logger="fiomon.root"):
        root.receive(_one_row_message("c1", T0 + 2 * Q, T0 + 2 * Q), T0 + 2 * Q + 5010, cell="c1")
    assert root.counts.rows["late"] == 1
    lag, warning = [r.getMessage() for r in caplog.records]
    assert "cell c1" in warning and "lateness" in warning, warning
    # Its mark trailed the root's clock by more than the root's lateness: said once.
    assert "cell c1: its closed mark trails the root's clock by 5010 ms" in lag, lag
    assert root.cells["c1"].mark_lag_ms == 5010


def test_a_closed_mark_far_ahead_of_the_roots_clock_is_not_believed() -> None:
    """One message saying "closed through an hour from now" (a cell's clock that jumped,
    or a forged message) made the root stop waiting for that cell for good: the mark only
    ever grows. Seen on loopback: 114 rows of the cell late after its next kill -9."""
    root = _merger(["c1", "c2"], lateness_ms=60_000)
    root.receive(_one_row_message("c1", T0 + Q, T0 + 3_600_000), T0, cell="c1")
    root.receive(_one_row_message("c2", T0 + Q, T0 + Q), T0, cell="c2")
    assert root.close(T0) == [], "c1 has not closed T0 + 1 s: it is waited for"
    assert root.counts.invalid["future-mark"] == 1
    root.receive(_one_row_message("c1", T0 + 2 * Q, T0 + Q), T0 + Q, cell="c1")
    assert [r.end_ms for r in root.close(T0 + Q)] == [T0 + Q]


def _marker(cell: str, seq: int, through: int) -> bytes:
    return encode(PartialsMessage(cell, seq, LAY, through, ()))


def test_two_cells_sending_under_one_name_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Their message numbers interleave; one cell's go back only once per restart.

    Seen on loopback (a copied configuration): the root took one cell's rows for resends
    of the other's and said nothing but ``duplicate``.
    """
    root = _merger(["c1", "c2"])
    with caplog.at_level("WARNING", logger="fiomon.root"):
        # A restart resends from the last acknowledged message: one step back, no warning.
        for t, seq in enumerate([10, 11, 12, 11, 12, 13, 14]):  # resends: the same bytes
            root.receive(_marker("c1", seq, T0 + (seq - 10) * Q), T0 + t * Q, cell="c1")
        assert not caplog.records
        for t, seq in enumerate([500, 20, 501, 21, 502, 22], start=7):
            root.receive(_marker("c1", seq, T0 + t * Q), T0 + t * Q, cell="c1")
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "c1" in warning and "two cells" in warning, warning


def test_quanta_while_two_cells_send_under_one_name_name_it_missing() -> None:
    """The root takes one's cluster rows for resends of the other's: those quanta hold only
    part of that name's hosts, so their rows say so (issue 24), and quanta well after the
    episode are complete again. Told by content: the same message number with other bytes
    (a cell's outbox resends the very bytes it sent, so resends after a flapping link mark
    nothing: a reviewer's loopback run marked 285 exact rows on message-number rewinds)."""
    root = _merger(["c1", "c2"], lateness_ms=5000)
    for t in range(1, 90):
        now = T0 + t * Q
        # c2 steady; c1's name used by two processes for the first 10 s, numbering alike
        root.receive(_one_row_message("c2", now, now, seq=t), now, cell="c2")
        root.receive(_one_row_message("c1", now, now, seq=t), now, cell="c1")
        if t <= 10:
            other = _one_row_message("c1", now, now - Q, seq=t)  # its own mark: other bytes
            root.receive(other, now, cell="c1")
        if t % 7 == 0:  # resends (reconnections): the same bytes again, a step back
            root.receive(_one_row_message("c1", now, now, seq=t), now, cell="c1")
    rows = root.close(T0 + 200 * Q)
    marked = {r.end_ms for r in rows if r.cells_missing == ("c1",)}
    complete = {r.end_ms for r in rows if r.complete}
    assert marked and complete and marked | complete == {r.end_ms for r in rows}
    # From the episode's start (less the lateness) to a minute after its last message.
    assert min(marked) <= T0 + 3 * Q
    assert T0 + 69 * Q in marked
    assert T0 + 80 * Q in complete  # a minute after it, complete again
    assert all(not r.complete for r in rows if r.end_ms in marked)


def test_resends_alone_never_mark_a_cell_as_two() -> None:
    """A flapping link resends unacknowledged messages, byte for byte, many times."""
    root = _merger(["c1"], lateness_ms=5000)
    sent = []
    for t in range(1, 40):
        now = T0 + t * Q
        sent.append(_one_row_message("c1", now, now, seq=t))
        root.receive(sent[-1], now, cell="c1")
        if t % 3 == 0:  # a reconnection every 3 s resends the last five
            for payload in sent[-5:]:
                root.receive(payload, now, cell="c1")
    assert all(r.complete for r in root.close(T0 + 100 * Q))


def test_a_cells_incomplete_row_makes_the_roots_row_incomplete() -> None:
    """A cell whose own row lacked a host it expected (its broker was down, say) passes
    that on: the root's row of that group is incomplete too, though no cell is missing;
    the other groups and quanta stay complete."""
    root = _merger(["c1", "c2"])
    flagged = decode(_one_row_message("c1", T0 + Q, T0 + Q))
    row = flagged.rows[0]
    flagged = dataclasses.replace(flagged, rows=(dataclasses.replace(row, complete=False),))
    root.receive(encode(flagged), T0, cell="c1")
    root.receive(_one_row_message("c2", T0 + Q, T0 + 2 * Q, seq=1), T0, cell="c2")
    root.receive(_one_row_message("c1", T0 + 2 * Q, T0 + 2 * Q, seq=2), T0, cell="c1")
    root.receive(_one_row_message("c2", T0 + 2 * Q, T0 + 2 * Q, seq=3), T0, cell="c2")
    first, second = root.close(T0 + 10 * Q)
    assert (first.end_ms, first.complete, first.cells_missing) == (T0 + Q, False, ())
    assert first.stats.samples == 20  # both cells' rows merged
    assert (second.end_ms, second.complete, second.cells_missing) == (T0 + 2 * Q, True, ())


def _sent(cell: AggregatorCore) -> list[bytes]:
    """What a cell's outbox would send now, in order (as PUBACKs come)."""
    out = []
    assert cell.outbox is not None
    while (nxt := cell.outbox.peek()) is not None:
        out.append(nxt[1])
        cell.outbox.ack(nxt[0])
    return out


def test_a_cell_idle_since_the_roots_start_is_not_missing(tmp_path: Path) -> None:
    """Its hosts have not run yet: before its first record it still sends, each quantum,
    the mark of what it closed (empty), so the busy cell's quanta are complete; records
    that come later for quanta it said closed are late at the cell as at the root.
    (A reviewer's loopback run: all 369 rows marked, FiomonRootCellMissing firing for a
    healthy idle cell.)"""
    clock = FakeClock(T0)
    idle = AggregatorCore(
        AggregatorConfig(
            align="epoch",
            lateness_ms=5000,
            state_dir=tmp_path / "c2",
            partials=PartialsConfig("c2"),
        ),
        now_ms=clock,
    )
    idle.restore()
    root = _merger(["c1", "c2"], lateness_ms=60_000)
    for t in range(1, 12):
        clock.t = T0 + 5000 + t * Q
        idle.tick()
        for payload in _sent(idle):
            root.receive(payload, clock.t, cell="c2")
        root.receive(_one_row_message("c1", T0 + t * Q, T0 + t * Q), clock.t, cell="c1")
    rows = root.close(clock.t)
    assert [r.end_ms for r in rows] == [T0 + t * Q for t in range(1, 12)]
    assert all(r.complete and r.cells_missing == () for r in rows)
    assert root.layout == LAY  # the idle cell's stand-in layout took no part
    # Its first records, for a quantum it said closed: late, as at the root.
    idle.on_records("a", encode_records("a", "s", 0, records(random.Random(3), ["a"], 30)))
    idle.tick()
    assert idle.engine is not None and sum(idle.engine.late_records.values()) > 0
    idle.close()
