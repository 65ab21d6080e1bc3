"""Small runtime helpers the services stop with."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from fiomon.runtime import cancel_and_wait, stop_on_signals, wait_event, write_atomic
from tests.conftest import DEADLINE_S, until
from tests.diskfull import fill, free_bytes, is_enospc, small_tmpfs


async def test_a_task_that_swallowed_one_cancellation_is_still_stopped() -> None:
    # What Python 3.11's wait_for does when the cancel lands as the awaited operation
    # completes: the CancelledError never reaches the task, which waits on.
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()
        await asyncio.Event().wait()  # the next await: forever, unless cancelled again

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, every_s=0.05), 10)
    assert swallowed.is_set() and task.done()


async def test_wait_event_says_whether_the_event_came() -> None:
    ev = asyncio.Event()
    assert await wait_event(ev, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, ev.set)
    assert await wait_event(ev, DEADLINE_S) is True
    assert await wait_event(ev, 0) is True  # already set: no wait


async def test_a_signal_sets_stop_a_second_one_cuts_short_and_sighup_reloads() -> None:
    stop = asyncio.Event()
    again: list[str] = []
    reloads: list[int] = []
    before = signal.getsignal(signal.SIGTERM)
    with stop_on_signals(stop, again=again.append, reload=lambda: reloads.append(1)):
        os.kill(os.getpid(), signal.SIGHUP)
        await until(lambda: reloads, what="SIGHUP reloads")
        assert not stop.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), DEADLINE_S)
        os.kill(os.getpid(), signal.SIGINT)
        await until(lambda: again, what="the second signal is handed to `again`")
    assert again == ["SIGINT"]
    # Left: the handlers are gone (SIGTERM has its previous action again).
    assert signal.getsignal(signal.SIGTERM) == before


def test_without_again_a_second_sigint_exits_at_once() -> None:
    async def service() -> None:
        stop = asyncio.Event()
        with stop_on_signals(stop):
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.wait_for(stop.wait(), DEADLINE_S)
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(DEADLINE_S)  # the stop sequence, hanging

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(service())


def test_write_atomic_on_a_nearly_full_disk_keeps_the_old_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real filesystem, not a mock: on a nearly full tmpfs os.write writes what fits and
    # returns less than asked (the short write), and only the next write fails.
    with small_tmpfs(tmp_path / "fs") as fs:
        path = fs / "state.json"
        old = b'{"version": 1, "closed_ms": 1795000019000}'
        write_atomic(path, old)
        fill(fs, leave=8192)
        new = bytes(range(256)) * 96  # 24 KiB: three times the space left
        wrote: list[int] = []
        real_write = os.write

        def spy(fd: int, data: bytes | memoryview) -> int:
            n = real_write(fd, data)
            wrote.append(n)
            return n

        monkeypatch.setattr(os, "write", spy)
        with pytest.raises(OSError) as info:
            write_atomic(path, new)
        monkeypatch.undo()
        assert is_enospc(info.value)
        assert wrote == [8192], "the disk took part of the data, then refused the rest"
        assert path.read_bytes() == old
        assert sorted(p.name for p in fs.iterdir()) == ["filler", "state.json"]
        assert free_bytes(fs) == 8192, "the temporary file's blocks were given back"
        (fs / "filler").unlink()  # room again: the next write goes through whole
        write_atomic(path, new)
        assert path.read_bytes() == new
        assert sorted(p.name for p in fs.iterdir()) == ["state.json"]
