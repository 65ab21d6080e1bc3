"""systemd units: verified and scored by systemd-analyze; fiomon speaks sd_notify itself."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DEADLINE_S, Mosquitto, free_port

UNITS = Path(__file__).resolve().parent.parent / "deploy" / "systemd"


@pytest.fixture(scope="module")
def systemd_analyze() -> str:
    path = shutil.which("systemd-analyze")
    if path is None:
        pytest.fail("systemd-analyze is missing: run .ci/run or apt-get install systemd")
    return path


def _local_copy(unit: Path, tmp: Path) -> Path:
    """The unit with ExecStart pointing at this checkout's fiomon (verify checks it exists)."""
    fiomon = Path(sys.executable).with_name("fiomon")
    assert fiomon.exists(), "pip install -e . puts the fiomon script beside the interpreter"
    out = tmp / unit.name
    text = unit.read_text()
    assert "ExecStart=/opt/fiomon/bin/fiomon " in text, "the documented venv (deploy/README.md)"
    out.write_text(text.replace("/opt/fiomon/bin/fiomon", str(fiomon)))
    return out


@pytest.mark.parametrize("name", ["fiomon-agent.service", "fiomon-aggregator.service"])
def test_unit_verifies_and_is_hardened(name: str, tmp_path: Path, systemd_analyze: str) -> None:
    unit = _local_copy(UNITS / name, tmp_path)
    text = unit.read_text()
    for needed in ("Type=notify", "Restart=on-failure", "StateDirectory=", "User=fiomon"):
        assert needed in text, needed
    # both services reload on SIGHUP (`systemctl reload`; logrotate and config tools send it)
    assert "\nExecReload=/bin/kill -HUP $MAINPID\n" in text
    v = subprocess.run(
        [systemd_analyze, "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert v.returncode == 0 and not v.stderr.strip(), v.stderr
    s = subprocess.run(
        [systemd_analyze, "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", s.stdout + s.stderr)
    assert m, s.stdout + s.stderr
    print(f"{name}: exposure {m.group(1)}")
    assert float(m.group(1)) <= 2.5


def test_agent_tells_systemd_it_is_ready_alive_and_stopping(tmp_path: Path) -> None:
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(DEADLINE_S)
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"broker: {{port: 1}}\nhost: h\nwatch: ['{tmp_path}/*.log']\nstate_dir: {tmp_path}/s\n"
    )
    env = {"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "2000000", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "fiomon", "agent", "--config", str(cfg)],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    got: list[str] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and not (
            any("READY=1" in g for g in got) and sum("WATCHDOG=1" in g for g in got) >= 2
        ):
            got.append(sock.recv(4096).decode())
        proc.send_signal(signal.SIGTERM)
        while not any("STOPPING=1" in g for g in got):
            got.append(sock.recv(4096).decode())
        assert proc.wait(DEADLINE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
    ready = next(g for g in got if "READY=1" in g)
    assert "STATUS=following" in ready
    assert sum("WATCHDOG=1" in g for g in got) >= 2


def test_aggregator_is_ready_only_once_subscribed_and_logs_its_counters_at_stop(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    # The broker is down at start: the unit stays "activating" with a STATUS that says
    # what it waits for, and READY=1 comes once the session is up and subscribed.
    mosquitto.stop()
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(DEADLINE_S)
    cfg = tmp_path / "aggregator.yaml"
    cfg.write_text(f"broker: {{port: {mosquitto.port}}}\nlisten: 127.0.0.1:{free_port()}\n")
    env = {"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "2000000", "PATH": "/usr/bin:/bin"}
    err = tmp_path / "aggregator.log"
    with err.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fiomon", "aggregator", "--config", str(cfg)],
            env=env,
            stderr=fh,
        )
    got: list[str] = []
    try:
        while not any("STATUS=waiting for the broker" in g for g in got):
            got.append(sock.recv(4096).decode())
        assert not any("READY=1" in g for g in got), got
        mosquitto.start()
        while not any("READY=1" in g for g in got):
            got.append(sock.recv(4096).decode())
        proc.send_signal(signal.SIGTERM)
        while not any("STOPPING=1" in g for g in got):
            got.append(sock.recv(4096).decode())
        assert proc.wait(DEADLINE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
    ready = next(g for g in got if "READY=1" in g)
    assert "records" in ready and "quanta closed" in ready, ready
    text = err.read_text()
    assert "stopped: 0 records received, 0 duplicate, 0 lost, 0 late" in text, text
