"""SIGHUP with command-line overrides, on real processes: no change nobody made is reported.

An aggregator and a root are started as ``python -m fiomon ...`` with a file that points
at a broker port where nothing listens and at another ``/metrics`` address, and with
``--broker``, ``--listen`` and ``--log-level`` over it (so only the overrides make them
subscribe on the test's Mosquitto). A SIGHUP with the file unchanged must reload with
"no changes" and name nothing as changed; a real edit of the file is still reported.
Before the overrides were carried as data, a reload re-read the file alone: the
aggregator logged "broker, listen changed but take effect at the next start" at every
SIGHUP, and the root "log_level kept (set by --log-level)".
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from tests.conftest import DEADLINE_S, Mosquitto, free_port, until


def _files(tmp: Path, command: str, config: str) -> tuple[Path, Path]:
    """The config file, written, and where the service's stderr goes."""
    tmp.mkdir(parents=True, exist_ok=True)
    cfg, err = tmp / f"{command}.yaml", tmp / f"{command}.stderr"
    cfg.write_text(config)
    return cfg, err


def _lines(err: Path) -> list[str]:
    return err.read_text().splitlines()


async def _start(
    tmp: Path, command: str, config: str, *flags: str
) -> tuple[asyncio.subprocess.Process, Path]:
    """The service as a real process; returns it and its stderr file."""
    cfg, err = _files(tmp, command, config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIOMON_")}
    with err.open("wb") as fh:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "fiomon",
            command,
            "--config",
            str(cfg),
            "--log-format",
            "text",
            *flags,
            env=env,
            stderr=fh,
        )
    return proc, err


def _reloads(err: Path) -> list[str]:
    return [x for x in _lines(err) if "SIGHUP: reloaded" in x]


async def _hup(proc: asyncio.subprocess.Process, err: Path) -> str:
    """SIGHUP, then the lines logged up to and including the reload's summary line."""
    before = len(_lines(err))
    n = len(_reloads(err))
    proc.send_signal(signal.SIGHUP)
    await until(lambda: len(_reloads(err)) > n, what="the reload's summary line")
    return "\n".join(_lines(err)[before:])


async def _check(
    mosquitto: Mosquitto,
    tmp: Path,
    command: str,
    *,
    config: str,
    subscribed: str,
    edit: tuple[str, str],
    reported: str,
) -> None:
    good = f"127.0.0.1:{mosquitto.port}"
    listen = f"127.0.0.1:{free_port()}"
    flags = ("--broker", good, "--listen", listen, "--log-level", "info")
    proc, err = await _start(tmp, command, config, *flags)
    try:
        await mosquitto.wait_for_log(subscribed)
        text = await _hup(proc, err)
        assert "changed" not in text and "kept" not in text, text
        assert text.splitlines()[-1].endswith(": no changes"), text
        # A real edit is still reported (and the overrides still are not).
        _files(tmp, command, config.replace(*edit))
        text = await _hup(proc, err)
        changed = [x for x in text.splitlines() if "changed" in x]
        assert len(changed) == 1 and changed[0].endswith(reported), text
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), DEADLINE_S) == 0, _lines(err)


async def test_an_aggregator_with_overrides_reloads_without_a_change_nobody_made(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    config = (
        f"broker: {{host: 127.0.0.1, port: {free_port()}}}\nclient_id: agg-hup\n"
        f"listen: 127.0.0.1:{free_port()}\nlog_level: warning\nlateness: 5s\n"
    )
    await _check(
        mosquitto,
        tmp_path,
        "aggregator",
        config=config,
        subscribed="agg-hup 1 fiomon/v1/+/records",
        edit=("lateness: 5s", "lateness: 7s"),
        reported="reload: lateness_ms changed but take effect at the next start",
    )


async def test_a_root_with_overrides_reloads_without_a_change_nobody_made(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    config = (
        f"broker: {{host: 127.0.0.1, port: {free_port()}}}\nclient_id: root-hup\n"
        f"listen: 127.0.0.1:{free_port()}\nlog_level: warning\nalign: epoch\n"
        "lateness: 10s\nroot: {cells: [c1]}\n"
    )
    await _check(
        mosquitto,
        tmp_path,
        "root",
        config=config,
        subscribed="root-hup 1 fiomon/v1/_partials/+",
        edit=("lateness: 10s", "lateness: 12s"),
        reported="reload: lateness_ms changed but take effect at the next start",
    )
