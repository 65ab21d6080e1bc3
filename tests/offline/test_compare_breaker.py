"""``fiomon compare`` against ground truth, on one real fio run as fio leaves it.

One 8 s fio job (json+ with --status-interval=1, a hist log, per-I/O latency logs) is
compared with itself: the numbers compare prints must be the per-I/O logs' exact
nearest-rank percentiles (``fiomon report``'s exact rows), a json+ document that holds
the whole run in one record must not be spread over windows as if each had been
measured, and inputs compare cannot read must give a message naming the run, not a
traceback. Two more fio jobs run beside it as a candidate of two hosts (``hosts/client-01``
reads 4 KiB, ``hosts/client-02`` 256 KiB blocks: every I/O slower than the baseline's
median), for the attribution of a regression to a host, and ``rw/`` reads and writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import DEADLINE_S
from tests.fiorun import start_fio, wait_fio

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_S = 8
JOB = """[global]
ioengine=psync
rw={rw}
bs={bs}
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
    slow_log: Path  # hosts/client-02's per-I/O log


@pytest.fixture(scope="module")
def run(fio_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    cwd = tmp_path_factory.mktemp("breaker")
    procs = []
    for name, bs, rw in (
        ("run", "4k", "randread"),
        ("hosts/client-01", "4k", "randread"),
        ("hosts/client-02", "256k", "randread"),
        ("rw", "4k", "randrw"),
    ):
        folder = cwd / name
        folder.mkdir(parents=True)
        job = folder / "job.fio"
        job.write_text(JOB.format(data=folder / "data", runtime=RUNTIME_S, bs=bs, rw=rw))
        procs.append(start_fio(fio_bin, job, folder / "out.json"))
    wait_fio(procs)
    run = cwd / "run"
    return Run(cwd, run, run / "r_clat.1.log", cwd / "hosts" / "client-02" / "r_clat.1.log")


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


def test_per_io_log_windows_are_the_exact_nearest_rank_of_report_s_rows(run: Run) -> None:
    """Per-I/O logs win over the json+ stream and hist log because they are exact: so must
    compare's windows be (they were the values binned in fio's layout: p50 91,496 ns where
    the I/Os' own nearest rank and ``fiomon report`` say 91,467; one I/O shown as three
    different percentiles)."""
    got = jsonl(fiomon(run, "compare", "--format", "jsonl", "--window", "2s", "run", "run"))
    windows = [v for v in got if v["window_start_s"] is not None and v["direction"] == "read"]
    assert windows
    # Aligned 0 is the run's first 1 s quantum; report's 2 s rows on the same grid.
    first = json.loads(
        fiomon(run, "report", "--format", "jsonl", str(run.clat_log)).stdout[:4000].splitlines()[0]
    )
    origin = int(first["start_ms"])
    rows = {
        (r["start_ms"] - origin) / 1000: r
        for r in jsonl(
            fiomon(
                run,
                "report",
                "--format",
                "jsonl",
                "--quantum",
                "2s",
                "--align",
                f"{origin % 2000}ms",
                "--directions",
                "read",
                str(run.clat_log),
            )
        )
        if r["scope"] == "cluster"
    }
    lines = np.loadtxt(run.clat_log, delimiter=",", usecols=(0, 1), dtype=np.int64, ndmin=2)
    for v in windows:
        row = rows[v["window_start_s"]]
        key = f"{v['percentile']:g}"
        assert v["baseline_ios"] == row["samples"]
        assert v["baseline_ns"] == pytest.approx(row["percentiles_ns"][key], rel=5e-6)
        for mine, theirs in zip(v["baseline_ci_ns"], row["percentiles_ci_ns"][key], strict=True):
            assert (mine is None) == (theirs is None)
            if mine is not None:
                assert mine == pytest.approx(theirs, rel=5e-6)
        # The I/Os' own nearest rank (fio stamps completions; a window is (start, end]).
        start = origin + v["window_start_s"] * 1000
        values = np.sort(lines[(lines[:, 0] > start) & (lines[:, 0] <= start + 2000), 1])
        rank = int(np.ceil(round(v["percentile"] * len(values) * 1000) / 100_000))
        assert v["baseline_ns"] == pytest.approx(values[max(rank, 1) - 1], rel=5e-6)


def test_a_host_slower_than_the_baseline_s_value_carries_all_its_i_os_above_it(run: Run) -> None:
    """Attribution counts a candidate host's I/Os in bins above the baseline's value; a
    host whose I/Os all lie above it lost its lowest bin (its columns start there, and
    the threshold's bin was taken as the first column): 1,999 of 2,000, and 0 for a host
    whose I/Os all fall in one bin."""
    args = ["--window", "2s", "--directions", "read", "--percentiles", "50", "run", "hosts"]
    got = jsonl(fiomon(run, "compare", "--format", "jsonl", *args))
    logs = [str(run.cwd / "hosts" / h / "r_clat.1.log") for h in ("client-01", "client-02")]
    first = fiomon(run, "report", "--format", "jsonl", *logs).stdout.splitlines()[0]
    origin = int(json.loads(first)["start_ms"])
    lines = np.loadtxt(run.slow_log, delimiter=",", usecols=(0, 1), dtype=np.int64, ndmin=2)
    checked = 0
    for v in got:
        if v["window_start_s"] is None or not v["hosts"]:
            continue
        start = origin + v["window_start_s"] * 1000
        mine = lines[(lines[:, 0] > start) & (lines[:, 0] <= start + 2000), 1]
        assert mine.min() > v["baseline_ns"]  # the premise: 256 KiB reads are all slower
        share = {h["host"]: h for h in v["hosts"]}["client-02"]
        assert share["above"] == len(mine)
        checked += 1
    assert checked >= 3


def test_one_json_document_of_the_whole_run_is_refused_not_spread_over_windows(run: Run) -> None:
    """fio's json+ output without --status-interval is one record of the whole run: each
    window got an even share of it and printed the whole run's percentiles as if measured
    there ('worse' in every window, exit 0)."""
    text = (run.folder / "out.json").read_text()
    last = text[text.rindex('{\n  "fio version"') :]
    final = run.cwd / "final"
    final.mkdir(exist_ok=True)
    (final / "final.json").write_text(last)
    r = fiomon(run, "compare", "--window", "2s", "--directions", "read", "final", "final")
    assert r.returncode == 1, r.stdout
    assert "Traceback" not in r.stderr
    assert "baseline final:" in r.stderr
    assert "--window" in r.stderr
    # One window as long as the run: the whole-run comparison it can give.
    got = jsonl(fiomon(run, "compare", "--format", "jsonl", "--window", "1h", "final", "final"))
    assert {v["window_start_s"] for v in got} == {0.0, None}


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


def test_the_whole_run_header_names_only_the_windows_both_runs_have(run: Run) -> None:
    """With --shift the windows at the ends are one run's only; the header said the
    whole-run lines covered them."""
    args = ["--window", "2s", "--shift", "4s", "--directions", "read", "run", "run"]
    got = jsonl(fiomon(run, "compare", "--format", "jsonl", *args))
    both = [
        v
        for v in got
        if v["window_start_s"] is not None and v["baseline_ios"] and v["candidate_ios"]
    ]
    only = [v for v in got if v["window_start_s"] is not None and not v["candidate_ios"]]
    assert only  # the baseline's last windows
    low = min(v["window_start_s"] for v in both)
    high = max(v["window_end_s"] for v in both)
    span = f"within {low:g} .. {high:g} s"
    r = fiomon(run, "compare", *args)
    assert r.returncode == 0, r.stderr
    assert f"whole run (the windows both runs have, {span}):" in r.stdout


def test_all_is_not_compared_when_one_run_has_a_direction_the_other_lacks(run: Run) -> None:
    """A read-only baseline against a candidate that also writes: the note said the writes
    were "not compared", yet the ``all`` lines compared the baseline's reads with the
    candidate's reads and writes (whole-run 'worse' from the writes alone)."""
    r = fiomon(run, "compare", "--format", "jsonl", "--percentiles", "50", "run", "rw")
    got = jsonl(r)
    assert {v["direction"] for v in got} == {"read"}
    assert "only the candidate has I/O in write" in r.stderr
    assert "all: not compared" in r.stderr
    # The same mix on both sides: all is compared.
    both = jsonl(fiomon(run, "compare", "--format", "jsonl", "--percentiles", "50", "rw", "rw"))
    assert {v["direction"] for v in both} == {"read", "write", "all"}


def test_a_run_ends_at_its_last_quantum_not_its_last_window(run: Run) -> None:
    """The rows are the windows, so a run's end was its last window's end: a point 2 s
    after the 8 s run was taken as inside it (exit 0), and the figure gave the run's
    length as the windows' (25 s for a 20 s run)."""
    after = f"+{RUNTIME_S + 2}s"
    r = fiomon(run, "compare", "--align-at", f"baseline={after},candidate=+1s", "run", "run")
    assert r.returncode == 1, r.stdout
    assert "outside the baseline run" in r.stderr
    assert "Traceback" not in r.stderr
    inside = fiomon(run, "compare", "--align-at", "baseline=+5s,candidate=+5s", "run", "run")
    assert inside.returncode == 0, inside.stderr
