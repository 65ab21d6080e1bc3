"""The agent's spool: bounded, never torn, and a failing disk is a state, not an exit."""

from __future__ import annotations

import os
from pathlib import Path

from fiomon.agent.spool import Outgoing, Spool
from tests.clock import FakeClock


def disk_error(spool: Spool) -> str | None:
    return spool.disk_error  # (a function: mypy would keep an asserted property narrowed)


def full(spool: Spool) -> bool:
    return spool.full


def drain(spool: Spool) -> list[tuple[int, bytes]]:
    got = []
    while (m := spool.peek()) is not None:
        got.append((m.first_seq, m.payload))
        spool.pop()
    return got


def test_spool_drops_the_oldest_when_full_and_counts_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=3000)
    dropped = []
    for i in range(5):
        dropped += spool.push(Outgoing("s@1", 10 * i, 10, bytes([i]) * 1000))
    assert [d.first_seq for d in dropped] == [0, 10]
    assert (spool.dropped_messages, spool.dropped_records) == (2, 20)
    assert [(s, p[:1]) for s, p in drain(spool)] == [(20, b"\x02"), (30, b"\x03"), (40, b"\x04")]
    spool.close()


def test_a_disk_that_refuses_writes_moves_messages_to_memory_then_back(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20, memory_bytes=2500, clock=clock)
    # The next segment file is /dev/full: every write fails with ENOSPC, as on a full disk.
    assert Path("/dev/full").exists(), "Linux provides /dev/full"
    os.symlink("/dev/full", tmp_path / "spool" / "segment-00000001.bin")
    for i in range(2):
        assert spool.push(Outgoing("s@1", i, 1, bytes([i]) * 1000)) == []
    assert spool.disk_error is not None
    assert spool.disk_errors == 1
    assert not full(spool)
    spool.push(Outgoing("s@1", 2, 1, b"\x02" * 1000))
    assert full(spool)  # memory at its cap: the agent stops reading until messages go out
    clock.t += 6  # the disk is tried again (a new segment, a real file this time)
    spool.push(Outgoing("s@1", 3, 1, b"\x03" * 1000))
    assert disk_error(spool) is None
    assert [(s, p[:1]) for s, p in drain(spool)] == [(i, bytes([i])) for i in range(4)]
    assert not spool.full
    spool.close()


def test_a_message_cut_short_on_disk_is_dropped_not_published(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20)
    spool.push(Outgoing("s@1", 0, 5, b"a" * 1000))
    spool.push(Outgoing("s@1", 5, 5, b"b" * 1000))
    os.truncate(tmp_path / "spool" / "segment-00000001.bin", 1500)  # the second is torn
    got = drain(spool)
    assert got == [(0, b"a" * 1000)]
    assert (spool.dropped_messages, spool.dropped_records) == (1, 5)
    spool.close()
