"""Following files through what fio and operators do to them: every record once.

Each test drives a :class:`Follower` over real files and counts the records it emits per
stream against what the files hold. Timelines use a fake clock; no sleeps.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fiomon.agent.follow import PACKET_OVERHEAD, RESCAN_S, Follower
from fiomon.agent.positions import FollowState, load_positions, save_positions
from fiomon.agent.spool import Outgoing
from fiomon.bins import plat_idx_to_val
from fiomon.tools.simulate import format_line
from fiomon.wire import decode
from tests.clock import T0, FakeClock


def line(i: int, direction: int = 0, value: int = 5) -> str:
    counts = np.zeros(1856, dtype=np.int64)
    counts[700 + i % 50] = value + i
    return format_line(T0 + 1000 * (i + 1), direction, 4096, counts)


def records(out: list[Outgoing]) -> list[tuple[str, int, int]]:
    """(stream, seq, end_ms) of every record in ``out``."""
    rows = []
    for m in out:
        msg = decode(m.payload)
        rows += [
            (msg.stream, int(s), int(e)) for s, e in zip(msg.seqs, msg.batch.end_ms, strict=True)
        ]
    return rows


def ends(out: list[Outgoing]) -> list[int]:
    return [e for _, _, e in records(out)]


_OPEN: list[Follower] = []


@pytest.fixture(autouse=True)
def _close_followers() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def follower(
    tmp_path: Path,
    state: FollowState | None = None,
    clock: FakeClock[float] | None = None,
    patterns: tuple[str, ...] | None = None,
    **kw: object,
) -> Follower:
    f = Follower(
        patterns or (str(tmp_path / "*.log"), str(tmp_path / "*.json")),
        agent="client-07",
        max_message_bytes=256 * 1024,
        state=state,
        log_hist_msec=1000,
        clock=clock or FakeClock(1000.0),
        **kw,  # type: ignore[arg-type]
    )
    _OPEN.append(f)
    return f


def test_partial_last_line_waits_and_new_files_are_picked_up(tmp_path: Path) -> None:
    f = follower(tmp_path)
    assert list(f.poll()) == []
    p = tmp_path / "a_clat_hist.1.log"
    full = line(0) + line(1) + line(2)
    p.write_text(full[: len(line(0)) + len(line(1)) + 10])
    got = records(list(f.poll()))
    assert [(s, e) for _, s, e in got] == [(0, T0 + 1000), (1, T0 + 2000)]
    with p.open("a") as fh:
        fh.write(full[len(line(0)) + len(line(1)) + 10 :])
    got2 = records(list(f.poll()))
    assert [(s, e) for _, s, e in got2] == [(2, T0 + 3000)]
    assert got2[0][0] == got[0][0]
    assert got[0][0].startswith(f"{p}@")


def test_truncated_and_rewritten_files_start_new_streams(tmp_path: Path) -> None:
    f = follower(tmp_path)
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0) + line(1))
    first = records(list(f.poll()))
    assert len(first) == 2
    p.write_text(line(5))  # fio re-run: truncated and shorter
    got = records(list(f.poll()))
    assert [(s, e) for _, s, e in got] == [(0, T0 + 6000)]
    assert got[0][0] != first[0][0]
    # Rewritten to the same size (same inode, same length, other bytes).
    text = line(7)
    assert len(text) == len(line(5))
    with p.open("r+") as fh:
        fh.write(text)
    got3 = records(list(f.poll()))
    assert [(s, e) for _, s, e in got3] == [(0, T0 + 8000)]
    assert len({first[0][0], got[0][0], got3[0][0]}) == 3


def test_longer_rerun_between_polls_counts_each_record_once(tmp_path: Path) -> None:
    """fio reopens hist logs with "w" at job exit: the old content is gone at once."""
    f = follower(tmp_path)
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text("".join(line(i) for i in range(4)))
    assert len(records(list(f.poll()))) == 4
    p.write_text("".join(line(i, value=9) for i in range(10)))  # longer re-run
    got = records(list(f.poll()))
    per_stream = Counter(s for s, _, _ in got)
    assert list(per_stream.values()) == [10]  # all 10 in the new stream, none in the old
    assert sorted(seq for _, seq, _ in got) == list(range(10))


def test_in_place_rewrite_with_an_identical_head_is_a_new_stream(tmp_path: Path) -> None:
    f = follower(tmp_path)
    p = tmp_path / "a_clat_hist.1.log"
    same = "".join(line(i) for i in range(3))
    p.write_text(same + line(3) + line(4))
    old = records(list(f.poll()))
    assert len(old) == 5
    # Same first three lines, then other content, and longer: what was read is no
    # longer a prefix (a head-and-tail check of 64 bytes cannot see it).
    with p.open("r+") as fh:
        fh.write(same + line(3, value=40) + line(4, value=40) + line(5) + line(6))
    got = records(list(f.poll()))
    assert {s for s, _, _ in got} != {old[0][0]}
    assert [seq for _, seq, _ in got] == list(range(7))


def test_identical_rewrite_plus_appends_continues_the_stream(tmp_path: Path) -> None:
    """A copy of the same content with more lines is an append: nothing is sent twice."""
    f = follower(tmp_path)
    p = tmp_path / "a_clat_hist.1.log"
    head = "".join(line(i) for i in range(3))
    p.write_text(head)
    old = records(list(f.poll()))
    p.write_text(head + line(3))
    got = records(list(f.poll()))
    assert got == [(old[0][0], 3, T0 + 4000)]


def test_deleted_file_is_drained_then_recreated_file_is_a_new_stream(tmp_path: Path) -> None:
    f = follower(tmp_path)
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0))
    first = records(list(f.poll()))
    with p.open("a") as fh:
        fh.write(line(1))
    p.unlink()
    # A re-run: other content (it may well get the same inode number back).
    p.write_text(line(0, value=50) + line(1, value=50) + line(2, value=50))
    got = records(list(f.poll()))
    old = [r for r in got if r[0] == first[0][0]]
    new = [r for r in got if r[0] != first[0][0]]
    assert [s for _, s, _ in old] == [1]  # the appended line was drained from the old file
    assert [s for _, s, _ in new] == [0, 1, 2]


def test_rename_to_a_matching_name_keeps_the_stream(tmp_path: Path) -> None:
    f = follower(tmp_path)
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0) + line(1))
    first = records(list(f.poll()))
    rotated = tmp_path / "a_clat_hist.1.old.log"
    p.rename(rotated)
    with rotated.open("a") as fh:
        fh.write(line(2))
    p.write_text(line(10))  # a new file under the old name
    got = records(list(f.poll()))
    same = [seq for s, seq, _ in got if s == first[0][0]]
    other = [(seq, e) for s, seq, e in got if s != first[0][0]]
    assert same == [2]  # only the appended line: nothing re-sent
    assert other == [(0, T0 + 11000)]
    assert f.stats.renames == 1


def test_rename_out_of_the_patterns_is_followed_until_quiet(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    f = follower(tmp_path, clock=clock, rename_grace_s=30.0)
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0))
    first = records(list(f.poll()))
    moved = tmp_path / "a_clat_hist.1.log.keep"  # the patterns do not match it
    p.rename(moved)
    assert list(f.poll()) == []
    clock.t += 20
    with moved.open("a") as fh:
        fh.write(line(1))
    got = records(list(f.poll()))
    assert got == [(first[0][0], 1, T0 + 2000)]  # appended after the rename: still sent
    clock.t += 29
    assert list(f.poll()) == []
    assert f.stats.files_followed == 1
    clock.t += 2  # quiet for 31 s: closed
    assert list(f.poll()) == []
    assert f.stats.files_followed == 0


def test_restart_skips_what_was_acknowledged_and_resends_the_rest(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text("".join(line(i) for i in range(6)))
    f = follower(tmp_path)
    first = records(list(f.poll()))
    stream = first[0][0]
    assert [s for _, s, _ in first] == list(range(6))
    saved = f.state({stream: 4})  # the broker acknowledged seqs 0..3
    f.close()
    with p.open("a") as fh:
        fh.write(line(6))
    g = follower(tmp_path, state=saved)
    again = records(list(g.poll()))
    assert again == [(stream, s, T0 + 1000 * (s + 1)) for s in (4, 5, 6)]
    assert g.stats.records_skipped_replay == 4


def test_restart_through_the_positions_file_and_a_rename_while_down(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text("".join(line(i) for i in range(3)))
    f = follower(tmp_path)
    stream = records(list(f.poll()))[0][0]
    (tmp_path / "state").mkdir()
    save_positions(tmp_path / "state" / "positions.json", f.state({stream: 3}))
    f.close()
    p.rename(tmp_path / "a_clat_hist.1.moved.log")  # while no agent runs
    state, problems = load_positions(tmp_path / "state" / "positions.json")
    assert problems == []
    clock = FakeClock(1000.0)
    g = follower(tmp_path, state=state, clock=clock)
    assert list(g.poll()) == []  # the same content: nothing new, nothing re-sent
    with (tmp_path / "a_clat_hist.1.moved.log").open("a") as fh:
        fh.write(line(3))
    clock.t += RESCAN_S  # a closed file that grows is noticed by the next full rescan
    assert records(list(g.poll())) == [(stream, 3, T0 + 4000)]


def test_restart_after_an_in_place_rewrite_with_the_same_head_starts_afresh(
    tmp_path: Path,
) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    same = line(0) + line(1)
    p.write_text(same + line(2))
    f = follower(tmp_path)
    stream = records(list(f.poll()))[0][0]
    saved = f.state({stream: 3})
    f.close()
    with p.open("r+") as fh:  # same inode, same first two lines, other third line
        fh.write(same + line(2, value=77))
    g = follower(tmp_path, state=saved)
    got = records(list(g.poll()))
    assert [seq for _, seq, _ in got] == [0, 1, 2]
    assert {s for s, _, _ in got} != {stream}


def test_restart_after_the_file_was_replaced_starts_a_new_generation(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0))
    f = follower(tmp_path)
    stream = records(list(f.poll()))[0][0]
    saved = f.state({stream: 1})
    f.close()
    os.remove(p)
    p.write_text(line(3) + line(4))
    g = follower(tmp_path, state=saved)
    got = records(list(g.poll()))
    assert [seq for _, seq, _ in got] == [0, 1]
    assert {s for s, _, _ in got} != {stream}


def test_descriptor_cap_closes_quiet_files_and_reopens_them_without_resending(
    tmp_path: Path,
) -> None:
    clock = FakeClock(1000.0)
    f = follower(tmp_path, clock=clock, max_open_files=4)
    paths = [tmp_path / f"j{k:02d}_clat_hist.1.log" for k in range(10)]
    for k, p in enumerate(paths):
        p.write_text(line(k) + line(k + 1))
    seen: Counter[tuple[str, int]] = Counter()
    for _ in range(5):
        for rec in records(list(f.poll())):
            seen[rec[:2]] += 1
        assert f.stats.files_followed <= 4
        clock.t += 11  # quiet files may now be closed to make room
    assert len(seen) == 20
    assert max(seen.values()) == 1
    with paths[0].open("a") as fh:  # a closed file grows: reopened, only the new line
        fh.write(line(2))
    for _ in range(3):
        for rec in records(list(f.poll())):
            seen[rec[:2]] += 1
        clock.t += 11
    assert len(seen) == 21
    assert max(seen.values()) == 1


def _json_doc(ts: int, prefix: str, count: int, lines: int = 0) -> str:
    """A json+ dump of one job; with ``lines``, its bins hold what line(0..lines-1) hold."""
    bins = {"20480": count}
    if lines:
        idx = np.array([700 + i % 50 for i in range(lines)])
        bins = {str(v): 5 + i for i, v in enumerate(plat_idx_to_val(idx).tolist())}
    return (
        json.dumps(
            {
                "fio version": "fio-3.33",
                "timestamp_ms": ts,
                "global options": {"write_hist_log": prefix},
                "jobs": [
                    {
                        "jobname": "j",
                        "job_runtime": 1000,
                        "read": {"io_bytes": 4096 * count, "clat_ns": {"bins": bins}},
                    }
                ],
            }
        )
        + "\n"
    )


def test_hist_logs_covered_by_a_followed_json_stream_are_not_published(tmp_path: Path) -> None:
    f = follower(tmp_path)
    run = tmp_path / "run.json"
    run.write_text(_json_doc(T0 + 1000, "h", 10, 1) + _json_doc(T0 + 2000, "h", 25, 2))
    covered = tmp_path / "h_clat_hist.1.log"  # sorts before run.json, same poll
    covered.write_text(line(0) + line(1))
    other = tmp_path / "other_clat_hist.1.log"  # no json+ stream declares "other"
    other.write_text(line(5))  # its own content (not a copy of the other log)
    got = records(list(f.poll()))
    streams = Counter(s.rsplit("@", 1)[0] for s, _, _ in got)
    assert streams == {str(run): 2, str(other): 1}
    assert f.stats.files_covered == 1
    # The decision survives a restart, even after the json+ stream is gone.
    saved = f.state({s: 99 for s, _, _ in got})
    f.close()
    run.unlink()
    covered.write_text(covered.read_text())  # rewritten identically: still covered
    g = follower(tmp_path, state=saved)
    assert records(list(g.poll())) == []


def test_hist_logs_of_other_runs_or_names_are_published(tmp_path: Path) -> None:
    """Same name, another time (a run without its json+ stream), or another name."""
    f = follower(tmp_path)
    run = tmp_path / "run.json"
    run.write_text(_json_doc(T0 + 3_600_000, "/elsewhere/h", 10))  # an hour later
    h = tmp_path / "h_clat_hist.1.log"
    h.write_text(line(0))
    other = tmp_path / "x_clat_hist.1.log"
    other.write_text(line(3))
    got = records(list(f.poll()))
    assert Counter(s.rsplit("@", 1)[0] for s, _, _ in got) == {
        str(run): 1,
        str(h): 1,
        str(other): 1,
    }


def test_a_hist_log_is_covered_whatever_folder_fio_wrote_it_from(tmp_path: Path) -> None:
    """fio's prefix names another folder (a bind mount, a symlink, fio's working dir)."""
    f = follower(tmp_path)
    run = tmp_path / "run.json"
    run.write_text(_json_doc(T0 + 1000, "/mnt/other/view/h", 10, 1))
    (tmp_path / "h_clat_hist.1.log").write_text(line(0))
    got = records(list(f.poll()))
    assert Counter(s.rsplit("@", 1)[0] for s, _, _ in got) == {str(run): 1}
    assert f.stats.files_covered == 1


def test_a_hist_log_written_before_the_first_status_dump_waits_for_it(tmp_path: Path) -> None:
    """A short job ends (its hist log appears) before fio writes its first json+ document."""
    clock = FakeClock(1000.0)
    f = follower(tmp_path, clock=clock)
    run = tmp_path / "run.json"
    run.write_text("")  # fio opened its output; no document yet
    (tmp_path / "h_clat_hist.1.log").write_text(line(0))
    assert list(f.poll()) == []  # held: the stream may still declare it
    clock.t += 1
    run.write_text(_json_doc(T0 + 1000, "h", 10, 1))
    got = records(list(f.poll()))
    assert Counter(s.rsplit("@", 1)[0] for s, _, _ in got) == {str(run): 1}
    assert f.stats.files_covered == 1


def test_a_line_that_never_ends_is_skipped_and_bounded(tmp_path: Path) -> None:
    f = follower(tmp_path, max_line_bytes=1 << 20)
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0))
    assert len(records(list(f.poll()))) == 1
    with p.open("a") as fh:
        for _ in range(5):
            fh.write("7" * (4 << 20))  # 20 MB of digits, no newline
            fh.flush()
            assert list(f.poll()) == []
        fh.write("\n" + line(1))
    got = records(list(f.poll()))
    assert [seq for _, seq, _ in got] == [1]
    assert f.stats.problems.get("line-too-long") == 1


def test_garbage_lines_are_counted_and_the_rest_flows(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    p.write_bytes(
        line(0).encode()
        + b"\x00\xff\x13garbage\x01\n"
        + b"1, 2, x\n"
        + b"1" * 30
        + b", 0, 4096, 1\n"
        + line(1).encode()
    )
    f = follower(tmp_path)
    assert ends(list(f.poll())) == [T0 + 1000, T0 + 2000]
    assert sum(f.stats.problems.values()) == 3


def test_messages_respect_the_size_cap(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    counts = np.arange(1, 1857, dtype=np.int64)  # every bin non-zero: ~18.6 KB per record
    p.write_text("".join(format_line(T0 + 1000 * (i + 1), 0, 4096, counts) for i in range(20)))
    with Follower((str(p),), agent="h", max_message_bytes=64 * 1024, log_hist_msec=1000) as f:
        out = list(f.poll())
    assert len(out) > 1
    # the packet's header and topic fit beside each payload (follow.PACKET_OVERHEAD)
    assert all(len(m.payload) <= 64 * 1024 - PACKET_OVERHEAD for m in out)
    assert [s for _, s, _ in records(out)] == list(range(20))


def test_relative_log_is_placed_on_the_wall_clock_by_its_mtime(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    counts = np.zeros(1856, dtype=np.int64)
    counts[700] = 4
    p.write_text("".join(format_line(1000 * (i + 1), 0, 4096, counts) for i in range(3)))
    mtime_ms = T0 + 123_456
    os.utime(p, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
    f = follower(tmp_path)
    out = records(list(f.poll()))
    # The last record (stamped 3000 ms after the job's start) is taken to end at the mtime.
    assert [e for _, _, e in out] == [mtime_ms - 2000, mtime_ms - 1000, mtime_ms]
    saved = f.state({})
    assert saved.streams[out[0][0]].time_offset_ms == mtime_ms - 3000


def test_idle_pattern_and_missing_folder_are_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(1000.0)
    pattern = str(tmp_path / "nowhere" / "*.json")
    f = follower(tmp_path, clock=clock, patterns=(pattern,), pattern_idle_s=60.0)
    caplog.set_level(logging.INFO, logger="fiomon.agent")
    list(f.poll())
    clock.t += 61
    list(f.poll())
    clock.t += 100
    list(f.poll())
    warned = [r.getMessage() for r in caplog.records if "matched no file" in r.getMessage()]
    assert len(warned) == 1
    assert "does not exist" in warned[0]
    assert f.stats.patterns_idle == 1
    (tmp_path / "nowhere").mkdir()
    (tmp_path / "nowhere" / "run.json").write_text(_json_doc(T0, "h", 1))
    list(f.poll())
    assert f.stats.patterns_idle == 0


def test_lost_state_keeps_a_files_stream_id_and_other_content_gets_another(
    tmp_path: Path,
) -> None:
    """Positions lost: the same bytes re-read give the same ids (the aggregator drops them)."""
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0) + line(1))
    wall = [1_800_000_000.0]
    f = follower(tmp_path, wall_s=lambda: wall[0])
    first = records(list(f.poll()))
    f.close()
    wall[0] += 1
    g = follower(tmp_path, wall_s=lambda: wall[0])  # positions lost: starts afresh
    assert records(list(g.poll())) == first
    g.close()
    p.write_text(line(5) + line(6))  # a re-run into the same name
    h = follower(tmp_path, wall_s=lambda: wall[0])
    again = records(list(h.poll()))
    assert [seq for _, seq, _ in again] == [0, 1]
    assert again[0][0] != first[0][0]


def test_a_rewrite_with_the_same_first_record_never_reuses_the_old_id(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0) + line(1))
    f = follower(tmp_path)
    first = records(list(f.poll()))
    p.write_text(line(0) + line(2, value=77))  # same first record, other content after it
    again = records(list(f.poll()))
    assert [seq for _, seq, _ in again] == [0, 1]
    assert again[0][0] != first[0][0]


def test_a_copy_is_not_published_and_a_move_across_file_systems_continues(
    tmp_path: Path,
) -> None:
    f = follower(tmp_path)
    p = tmp_path / "run_clat_hist.1.log"
    p.write_text("".join(line(i) for i in range(5)))
    first = records(list(f.poll()))
    assert len(first) == 5
    shutil.copy(p, tmp_path / "archive_clat_hist.1.log")  # cp into the watched folder
    assert records(list(f.poll())) == []
    assert f.stats.files_copies == 1
    # mv to another file system is a copy plus a delete: the stream carries on in the copy.
    moved = tmp_path / "moved_clat_hist.1.log"
    shutil.copy(p, moved)
    p.unlink()
    with moved.open("a") as fh:
        fh.write(line(5))
    got = records(list(f.poll()))
    assert got == [(first[0][0], 5, T0 + 6000)]


def test_only_whitespace_so_far_does_not_decide_the_kind(tmp_path: Path) -> None:
    f = follower(tmp_path)
    p = tmp_path / "out.json"
    p.write_text("\n\n")  # fio client mode starts its output with a newline
    assert list(f.poll()) == []
    with p.open("a") as fh:
        fh.write(_json_doc(T0 + 1000, "h", 5))
    got = records(list(f.poll()))
    assert len(got) == 1


def test_a_copy_that_diverges_publishes_what_follows_the_shared_bytes(tmp_path: Path) -> None:
    clock = FakeClock(1000.0)
    f = follower(tmp_path, clock=clock)
    p = tmp_path / "run_clat_hist.1.log"
    p.write_text("".join(line(i) for i in range(5)))
    assert len(records(list(f.poll()))) == 5
    copy = tmp_path / "copy_clat_hist.1.log"
    copy.write_text("".join(line(i) for i in range(3)))  # a prefix: a copy
    assert records(list(f.poll())) == []
    assert f.stats.files_copies == 1
    with copy.open("a") as fh:  # its own lines from here on
        fh.write(line(3, value=99) + line(4, value=99) + line(7))
    got = records(list(f.poll()))
    assert [(seq, end) for _, seq, end in got] == [(3, T0 + 4000), (4, T0 + 5000), (5, T0 + 8000)]
    assert f.stats.copies_diverged == 1
    # A copy that grows past an original gone quiet is its own from the original's end.
    other = tmp_path / "other_clat_hist.1.log"
    other.write_text("".join(line(i) for i in range(5)))
    assert records(list(f.poll())) == []
    with other.open("a") as fh:
        fh.write(line(5))
    clock.t += 10
    got = records(list(f.poll()))
    assert [(seq, end) for _, seq, end in got] == [(5, T0 + 6000)]
    saved = f.state({})
    assert saved.streams[got[0][0]].acked_seq == 5  # a restart skips the shared records too


def test_garbage_appended_and_a_file_replaced_by_a_folder_never_stop_the_follower(
    tmp_path: Path,
) -> None:
    """Bad input is counted and skipped; what follows it still flows."""
    clock = FakeClock(1000.0)
    f = follower(tmp_path, clock=clock)
    log_file = tmp_path / "a_clat_hist.1.log"
    stream_file = tmp_path / "run.json"
    log_file.write_text(line(0))
    stream_file.write_text(_json_doc(T0 + 1000, "x", 10))
    assert len(records(list(f.poll()))) == 2
    junk = b"\x00\xff\xfe garbage {{{ \x89PNG\r\n" + os.urandom(512).replace(b"{", b"(") + b"\n"
    for p in (log_file, stream_file):
        with p.open("ab") as fh:
            fh.write(junk)
    assert records(list(f.poll())) == []
    assert sum(f.stats.problems.values()) >= 2  # counted, and logged with the file's name
    with log_file.open("a") as fh:
        fh.write(line(1))
    with stream_file.open("a") as fh:
        fh.write(_json_doc(T0 + 2000, "x", 25))
    assert len(records(list(f.poll()))) == 2  # the records after the junk still come
    # A followed file replaced by a folder of the same name: drained, closed, no crash.
    log_file.unlink()
    log_file.mkdir()
    clock.t += RESCAN_S
    assert records(list(f.poll())) == []
    assert f.stats.files_followed == 1


def test_a_copy_stays_a_copy_across_a_restart_and_diverges_after_it(tmp_path: Path) -> None:
    f = follower(tmp_path)
    p = tmp_path / "run_clat_hist.1.log"
    p.write_text("".join(line(i) for i in range(4)))
    first = records(list(f.poll()))
    copy = tmp_path / "copy_clat_hist.1.log"
    copy.write_text("".join(line(i) for i in range(2)))
    assert records(list(f.poll())) == []
    saved = f.state({first[0][0]: 4})
    f.close()
    clock = FakeClock(1000.0)
    g = follower(tmp_path, state=saved, clock=clock)
    assert records(list(g.poll())) == []  # nothing re-sent, the copy still not published
    with copy.open("a") as fh:
        fh.write(line(2, value=50))
    clock.t += RESCAN_S  # a closed file that grew is noticed by the next full rescan
    got = records(list(g.poll()))
    assert [(seq, end) for _, seq, end in got] == [(2, T0 + 3000)]
    assert got[0][0] != first[0][0]


def test_a_stream_saved_before_its_first_record_still_gets_its_content_id(
    tmp_path: Path,
) -> None:
    """Positions saved while a file held no complete record, then lost: one id, no double."""
    p = tmp_path / "a_clat_hist.1.log"
    first = line(0)
    p.write_text(first[:100])  # fio is writing its first line
    f = follower(tmp_path)
    assert records(list(f.poll())) == []
    saved = f.state({})
    assert len(saved.streams) == 1  # listed under its provisional id
    f.close()
    with p.open("a") as fh:
        fh.write(first[100:] + line(1))
    g = follower(tmp_path, state=saved)
    resumed = records(list(g.poll()))
    g.close()
    h = follower(tmp_path)  # positions lost
    assert records(list(h.poll())) == resumed
