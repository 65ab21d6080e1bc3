"""The state directory of both services: one lock rule, one refusal, one close.

The refusal is checked on real processes too: a second ``fiomon root`` on a held state
directory exits 1 and names the first one's pid (an aggregator's case is in
tests/aggregator/test_aggregator_faults.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import pytest

from fiomon.config import AggregatorConfig
from fiomon.errors import StateLockedError
from fiomon.server.metrics import Counts
from fiomon.server.state import GRID_STATE_FILE, StateDir
from tests.conftest import DEADLINE_S, Mosquitto, free_port

log = logging.getLogger("fiomon.test")


def _state(tmp_path: Path, service: str, *, grid_state: bool = True) -> StateDir:
    cfg = AggregatorConfig(state_dir=tmp_path / "s", quanta_file=tmp_path / "q.jsonl")
    return StateDir(cfg, service=service, counts=Counts(), log=log, grid_state=grid_state)


@pytest.mark.parametrize("service", ["aggregator", "root"])
def test_a_held_directory_refuses_the_second_service_naming_the_holder(
    tmp_path: Path, service: str
) -> None:
    first = _state(tmp_path, service)
    assert first.journal is None and first.writer is None  # nothing opened before open()
    first.open()
    second = _state(tmp_path, service)
    with pytest.raises(StateLockedError, match=f"another {service} \\(pid {os.getpid()}\\)"):
        second.open()
    assert second.counts.state_errors["lock"] == 1
    first.finish(5.0)
    first.close()
    second.open()  # unlocked by close()
    second.finish(5.0)
    second.close()


def test_only_the_aggregator_keeps_a_grid_state(tmp_path: Path) -> None:
    assert _state(tmp_path, "aggregator").state_path == tmp_path / "s" / GRID_STATE_FILE
    assert _state(tmp_path, "root", grid_state=False).state_path is None


def test_problems_are_logged_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = _state(tmp_path, "root")
    state.problem("state-write", "disk full")
    assert state.counts.state_errors["state-write"] == 1
    assert "state-write: disk full" in caplog.text


async def test_a_second_root_on_a_held_directory_exits_naming_the_holder(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    config = _root_config(tmp_path, mosquitto.port)
    first = await _root(config, tmp_path / "first.stderr")
    try:
        await mosquitto.wait_for_log("root-lock 1 fiomon/v1/_partials/+")
        second = await _root(config, tmp_path / "second.stderr")
        assert await asyncio.wait_for(second.wait(), DEADLINE_S) == 1
        text = _read(tmp_path / "second.stderr")
        assert f"fiomon root: another root (pid {first.pid}) uses the state directory" in text
    finally:
        if first.returncode is None:
            first.terminate()
        assert await asyncio.wait_for(first.wait(), DEADLINE_S) == 0, _read(
            tmp_path / "first.stderr"
        )


def _root_config(tmp: Path, port: int) -> Path:
    cfg = tmp / "root.yaml"
    cfg.write_text(
        f"broker: {{host: 127.0.0.1, port: {port}}}\nclient_id: root-lock\n"
        f"listen: 127.0.0.1:{free_port()}\nstate_dir: {tmp / 'state'}\nalign: epoch\n"
        "lateness: 10s\nroot: {cells: [c1]}\n"
    )
    return cfg


def _read(path: Path) -> str:
    return path.read_text()


async def _root(config: Path, err: Path) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIOMON_")}
    with err.open("wb") as fh:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fiomon", "root", "--config", str(config), env=env, stderr=fh
        )
