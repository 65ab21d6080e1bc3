"""Shared fixtures: real fio and a real Mosquitto (required, never skipped), helpers.

Tests wait for events (a subscription in the broker's log, a file that fills, a counter
that reaches its value) with deadlines generous enough for a loaded 2-core machine, never
for a fixed time: what takes 0.3 s on an idle machine took several seconds on a first run
after boot with two other test suites sharing the cores.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.ports import free_port as free_port  # noqa: PLC0414 -- the tests import it from here
from tests.release import Release, build_release

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def fio_bin() -> str:
    """Path of the real fio binary; the suite fails loudly when it is missing."""
    path = shutil.which("fio")
    if path is None:
        pytest.fail("fio is not installed: run .ci/run (it installs fio) or apt-get install fio")
    return path


# Long enough for the slowest start-up seen under load; a healthy run returns in
# well under a second, so a generous deadline costs nothing when things work.
DEADLINE_S = 60.0


async def until(
    predicate: Callable[[], object], *, what: str, within: float = DEADLINE_S, every: float = 0.1
) -> None:
    """Poll ``predicate`` until it is true; fail naming ``what`` after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            pytest.fail(f"not within {within:g} s: {what}")
        await asyncio.sleep(every)


class Mosquitto:
    """A real Mosquitto on a free loopback port, with persistence in a temporary folder.

    Persistence and a persistent test subscriber let messages queued for the subscriber
    survive a broker restart (the outage test stops and starts it on the same port).
    """

    def __init__(self, binary: str, folder: Path) -> None:
        self.binary = binary
        self.folder = folder
        self.port = free_port()
        self.conf = folder / "mosquitto.conf"
        self.log = folder / "mosquitto.log"
        folder.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            # Started as root, Mosquitto drops to its own user, which cannot write here.
            "user root\n"
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {folder}/\n"
            "autosave_interval 1\n"
            "max_queued_messages 100000\n"
            f"log_dest file {self.log}\n"
            "log_type error\nlog_type warning\nlog_type notice\nlog_type information\n"
            # "<client id> <qos> <filter>" per subscription: tests wait for it before
            # anything is published, instead of sleeping.
            "log_type subscribe\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"mosquitto exited: {self.log.read_text() if self.log.exists() else ''}"
                )
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        pytest.fail(f"mosquitto did not listen within {DEADLINE_S:g} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(DEADLINE_S)
        self.proc = None

    def log_text(self) -> str:
        """The broker's log so far."""
        return self.log.read_text() if self.log.exists() else ""

    async def wait_for_log(
        self, needle: str, *, since: int = 0, within: float = DEADLINE_S
    ) -> None:
        """Until the log, from character ``since`` on, holds ``needle``.

        For example ``f"{client_id} 1 {topic_filter}"``: that client's subscription.
        """
        await until(
            lambda: needle in self.log_text()[since:],
            what=f"{needle!r} in the broker's log",
            within=within,
        )


@pytest.fixture(scope="session")
def mosquitto_bin() -> str:
    """Path of the real mosquitto broker; the suite fails loudly when it is missing."""
    path = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )
    if path is None:
        pytest.fail("mosquitto is not installed: run .ci/run or apt-get install mosquitto")
    return path


@pytest.fixture
def mosquitto(mosquitto_bin: str, tmp_path: Path) -> Iterator[Mosquitto]:
    """A fresh broker for one test."""
    broker = Mosquitto(mosquitto_bin, tmp_path / "mosquitto")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """scripts/release's sdist and wheel (tests/release.py), built once per session."""
    return build_release(tmp_path_factory.mktemp("dist"))
