"""Small runtime helpers the services stop with."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from fiomon.runtime import cancel_and_wait, stop_on_signals
from tests.conftest import DEADLINE_S, until


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
