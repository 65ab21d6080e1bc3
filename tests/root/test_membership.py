"""The root under faults (issue 24): membership, grid and skew from its configuration,
and every row saying which listed cells it lacks. Pure: a fake clock, no broker."""

from __future__ import annotations

import collections
import itertools
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from fiomon.bins import BinLayout
from fiomon.config import AggregatorConfig, RootConfig
from fiomon.errors import ConfigError
from fiomon.partials import PartialRow, PartialsMessage, RawPartial, encode
from fiomon.root.merger import RootMerger
from fiomon.root.service import RootService
from tests.clock import T0, FakeClock

LAY = BinLayout()
Q = 1000


def merger(
    cells: list[str], *, lateness_ms: int = 5000, cell_timeout_ms: int = 30_000
) -> RootMerger:
    """A root on the epoch grid of 1 s quanta (lateness 5 s, cell timeout 30 s, p50)."""
    return RootMerger(
        quantum_ms=Q,
        lateness_ms=lateness_ms,
        percentiles=(50,),
        confidence_level=None,
        per_host=True,
        cells=cells,
        cell_timeout_ms=cell_timeout_ms,
        now_ms=T0,
    )


def through(root: RootMerger, cell: str) -> int | None:
    """The cell's closed mark as the root took it."""
    return root.cells[cell].through_ms


def part(end: int, host: str | None, *, length: int = Q, samples: float = 10.0) -> RawPartial:
    hist = np.zeros(LAY.nbins)
    hist[700] = samples
    return RawPartial(
        start_ms=end - length,
        end_ms=end,
        scope="cluster" if host is None else "host",
        host=host,
        direction="read",
        hist=hist,
        lo_ms=end - length,
        hi_ms=end,
        nbytes=4096.0,
        streams=1,
    )


# Each cell's message numbers, one after another as its outbox gives them (the root
# tells two cells under one name by a number that comes again with other bytes).
NUMBERS: collections.defaultdict[str, itertools.count[int]] = collections.defaultdict(
    itertools.count
)


def message(cell: str, end: int, through: int, *, host: str, length: int = Q) -> bytes:
    """A cell's close of quantum ``end``: its cluster row and its one host's row."""
    rows = (PartialRow(part(end, None, length=length)), PartialRow(part(end, host, length=length)))
    return encode(PartialsMessage(cell, next(NUMBERS[cell]), LAY, through, rows))


def marker(cell: str, through: int) -> bytes:
    return encode(PartialsMessage(cell, next(NUMBERS[cell]), LAY, through, ()))


def text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


def test_a_missing_cell_is_named_in_every_row_until_it_returns() -> None:
    """Cell b down past the root's lateness: a's rows go out marked, b named; counted."""
    root = merger(["a", "b"])
    root.receive(message("a", T0 + Q, T0 + Q, host="ha"), T0 + Q, cell="a")
    root.receive(message("b", T0 + Q, T0 + Q, host="hb"), T0 + Q, cell="b")
    rows = root.close(T0 + Q)
    assert {(r.scope, r.host) for r in rows} == {("cluster", None), ("host", "ha"), ("host", "hb")}
    assert all(r.complete and r.cells_missing == () for r in rows)
    # b goes silent (still "live" for its cell_timeout): the clock closes without it.
    root.receive(message("a", T0 + 2 * Q, T0 + 2 * Q, host="ha"), T0 + 2 * Q, cell="a")
    assert root.close(T0 + 2 * Q + 4999) == []  # b is waited for up to the lateness
    rows = root.close(T0 + 2 * Q + 5000)
    assert {(r.scope, r.host) for r in rows} == {("cluster", None), ("host", "ha")}
    assert all(not r.complete and r.cells_missing == ("b",) for r in rows)
    (cluster,) = [r for r in rows if r.scope == "cluster"]
    assert cluster.stats.samples == 10  # a's alone
    line = json.loads(cluster.to_json_line())  # the quanta file's line
    assert (line["complete"], line["cells_missing"]) == (False, ["b"])
    assert root.counts.closed_by_lateness == 1
    assert root.counts.missing == {"a": 0, "b": 1}
    # b returns (a quantum that closed empty at b counts by its mark): complete again.
    root.receive(message("a", T0 + 3 * Q, T0 + 4 * Q, host="ha"), T0 + 4 * Q, cell="a")
    root.receive(message("a", T0 + 4 * Q, T0 + 4 * Q, host="ha"), T0 + 4 * Q, cell="a")
    root.receive(message("b", T0 + 3 * Q, T0 + 3 * Q, host="hb"), T0 + 4 * Q, cell="b")
    root.receive(marker("b", T0 + 4 * Q), T0 + 4 * Q, cell="b")
    rows = root.close(T0 + 4 * Q)
    assert {r.end_ms for r in rows} == {T0 + 3 * Q, T0 + 4 * Q}
    assert all(r.complete and r.cells_missing == () for r in rows)
    assert root.counts.closed_by_lateness == 1


def test_a_gone_cell_still_counts_as_missing_and_closing_by_lateness() -> None:
    """Past cell_timeout a cell is not waited for: its quanta close on the others' marks,
    and each is counted as closed without it (it stayed 0 before issue 24)."""
    root = merger(["a", "b"], lateness_ms=30_000, cell_timeout_ms=30_000)
    now = T0 + 31_000  # b never said anything: gone
    for k in range(1, 4):
        root.receive(message("a", now + k * Q, now + k * Q, host="ha"), now + k * Q, cell="a")
    rows = root.close(now + 3 * Q)
    assert sorted({r.end_ms for r in rows}) == [now + k * Q for k in range(1, 4)]
    assert all(r.cells_missing == ("b",) for r in rows)
    assert root.counts.closed_by_lateness == 3
    assert root.counts.missing["b"] == 3


def test_an_unlisted_cell_is_refused_logged_once_and_not_waited_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = merger(["a"])
    with caplog.at_level(logging.WARNING, logger="fiomon.root"):
        for k in range(3):  # rows 836 times a's, and a mark that would freeze closing
            evil = encode(
                PartialsMessage(
                    "evil", k, LAY, T0 - 60_000, (PartialRow(part(T0 + Q, None, samples=8360)),)
                )
            )
            assert root.receive(evil, T0 + Q, cell="evil") is None
        root.receive(message("a", T0 + Q, T0 + Q, host="ha"), T0 + Q, cell="a")
    (row, _) = root.close(T0 + Q)  # on a's mark alone
    assert (row.stats.samples, row.complete, row.cells_missing) == (10, True, ())
    assert root.counts.invalid["unlisted"] == 3
    assert set(root.cells) == {"a"} and set(root.counts.messages) == {"a"}
    said = text(caplog)
    assert said.count("'evil' is not in root.cells (a)") == 1, said
    # Many names: each logged once up to a bound, the state does not grow with them.
    for i in range(500):
        root.receive(marker(f"x{i}", T0), T0 + Q, cell=f"x{i}")
    assert set(root.cells) == {"a"}
    assert len(root._unlisted) <= 100  # the bound of the logged names


def test_a_cell_of_another_latency_kind_is_refused_and_shows_as_missing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 27: a root with latency lat merges lat cells only; a clat cell's rows (and
    # marks) are refused, counted, and its quanta name it missing.
    root = RootMerger(
        quantum_ms=Q,
        lateness_ms=5000,
        percentiles=(50,),
        confidence_level=None,
        per_host=True,
        cells=["a", "b"],
        cell_timeout_ms=30_000,
        now_ms=T0,
        latency="lat",
    )
    rows = (PartialRow(part(T0 + Q, None)), PartialRow(part(T0 + Q, "ha")))
    lat = encode(PartialsMessage("a", next(NUMBERS["a"]), LAY, T0 + Q, rows, "lat"))
    with caplog.at_level(logging.WARNING, logger="fiomon.root"):
        assert root.receive(lat, T0 + Q, cell="a") == T0 + Q
        assert root.receive(message("b", T0 + Q, T0 + Q, host="hb"), T0 + Q, cell="b") is None
    assert root.counts.invalid["latency"] == 1
    assert "cell b: its partials hold clat latency, this root merges lat" in text(caplog)
    out = root.close(T0 + Q + 5000)  # on the lateness: b's mark was refused too
    assert {(r.scope, r.host) for r in out} == {("cluster", None), ("host", "ha")}
    assert all(r.cells_missing == ("b",) for r in out)
    (cluster,) = [r for r in out if r.scope == "cluster"]
    assert cluster.stats.samples == 10  # a's alone


def test_a_payload_naming_another_cell_than_its_topic_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = merger(["a", "b"])
    with caplog.at_level(logging.WARNING, logger="fiomon.root"):
        # b's name on a's topic (its rows, and a mark that would close a's quanta)
        assert root.receive(message("b", T0 + Q, T0 + 60_000, host="hb"), T0, cell="a") is None
    assert root.counts.invalid["cell-name"] == 1
    assert root.open_quanta == 0
    assert root.cells["a"].through_ms is None and root.cells["b"].through_ms is None
    assert "topic of cell a names cell b" in text(caplog)


def test_a_cell_off_the_grid_is_refused_and_named_while_the_listed_one_stays_exact(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seen live: cell b with ``align: 500ms`` spoke first and the root took its phase,
    refusing the correctly configured a. Now the root's own grid (epoch) decides."""
    root = merger(["a", "b"])
    off = T0 + Q + Q // 2
    with caplog.at_level(logging.WARNING, logger="fiomon.root"):
        root.receive(marker("b", off - Q), off - Q, cell="b")  # a marker first: no rows
        root.receive(message("b", off, off, host="hb"), off, cell="b")
        root.receive(message("a", T0 + Q, T0 + Q, host="ha"), T0 + Q, cell="a")
        root.receive(message("b", off + Q, off + Q, host="hb"), off + Q, cell="b")
        root.receive(marker("b", off + 2 * Q), off + 2 * Q, cell="b")  # its mark: ignored
        root.receive(message("a", T0 + 2 * Q, T0 + 2 * Q, host="ha"), T0 + 2 * Q, cell="a")
    assert root.counts.invalid["grid"] == 2
    assert root.cells["b"].through_ms is None  # its marks say nothing of the root's quanta
    rows = root.close(T0 + 2 * Q + 5000)  # b not closed: the clock closes, without b
    assert sorted({r.end_ms for r in rows}) == [T0 + Q, T0 + 2 * Q]
    for r in rows:
        assert (r.stats.samples, r.host in (None, "ha")) == (10, True)
        assert r.cells_missing == ("b",)
    said = [m for m in text(caplog).splitlines() if "grid" in m]
    assert len(said) == 1, said  # rate-limited per cell
    assert "cell b sent quantum" in said[0] and "phase 500 ms" in said[0], said
    assert "root's grid (1000 ms, phase 0 ms" in said[0], said
    # Back on the grid: taken again, and its mark counts.
    root.receive(message("b", T0 + 3 * Q, T0 + 3 * Q, host="hb"), T0 + 3 * Q, cell="b")
    root.receive(message("a", T0 + 3 * Q, T0 + 3 * Q, host="ha"), T0 + 3 * Q, cell="a")
    rows = root.close(T0 + 3 * Q)
    assert all(r.complete for r in rows) and len(rows) == 3


def test_a_cell_on_another_quantum_length_shows_as_missing() -> None:
    root = merger(["a", "b"])
    root.receive(message("b", T0 + 2 * Q, T0 + 2 * Q, host="hb", length=2 * Q), T0, cell="b")
    root.receive(message("a", T0 + Q, T0 + Q, host="ha"), T0 + Q, cell="a")
    rows = root.close(T0 + Q + 5000)
    assert root.counts.invalid["grid"] == 1
    assert rows and all(r.cells_missing == ("b",) for r in rows)


def test_a_forged_mark_far_ahead_is_ignored_counted_and_closes_nothing_early(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """+120 s (under the old 10-minute bound) let the root close 4 quanta without a cell."""
    root = merger(["a", "b"], lateness_ms=30_000)
    now = T0 + Q
    with caplog.at_level(logging.WARNING, logger="fiomon.root"):
        root.receive(message("a", T0 + Q, now + 120_000, host="ha"), now, cell="a")
        root.receive(message("a", T0 + 2 * Q, now + 120_000, host="ha"), now, cell="a")
    root.receive(message("b", T0 + Q, T0 + Q, host="hb"), now, cell="b")
    assert root.counts.invalid["future-mark"] == 2
    assert through(root, "a") is None
    assert root.counts.rows["merged"] == 6  # its rows still count
    assert root.close(now + 5000) == []  # a is waited for: it has not closed T0 + 1 s
    said = [m for m in text(caplog).splitlines() if "ahead of the root's clock" in m]
    assert len(said) == 1 and "cell a: closed mark" in said[0] and "120000 ms ahead" in said[0]
    # Within the skew bound a mark is believed.
    root.receive(marker("a", now + 4000), now, cell="a")
    assert through(root, "a") == now + 4000
    assert [r.end_ms for r in root.close(now) if r.scope == "cluster"] == [T0 + Q]


def test_the_mark_lag_is_kept_per_cell_and_a_lag_past_the_lateness_is_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = merger(["a"])
    with caplog.at_level(logging.WARNING, logger="fiomon.root"):
        root.receive(marker("a", T0), T0 + 1200, cell="a")
        assert root.cells["a"].mark_lag_ms == 1200
        root.receive(marker("a", T0 + Q), T0 + Q + 7000, cell="a")
        root.receive(marker("a", T0 + 2 * Q), T0 + 2 * Q + 7000, cell="a")
        root.receive(marker("a", T0 + Q), T0 + 2 * Q + 9000, cell="a")  # an old one: no
    assert root.cells["a"].mark_lag_ms == 7000
    said = [m for m in text(caplog).splitlines() if "trails the root's clock" in m]
    assert len(said) == 1, said


def _root(tmp_path: Path, clock: FakeClock[int]) -> RootService:
    cfg = AggregatorConfig(
        align="epoch",
        lateness_ms=10_000,
        quanta_file=tmp_path / "quanta.jsonl",
        state_dir=tmp_path / "state",
        root=RootConfig(cells=("a", "b")),
    )
    return RootService(cfg, now_ms=clock)


def test_a_root_that_lost_its_state_says_so_and_trusts_no_first_mark(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(T0 + Q)
    with caplog.at_level(logging.WARNING, logger="fiomon.root"):
        first = _root(tmp_path, clock)
    assert "taken as a first start" in text(caplog)  # a new directory: logged, not counted
    assert first.counts.state_errors == {}
    first.on_message("a", message("a", T0 + Q, T0 + Q, host="ha"))
    first.on_message("b", message("b", T0 + Q, T0 + Q, host="hb"))
    assert first.tick() != []
    # b's rows of T0 + 2 s reach this run only; then it dies with its state.
    first.on_message("b", message("b", T0 + 2 * Q, T0 + 2 * Q, host="hb"))
    first.close()
    (tmp_path / "state" / "state.json").unlink()
    for seg in (tmp_path / "state" / "journal").iterdir():
        seg.unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fiomon.root"):
        second = _root(tmp_path, clock)
    said = text(caplog)
    assert "state-lost" in said and f"quanta through {T0 + Q} are taken as published" in said
    assert "may lack the rows it had received" in said
    assert second.counts.state_errors["state-lost"] == 1
    # An unlisted cell's messages are not even journaled.
    journal = tmp_path / "state" / "journal"
    size = sum(f.stat().st_size for f in journal.iterdir())
    for _ in range(10):
        second.on_message("evil", message("evil", T0 + 2 * Q, T0 + 2 * Q, host="he"))
    assert sum(f.stat().st_size for f in journal.iterdir()) == size
    assert second.merger.counts.invalid["unlisted"] == 10
    # b's first mark now covers T0 + 2 s, whose rows went to the previous run: b missing.
    second.on_message("b", marker("b", T0 + 2 * Q))
    second.on_message("a", message("a", T0 + 2 * Q, T0 + 2 * Q, host="ha"))
    rows = second.tick()
    assert rows and all(r.cells_missing == ("b",) for r in rows)
    # A later mark of b vouches as usual.
    second.on_message("b", marker("b", T0 + 3 * Q))
    second.on_message("a", message("a", T0 + 3 * Q, T0 + 3 * Q, host="ha"))
    rows = second.tick()
    assert rows and all(r.complete for r in rows)
    second.close()


def test_the_root_needs_its_cells_and_its_own_grid() -> None:
    with pytest.raises(ConfigError, match=r"root\.cells: required"):
        RootService(AggregatorConfig(align="epoch", lateness_ms=10_000, root=RootConfig()))
    with pytest.raises(ConfigError, match="align: the root needs epoch or a fixed offset"):
        RootService(AggregatorConfig(lateness_ms=10_000, root=RootConfig(cells=("a",))))
    svc = RootService(
        AggregatorConfig(align=250, lateness_ms=10_000, root=RootConfig(cells=("a",)))
    )
    assert svc.merger.phase_ms == 250
    svc.close()
