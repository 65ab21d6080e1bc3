"""Small runtime helpers the services stop with."""

from __future__ import annotations

import asyncio

from fiomon.runtime import cancel_and_wait


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
