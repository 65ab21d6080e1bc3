"""Following growing files: partial lines, truncation, rewrites, re-creation, replay."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fiomon.follow import Follower, Outgoing, Resume
from fiomon.simulate import format_line
from fiomon.wire import decode

T0 = 1_795_000_000_000


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


_OPEN: list[Follower] = []


@pytest.fixture(autouse=True)
def _close_followers() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def follower(tmp_path: Path, resume: dict[str, Resume] | None = None) -> Follower:
    f = Follower(
        (str(tmp_path / "*.log"),),
        agent="client-07",
        max_message_bytes=256 * 1024,
        resume=resume,
        log_hist_msec=1000,
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
    got = records(list(f.poll()))
    assert [(s, e) for _, s, e in got] == [(2, T0 + 3000)]
    assert got[0][0] == f"{p}@1"


def test_truncated_and_rewritten_files_start_new_streams(tmp_path: Path) -> None:
    f = follower(tmp_path)
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0) + line(1))
    assert len(records(list(f.poll()))) == 2
    p.write_text(line(5))  # fio re-run: truncated and shorter
    got = records(list(f.poll()))
    assert got == [(f"{p}@2", 0, T0 + 6000)]
    # Rewritten to the same size (same inode, same length, other bytes).
    text = line(7)
    assert len(text) == len(line(5))
    with p.open("r+") as fh:
        fh.write(text)
    got = records(list(f.poll()))
    assert got == [(f"{p}@3", 0, T0 + 8000)]


def test_deleted_file_is_drained_then_recreated_file_is_a_new_stream(tmp_path: Path) -> None:
    f = follower(tmp_path)
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0))
    assert len(records(list(f.poll()))) == 1
    with p.open("a") as fh:
        fh.write(line(1))
    ino = p.stat().st_ino
    p.unlink()
    p.write_text(line(0) + line(1) + line(2))  # may well get the same inode number back
    got = records(list(f.poll()))
    old = [r for r in got if r[0] == f"{p}@1"]
    new = [r for r in got if r[0] == f"{p}@2"]
    assert [s for _, s, _ in old] == [1]  # the appended line was drained from the old file
    assert [s for _, s, _ in new] == [0, 1, 2]
    del ino


def test_restart_skips_what_was_acknowledged_and_resends_the_rest(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text("".join(line(i) for i in range(6)))
    f = follower(tmp_path)
    first = records(list(f.poll()))
    assert [s for _, s, _ in first] == list(range(6))
    saved = f.positions({f"{p}@1": 4})  # the broker acknowledged seqs 0..3
    f.close()
    with p.open("a") as fh:
        fh.write(line(6))
    g = follower(tmp_path, resume=saved)
    again = records(list(g.poll()))
    assert again == [(f"{p}@1", s, T0 + 1000 * (s + 1)) for s in (4, 5, 6)]
    assert g.stats.records_skipped_replay == 4


def test_restart_after_the_file_was_replaced_starts_a_new_generation(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0))
    f = follower(tmp_path)
    list(f.poll())
    saved = f.positions({f"{p}@1": 1})
    f.close()
    os.remove(p)
    p.write_text(line(3) + line(4))
    g = follower(tmp_path, resume=saved)
    assert [(st, s) for st, s, _ in records(list(g.poll()))] == [(f"{p}@2", 0), (f"{p}@2", 1)]


def test_garbage_lines_are_counted_and_the_rest_flows(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    p.write_bytes(line(0).encode() + b"\x00\xff\x13garbage\x01\n" + b"1, 2, x\n" + line(1).encode())
    f = follower(tmp_path)
    got = records(list(f.poll()))
    assert [e for _, _, e in got] == [T0 + 1000, T0 + 2000]
    assert sum(f.stats.problems.values()) == 2


def test_messages_respect_the_size_cap(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    counts = np.arange(1, 1857, dtype=np.int64)  # every bin non-zero: ~18.6 KB per record
    p.write_text("".join(format_line(T0 + 1000 * (i + 1), 0, 4096, counts) for i in range(20)))
    with Follower((str(p),), agent="h", max_message_bytes=64 * 1024, log_hist_msec=1000) as f:
        out = list(f.poll())
    assert len(out) > 1
    assert all(len(m.payload) <= 64 * 1024 for m in out)
    assert [s for _, s, _ in records(out)] == list(range(20))


def test_relative_log_is_placed_on_the_wall_clock_by_its_mtime(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    counts = np.zeros(1856, dtype=np.int64)
    counts[700] = 4
    p.write_text("".join(format_line(1000 * (i + 1), 0, 4096, counts) for i in range(3)))
    mtime_ms = T0 + 123_456
    os.utime(p, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))
    f = follower(tmp_path)
    ends = [e for _, _, e in records(list(f.poll()))]
    # The last record (stamped 3000 ms after the job's start) is taken to end at the mtime.
    assert ends == [mtime_ms - 2000, mtime_ms - 1000, mtime_ms]
    saved = f.positions({})
    assert saved[str(p)].time_offset_ms == mtime_ms - 3000


def test_spool_drops_the_oldest_when_full_and_counts_it(tmp_path: Path) -> None:
    from fiomon.spool import Spool  # noqa: PLC0415

    spool = Spool(tmp_path / "spool", max_bytes=3000)
    dropped = []
    for i in range(5):
        dropped += spool.push(Outgoing("s@1", 10 * i, 10, bytes([i]) * 1000))
    assert [d.first_seq for d in dropped] == [0, 10]
    assert (spool.dropped_messages, spool.dropped_records) == (2, 20)
    got = []
    while (m := spool.peek()) is not None:
        got.append((m.first_seq, m.payload[:1]))
        spool.pop()
    assert got == [(20, b"\x02"), (30, b"\x03"), (40, b"\x04")]
    spool.close()
