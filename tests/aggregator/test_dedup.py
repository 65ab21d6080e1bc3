"""SeqTracker: each record new exactly once, gaps counted lost, late arrivals recovered."""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from fiomon.aggregator.dedup import SeqTracker


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.randoms(use_true_random=False), st.integers(0, 5))
def test_every_record_is_new_exactly_once_whatever_the_redelivery(
    total: int, rnd: random.Random, drops: int
) -> None:
    # Cut 0..total-1 into messages, deliver each once or more, out of order at times.
    cuts = (
        sorted(rnd.sample(range(1, total), min(total - 1, rnd.randint(0, 6)))) if total > 1 else []
    )
    bounds = [0, *cuts, total]
    msgs = [(a, b - a) for a, b in itertools.pairwise(bounds)]
    deliveries = msgs + [rnd.choice(msgs) for _ in range(drops)]
    tail = deliveries[1:]
    rnd.shuffle(tail)
    deliveries = deliveries[:1] + tail
    t = SeqTracker()
    seen: list[int] = []
    for first, n in deliveries:
        v = t.judge("a", "s", first, n)
        seen += [first + i for i in range(n) if v.new[i]]
    assert len(seen) == len(set(seen)), "no record is new twice"
    first = deliveries[0][0]
    # Everything from the first message's start on arrives, and once.
    assert set(range(first, total)) <= set(seen) | set(range(first))


def test_gap_is_counted_lost_and_late_arrival_recovered() -> None:
    t = SeqTracker()
    assert t.judge("a", "s", 0, 5).new.all()
    v = t.judge("a", "s", 8, 2)  # 5, 6, 7 skipped
    assert v.lost == 3 and v.new.all()
    v = t.judge("a", "s", 4, 4)  # 4 is a duplicate, 5-7 arrive late
    assert list(v.new) == [False, True, True, True]
    assert (v.duplicates, v.recovered) == (1, 3)
    assert t.judge("a", "s", 5, 3).duplicates == 3


def test_stream_cap_refuses_and_says_so() -> None:
    t = SeqTracker(max_streams=2)
    t.judge("a", "1", 0, 1)
    t.judge("a", "2", 0, 1)
    assert t.judge("a", "3", 0, 1).refused
