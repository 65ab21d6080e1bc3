"""``fiomon compare`` on real fio runs: the same job twice, a throttled phase, a slowed host.

Two fio runs of the same jobs, one after the other (50 s each): two "hosts" (folders
client-01 and client-02, one fio each, running at once), each reading eight loop devices.
The devices' latency is set by the kernel's blkio throttle (reads of 200 ms and 400 ms,
see :mod:`tests.fiothrottle`), because nothing else on this machine repeats from run to
run. In the candidate, client-02's devices are throttled four times as hard from when its
jobs have run 12 s until 32 s; the test records when (the truth the verdicts are held to).
Each host folder also holds fio's json+ status stream of the same jobs (one-truth cases).

Timeline of the candidate (aligned s; ``#`` = client-02 at 800 ms a read and more; the
switch lands up to 2 s late, following fio's status stream)::

    0        10        20        30        40        50
    |--------|---######|#########|#####----|---------|   client-02
    |--------|---------|---------|---------|---------|   client-01
"""

from __future__ import annotations

import io
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from fiomon.cli import build_parser
from fiomon.offline.compare.model import CompareOptions, CompareResult, Verdict
from fiomon.offline.compare.run import RunInput, run_compare, run_files
from fiomon.offline.quanta import QuantaOptions
from fiomon.offline.sources import SourceOptions
from fiomon.tools import comparecmd
from tests.fiorun import fiomon, report_counts, total_ios
from tests.fiothrottle import BASE_READS, Phase, loop_devices, run_hosts
from tests.offline.test_fio_client import final_ios, fio_servers, load

pytestmark = pytest.mark.fio

RUNTIME_S = 50
SLOW_MS = (12_000, 32_000)  # client-02's slow phase, by its jobs' runtime
PCTS = (50.0, 90.0, 99.0)
HOSTS = ("client-01", "client-02")
DEVICES_PER_HOST = 8
WINDOW_MS = 4_000  # of the phase tests: 200 I/Os a cluster window in the phase
SOURCES = ("json", "hist", "both")


@dataclass(frozen=True, slots=True)
class Runs:
    """The two runs' folders and when client-02 really was slow (epoch ms)."""

    baseline: Path
    candidate: Path
    phase: Phase


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, fio_bin: str) -> Runs:
    """Baseline and candidate, 50 s each; the candidate's client-02 slowed for 20 s."""
    root = tmp_path_factory.mktemp("compare-fio")
    with loop_devices(root / "loops", DEVICES_PER_HOST * len(HOSTS)) as loops:
        hosts = {
            h: loops[i * DEVICES_PER_HOST : (i + 1) * DEVICES_PER_HOST] for i, h in enumerate(HOSTS)
        }
        run_hosts(fio_bin, root / "baseline", hosts, runtime=RUNTIME_S)
        phase = run_hosts(
            fio_bin, root / "candidate", hosts, runtime=RUNTIME_S, slow=("client-02", *SLOW_MS)
        )
    assert phase is not None
    return Runs(root / "baseline", root / "candidate", phase)


def hist_logs(folder: Path) -> tuple[Path, ...]:
    logs = tuple(sorted(folder.rglob("h_clat_hist.*.log")))
    assert logs, f"no hist logs in {folder}"
    return logs


def compare(
    baseline: Path, candidate: Path, *, window_ms: int = 10_000, per_host: bool = False
) -> CompareResult:
    """run_compare on the hist logs of two folders."""
    quanta = QuantaOptions(percentiles=PCTS, per_host=per_host)
    return run_compare(
        RunInput("baseline", str(baseline), hist_logs(baseline), SourceOptions()),
        RunInput("candidate", str(candidate), hist_logs(candidate), SourceOptions()),
        CompareOptions(quanta=quanta, window_ms=window_ms),
        io.StringIO(),
    )


def aligned_s(result: CompareResult, epoch_ms: int) -> float:
    """An instant of the candidate in aligned seconds."""
    assert not result.candidate.relative
    return (epoch_ms - result.candidate.origin_ms) / 1000


def windows(result: CompareResult) -> list[Verdict]:
    return [v for v in result.verdicts if not v.whole_run]


def span(v: Verdict) -> tuple[float, float]:
    """A window verdict's aligned start and end, s."""
    assert v.window_start_s is not None
    assert v.window_end_s is not None
    return v.window_start_s, v.window_end_s


def within(v: Verdict, on_s: float, off_s: float) -> bool:
    start, end = span(v)
    return on_s <= start and end <= off_s


def chance(verdicts: list[Verdict]) -> int:
    """How many of ``verdicts`` may be flagged by chance alone: 1 in 20 at 95 %, rounded up.

    Not a formality: this machine's timers also slip now and then (a window of the
    baseline whose p90 was 290 ms for one host, the others' 204 ms).
    """
    return math.ceil(len(verdicts) / 20)


def flagged(v: Verdict) -> bool:
    return v.significant and v.ratio is not None and v.ratio > 1


def show(vs: list[Verdict]) -> str:
    return "\n".join(
        f"{v.window_start_s} {v.scope} {v.host} {v.direction} p{v.percentile:g} "
        f"{v.baseline_ns} {v.candidate_ns} ratio {v.ratio} {v.ratio_ci} {v.significant}"
        for v in vs
    )


@pytest.mark.parametrize(("window_ms", "method"), [(10_000, "mover+bootstrap"), (15_000, "mover")])
def test_the_same_job_twice_differs_in_no_whole_run_p50_or_p90(
    runs: Runs, window_ms: int, method: str
) -> None:
    """client-01 ran the same jobs on the same devices in both runs: no whole-run verdict.

    Its intervals are narrow enough to see a change of a few per cent, so this can fail.
    """
    result = compare(runs.baseline / "client-01", runs.candidate / "client-01", window_ms=window_ms)
    whole = [v for v in result.verdicts if v.whole_run and v.percentile in (50.0, 90.0)]
    print(show(whole))
    assert {v.direction for v in whole} == {"read", "all"}  # every direction with I/O
    for v in whole:
        assert v.scope == "cluster"
        assert v.method == method
        assert not v.significant, show([v])
        low, high = v.ratio_ci
        assert low is not None
        assert high is not None
        assert high / low < 1.1, show([v])  # a 10 % change would be seen
    # 8 devices x 5 reads a second x 50 s, both runs
    for ios in (result.baseline.ios, result.candidate.ios):
        assert 1900 <= ios <= 2010


def test_a_throttled_phase_is_flagged_in_its_windows_and_nowhere_else(runs: Runs) -> None:
    """Cluster windows (4 s) inside client-02's slow phase: p90 up; well outside: nothing."""
    result = compare(runs.baseline, runs.candidate, window_ms=WINDOW_MS)
    on_s, off_s = aligned_s(result, runs.phase.on_ms), aligned_s(result, runs.phase.off_ms)
    print(f"slow phase: {on_s:.2f} .. {off_s:.2f} s (aligned)")
    # the switch follows fio's status stream (a document a second), so a little late
    assert 12 <= on_s <= 15
    assert off_s - on_s == pytest.approx(20, abs=1.5)
    # not the partial windows where fio starts or stops (its jobs' last reads)
    reads = [v for v in windows(result) if v.direction == "read" and not v.partial]
    inside = [v for v in reads if within(v, on_s, off_s)]
    outside = [v for v in reads if span(v)[1] <= on_s - 1 or span(v)[0] >= off_s + 1]
    starts_in = {span(v)[0] for v in inside}
    assert len(starts_in) >= 4, (on_s, off_s)
    for start in starts_in:
        tail = [v for v in inside if span(v)[0] == start and v.percentile in (90.0, 99.0)]
        assert any(flagged(v) for v in tail), show(tail)
    print("outside:\n" + show(outside))
    stray = [v for v in outside if v.significant]
    assert len(stray) <= chance(outside), show(stray)
    assert len({span(v)[0] for v in outside}) >= 4


def test_the_slowed_host_carries_the_regression(runs: Runs) -> None:
    """--per-host: the flagged cluster windows give client-02 a share far above its I/Os'.

    client-02's own windows are flagged in the phase; client-01's no more than by chance.
    """
    result = compare(runs.baseline, runs.candidate, window_ms=WINDOW_MS, per_host=True)
    on_s, off_s = aligned_s(result, runs.phase.on_ms), aligned_s(result, runs.phase.off_ms)
    assert set(result.candidate.hosts) == set(HOSTS)
    cluster = [v for v in windows(result) if v.scope == "cluster" and flagged(v)]
    in_phase = [v for v in cluster if within(v, on_s, off_s)]
    assert len({span(v)[0] for v in in_phase}) >= 4
    for v in in_phase:
        shares = {h.host: h for h in v.hosts}
        hit, calm = shares["client-02"], shares["client-01"]
        # All of client-02's reads are above the baseline's p90 (400 ms), a fifth of the
        # window's. The engine counts the bin of that p90 whole, and a quarter of
        # client-01's reads take exactly 400 ms, so it gets about half the share: the
        # slowed host is told by its share over its I/O share, not by its rank here.
        assert hit.share >= 2 * hit.io_share, v.hosts
        assert calm.share <= calm.io_share, v.hosts
    # the whole run's flagged lines name the hosts too, client-02 above its I/O share
    whole = [v for v in result.verdicts if v.whole_run and v.scope == "cluster" and flagged(v)]
    assert whole
    for v in whole:
        shares = {h.host: h for h in v.hosts}
        assert shares["client-02"].share > shares["client-02"].io_share, v.hosts
        assert shares["client-01"].share < shares["client-01"].io_share, v.hosts
    hosts = [v for v in windows(result) if v.scope == "host" and v.direction == "read"]
    inside = {span(v)[0] for v in hosts if within(v, on_s, off_s)}
    slow = {
        span(v)[0]
        for v in hosts
        if v.host == "client-02" and flagged(v) and v.percentile in (90.0, 99.0)
    }
    assert len(inside) >= 4
    assert inside <= slow, (sorted(inside), sorted(slow))
    # client-01: windows and whole run, by chance only (its p99 rests on the 400 ms
    # reads' few tick-late ones, whose share differs from run to run)
    others = [
        v
        for v in result.verdicts
        if v.host == "client-01" and v.direction == "read" and not v.partial
    ]
    stray = [v for v in others if v.significant]
    assert len(stray) <= chance(others), show(stray)
    whole_01 = [v for v in others if v.whole_run and v.percentile in (50.0, 90.0)]
    assert len(whole_01) == 2
    assert not any(v.significant for v in whole_01), show(whole_01)


def compare_cli(baseline: Path, candidate: Path, *flags: str) -> CompareResult:
    """What ``fiomon compare BASELINE CANDIDATE FLAGS`` computes (its own reading of runs)."""
    args = build_parser().parse_args(["compare", str(baseline), str(candidate), *flags])
    b, c = (comparecmd._run_input(args, name) for name in ("baseline", "candidate"))
    return run_compare(b, c, comparecmd._options(args, b, c), io.StringIO())


def test_a_run_folder_with_both_views_counts_each_io_once(runs: Runs) -> None:
    """json+ streams and the hist logs of the same jobs in one folder: report's --source rules."""
    folders = {"baseline": runs.baseline, "candidate": runs.candidate}
    refused = fiomon("compare", runs.baseline, runs.candidate)
    by_report = fiomon("report", *run_files(str(runs.baseline)))
    assert refused.returncode == by_report.returncode == 2, refused.stderr
    for r in (refused, by_report):
        assert "describe the same I/Os twice" in r.stderr
        assert "--source json" in r.stderr
    ios = {s: compare_cli(runs.baseline, runs.candidate, "--source", s) for s in SOURCES}
    # fio never writes a job's last partial interval (1 s) to its hist log: 5 reads a
    # job at most, one more when a read ends on a timer tick at the interval's edge
    per_job_second = BASE_READS + 1
    for name, folder in folders.items():
        got = {s: getattr(result, name).ios for s, result in ios.items()}
        print(name, got)
        files = run_files(str(folder))
        for s in SOURCES:
            counted = report_counts("--source", s, *files)
            assert got[s] == round(sum(counted.values())), (s, counted)
        assert got["json"] == sum(total_ios(folder / h / "out.json") for h in HOSTS)
        assert got["both"] == got["json"] + got["hist"]
        jobs = DEVICES_PER_HOST * len(HOSTS)
        assert got["json"] - jobs * per_job_second <= got["hist"] <= got["json"]


CLIENT_JOB = """[j]
ioengine=psync
rw=randread
bs=4k
size=4m
filename={data}
time_based
runtime=4
rate_iops=100
write_hist_log=h
log_hist_msec=1000
log_unix_epoch=1
"""


def test_a_client_server_run_counts_each_server_s_ios_once(tmp_path: Path, fio_bin: str) -> None:
    """fio --client to two servers: its json+ document and the hist logs it wrote per server."""
    run = tmp_path / "run"
    run.mkdir()
    job = tmp_path / "job.fio"
    job.write_text(CLIENT_JOB.format(data=tmp_path / "data"))
    servers = ("127.0.0.2", "127.0.0.3")
    with fio_servers(fio_bin, servers) as port:
        cmd = [fio_bin]
        for ip in servers:
            cmd += [f"--client=ip:{ip},{port}", str(job)]
        cmd += ["--status-interval=1", "--output-format=json+", "--output=out.json"]
        r = subprocess.run(cmd, cwd=run, capture_output=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr
    assert len(list(run.glob("h_clat_hist.1.log.*"))) == len(servers)
    truth = final_ios(load(run / "out.json"))  # per server, fio's own totals
    assert set(truth) == set(servers)
    files = run_files(str(run))
    ios = {}
    for s in SOURCES:
        result = compare_cli(run, run, "--source", s, "--per-host", "--window", "1s")
        assert set(result.baseline.hosts) == set(servers)
        ios[s] = result.baseline.ios
        assert ios[s] == round(sum(report_counts("--source", s, *files).values()))
        whole = [v for v in result.verdicts if v.whole_run and v.scope == "host"]
        assert {v.host for v in whole} == set(servers)
        assert all(v.ratio == 1 for v in whole)
    print(truth, ios)
    assert ios["json"] == sum(truth.values())
    assert ios["both"] == ios["json"] + ios["hist"]
    # fio --client writes no server's last interval (1 s at 100 IOPS, rate catching up)
    assert ios["json"] - len(servers) * 110 <= ios["hist"] < ios["json"]
