"""Service plumbing shared by agent and aggregator: signals, systemd, durable writes, waits.

:func:`stop_on_signals` is both services' signal rule: SIGTERM or SIGINT starts the
ordered stop, a second one cuts it short (a second SIGINT exits at once unless the service
says otherwise), SIGHUP reloads where the service can.

``Type=notify`` units learn from fiomon itself when it is ready (``READY=1``), what it is
doing (``STATUS=...``) and that its event loop still turns (``WATCHDOG=1`` at half of
``WatchdogSec``). The protocol is one datagram per message on the ``AF_UNIX`` socket named
in ``NOTIFY_SOCKET`` (``sd_notify(3)``); without that variable (not under systemd)
everything here does nothing.

:func:`write_atomic` is the one way a state file (the agent's positions, the aggregator's
grid state, the root's closed-through mark) is replaced; :func:`wait_event` is the one
"sleep, unless this event comes first".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("fiomon")

# An ordered stop (aggregator, root, a cell's partials) waits this long at most, all its
# steps together: the disk, Alertmanager, the brokers. A second signal cuts it short.
GRACE_S = 10.0


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new content.

    The data goes to a temporary file beside ``path`` (written whole, fsynced), which is
    then renamed over it; the directory is fsynced too where that is supported, so the
    rename itself survives a crash.

    Raises:
        OSError: the data could not be made durable (e.g. ENOSPC); the old file stays
            and no temporary file is left behind.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            view = memoryview(data)
            while view:  # os.write may write less than asked (a nearly full disk)
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where supported
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@contextlib.contextmanager
def stop_on_signals(
    stop: asyncio.Event,
    *,
    again: Callable[[str], None] | None = None,
    reload: Callable[[], None] | None = None,
    logger: logging.Logger = log,
    stopping: str = "stopping",
) -> Iterator[None]:
    """While inside: SIGTERM/SIGINT set ``stop``; a second one cuts the stop short.

    Args:
        stop: the event the service's stop sequence waits on.
        again: called with the signal's name when a signal comes while stopping; without
            it a second SIGINT raises KeyboardInterrupt out of the event loop (exit now)
            and a second SIGTERM is only logged.
        reload: SIGHUP calls it (without it SIGHUP keeps its default action).
        logger: where the stop is logged.
        stopping: the log text after the signal's name.

    The handlers are removed on leaving. Where the loop cannot take signal handlers (not
    the main thread), nothing is installed and ``stop`` is the only way to stop.
    """
    loop = asyncio.get_running_loop()

    def on_stop(sig: signal.Signals) -> None:
        if stop.is_set():
            if again is not None:
                again(sig.name)
                return
            if sig == signal.SIGINT:
                raise KeyboardInterrupt
        logger.info("%s: %s", sig.name, stopping)
        stop.set()

    handlers: dict[signal.Signals, Callable[[], None]] = {
        signal.SIGTERM: lambda: on_stop(signal.SIGTERM),
        signal.SIGINT: lambda: on_stop(signal.SIGINT),
    }
    if reload is not None:
        handlers[signal.SIGHUP] = reload
    installed = []
    for sig, fn in handlers.items():
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, fn)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def sd_notify(*states: str) -> bool:
    """Send ``states`` (``READY=1``, ``STATUS=...``) to systemd; False when not under it."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):  # an abstract socket
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall("\n".join(states).encode())
    except OSError as exc:
        log.warning("cannot notify systemd at %s: %s", os.environ.get("NOTIFY_SOCKET"), exc)
        return False
    return True


def watchdog_period_s() -> float | None:
    """Half of ``WatchdogSec`` when systemd asks for keep-alives (for this process)."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    with contextlib.suppress(ValueError):
        return max(0.5, int(usec) / 2e6)
    return None


async def wait_event(ev: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``ev`` is set or ``timeout_s`` has passed; True if it is set.

    The services' "sleep, unless told to stop (or woken) first".
    """
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ev.wait(), timeout_s)
    return ev.is_set()


async def keep_alive(stop: asyncio.Event, status: Callable[[], str], every_s: float = 10.0) -> None:
    """Until ``stop``: ``WATCHDOG=1`` (if asked for) and a fresh ``STATUS=`` line.

    The watchdog ping comes from the event loop itself, so a loop that hangs gets the
    unit restarted.
    """
    period = min(every_s, watchdog_period_s() or every_s)
    watchdog = watchdog_period_s() is not None
    while not stop.is_set():
        states = [f"STATUS={status()}"]
        if watchdog:
            states.append("WATCHDOG=1")
        sd_notify(*states)
        await wait_event(stop, period)
    sd_notify("STOPPING=1", "STATUS=stopping")


async def cancel_and_wait(task: asyncio.Task[Any], *, every_s: float = 0.5) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling again if it carries on.

    Python 3.11's ``asyncio.wait_for`` (which aiomqtt's ``publish`` awaits) loses a
    cancellation that arrives as the awaited operation completes: the task then carries on
    to its next ``await`` still marked as cancelling, and a single ``cancel()`` followed by
    ``await task`` waits forever (the aggregator once hung at SIGTERM this way). Whatever
    the task ends with is swallowed: the caller only wants it gone.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every_s)
    if not task.cancelled():
        with contextlib.suppress(Exception):
            task.result()
