"""The state directory of both services: one lock rule, one refusal, one close."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from fiomon.config import AggregatorConfig
from fiomon.errors import StateLockedError
from fiomon.server.metrics import Counts
from fiomon.server.state import GRID_STATE_FILE, StateDir

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
