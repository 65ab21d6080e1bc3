"""fiomon summary on fio's per-I/O latency logs (real fio): IOstats' statistics, exactly.

Every expected number is computed here with NumPy from the raw lines of the same logs:
the time between operations of one type (per file, consecutive stamps of that direction),
bytes per request, bytes per second per request and of total time, exact latency
statistics and nearest-rank percentiles; counts are fio's own ``total_ios``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.fiorun import fiomon, last_document, start_fio, wait_fio

I64 = npt.NDArray[np.int64]

JOB = """[global]
ioengine=psync
rw=randrw
bssplit=4k/50:16k/30:64k/20
size=4m
filename={data}
time_based
runtime=2
rate_iops=150
write_lat_log=P
log_avg_msec=0
log_unix_epoch={epoch}
numjobs=2
{extra}
[j]
"""
# Percentiles in thousandths of a per cent, so that the ranks are exact integers here.
PCT_MILLI = {"50": 50_000, "90": 90_000, "99": 99_000, "99.9": 99_900}
DIRS = {"read": (0,), "write": (1,), "all": (0, 1, 2)}


def run_fio(fio_bin: str, folder: Path, *, epoch: int = 0, extra: str = "") -> dict[str, Any]:
    """A short rate-limited randrw run of two jobs in ``folder``; fio's final json document."""
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.fio"
    job.write_text(JOB.format(data=folder / "data", epoch=epoch, extra=extra))
    wait_fio([start_fio(fio_bin, job, folder / "fio.json", fmt="json")])
    return last_document(folder / "fio.json")


def fio_ios(doc: dict[str, Any], directions: tuple[int, ...], jobs: slice = slice(None)) -> int:
    """fio's total_ios of these directions over these jobs."""
    names = [("read", "write", "trim")[d] for d in directions]
    return sum(int(j[d]["total_ios"]) for j in doc["jobs"][jobs] for d in names)


def lines(path: Path) -> I64:
    """The raw per-I/O lines: time_ms, value_ns, ddir, bs[, offset][, prio]."""
    return np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)


def summary(*args: str | Path) -> tuple[dict[str, dict[str, Any]], str]:
    """``fiomon summary --format json ARGS``: per operation, and stderr."""
    r = fiomon("summary", "--format", "json", "--percentiles", ",".join(PCT_MILLI), *args)
    assert r.returncode == 0, r.stderr
    return {s["operation"]: s for s in json.loads(r.stdout)}, r.stderr


def nearest(values: I64, milli: int) -> int:
    """x_(ceil(p * n / 100)) with p = milli / 1000, in integers."""
    rank = max(1, -(-values.size * milli // 100_000))
    return int(np.sort(values)[rank - 1])


def expected(files: list[I64], dirs: tuple[int, ...]) -> tuple[I64, I64, I64]:
    """Latencies, sizes and the pooled per-file inter-arrival gaps of these directions."""
    sel = [f[np.isin(f[:, 2], dirs)] for f in files]
    gaps = [np.diff(s[:, 0]) for s in sel]
    return (
        np.concatenate([s[:, 1] for s in sel]),
        np.concatenate([s[:, 3] for s in sel]),
        np.concatenate(gaps),
    )


def test_interarrival_and_request_statistics_equal_numpy_on_the_same_lines(
    tmp_path: Path, fio_bin: str
) -> None:
    doc = run_fio(fio_bin, tmp_path, epoch=1, extra="log_offset=1")
    logs = sorted(tmp_path.glob("P_clat.*.log"))
    assert len(logs) == 2
    files = [lines(p) for p in logs]
    # The lat and slat logs of the same I/Os are named and left out, not counted again.
    got, err = summary(*sorted(tmp_path.glob("P_*.log")))
    assert "P_lat.1.log" in err
    for name, dirs in DIRS.items():
        lat, bs, gaps = expected(files, dirs)
        s = got[name]
        assert s["ios"] == lat.size == fio_ios(doc, dirs)
        assert s["bytes"] == int(bs.sum())
        assert s["min_ns"] == lat.min()
        assert s["max_ns"] == lat.max()
        assert s["mean_ns"] == pytest.approx(lat.mean(), rel=1e-12)
        assert s["stddev_ns"] == pytest.approx(lat.std(), rel=1e-9)
        for key, milli in PCT_MILLI.items():
            assert s["percentiles_ns"][key] == nearest(lat, milli), key
        assert sum(h["ios"] for h in s["histogram"]) + s["below_histogram"] + s[
            "above_histogram"
        ] == pytest.approx(lat.size)

        io = s["per_io"]
        assert io["total_latency_ns"] == int(lat.sum())
        rb = io["request_bytes"]
        assert (rb["count"], rb["total_bytes"]) == (bs.size, int(bs.sum()))
        assert (rb["min_bytes"], rb["max_bytes"]) == (bs.min(), bs.max())
        assert rb["mean_bytes"] == pytest.approx(bs.mean(), rel=1e-12)
        assert rb["stddev_bytes"] == pytest.approx(bs.std(), rel=1e-9)
        rate = bs[lat > 0] * 1e9 / lat[lat > 0]
        rq = io["request_bytes_per_second"]
        assert rq["count"] + io["zero_latency"] == lat.size
        assert rq["mean_bytes_per_second"] == pytest.approx(rate.mean(), rel=1e-9)
        assert rq["min_bytes_per_second"] == pytest.approx(rate.min(), rel=1e-12)
        assert rq["max_bytes_per_second"] == pytest.approx(rate.max(), rel=1e-12)
        assert io["bytes_per_second_of_total_time"] == pytest.approx(
            bs.sum() * 1e9 / lat.sum(), rel=1e-12
        )

        ia = io["interarrival"]
        assert gaps.min() >= 0  # one job per file: its stamps never go back
        assert ia["count"] == gaps.size == lat.size - len(logs)
        assert ia["restarts"] == 0
        assert (ia["min_ms"], ia["max_ms"]) == (gaps.min(), gaps.max())
        assert ia["mean_ms"] == pytest.approx(gaps.mean(), rel=1e-12)
        assert ia["stddev_ms"] == pytest.approx(gaps.std(), rel=1e-9)
        assert ia["variance_ms2"] == pytest.approx(gaps.var(), rel=1e-9)
        assert ia["same_stamp"] == np.count_nonzero(gaps == 0)
        for key, milli in PCT_MILLI.items():
            assert ia["percentiles_ms"][key] == nearest(gaps, milli), key
        assert sum(h["gaps"] for h in ia["histogram"]) + ia["same_stamp"] == gaps.size


def test_host_and_job_filters_select_their_files(tmp_path: Path, fio_bin: str) -> None:
    docs = {}
    for host in ("c1", "c2"):
        docs[host] = run_fio(fio_bin, tmp_path / host)
    logs = sorted(tmp_path.glob("c*/P_clat.*.log"))
    assert len(logs) == 4
    everything, _ = summary(*logs)
    assert everything["all"]["ios"] == sum(fio_ios(d, DIRS["all"]) for d in docs.values())
    for host, doc in docs.items():
        got, _ = summary(*logs, "--host", host)
        assert got["all"]["ios"] == fio_ios(doc, DIRS["all"]), host
        assert got["read"]["ios"] == fio_ios(doc, (0,)), host
    # --job keeps the files whose name holds it: thread 2 of both hosts.
    job2 = [p for p in logs if p.name == "P_clat.2.log"]
    got, _ = summary(*logs, "--job", "P_clat.2.")
    assert got["all"]["ios"] == sum(lines(p).shape[0] for p in job2)
    assert got["all"]["per_io"]["interarrival"]["count"] == got["all"]["ios"] - len(job2)
    got, _ = summary(*logs, "--job", "P_clat.2.", "--host", "c2")
    assert got["all"]["ios"] == lines(tmp_path / "c2" / "P_clat.2.log").shape[0]
    # --from/--to keep the I/Os stamped in (from, to]: relative stamps, seconds since start
    got, _ = summary(*logs, "--from", "0.5", "--to", "1.5")
    stamps = np.concatenate([lines(p)[:, 0] for p in logs])
    assert got["all"]["ios"] == np.count_nonzero((stamps > 500) & (stamps <= 1500))


def test_a_bad_line_is_named_and_skipped(tmp_path: Path, fio_bin: str) -> None:
    doc = run_fio(fio_bin, tmp_path / "run")
    bad = tmp_path / "P_clat.1.log"
    text = (tmp_path / "run" / "P_clat.1.log").read_text().splitlines(keepends=True)
    bad.write_text("".join([*text[:2], "12, not-a-number, 0, 4096\n", *text[2:]]))
    got, err = summary(bad)
    assert f"{bad}:3" in err
    assert got["all"]["ios"] == len(text) == fio_ios(doc, DIRS["all"], slice(0, 1))
    assert got["all"]["per_io"]["interarrival"]["count"] == len(text) - 1


def test_jobs_one_after_another_in_one_file_restart_the_sequence(
    tmp_path: Path, fio_bin: str
) -> None:
    # per_job_logs=0: both jobs' lines in one P_clat.log, the second job's after the first's;
    # with epoch stamps the second job's first stamp is before the first job's last.
    doc = run_fio(fio_bin, tmp_path, epoch=1, extra="per_job_logs=0")
    log = tmp_path / "P_clat.log"
    rows = lines(log)
    back = np.flatnonzero(np.diff(rows[:, 0]) < 0)
    assert back.size == 1, "fio wrote the two jobs one after another"
    jobs = [rows[: back[0] + 1], rows[back[0] + 1 :]]
    got, _ = summary(log)
    for name, dirs in DIRS.items():
        lat, _, gaps = expected(jobs, dirs)
        ia = got[name]["per_io"]["interarrival"]
        assert got[name]["ios"] == lat.size == fio_ios(doc, dirs)
        assert ia["count"] == gaps.size
        assert ia["restarts"] == len(jobs) - 1
        assert ia["mean_ms"] == pytest.approx(gaps.mean(), rel=1e-12)
        for key, milli in PCT_MILLI.items():
            assert ia["percentiles_ms"][key] == nearest(gaps, milli), key


def test_text_output_names_every_iostats_statistic(tmp_path: Path, fio_bin: str) -> None:
    run_fio(fio_bin, tmp_path)
    log = tmp_path / "P_clat.1.log"
    r = fiomon("summary", log)
    assert r.returncode == 0, r.stderr
    for phrase in ("total time", "per request", "inter-arrival", "of total time"):
        assert phrase in r.stdout, phrase


def test_an_averaged_log_is_refused_by_name(tmp_path: Path, fio_bin: str) -> None:
    # log_avg_msec > 0: one mean per window and direction, no I/O of its own.
    run_fio(fio_bin, tmp_path, extra="log_avg_msec=200")
    log = tmp_path / "P_clat.1.log"
    r = fiomon("summary", log)
    assert r.returncode == 1
    assert f"{log}: an averaged log" in r.stderr
    assert "log_avg_msec=0" in r.stderr
