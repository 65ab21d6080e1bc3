"""Real fio runs for the pairing tests: short rate-limited jobs, fio's own totals, reports."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.conftest import DEADLINE_S

JOB = """[global]
ioengine=psync
rw={rw}
bs=4k
size=1m
filename={data}
time_based
runtime={runtime}
rate_iops={iops}
log_hist_msec=250
log_unix_epoch={epoch}
{extra}
[j]
"""


def job_file(
    folder: Path,
    *,
    prefix: str | None = "run",
    iops: int = 100,
    runtime: int = 2,
    rw: str = "randread",
    epoch: int = 1,
    extra: str = "",
    name: str = "job.fio",
) -> Path:
    """A job file in ``folder`` (its data file there too)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = extra + (f"\nwrite_hist_log={prefix}" if prefix else "")
    path = folder / name
    data = folder / "data"
    path.write_text(
        JOB.format(rw=rw, data=data, runtime=runtime, iops=iops, epoch=epoch, extra=lines)
    )
    return path


def start_fio(
    fio_bin: str,
    job: Path,
    out: Path,
    *,
    fmt: str = "json+",
    interval: int = 1,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """fio running ``job`` with its status stream in ``out`` (working folder: the job's)."""
    return subprocess.Popen(
        [
            fio_bin,
            str(job),
            f"--status-interval={interval}",
            f"--output-format={fmt}",
            f"--output={out}",
        ],
        cwd=cwd or job.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def wait_fio(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Wait for fio processes; each must succeed."""
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err


def last_document(path: Path) -> dict[str, Any]:
    """The last JSON document of a fio status file."""
    text = path.read_text()
    decoder = json.JSONDecoder()
    pos, last = 0, None
    while (start := text.find("{", pos)) >= 0:
        doc, pos = decoder.raw_decode(text, start)
        last = doc
    assert isinstance(last, dict)
    return last


def total_ios(path: Path) -> int:
    """fio's own count of I/Os: every job's total_ios in its final document."""
    doc = last_document(path)
    return sum(
        int(job[d]["total_ios"])
        for job in doc["jobs"]
        for d in ("read", "write", "trim")
        if isinstance(job.get(d), dict)
    )


def fiomon(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m fiomon ARGS``."""
    return subprocess.run(
        [sys.executable, "-m", "fiomon", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 2,
        check=False,
    )


def report_counts(*args: str | Path) -> dict[str, float]:
    """Samples per host (``""`` without --per-host) of ``fiomon report ... --format jsonl``."""
    r = fiomon("report", "--format", "jsonl", "--directions", "all", *args)
    assert r.returncode == 0, r.stderr
    counts: dict[str, float] = {}
    per_host = "--per-host" in args
    for line in r.stdout.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row["direction"] != "all" or row["scope"] != ("host" if per_host else "cluster"):
            continue
        host = str(row["host"] or "")
        counts[host] = counts.get(host, 0.0) + float(row["samples"])
    return {h: round(n, 3) for h, n in counts.items()}
