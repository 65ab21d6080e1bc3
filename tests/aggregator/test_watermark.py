"""Watermark: how far quanta may close, from the streams' reports and the clock."""

from __future__ import annotations

from fiomon.aggregator.watermark import Watermark
from tests.clock import T0


def test_watermark_early_close_live_streams_and_lateness() -> None:
    # time (s)   0    1    2    3 ...      lateness 5 s
    # stream a   |----a ends 12 s
    # stream b   |----b ends 10 s, then silent
    w = Watermark(lateness_ms=5000)
    w.observe("h1", "a", T0 + 12_000, now_ms=T0)
    w.observe("h2", "b", T0 + 10_000, now_ms=T0)
    assert w.close_through(T0) == T0 - 5000  # warm-up: only the clock bound
    w.observe("h1", "a", T0 + 13_000, now_ms=T0 + 5000)
    w.observe("h2", "b", T0 + 11_000, now_ms=T0 + 5000)
    assert w.close_through(T0 + 5000) == T0 + 11_000  # both reported past 11 s
    w.set_online("h2", online=False)  # b's agent went offline: a alone decides
    assert w.close_through(T0 + 5000) == T0 + 13_000
    w.set_online("h2", online=True)
    w.observe("h1", "a", T0 + 20_000, now_ms=T0 + 11_000)
    # b has been silent 6 s (> idle = lateness): it no longer holds quanta open.
    assert w.close_through(T0 + 11_000) == T0 + 20_000
    assert w.close_through(T0 + 1000) == T0 + 20_000  # never moves back


def test_a_stream_has_reported_only_as_far_as_its_slowest_part() -> None:
    # A hist log's write records are stamped ~7 ms after its reads; the next write record
    # starts where the last one ended, so the stream has reported up to that, not further.
    w = Watermark(lateness_ms=5000, warmup_ms=0)
    w.observe("h", "s", T0 + 1007, T0, {("j", 0): T0 + 1000, ("j", 1): T0 + 1007})
    w.observe("h", "s", T0 + 2000, T0 + 100, {("j", 0): T0 + 2000})  # the read came first
    assert w.close_through(T0 + 100) == T0 + 1007
    w.observe("h", "s", T0 + 2007, T0 + 200, {("j", 1): T0 + 2007})
    assert w.close_through(T0 + 200) == T0 + 2000


def test_silent_names_the_hosts_expected_in_a_quantum_that_sent_nothing_for_it() -> None:
    # h1 reports every second through 20 s; h2 through 7 s, then nothing; h3 starts at 12 s.
    w = Watermark(lateness_ms=5000)
    for s in range(1, 21):
        w.observe("h1", "a", T0 + 1000 * s, now_ms=T0 + 1000 * s)
        if s <= 7:
            w.observe("h2", "b", T0 + 1000 * s, now_ms=T0 + 1000 * s)
        if s >= 12:
            w.observe("h3", "c", T0 + 1000 * s, now_ms=T0 + 1000 * s)
    quanta = [(T0 + 1000 * (s - 1), T0 + 1000 * s) for s in range(1, 21)]
    silent = dict(zip(range(1, 21), w.silent(quanta), strict=True))
    # h2 is expected (reported within idle = 5 s before the quantum's start) in the
    # quanta starting at 7..11 s; h3 before its first record is not known at all.
    assert {s for s, hosts in silent.items() if hosts} == {8, 9, 10, 11, 12}
    assert all(silent[s] == ("h2",) for s in (8, 9, 10, 11, 12))
    # The quantum h2's last record ends in is not marked (it holds part of h2), nor the
    # quantum past everyone's progress (the input as a whole stopped).
    assert w.silent([(T0 + 20_000, T0 + 21_000)]) == [()]
    # An agent that said offline (a clean stop) is not expected.
    w.set_online("h2", online=False)
    assert w.silent(quanta) == [()] * 20


def test_a_broker_outage_is_not_the_hosts_silence() -> None:
    """Cut from the broker for 20 s, the aggregator hears nobody; when h1's spooled records
    come, h2's do not. h2 was last heard before the outage: it stays expected until it has
    been silent ``idle_ms`` of *connected* time, so the quanta closed without it say so
    (before, a host last heard more than ``idle_ms`` ago was taken as gone: unmarked)."""
    w = Watermark(lateness_ms=5000)
    for s in range(1, 11):
        w.observe("h1", "a", T0 + 1000 * s, now_ms=T0 + 1000 * s)
        w.observe("h2", "b", T0 + 1000 * s, now_ms=T0 + 1000 * s)
    w.disconnected(T0 + 10_500)
    w.connected(T0 + 30_000)
    for s in range(11, 41):  # h1's spool, then live again; h2 never comes back
        w.observe("h1", "a", T0 + 1000 * s, now_ms=max(T0 + 30_000, T0 + 1000 * s))
    quanta = [(T0 + 1000 * (s - 1), T0 + 1000 * s) for s in range(12, 41)]
    marked = {end for (_, end), hosts in zip(quanta, w.silent(quanta), strict=True) if hosts}
    # Silent since 10 s: 0.5 s of it connected before the outage, then connected from 30 s:
    # expected in quanta starting up to 30 s + 4.5 s.
    assert marked == {T0 + 1000 * s for s in range(12, 36)}
