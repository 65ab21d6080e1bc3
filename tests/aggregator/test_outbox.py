"""A cell's partials outbox: what it counts as sent, dropped, and where it resends from."""

from __future__ import annotations

from pathlib import Path

import pytest

import fiomon.aggregator.outbox as outbox_mod
from fiomon.aggregator.outbox import Outbox
from fiomon.bins import BinLayout
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
