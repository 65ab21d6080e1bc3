"""The aggregator core under faults, on a fake clock: lost, garbled or torn state never
publishes a quantum twice, and is reported with what was lost; hostile payloads are
counted; counters add up."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fiomon.aggregator.merger import AggregatorCore
from fiomon.bins import BinLayout
from fiomon.config import AggregatorConfig, SlaRule
from fiomon.errors import StateLockedError
from fiomon.model import RecordBatch, StreamInfo
from fiomon.server.alerts import AlertState, Phase
from fiomon.wire import encode
from tests.batches import batch
from tests.clock import T0, FakeClock

HOSTS = ("h1", "h2", "h3")
SECONDS = 24
CRASH_AT = 12  # the first run receives the records of seconds 1..12


def records(host: int, s: int) -> RecordBatch:
    """Second ``s`` of one host: a read and a write record, counts varying by second."""
    start, end = T0 + 1000 * (s - 1), T0 + 1000 * s
    recs = [
        (start, end, 0, {700 + host: 10 + s, 720 + s % 5: 3 + host}),
        (start, end, 1, {650: 7, 800 + host: 1 + s % 3}),
    ]
    return batch(recs, "", "run.json:0:job0", nbytes=4096 * 50)


def message(host: int, s: int) -> tuple[str, bytes]:
    name = HOSTS[host]
    return name, encode(name, "run.json@1", 2 * (s - 1), records(host, s))


def config(tmp: Path, **kw: object) -> AggregatorConfig:
    return AggregatorConfig(
        align="epoch",
        lateness_ms=5000,
        quanta_file=tmp / "quanta.jsonl",
        state_dir=tmp / "state",
        **kw,  # type: ignore[arg-type]
    )


def feed(core: AggregatorCore, clock: FakeClock[int], seconds: range) -> None:
    """Each second's records arrive 300 ms after they end; ticks every 250 ms."""
    for s in seconds:
        clock.t = T0 + 1000 * s + 300
        core.receive([message(h, s) for h in range(len(HOSTS))])
        for _ in range(4):
            core.tick()
            clock.t += 175


def finish(core: AggregatorCore) -> None:
    core.flush()
    core.close()


def crash(core: AggregatorCore) -> None:
    """What kill -9 leaves: the page cache has every write; nothing else happens."""
    assert core.state.writer is not None
    core.state.writer.close()  # what was handed to the disk is on it
    assert core.state.journal is not None
    core.state.journal.close()
    assert core.state.lock is not None
    core.state.lock.release()  # the kernel drops the dead process's lock


def rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def key(r: dict[str, object]) -> tuple[object, ...]:
    return (r["end_ms"], r["scope"], r["host"] or "", r["direction"])


@pytest.fixture
def reference(tmp_path: Path) -> dict[tuple[object, ...], dict[str, object]]:
    """The quanta of one run without faults."""
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path / "ref"), now_ms=clock)
    core.restore()
    feed(core, clock, range(1, SECONDS + 1))
    finish(core)
    out = {key(r): r for r in rows(tmp_path / "ref" / "quanta.jsonl")}
    assert len({k[0] for k in out}) == SECONDS
    return out


def first_run(tmp: Path, *, confirm: bool = True) -> tuple[AggregatorCore, FakeClock[int]]:
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp), now_ms=clock)
    core.restore()
    if not confirm:
        # The crash comes between writing the last quantum and confirming it: the
        # journal still holds its records (they are released only after confirmation).
        assert core.state.journal is not None
        core.state.journal.release = lambda closed_ms: None  # type: ignore[method-assign]
    feed(core, clock, range(1, CRASH_AT))
    clock.t += 300
    # The last batch is journaled (and would now be acknowledged); the crash comes before
    # anything else happens.
    core.receive([message(h, CRASH_AT) for h in range(len(HOSTS))])
    crash(core)
    return core, clock


def second_run(
    tmp: Path, clock: FakeClock[int], redeliver: list[tuple[str, bytes]] | None = None
) -> AggregatorCore:
    core = AggregatorCore(config(tmp), now_ms=clock)
    core.restore()
    if redeliver:
        core.receive(redeliver)
    feed(core, clock, range(CRASH_AT + 1, SECONDS + 1))
    finish(core)
    return core


def assert_exact(tmp: Path, reference: dict[tuple[object, ...], dict[str, object]]) -> None:
    got = rows(tmp / "quanta.jsonl")
    keys = [key(r) for r in got]
    assert len(keys) == len(set(keys)), "a row was written twice"
    assert {key(r): r for r in got} == reference


@pytest.mark.parametrize("damage", ["deleted", "garbled"])
def test_a_lost_or_garbled_state_file_publishes_nothing_twice_and_says_so(
    tmp_path: Path,
    reference: dict[tuple[object, ...], dict[str, object]],
    damage: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # state.json tells how far the quanta file is confirmed; without it the journal
    # re-forms quanta that were already written. The quanta file says which.
    _, clock = first_run(tmp_path)
    written = len(rows(tmp_path / "quanta.jsonl"))
    assert written, "quanta closed before the crash"
    state = tmp_path / "state" / "state.json"
    if damage == "deleted":
        state.unlink()
    else:
        state.write_text('{"quantum_ms": 1000, "layout": [29')
    with caplog.at_level(logging.ERROR, "fiomon.aggregator"):
        core = second_run(tmp_path, clock)
    assert_exact(tmp_path, reference)
    errors = {k: v for k, v in core.counts.state_errors.items() if v}
    assert errors == (
        {"state-lost": 1}
        if damage == "deleted"
        else {
            "state-unreadable": 1,
            "state-lost": 1,
        }
    )
    assert "taken as published" in caplog.text


def test_a_torn_journal_record_is_reported_and_its_redelivery_completes_the_quanta(
    tmp_path: Path,
    reference: dict[tuple[object, ...], dict[str, object]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # kill -9 while the last batch was being journaled: its messages were never
    # acknowledged, so the broker redelivers them; the torn bytes are reported.
    _, clock = first_run(tmp_path)
    (segment,) = sorted((tmp_path / "state" / "journal").glob("journal-*.jnl"))
    data = segment.read_bytes()
    last_host, last_payload = message(len(HOSTS) - 1, CRASH_AT)
    assert data.endswith(last_payload)
    segment.write_bytes(data[: len(data) - len(last_payload) // 2])
    with caplog.at_level(logging.ERROR, "fiomon.aggregator"):
        core = second_run(tmp_path, clock, redeliver=[(last_host, last_payload)])
    assert_exact(tmp_path, reference)
    assert core.counts.state_errors["journal-torn"] == 1
    assert (
        f"h3 stream run.json@1, seqs {2 * CRASH_AT - 2}..{2 * CRASH_AT - 1} (2 records)"
        in caplog.text
    )
    assert "redelivers" in caplog.text


def test_a_corrupt_journal_record_is_counted_with_what_it_held(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A complete record whose bytes changed (the disk, a person): its records were
    # acknowledged and are lost; that is said, with the stream and seqs, and counted.
    _, clock = first_run(tmp_path)
    (segment,) = sorted((tmp_path / "state" / "journal").glob("journal-*.jnl"))
    data = bytearray(segment.read_bytes())
    _, payload = message(0, CRASH_AT)
    at = data.rfind(payload)
    data[at + len(payload) - 3] ^= 0xFF  # a count of h1's last message
    segment.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, "fiomon.aggregator"):
        core = second_run(tmp_path, clock)
    assert core.counts.state_errors["journal-corrupt"] == 1
    assert "corrupt (bad CRC)" in caplog.text
    assert f"h1 stream run.json@1, seqs {2 * CRASH_AT - 2}..{2 * CRASH_AT - 1}" in caplog.text
    assert "those records are lost" in caplog.text
    keys = [key(r) for r in rows(tmp_path / "quanta.jsonl")]
    assert len(keys) == len(set(keys))


def test_a_quantum_cut_short_by_the_crash_gets_its_missing_rows_and_no_row_twice(
    tmp_path: Path,
    reference: dict[tuple[object, ...], dict[str, object]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The crash came while the quanta file was being written: the last quantum has some
    # of its rows and a torn line, and state.json was not updated after it.
    _, clock = first_run(tmp_path, confirm=False)
    qf = tmp_path / "quanta.jsonl"
    text = qf.read_text()
    lines = text.splitlines(keepends=True)
    last_end = json.loads(lines[-1])["end_ms"]
    first_of_last = next(i for i, ln in enumerate(lines) if json.loads(ln)["end_ms"] == last_end)
    kept = lines[: first_of_last + 2]
    qf.write_text("".join(kept) + lines[first_of_last + 2][:25])  # two rows and a torn one
    state = tmp_path / "state" / "state.json"
    doc = json.loads(state.read_text())
    doc["closed_ms"] = last_end - 1000
    state.write_text(json.dumps(doc))
    with caplog.at_level(logging.INFO, "fiomon.aggregator"):
        core = second_run(tmp_path, clock)
    assert_exact(tmp_path, reference)
    assert core.counts.state_errors["quanta-file-torn"] == 1
    assert "may be incomplete" in caplog.text


def test_a_second_aggregator_on_the_same_state_directory_is_refused(tmp_path: Path) -> None:
    first = AggregatorCore(config(tmp_path))
    first.restore()
    second = AggregatorCore(config(tmp_path))
    with pytest.raises(StateLockedError, match="another aggregator"):
        second.restore()
    first.close()
    second = AggregatorCore(config(tmp_path))
    second.restore()  # once the first is gone
    second.close()


def test_hostile_status_payloads_are_counted_and_change_nothing() -> None:
    clock = FakeClock(T0)
    core = AggregatorCore(AggregatorConfig(align="epoch"), now_ms=clock)
    core.on_status("h1", b"[" * 100_000)  # the payload: over the size limit
    core.on_status("h1", b"[" * 50_000)  # under it: json's RecursionError is caught
    core.on_status("h1", b"\xff\xfe garbage")
    core.on_status("h1", b'{"state": 5}')
    core.on_status("h1", b'"online"')
    core.on_status("h1", b"{" + b" " * 70_000 + b"}")  # over the size limit: not parsed
    assert dict(core.counts.invalid) == {"status": 4, "status-oversized": 2}
    assert core.hosts_up() == 0
    core.on_records(*message(0, 1))
    assert core.counts.records["received"] == 2


def test_hosts_up_counts_hosts_that_send_or_hold_a_fresh_status() -> None:
    clock = FakeClock(T0 + 100_000)
    core = AggregatorCore(AggregatorConfig(align="epoch", host_timeout_ms=30_000), now_ms=clock)
    online = {"state": "online", "instance": "x"}
    # A retained "online" left by an agent that died long ago: not up.
    core.on_status("dead", json.dumps({**online, "time_ms": T0}).encode(), retained=True)
    core.on_status("fresh", json.dumps({**online, "time_ms": T0 + 95_000}).encode(), retained=True)
    core.on_status("live", json.dumps(online).encode())  # delivered live: up now
    core.on_records(*message(0, 1))  # h1 sends records
    assert core.hosts_up() == 3
    core.on_status("live", json.dumps({"state": "offline"}).encode())
    assert core.hosts_up() == 2
    clock.t += 31_000
    assert core.hosts_up() == 0
    snap = core.refresh_snapshot() and core.snapshot
    assert snap and snap.gauges[next(k for k in snap.gauges if k[0] == "fiomon_hosts_up")] == {
        (): 0.0
    }


def test_late_records_of_hosts_over_the_cap_add_up_under_other() -> None:
    clock = FakeClock(T0 + 60_000)
    # No revision horizon: the records stay late (merged ones are counted apart).
    cfg = AggregatorConfig(align="epoch", max_hosts=2, revise_within_ms=0)
    core = AggregatorCore(cfg, now_ms=clock)
    for h in range(5):
        name = f"x{h}"
        core.on_records(name, encode(name, "s@1", 0, records(0, 50)))
    clock.t += 5001  # no more records: the wall clock closes the quantum ending at T0 + 50 s
    core.tick()
    for h in range(5):  # one late record pair from each host
        name = f"x{h}"
        core.on_records(name, encode(name, "s@1", 2, records(0, 50)))
    core.refresh_snapshot()
    late = core.snapshot.counters[
        next(k for k in core.snapshot.counters if k[0] == "fiomon_late_records")
    ]
    assert late == {("x0",): 2.0, ("x1",): 2.0, ("_other",): 6.0}


def test_reload_keeps_unchanged_rules_and_refuses_uncomputed_percentiles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = SlaRule("a", "read", 99.0, 5e6, for_quanta=1, min_samples=1)
    b = SlaRule("b", "write", 99.0, 5e6, for_quanta=1, min_samples=1)
    core = AggregatorCore(AggregatorConfig(align="epoch", sla=(a, b)))
    core.publisher.alerts.states[("a", None)] = (
        core.publisher.alerts.states.get(("a", None)) or _firing()
    )
    core.publisher.alerts.states[("b", None)] = _firing()
    changed_b = SlaRule("b", "write", 99.0, 9e6, for_quanta=1, min_samples=1)
    done = core.reload(AggregatorConfig(align="epoch", sla=(a, changed_b), log_level="debug"))
    assert "sla rules: 1 kept; changed b" in done[0]
    assert ("a", None) in core.publisher.alerts.states and (
        "b",
        None,
    ) not in core.publisher.alerts.states
    assert core.cfg.log_level == "debug"
    bad = SlaRule("c", "read", 95.0, 5e6)
    with caplog.at_level(logging.ERROR):
        core.reload(AggregatorConfig(align="epoch", sla=(bad,)))
    assert core.cfg.sla == (a, changed_b)
    assert "need percentiles that are not computed" in caplog.text


def _firing() -> AlertState:
    return AlertState(Phase.FIRING, 1, 0, 6e6, T0, T0)


@pytest.mark.parametrize(
    ("webhook", "problem"),
    [
        ({"url": "alertmanager:9093"}, "webhook.url: expected an http:// or https:// URL"),
        ({"url": "ftp://am:9093"}, "webhook.url: expected an http:// or https:// URL"),
        ({"url": "http://:9093"}, "webhook.url: expected an http:// or https:// URL"),
        ({"url": "http://am:99999"}, "webhook.url: bad port"),
        ({"url": "http://am", "timeout": "10m"}, "webhook.timeout: must be at most 30000 ms"),
        ({"url": "http://am", "timeout": "50ms"}, "webhook.timeout: must be at least 100 ms"),
        ({"url": "http://am", "timeout": "5s", "resend": "5s"}, "must be longer than"),
    ],
)
def test_check_config_refuses_a_webhook_that_could_hang_or_go_nowhere(
    webhook: dict[str, str], problem: str
) -> None:
    from fiomon.config import aggregator_config_from  # noqa: PLC0415
    from fiomon.errors import ConfigError  # noqa: PLC0415

    with pytest.raises(ConfigError) as err:
        aggregator_config_from({"webhook": webhook})
    assert any(problem in p for p in err.value.problems), err.value.problems
    ok = aggregator_config_from({"webhook": {"url": "https://am.example:9093/", "timeout": "2s"}})
    assert ok.webhook is not None and ok.webhook.timeout_ms == 2000


def test_a_graceful_stop_right_after_receiving_keeps_what_it_received(
    tmp_path: Path, reference: dict[tuple[object, ...], dict[str, object]]
) -> None:
    # SIGTERM lands between receiving (journaled, acknowledged) and the next tick: the
    # stop closes nothing early and releases nothing the next start still needs.
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    feed(core, clock, range(1, CRASH_AT))
    clock.t += 300
    core.receive([message(h, CRASH_AT) for h in range(len(HOSTS))])
    core.close()
    again = second_run(tmp_path, clock)
    assert again.counts.records["replayed"] >= 2 * len(HOSTS)
    assert_exact(tmp_path, reference)


def test_when_intake_lags_quanta_wait_for_their_records_instead_of_all_turning_late() -> None:
    # A CPU-starved aggregator (or a backlog after an outage) receives records 8 s after
    # their end, steadily: with the lateness of 5 s counted on the wall clock every record
    # would be late. Counted from the newest record received, quanta wait and are whole.
    clock = FakeClock(T0)
    core = AggregatorCore(AggregatorConfig(align="epoch", lateness_ms=5000), now_ms=clock)
    for s in range(1, 30):
        clock.t = T0 + 1000 * s + 8000
        core.on_records(*message(0, s))
        core.tick()
    assert core.engine is not None
    assert sum(core.engine.late_records.values()) == 0
    assert core.counts.quanta_closed >= 20
    clock.t += 5001  # the records stop: after the lateness the wall clock closes the rest
    core.tick()
    assert core.counts.quanta_closed == 29


def test_the_clock_bound_holds_while_disconnected_and_for_lateness_after() -> None:
    # time (s)   0 ... 10        20   23    25   26
    # broker     connected | down  ...  | up again
    # clock bound: now - 5 s, frozen at 5 s while down and until 5 s after the reconnect
    from fiomon.aggregator.watermark import Watermark  # noqa: PLC0415

    w = Watermark(lateness_ms=5000)
    assert w.close_through(T0 + 10_000) == T0 + 5000
    w.disconnected(T0 + 10_000)
    assert w.close_through(T0 + 20_000) == T0 + 5000  # records may wait in the broker
    w.connected(T0 + 20_000)
    assert w.close_through(T0 + 23_000) == T0 + 5000  # they are being delivered now
    assert w.close_through(T0 + 25_000) == T0 + 20_000  # lateness after the reconnect
    w.hold(T0 + 19_000)  # a start holds at what the previous run published
    assert w.close_through(T0 + 30_000) == T0 + 20_000  # never back
    w.connected(T0 + 30_000)
    assert w.close_through(T0 + 35_000) == T0 + 30_000


def test_open_quanta_are_bounded_by_memory_and_the_forced_closes_counted() -> None:
    from fiomon.engine import QuantumEngine  # noqa: PLC0415

    engine = QuantumEngine(
        layout=BinLayout(), quantum_ms=1000, per_host=True, max_hosts=100, max_open_rows=20
    )
    for s in range(1, 13):  # 3 hosts x 2 directions = 6 rows per quantum
        for h in range(3):
            b = records(h, s)
            engine.add(
                RecordBatch(
                    **{
                        **{f: getattr(b, f) for f in b.__dataclass_fields__},
                        "streams": (StreamInfo(f"x{h}", "job"),),
                    }
                )
            )
    assert len(engine._rows) <= 20  # the bound itself
    assert engine.forced_closes == 12 - 3
    rows = engine.close_through(T0 + 100_000)
    assert {r.end_ms for r in rows} == {T0 + 1000 * s for s in range(1, 13)}, "none lost"


def _lagging_run(tmp: Path, clock: FakeClock[int], *, lag_ms: int) -> None:
    """A first run whose intake lags ``lag_ms`` behind the records, stopped by SIGTERM
    after second CRASH_AT: the journal holds the quanta still open."""
    core = AggregatorCore(config(tmp), now_ms=clock)
    # Only the clock bound closes quanta in this run (no early closing): quanta 11 and 12
    # are open at the stop whatever the timing. With early closing every quantum could
    # close and be confirmed, and what the journal still held at the stop depended on how
    # fast the quanta file's writer thread confirmed it (in CI under load: nothing, or
    # only some hosts).
    core.watermark.warmup_ms = 1 << 40
    core.restore()
    for s in range(1, CRASH_AT + 1):
        clock.t = T0 + 1000 * s + lag_ms
        core.receive([message(h, s) for h in range(len(HOSTS))])
        for _ in range(4):
            core.tick()
            clock.t += 200
    core.close()


def _backlog(core: AggregatorCore, clock: FakeClock[int], seconds: range) -> None:
    """The broker's backlog after a restart: one message at a time, host by host, 50 ms
    apart (or when it is published), a tick after each, as a lagging intake meets them."""
    for s in seconds:
        for h in range(len(HOSTS)):
            clock.t = max(clock.t + 50, T0 + 1000 * s + 300)
            core.receive([message(h, s)])
            core.tick()


def test_a_slow_restart_does_not_close_quanta_on_the_first_hosts_that_arrive(
    tmp_path: Path, reference: dict[tuple[object, ...], dict[str, object]]
) -> None:
    # time (s)  1 ........ 12 | stop  | start: the journal re-forms 9..12 | +7 s: the
    #           (intake 3 s behind)     (re-forming and reconnecting took 7 s)   backlog
    # backlog   h1@13 h2@13 h3@13 h1@14 ...
    # The restart met h2 and h3 only in the journal, 7 s ago on the wall clock. Judged by
    # the wall clock alone h1 was then the only live stream, so h1's record of second 13
    # closed quantum 13 without h2 and h3 (their records late): what the restart benchmark
    # found after slow restarts under load. In event time h2 and h3 are as far as h1 was.
    clock = FakeClock(T0)
    _lagging_run(tmp_path, clock, lag_ms=3000)
    clock.t += 200
    again = AggregatorCore(config(tmp_path), now_ms=clock)
    again.restore()
    assert again.replayed > 0, "the journal held open quanta"
    clock.t += 7000
    again.watermark.hold(again.published_ms or clock.t)  # what run_aggregator does
    again.watermark.connected(clock.t)
    _backlog(again, clock, range(CRASH_AT + 1, SECONDS + 1))
    finish(again)
    assert again.engine is not None
    assert sum(again.engine.late_records.values()) == 0
    assert_exact(tmp_path, reference)


def test_a_stall_of_our_own_is_not_input_silence(
    tmp_path: Path, reference: dict[tuple[object, ...], dict[str, object]]
) -> None:
    # time (s)  1 ........ 12 | 12.3 .. 19.3 the process stalls (CPU starvation, a pause,
    #           intake 3 s behind  a long step): nothing is read | then the backlog
    # A 7 s stall is longer than the lateness; taken as input silence, the next tick
    # would close everything up to now - 5 s while those records wait in the socket.
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    for s in range(1, CRASH_AT + 1):
        clock.t = T0 + 1000 * s + 3000
        core.receive([message(h, s) for h in range(len(HOSTS))])
        for _ in range(4):
            core.tick()
            clock.t += 200
    clock.t += 7000
    core.watermark.stalled(7000 - 250)  # what the service's close loop credits
    core.tick()  # the first tick after the stall runs before the socket is read
    _backlog(core, clock, range(CRASH_AT + 1, SECONDS + 1))
    finish(core)
    assert core.engine is not None
    assert sum(core.engine.late_records.values()) == 0
    assert_exact(tmp_path, reference)


def _confirmed_run(tmp: Path, clock: FakeClock[int]) -> None:
    """A first run that closed (early: every host reported) and confirmed every quantum
    through CRASH_AT, then died (kill -9) after a tick had released the journal: no
    record of any host is left to replay."""
    core = AggregatorCore(config(tmp), now_ms=clock)
    core.restore()
    feed(core, clock, range(1, CRASH_AT + 1))
    assert core.published_ms == T0 + 1000 * CRASH_AT, "every quantum closed early"
    assert core.state.writer is not None
    assert core.state.journal is not None
    core.state.writer.close()  # what was handed to the disk is on it
    assert core.state.writer.confirmed_ms == T0 + 1000 * CRASH_AT
    core.state.journal.release(core.state.writer.confirmed_ms)  # what the next tick would do
    crash(core)


def test_a_restart_waits_for_known_hosts_whose_records_all_lie_in_confirmed_quanta(
    tmp_path: Path, reference: dict[tuple[object, ...], dict[str, object]]
) -> None:
    # time (s)  1 ....... 12 | kill -9, restart | 13  14  15  16 | 17: h2, h3 back
    # run 1     all hosts, quanta 1..12 closed   h1 comes back    with their backlog
    #           and confirmed: journal empty     first, alone     (13..16 at once)
    # The restart knows h2 and h3 only from the saved state: with nothing of theirs in
    # the journal, h1 alone used to close 13..15 once warm, and h2's and h3's records of
    # 13..15 turned late. They hold quanta open exactly as they did before the stop.
    clock = FakeClock(T0)
    _confirmed_run(tmp_path, clock)
    clock.t += 500
    again = AggregatorCore(config(tmp_path), now_ms=clock)
    again.restore()
    assert again.replayed == 0, "the journal held nothing"
    again.watermark.hold(again.published_ms or clock.t)  # what run_aggregator does
    again.watermark.connected(clock.t)
    for s in range(CRASH_AT + 1, CRASH_AT + 5):
        clock.t = T0 + 1000 * s + 300
        again.receive([message(0, s)])
        for _ in range(4):
            again.tick()
            clock.t += 175
    assert again.published_ms == T0 + 1000 * CRASH_AT, "h2 and h3 hold quantum 13 open"
    again.receive([message(h, s) for s in range(CRASH_AT + 1, CRASH_AT + 5) for h in (1, 2)])
    again.tick()
    feed(again, clock, range(CRASH_AT + 5, SECONDS + 1))
    finish(again)
    assert again.engine is not None
    assert sum(again.engine.late_records.values()) == 0
    assert_exact(tmp_path, reference)


def test_known_streams_go_once_idle_in_event_time_and_old_state_files_still_load(
    tmp_path: Path,
) -> None:
    from fiomon.aggregator.watermark import KnownStreams, Watermark  # noqa: PLC0415
    from fiomon.server.journal import GridState  # noqa: PLC0415

    w = Watermark(lateness_ms=5000)
    for h, end in (("h1", 20_000), ("h2", 17_000), ("h3", 14_000)):
        w.observe(h, "s", T0 + end, T0 + 21_000)
    w.set_online("h2", False)
    known = w.known()
    assert known is not None
    # h3 is 6 s behind the newest end (idle), h2 offline: neither holds anything.
    assert known.streams == (("h1", "s", T0 + 20_000),)
    path = tmp_path / "state.json"
    GridState(1000, 0, (1, 1, "ns"), T0 + 19_000, known).save(path)
    grid, why = GridState.load(path, KnownStreams.from_json)
    assert why is None
    assert grid is not None
    assert grid.known == known
    assert json.loads(path.read_text()) == GridState(
        1000, 0, (1, 1, "ns"), None, known
    ).to_json() | {"closed_ms": T0 + 19_000}
    # The encoding of the known streams is reused for the same object only.
    later = KnownStreams(T0 + 30_000, (("h9", "s", T0 + 29_000),))
    GridState(1000, 0, (1, 1, "ns"), T0 + 19_000, later).save(path)
    grid, _ = GridState.load(path, KnownStreams.from_json)
    assert grid is not None and grid.known == later
    GridState(1000, 0, (1, 1, "ns"), T0 + 19_000, known).save(path)
    grid, _ = GridState.load(path, KnownStreams.from_json)
    assert grid is not None and grid.known == known
    doc = json.loads(path.read_text())
    del doc["known"]
    path.write_text(json.dumps(doc))  # a state file of an older version
    grid, why = GridState.load(path, KnownStreams.from_json)
    assert why is None
    assert grid is not None
    assert grid.known is None
    assert grid.closed_ms == T0 + 19_000
    doc["known"] = {"newest_end_ms": 5, "streams": [["h1", "s", -3]]}
    path.write_text(json.dumps(doc))
    grid, why = GridState.load(path, KnownStreams.from_json)
    assert grid is not None, "the grid is still good"
    assert grid.known is None
    assert why is not None
    assert "known streams" in why

    again = Watermark(lateness_ms=5000, warmup_ms=0)
    again.restore_known(known)
    again.observe("h9", "s", T0 + 22_000, T0 + 30_000)
    again.observe("h9", "s", T0 + 23_000, T0 + 30_100)
    assert again.close_through(T0 + 30_100) == T0 + 20_000, "h1 holds at its saved end"
    again.observe("h9", "s", T0 + 25_001, T0 + 30_200)
    assert again.close_through(T0 + 30_200) == T0 + 25_001, "h1 idle in event time"
    again.observe("h1", "s", T0 + 26_000, T0 + 30_300)
    now = again.known()
    assert now is not None
    assert {(a, s, e) for a, s, e in now.streams} == {
        ("h1", "s", T0 + 26_000),  # its own part replaced the saved one
        ("h9", "s", T0 + 25_001),
    }


def test_early_close_waits_for_a_host_that_announced_itself_and_has_not_sent_yet(
    tmp_path: Path, reference: dict[tuple[object, ...], dict[str, object]]
) -> None:
    # time (s)  0: h1, h2, h3 announce online | 1.3: h1's and h2's first records, then
    #           every second | 4.3: h3's first records (seconds 1..4: its fio started
    #           slowly), then every second
    # Warm at 3.3 s, h1 and h2 alone closed quanta 1..3 early: h3's records turned late
    # (the live kill -9 test's first quantum, seen in CI under load).
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    for h in HOSTS:
        core.on_status(h, json.dumps({"state": "online", "agent": h}).encode())
    for s in range(1, SECONDS + 1):
        clock.t = T0 + 1000 * s + 300
        msgs = [message(0, s), message(1, s)]
        if s >= 4:
            msgs += [message(2, x) for x in range(1 if s == 4 else s, s + 1)]
        core.receive(msgs)
        for _ in range(4):
            core.tick()
            clock.t += 175
    finish(core)
    assert core.engine is not None
    assert sum(core.engine.late_records.values()) == 0
    assert_exact(tmp_path, reference)


def test_a_host_announced_online_that_never_sends_holds_quanta_no_longer_than_lateness(
    tmp_path: Path,
) -> None:
    # time (s)  0: h3 announces online | 1.3 .. 24.3: h1's and h2's records every second
    #           h3 never sends: early closing waits one lateness after the first record
    #           (quanta 1..5 close on the clock), then goes on without h3
    clock = FakeClock(T0)
    core = AggregatorCore(config(tmp_path), now_ms=clock)
    core.restore()
    core.on_status("h3", json.dumps({"state": "online", "agent": "h3"}).encode())
    closed: dict[int, int] = {}
    for s in range(1, SECONDS + 1):
        clock.t = T0 + 1000 * s + 300
        core.receive([message(0, s), message(1, s)])
        for _ in range(4):
            for row in core.tick():  # each quantum's close delay: its end to its close
                closed.setdefault(row.end_ms, clock.t - row.end_ms)
            clock.t += 175
            assert core.watermark.close_through(clock.t) >= clock.t - 5000, "clock bound"
    delays = [closed[end] for end in sorted(closed)]
    assert len(delays) == SECONDS, "every quantum closed"
    assert delays[0] > 3000, "quantum 1 waited for h3"
    # (plus the longest gap between two ticks here: 475 ms)
    assert max(delays) <= 5000 + 475, "never held beyond the lateness"
    assert max(delays[-10:]) < 1000, "early closing resumes once the wait is over"
    finish(core)


def test_only_a_fresh_online_status_makes_early_closing_wait() -> None:
    clock = FakeClock(T0)
    core = AggregatorCore(AggregatorConfig(lateness_ms=5000), now_ms=clock)
    stale = {"state": "online", "agent": "h1", "time_ms": T0 - 31_000}  # host_timeout 30 s
    core.on_status("h1", json.dumps(stale).encode(), retained=True)
    assert core.watermark.waiting(clock.t) == 0
    fresh = {"state": "online", "agent": "h2", "time_ms": T0 - 9_000}  # a heartbeat ago
    core.on_status("h2", json.dumps(fresh).encode(), retained=True)
    core.on_status("h2", json.dumps(fresh).encode(), retained=True)  # heartbeats: once
    assert core.watermark.waiting(clock.t) == 1
    core.on_status("h2", json.dumps({"state": "offline", "agent": "h2"}).encode())
    assert core.watermark.waiting(clock.t) == 0, "offline: nothing to wait for"
    core.on_status("h2", json.dumps({"state": "online", "agent": "h2"}).encode())
    assert core.watermark.waiting(clock.t) == 1, "back online: waited for again"
    core.receive([message(1, 1)])
    core.tick()
    assert core.watermark.waiting(clock.t) == 0, "its first record ends the wait"


def test_forgotten_streams_leave_the_known_ones_intact() -> None:
    from fiomon.aggregator.watermark import KnownStreams, Watermark  # noqa: PLC0415

    w = Watermark(lateness_ms=1000)
    w.restore_known(KnownStreams(T0 + 1000, (("r", "run1", T0 + 1000),)))
    w.observe("a", "old", T0 + 1000, T0 + 1000)
    w.observe("b", "new", T0 + 1000, T0 + 1000)
    w.observe("b", "new", T0 + 30_000, T0 + 30_000)
    w.close_through(T0 + 30_000)  # silent for ten idle periods: "a", "r" are forgotten
    w.observe("c", "x", T0 + 30_500, T0 + 30_500)
    w.observe("b", "new", T0 + 30_600, T0 + 30_600)
    known = w.known()
    assert known is not None
    assert known.streams == (("b", "new", T0 + 30_600), ("c", "x", T0 + 30_500))


def test_a_run_after_an_idle_input_warms_up_again_before_closing_early() -> None:
    # time (s)  1..20: run 1, h1 and h2 every second | 20..36: nothing (idle: 2 x lateness)
    #           36.3: run 2, h1's first record (35, 36] | 38.3: h2's first records
    #           (35, 38]: its agent published late (seen live on loopback, the second run
    #           of two cells: two records of client-04 late at its cell)
    # Like the first run's, the second run's hosts start at different times: early
    # closing on h1 alone made h2's (35, 36] late.
    from fiomon.aggregator.watermark import Watermark  # noqa: PLC0415

    w = Watermark(lateness_ms=5000)
    for s in range(1, 21):
        for h in ("h1", "h2"):
            w.observe(h, "run1", T0 + 1000 * s, T0 + 1000 * s + 300)
        w.close_through(T0 + 1000 * s + 300)
    assert w.close_through(T0 + 20_300) == T0 + 20_000, "run 1 closed early (warm)"
    for t in range(36_300, 38_300, 100):
        if t % 1000 == 300:
            w.observe("h1", "run2", T0 + t - 300, T0 + t)
        assert w.close_through(T0 + t) <= T0 + 35_000, f"closed past h2's first record at {t}"
    w.observe("h2", "run2", T0 + 38_000, T0 + 38_300)
    assert w.close_through(T0 + 44_000) >= T0 + 38_000, "warm again: early closing resumes"
