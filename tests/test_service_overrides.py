"""Service settings from flags and the environment: flag > environment > file, for real.

Each case starts the real ``fiomon aggregator`` (or agent) with a file that points at a
broker port where nothing listens, so only an override that wins can make it subscribe on
the test's Mosquitto; ``/metrics`` answers only on the address that wins.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.conftest import DEADLINE_S, Mosquitto, free_port, until


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _files(tmp: Path, command: str, config: str) -> tuple[Path, Path]:
    """The config file, written, and where the service's stderr goes."""
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / f"{command}.yaml"
    cfg.write_text(config)
    return cfg, tmp / f"{command}.stderr"


async def _run(
    tmp: Path, command: str, config: str, env: dict[str, str], *flags: str
) -> tuple[asyncio.subprocess.Process, Path]:
    cfg, err = _files(tmp, command, config)
    with err.open("wb") as fh:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "fiomon",
            command,
            "--config",
            str(cfg),
            *flags,
            env={k: v for k, v in os.environ.items() if not k.startswith("FIOMON_")} | env,
            stderr=fh,
        )
    return proc, err


async def _stop(proc: asyncio.subprocess.Process) -> int:
    proc.terminate()
    return await asyncio.wait_for(proc.wait(), DEADLINE_S)


async def test_environment_beats_the_file_and_a_flag_beats_both(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    dead, file_port, env_port, flag_port = free_port(), free_port(), free_port(), free_port()
    good = f"127.0.0.1:{mosquitto.port}"

    def config(client_id: str) -> str:
        return (
            f"broker: {{host: 127.0.0.1, port: {dead}}}\nclient_id: {client_id}\n"
            f"listen: 127.0.0.1:{file_port}\n"
        )

    env = {
        "FIOMON_BROKER": good,
        "FIOMON_LISTEN": f"127.0.0.1:{env_port}",
        "FIOMON_LOG_FORMAT": "json",
    }
    proc, err = await _run(tmp_path / "env", "aggregator", config("agg-env"), env)
    try:
        await mosquitto.wait_for_log("agg-env 1 fiomon/v1/+/records")
        await until(lambda: _answers(env_port), what=f"/metrics on FIOMON_LISTEN :{env_port}")
        assert not _answers(file_port)
    finally:
        assert await _stop(proc) == 0
    docs = [json.loads(line) for line in err.read_text().splitlines()]
    assert {d["level"] for d in docs} <= {"info", "warning"}
    assert any(d["msg"] == f"broker {good} (from FIOMON_BROKER)" for d in docs), docs

    env |= {"FIOMON_BROKER": f"127.0.0.1:{dead}"}  # now only the flag points at the broker
    flags = ["--broker", good, "--listen", f"127.0.0.1:{flag_port}", "--log-format", "text"]
    proc, err = await _run(tmp_path / "flag", "aggregator", config("agg-flag"), env, *flags)
    try:
        await mosquitto.wait_for_log("agg-flag 1 fiomon/v1/+/records")
        await until(lambda: _answers(flag_port), what=f"/metrics on --listen :{flag_port}")
        assert not _answers(env_port) and not _answers(file_port)
    finally:
        assert await _stop(proc) == 0
    lines = err.read_text().splitlines()
    assert lines and all(re.match(r"\d{4}-\d\d-\d\dT[\d:.]+Z [A-Z]+ fiomon", x) for x in lines)
    assert f"broker {good} (from --broker)" in lines[0]


async def test_the_agent_takes_its_broker_from_the_environment(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    config = (
        f"broker: {{port: {free_port()}}}\nhost: ovr\nwatch: ['{tmp_path}/*.json']\n"
        f"state_dir: {tmp_path}/state\n"
    )
    env = {"FIOMON_BROKER": f"localhost:{mosquitto.port}"}
    proc, err = await _run(tmp_path / "a", "agent", config, env)
    try:
        await mosquitto.wait_for_log("as fiomon-agent-ovr ")
    finally:
        assert await _stop(proc) == 0
    assert "(from FIOMON_BROKER)" in err.read_text()


async def test_a_bad_override_is_a_usage_error_that_names_its_source(tmp_path: Path) -> None:
    config = f"broker: {{port: {free_port()}}}\n"
    for env, flags, source in [
        ({"FIOMON_BROKER": "broker:99999"}, (), "FIOMON_BROKER: port must be a number"),
        ({"FIOMON_LISTEN": "localhost"}, (), "FIOMON_LISTEN: expected host:port"),
        ({}, ("--broker", ":1883"), "--broker: expected HOST or HOST:PORT"),
        ({"FIOMON_LOG_FORMAT": "yaml"}, (), "FIOMON_LOG_FORMAT: expected one of"),
    ]:
        proc, err = await _run(tmp_path, "aggregator", config, env, *flags)
        assert await asyncio.wait_for(proc.wait(), DEADLINE_S) == 2
        assert source in err.read_text()
