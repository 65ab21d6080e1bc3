"""``fiomon compare`` against ground truth, on one real fio run as fio leaves it.

One 8 s fio job (json+ with --status-interval=1, a hist log, per-I/O latency logs) is
compared with itself: the numbers compare prints must be the per-I/O logs' exact
nearest-rank percentiles (``fiomon report``'s exact rows), a json+ document that holds
the whole run in one record must not be spread over windows as if each had been
measured, and inputs compare cannot read must give a message naming the run, not a
traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DEADLINE_S
from tests.fiorun import start_fio, wait_fio

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_S = 8
JOB = """[global]
ioengine=psync
rw=randread
bs=4k
size=4m
filename={data}
time_based
runtime={runtime}
rate_iops=200
log_hist_msec=1000
write_hist_log=r
write_lat_log=r
log_avg_msec=0
log_unix_epoch=1
[reader]
"""


@dataclass(frozen=True)
class Run:
    """The run's folder (``run/``: job file, json+ stream, logs, data) and a cwd around it."""

    cwd: Path
    folder: Path
    clat_log: Path


@pytest.fixture(scope="module")
def run(fio_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    cwd = tmp_path_factory.mktemp("breaker")
    folder = cwd / "run"
    folder.mkdir()
    job = folder / "job.fio"
    job.write_text(JOB.format(data=folder / "data", runtime=RUNTIME_S))
    wait_fio([start_fio(fio_bin, job, folder / "out.json")])
    return Run(cwd, folder, folder / "r_clat.1.log")


def fiomon(run: Run, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fiomon", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 2,
        check=False,
        cwd=run.cwd,
        env={**os.environ, "TZ": "UTC", "PYTHONPATH": str(ROOT)},
    )


def jsonl(r: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "garbage"], "candidate garbage:"),
        (["--latency", "lat", "--source", "json", "run", "run"], "baseline run:"),
    ],
)
def test_unreadable_input_is_a_message_naming_the_run_not_a_traceback(
    run: Run, args: list[str], says: str
) -> None:
    """An ``InputError`` re-raised with the run's name went through ``type(exc)(message)``,
    which ``InputError(refusals)`` cannot take: a ValueError traceback, exit 1."""
    (run.cwd / "garbage").mkdir(exist_ok=True)
    (run.cwd / "garbage" / "x_clat_hist.1.log").write_text("garbage\n")
    r = fiomon(run, "compare", *args)
    assert r.returncode == 1, r.stdout
    assert "Traceback" not in r.stderr
    assert says in r.stderr.splitlines()[-1] or says in r.stderr
