"""A cell's partials outbox: what it counts as sent, dropped, and where it resends from."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import fiomon.aggregator.outbox as outbox_mod
from fiomon.aggregator.outbox import Outbox
from fiomon.bins import BinLayout
from fiomon.model import LatencyKind
from fiomon.partials import decode
from tests.clock import T0

LAY = BinLayout()
Q = 1000


def test_dropping_the_oldest_counts_drops_not_sends_and_a_late_ack_never_moves_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = Outbox(tmp_path, "c1", 1 << 20, lambda k, t: None)
    box.add(LAY, T0, [])
    in_flight = box.peek()  # the publisher took the first message; its PUBACK is pending
    assert in_flight is not None
    one = in_flight[0]  # every marker-only message has the same size
    # The root's broker is gone for long: the backlog passes the cap, the oldest go.
    monkeypatch.setattr(outbox_mod, "MAX_BACKLOG_BYTES", 4 * one)
    for k in range(1, 5):
        box.add(LAY, T0 + k * Q, [])
    assert (box.sent, box.dropped) == (0, 3)
    assert box.backlog_bytes == 2 * one
    box.ack(in_flight[0])  # the PUBACK of a message dropped meanwhile: no resend
    assert box.sent == 0
    rest = []
    while (nxt := box.peek()) is not None:
        rest.append(decode(nxt[1]).closed_through_ms)
        box.ack(nxt[0])
    assert rest == [T0 + 3 * Q, T0 + 4 * Q]
    assert (box.sent, box.dropped, box.backlog_bytes) == (2, 3, 0)
    box.close()


# -- the root's acknowledgement (issue 24) ----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _box(tmp_path: Path, clock: Clock | None = None) -> Outbox:
    return Outbox(tmp_path, "c1", 1 << 20, lambda k, t: None, clock=clock or Clock())


def _send_all(box: Outbox) -> list[int]:
    """Publish everything the outbox offers (every PUBACK comes); the numbers sent."""
    seqs = []
    while (nxt := box.peek()) is not None:
        seqs.append(decode(nxt[1]).seq)
        box.ack(nxt[0])
    return seqs


def test_once_the_root_acknowledges_only_its_word_trims_and_a_restart_resends_the_rest(
    tmp_path: Path,
) -> None:
    box = _box(tmp_path)
    for k in range(3):
        box.add(LAY, T0 + k * Q, [])
    assert _send_all(box) == [0, 1, 2]
    assert box.backlog_messages == 0  # no root has spoken: the broker's PUBACK trims
    box.root_ack(3, None)  # a root that acknowledges: from now on only its word trims
    assert box.root_acks
    for k in range(3, 6):
        box.add(LAY, T0 + k * Q, [])
    assert _send_all(box) == [3, 4, 5]
    assert (box.backlog_messages, box.sent) == (3, 6)
    box.root_ack(4, None)
    assert box.backlog_messages == 2
    box.close()
    assert (tmp_path / "partials.acked").read_text().split()[1:] == ["4", "root"]
    again = _box(tmp_path)  # a restart resends what the root has not acknowledged
    assert again.root_acks
    assert _send_all(again) == [4, 5]
    again.close()


def test_a_gap_rewinds_once_and_the_resends_are_counted(tmp_path: Path) -> None:
    box = _box(tmp_path)
    box.add(LAY, T0, [])
    _send_all(box)
    box.root_ack(1, None)
    for k in range(1, 5):
        box.add(LAY, T0 + k * Q, [])
    assert _send_all(box) == [1, 2, 3, 4]
    box.root_ack(2, (2, 2))  # the root has 1 and 3.., misses 2
    assert _send_all(box) == [2, 3, 4]
    assert (box.sent, box.resent, box.rewinds) == (5, 3, 1)
    box.root_ack(2, (2, 2))  # the same gap again, before the resends arrived: no storm
    assert _send_all(box) == []
    box.root_ack(5, None)
    assert box.backlog_messages == 0
    box.close()


def test_no_progress_after_sending_resends_at_doubling_delays(tmp_path: Path) -> None:
    clock = Clock()
    box = _box(tmp_path, clock)
    box.add(LAY, T0, [])
    _send_all(box)
    box.root_ack(1, None)
    clock.t += 100  # idle: nothing outstanding, nothing to resend
    box.check()
    assert box.rewinds == 0
    box.add(LAY, T0 + Q, [])
    assert _send_all(box) == [1]  # the root's broker takes it and loses it
    clock.t += outbox_mod.RESEND_FIRST_S - 0.1
    box.check()
    assert _send_all(box) == []
    clock.t += 0.1
    box.check()
    assert _send_all(box) == [1]
    clock.t += outbox_mod.RESEND_FIRST_S
    box.check()
    assert _send_all(box) == []  # now 6 s
    clock.t += outbox_mod.RESEND_FIRST_S
    box.check()
    assert _send_all(box) == [1]
    box.root_ack(2, None)  # progress: back to 3 s
    box.add(LAY, T0 + 2 * Q, [])
    assert _send_all(box) == [2]
    clock.t += outbox_mod.RESEND_FIRST_S
    box.check()
    assert _send_all(box) == [2]
    box.close()


def test_a_reconnection_rewinds_and_a_puback_of_a_rewound_message_is_ignored(
    tmp_path: Path,
) -> None:
    box = _box(tmp_path)
    box.add(LAY, T0, [])
    _send_all(box)
    box.root_ack(1, None)
    box.add(LAY, T0 + Q, [])
    box.add(LAY, T0 + 2 * Q, [])
    first = box.peek()
    assert first is not None
    box.ack(first[0])
    in_flight = box.peek()  # message 2's publish is on its way when the connection ends
    assert in_flight is not None
    box.rewind()  # the next connection starts from the root's word
    box.ack(in_flight[0])  # a late PUBACK must not skip message 1's resend
    assert _send_all(box) == [1, 2]
    box.close()


def test_an_acknowledgement_beyond_our_numbers_is_ignored_and_pubacks_trim(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    box = _box(tmp_path)
    box.add(LAY, T0, [])
    _send_all(box)
    box.root_ack(1, None)
    box.add(LAY, T0 + Q, [])
    with caplog.at_level(logging.WARNING, "fiomon.aggregator"):
        box.root_ack(500, None)  # another cell's, or ours before our state was lost
        box.root_ack(501, None)
    assert caplog.text.count("numbered only 2") == 1
    assert (box.broker_trims, box.root_acks) == (True, True)
    assert _send_all(box) == [1]
    assert box.backlog_messages == 0  # the PUBACK trimmed it: the outbox stays bounded
    box.add(LAY, T0 + 2 * Q, [])
    box.root_ack(2, None)  # sensible again: the root's word trims
    assert not box.broker_trims
    assert _send_all(box) == [2]
    assert box.backlog_messages == 1
    box.close()


def test_the_window_and_the_backlog_bound_count_what_the_root_has_not_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = _box(tmp_path)
    box.add(LAY, T0, [])
    nxt = box.peek()
    assert nxt is not None
    one = nxt[0]
    _send_all(box)
    box.root_ack(1, None)
    monkeypatch.setattr(outbox_mod, "WINDOW_BYTES", 2 * one)
    for k in range(1, 5):
        box.add(LAY, T0 + k * Q, [])
    assert _send_all(box) == [1, 2]  # two ahead of the root's word, then it waits
    box.root_ack(2, None)
    assert _send_all(box) == [3]
    monkeypatch.setattr(outbox_mod, "MAX_BACKLOG_BYTES", 4 * one)
    box.add(LAY, T0 + 5 * Q, [])  # 2..5 wait for the root: 4 messages, the bound
    assert box.dropped == 0
    box.add(LAY, T0 + 6 * Q, [])  # over it: the oldest go until half is left
    assert (box.dropped, box.backlog_messages) == (3, 2)
    assert _send_all(box) == [5, 6]
    box.close()


def test_everything_acknowledged_by_the_root_empties_a_large_outbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_mod, "COMPACT_BYTES", 1)
    box = _box(tmp_path)
    box.add(LAY, T0, [])
    _send_all(box)
    box.root_ack(1, None)
    box.add(LAY, T0 + Q, [])
    _send_all(box)
    assert box.path.stat().st_size > 0  # sent, not acknowledged by the root: kept
    box.root_ack(2, None)
    assert box.path.stat().st_size == 0
    box.add(LAY, T0 + 2 * Q, [])
    assert _send_all(box) == [2]
    box.close()


@pytest.mark.parametrize(
    ("payload", "want"),
    [
        (b'{"next_seq": 5, "at_ms": 1}', (5, None)),
        (b'{"next_seq": 5, "at_ms": 1, "gap": [5, 7]}', (5, (5, 7))),
        (b'{"next_seq": 5, "gap": [4, 7]}', None),  # a gap below next_seq
        (b'{"next_seq": -1}', None),
        (b'{"next_seq": "5"}', None),
        (b"[]", None),
        (b"", None),
        (b"\xff", None),
    ],
)
def test_acknowledgements_are_parsed_strictly(
    payload: bytes, want: tuple[int, tuple[int, int] | None] | None
) -> None:
    assert outbox_mod.parse_ack(payload) == want


def test_a_cells_messages_carry_its_latency_kind(tmp_path: Path) -> None:
    # Issue 27: the root merges only its own kind, so every partials message says the
    # cell's (the aggregator's `latency`); a cell without it says clat, as before.
    kinds: tuple[LatencyKind, ...] = ("lat", "clat")
    for kind in kinds:
        (tmp_path / kind).mkdir()
        box = Outbox(tmp_path / kind, "c1", 1 << 20, lambda k, t: None, latency=kind)
        box.add(LAY, T0, [])
        nxt = box.peek()
        assert nxt is not None
        assert decode(nxt[1]).latency == kind
        box.close()
