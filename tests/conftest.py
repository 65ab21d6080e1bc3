"""Shared fixtures: real fio and a real Mosquitto (required, never skipped), helpers."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def fio_bin() -> str:
    """Path of the real fio binary; the suite fails loudly when it is missing."""
    path = shutil.which("fio")
    if path is None:
        pytest.fail("fio is not installed: run .ci/run (it installs fio) or apt-get install fio")
    return path


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"mosquitto exited: {self.log.read_text() if self.log.exists() else ''}"
                )
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        pytest.fail("mosquitto did not listen within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


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
