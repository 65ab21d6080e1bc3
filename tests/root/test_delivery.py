"""The root's bookkeeping of each cell's message numbers (fiomon.root.delivery)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from fiomon.config import AggregatorConfig, RootConfig
from fiomon.partials import decode, encode
from fiomon.root.delivery import DeliveryTracker
from fiomon.root.service import ACKED_FILE, RootService
from tests.clock import T0, FakeClock
from tests.root.test_merger import Q, _one_row_message

T = 1_700_000_000_000


def test_in_order_numbers_advance_and_a_root_without_state_starts_at_the_first() -> None:
    t = DeliveryTracker()
    assert t.ack("c1", T) is None  # nothing known: nothing to say
    assert t.seen("c1", 40, T)[0] == "first"
    assert t.seen("c1", 41, T)[0] == "next"
    assert t.ack("c1", T + 5) == {"next_seq": 42, "at_ms": T + 5}
    assert t.take_dirty() == ["c1"]
    assert t.take_dirty() == []
    assert t.seen("c1", 40, T)[0] == "resend"  # below next_seq: a resend, no change
    assert t.take_dirty() == []
    assert t.cells["c1"].resends == 1
    assert t.positions() == {"c1": 42}


def test_a_saved_position_continues_and_earlier_numbers_are_resends() -> None:
    t = DeliveryTracker({"c1": 10})
    assert t.seen("c1", 3, T)[0] == "resend"
    assert t.seen("c1", 10, T)[0] == "next"
    assert t.positions() == {"c1": 11}


def test_a_hole_is_logged_with_its_numbers_counted_asked_for_and_filled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    t = DeliveryTracker({"c1": 5})
    with caplog.at_level(logging.WARNING, "fiomon.root"):
        assert t.seen("c1", 8, T)[0] == "ahead"
        assert t.seen("c1", 9, T)[0] == "ahead"  # no new hole
    assert "cell c1: partials messages 5..7 missing" in caplog.text
    c = t.cells["c1"]
    assert (c.gaps, c.next_seq) == (1, 5)
    assert t.ack("c1", T) == {"next_seq": 5, "at_ms": T, "gap": [5, 7]}
    # The cell resends from 5: the hole fills and next_seq passes what was held ahead.
    for seq in (5, 6, 7, 8, 9):
        t.seen("c1", seq, T + 1)
    assert t.ack("c1", T + 2) == {"next_seq": 10, "at_ms": T + 2}
    assert c.resends == 2  # 8 and 9 again
    assert (c.gaps, c.lost, c.hole_since_ms) == (1, 0, None)


def test_a_second_hole_is_counted_and_logging_is_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    t = DeliveryTracker({"c1": 0})
    with caplog.at_level(logging.WARNING, "fiomon.root"):
        t.seen("c1", 2, T)
        t.seen("c1", 5, T + 1)  # a second hole, 3..4: counted, not logged (too soon)
        t.seen("c1", 9, T + 20_000)  # a third, later: logged with the count since
    assert t.cells["c1"].gaps == 3
    assert caplog.text.count("missing") == 2
    assert "partials messages 6..8 missing (2 holes since the last such line" in caplog.text
    assert t.ack("c1", T)["gap"] == [0, 1]  # type: ignore[index]
    t.seen("c1", 0, T)
    t.seen("c1", 1, T)
    assert t.ack("c1", T)["gap"] == [3, 4]  # type: ignore[index]


def test_a_hole_that_never_fills_is_given_up_and_counted_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    t = DeliveryTracker({"c1": 0}, give_up_ms=60_000)
    t.seen("c1", 3, T)
    with caplog.at_level(logging.ERROR, "fiomon.root"):
        t.seen("c1", 4, T + 59_999)
        assert t.cells["c1"].lost == 0
        t.seen("c1", 5, T + 60_000)
    assert "cell c1: partials messages 0..2 never came" in caplog.text
    assert t.cells["c1"].lost == 3
    assert t.ack("c1", T) == {"next_seq": 6, "at_ms": T}
    assert t.seen("c1", 1, T)[0] == "resend"  # it came after all: merged, nothing to track


def test_too_many_numbers_behind_a_hole_give_it_up() -> None:
    t = DeliveryTracker({"c1": 0}, max_ahead=3)
    for seq in (2, 3, 4):
        t.seen("c1", seq, T)
    assert t.cells["c1"].next_seq == 0
    t.seen("c1", 5, T)
    assert (t.cells["c1"].next_seq, t.cells["c1"].lost) == (6, 2)


def test_cells_are_apart() -> None:
    t = DeliveryTracker()
    t.seen("c1", 0, T)
    t.seen("c2", 7, T)
    t.seen("c2", 9, T)
    assert t.positions() == {"c1": 1, "c2": 8}
    assert "gap" not in t.ack("c1", T)  # type: ignore[operator]
    assert t.ack("c2", T)["gap"] == [8, 8]  # type: ignore[index]


def test_a_mark_behind_a_hole_waits_until_the_hole_fills() -> None:
    """Message 3 closes through 3 s, but 2 is missing: its quanta must not close yet."""
    t = DeliveryTracker({"c1": 2})
    assert t.holds_back("c1", 3)
    assert not t.holds_back("c1", 2)
    assert not t.holds_back("c9", 5)  # a cell not known yet: its first number is its start
    assert t.seen("c1", 3, T, 3000) == ("ahead", None)
    assert t.seen("c1", 4, T, 4000) == ("ahead", None)
    assert t.seen("c1", 2, T, 2000) == ("next", 4000)  # 2, 3, 4 all in: 4's mark goes
    assert t.seen("c1", 3, T, 3000) == ("resend", None)
    assert t.seen("c1", 5, T, 5000) == ("next", 5000)


def test_a_given_up_hole_releases_the_marks_behind_it() -> None:
    t = DeliveryTracker({"c1": 0}, give_up_ms=1000)
    assert t.seen("c1", 2, T, 2000) == ("ahead", None)
    assert t.seen("c1", 3, T + 1000, 3000) == ("ahead", 3000)


# -- in the root service -------------------------------------------------------------------


def _numbered(seq: int, end: int, through: int, cell: str = "c1") -> bytes:
    msg = decode(_one_row_message(cell, end, through))
    return encode(dataclasses.replace(msg, seq=seq))


def test_the_root_holds_a_mark_behind_a_hole_also_across_a_restart(tmp_path: Path) -> None:
    """Message 1 is missing: message 2's mark must not close quantum 2 (message 1's rows)."""
    clock = FakeClock(T0)
    cfg = AggregatorConfig(
        align="epoch",
        lateness_ms=60_000,
        state_dir=tmp_path / "s",
        quanta_file=tmp_path / "q.jsonl",
        root=RootConfig(cells=("c1",)),
    )
    first = RootService(cfg, now_ms=clock)
    first.on_message("c1", _numbered(0, T0 + Q, T0 + Q))
    first.on_message("c1", _numbered(2, T0 + 3 * Q, T0 + 3 * Q))
    clock.t = T0 + 3 * Q + 10
    assert [r.end_ms for r in first.tick()] == [T0 + Q]
    assert first.delivery.ack("c1", clock.t) == {"next_seq": 1, "at_ms": clock.t, "gap": [1, 1]}
    first.on_message("c1", _numbered(2, T0 + 3 * Q, T0 + 3 * Q))  # a resend: still held
    assert first.tick() == []
    first.close()
    # A restart replays message 2 from the journal: its mark is still held.
    again = RootService(cfg, now_ms=clock)
    assert again.tick() == []
    assert again.delivery.ack("c1", clock.t) == {"next_seq": 1, "at_ms": clock.t, "gap": [1, 1]}
    again.on_message("c1", _numbered(1, T0 + 2 * Q, T0 + 2 * Q))  # the resend fills the hole
    assert [r.end_ms for r in again.tick()] == [T0 + 2 * Q, T0 + 3 * Q]
    assert again.delivery.positions() == {"c1": 3}
    again.close()
    saved = json.loads((tmp_path / "s" / ACKED_FILE).read_text())
    assert saved == {"next_seq": {"c1": 3}}


def test_an_unlisted_cell_or_a_message_under_another_name_moves_no_position() -> None:
    clock = FakeClock(T0)
    cfg = AggregatorConfig(align="epoch", lateness_ms=60_000, root=RootConfig(cells=("c1",)))
    svc = RootService(cfg, now_ms=clock)
    svc.on_message("evil", _numbered(0, T0 + Q, T0 + Q, cell="evil"))
    svc.on_message("c1", _numbered(7, T0 + Q, T0 + Q, cell="c2"))
    assert svc.delivery.positions() == {}
    svc.close()
