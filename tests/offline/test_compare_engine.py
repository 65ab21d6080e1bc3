"""``fiomon compare``'s engine: windows equal the report's rows, ratios, alignment, parts.

Simulated hist logs (:mod:`fiomon.tools.simulate`, fio's format and bins) with known
slow windows; the report's own rows are the ground truth of what a window holds.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest

from fiomon.bins import BinLayout
from fiomon.errors import FiomonError
from fiomon.offline.compare.align import parse_align_at, time_of_day_at
from fiomon.offline.compare.model import AlignPoint, CompareOptions, CompareResult
from fiomon.offline.compare.run import RunInput, run_compare, run_files
from fiomon.offline.compare.stats import (
    above_counts,
    bootstrap_ratio,
    hull,
    mover_ratio,
    significant,
)
from fiomon.offline.compare.windows import Hist
from fiomon.offline.quanta import QuantaOptions, iter_quanta
from fiomon.offline.sources import SourceOptions
from fiomon.tools.simulate import write_cluster

START_MS = 1_795_000_000_000
PCTS = (50.0, 90.0, 99.0)


def _run(name: str, folder: Path) -> RunInput:
    return RunInput(name, str(folder), tuple(run_files(str(folder))), SourceOptions())  # type: ignore[arg-type]


def _compare(base: Path, cand: Path, **kw: object) -> CompareResult:
    quanta = QuantaOptions(percentiles=PCTS, per_host=bool(kw.pop("per_host", False)))
    opts = CompareOptions(quanta=quanta, **kw)  # type: ignore[arg-type]
    return run_compare(_run("baseline", base), _run("candidate", cand), opts, io.StringIO())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A baseline, a candidate of the same model (another seed), one with a slow host."""
    root = tmp_path_factory.mktemp("compare")
    out = {}
    for name, seed, slow in (("base", 1, 0), ("same", 2, 0), ("slow", 3, 1)):
        write_cluster(
            root / name,
            hosts=3,
            jobs_per_host=1,
            seconds=60,
            iops=300,
            start_ms=START_MS,
            slow_hosts=slow,  # client-01 slowed 3x from 20 s to 40 s
            slow_window_s=(20, 40),
            slow_factor=3.0,
            seed=seed,
        )
        out[name] = root / name
    return out


def test_a_window_holds_exactly_the_report_rows_of_its_quanta(runs: dict[str, Path]) -> None:
    """Per window and direction, compare's I/Os equal the sum of report's rows there."""
    result = _compare(runs["base"], runs["slow"])
    for name, folder, info in (
        ("baseline", runs["base"], result.baseline),
        ("candidate", runs["slow"], result.candidate),
    ):
        rows = [
            r
            for r in iter_quanta(run_files(str(folder)), QuantaOptions(percentiles=PCTS))
            if r.scope == "cluster"
        ]
        first = min(r.start_ms for r in rows)
        assert info.start_ms == first == info.origin_ms
        for d in ("read", "write", "all"):
            want: dict[float, float] = {}
            for r in rows:
                if r.direction == d:
                    k = (r.start_ms - first) // 10_000 * 10.0
                    want[k] = want.get(k, 0) + r.stats.samples
            got = {p.start_s: p.ios for p in result.series[(name, "cluster", None, d)]}  # type: ignore[index]
            # records split over quanta leave fractions, summed before rounding
            assert got == {k: round(v) for k, v in want.items()}, (name, d)
        assert info.ios == round(sum(r.stats.samples for r in rows if r.direction != "all"))
    # Whole-run lines count every I/O of the windows both runs have (all of them here),
    # their records' fractions summed before rounding.
    whole = [v for v in result.verdicts if v.whole_run and v.direction == "all"]
    assert whole and {(v.baseline_ios, v.candidate_ios) for v in whole} == {
        (result.baseline.ios, result.candidate.ios)
    }


def test_a_run_against_itself_is_ratio_one_everywhere(runs: dict[str, Path]) -> None:
    result = _compare(runs["base"], runs["base"])
    assert result.verdicts
    for v in result.verdicts:
        assert v.ratio == pytest.approx(1.0), v
        assert not v.significant, v
        lo, hi = v.ratio_ci
        assert lo is None or lo <= 1.0
        assert hi is None or hi >= 1.0
    whole = [v for v in result.verdicts if v.whole_run]
    assert {v.method for v in whole} == {"mover+bootstrap"}
    assert len(whole) == len(PCTS) * 3  # read, write, all


def test_the_slow_windows_are_flagged_and_carried_by_the_slow_host(runs: dict[str, Path]) -> None:
    """client-01 is 3x slower in 20-40 s: those p90 windows are worse, the rest are not."""
    result = _compare(runs["base"], runs["slow"], per_host=True)
    read = [
        v
        for v in result.verdicts
        if v.scope == "cluster" and v.direction == "read" and v.percentile == 90.0
    ]
    windows = [v for v in read if not v.whole_run and v.window_end_s and v.window_end_s <= 60]
    assert len(windows) == 6
    for v in windows:
        inside = 20.0 <= (v.window_start_s or 0) < 40.0
        assert v.significant == inside, v
        if inside:
            assert v.ratio is not None and v.ratio > 1.2
            assert v.hosts[0].host == "client-01"
            assert v.hosts[0].share > max(0.7, 2 * v.hosts[0].io_share)
            assert sum(h.share for h in v.hosts) == pytest.approx(1.0)
    hosts = [
        v
        for v in result.verdicts
        if v.scope == "host"
        and v.direction == "read"
        and v.percentile == 90.0
        and v.window_start_s == 20.0
    ]
    assert {v.host: v.significant for v in hosts} == {
        "client-01": True,
        "client-02": False,
        "client-03": False,
    }


def test_jsonl_objects_put_whole_run_lines_last(runs: dict[str, Path]) -> None:
    """(Their keys and types: tests/offline/test_compare_cli.py.)"""
    result = _compare(runs["base"], runs["same"])
    objs = [v.to_json() for v in result.verdicts]
    whole = [o for o in objs if o["window_start_s"] is None]
    assert whole and all(o["window_end_s"] is None for o in whole)
    starts = [o["window_start_s"] for o in objs if o["window_start_s"] is not None]
    assert starts == sorted(starts)
    assert objs.index(whole[0]) == len(objs) - len(whole)


def _shifted_copy(src: Path, dst: Path, shift_ms: int) -> None:
    """The same logs with every stamp ``shift_ms`` later (the same I/Os, run later)."""
    for f in run_files(str(src)):
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        lines = []
        for line in f.read_text().splitlines(keepends=True):
            stamp, rest = line.split(",", 1)
            lines.append(f"{int(stamp) + shift_ms},{rest}")
        out.write_text("".join(lines))


def test_shift_and_align_at_line_up_a_run_that_started_later(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """The slow run, re-stamped 3 600 s later, against itself: default alignment (each
    run's start) and --align-at on wall clocks both give ratio 1 in every window."""
    late = tmp_path / "late"
    _shifted_copy(runs["slow"], late, 3_600_000)
    for kw in (
        {},
        {
            "align_at": (
                AlignPoint(epoch_ms=START_MS + 20_000),
                AlignPoint(epoch_ms=START_MS + 3_620_000),
            )
        },
    ):
        result = _compare(runs["slow"], late, **kw)
        assert all(v.ratio == pytest.approx(1.0) for v in result.verdicts), kw
    # Aligned 20 s apart, the slow phase of one meets the fast phase of the other.
    result = _compare(runs["slow"], late, shift_ms=20_000)
    flagged = [
        v
        for v in result.verdicts
        if v.significant and v.scope == "cluster" and v.direction == "read" and v.percentile == 90
    ]
    # baseline 20-40 s (slow) meets candidate 40-60 s (fast): aligned 20-40 s better;
    # candidate 20-40 s (slow) is aligned 0-20 s, against the baseline's fast 0-20 s: worse.
    worse = {v.window_start_s for v in flagged if (v.ratio or 0) > 1}
    better = {v.window_start_s for v in flagged if (v.ratio or 0) < 1}
    assert worse == {0.0, 10.0}
    assert better == {20.0, 30.0}


def test_bad_alignments_are_errors_that_say_why(runs: dict[str, Path]) -> None:
    with pytest.raises(FiomonError, match="multiple of the quantum"):
        _compare(runs["base"], runs["same"], window_ms=1500)
    with pytest.raises(FiomonError, match=r"shift .* multiple of the quantum"):
        _compare(runs["base"], runs["same"], shift_ms=250)
    with pytest.raises(FiomonError, match="outside the baseline run"):
        _compare(
            runs["base"],
            runs["same"],
            align_at=(AlignPoint(epoch_ms=START_MS + 86_400_000), AlignPoint(offset_ms=0)),
        )
    with pytest.raises(FiomonError, match="share no window"):
        _compare(runs["base"], runs["same"], shift_ms=-600_000)


def test_run_files_takes_fio_output_from_a_folder_or_glob(tmp_path: Path) -> None:
    """A run folder as fio leaves it: the logs and json+ are taken; the job file, fio's
    text output, a bw log, the data file and hidden files are left out (and said)."""
    run = tmp_path / "run"
    (run / "client-01").mkdir(parents=True)
    (run / ".hidden").mkdir()
    hist = run / "client-01" / "j_clat_hist.1.log"
    hist.write_text("1000, 0, 4096, 1\n")
    lat = run / "client-01" / "j_lat.1.log.gz"
    with gzip.open(lat, "wt") as fh:
        fh.write("1, 2000, 0, 4096, 0, 0x0000\n")
    js = run / "out.txt"  # json+ whatever its name
    js.write_text('note: both iodepth\n{\n  "fio version" : "fio-3.33",\n  "jobs" : []\n}\n')
    others = [
        run / "job.fio",
        run / "normal.out",
        run / "client-01" / "j_bw.1.log",
        run / "datafile",
        run / ".hidden" / "x_clat_hist.1.log",
    ]
    others[0].write_text("[job]\nrw=randread\n")
    others[1].write_text("job: (g=0): rw=randread, bs=(R) 4096B-4096B\nRun status group 0\n")
    others[2].write_text("1000, 4096, 0, 4096, 0\n")
    others[3].write_bytes(bytes(range(256)) * 64)
    others[4].write_text("1000, 0, 4096, 1\n")
    skipped: list[Path] = []
    assert run_files(str(run), skipped) == sorted([hist, lat, js])
    assert sorted(skipped) == sorted(others[:4])
    assert run_files(str(others[0])) == [others[0]]  # named alone: taken, it will say why
    assert run_files(str(run / "**" / "*.log")) == [hist]
    with pytest.raises(FiomonError, match="no file matches"):
        run_files(str(tmp_path / "*.nothing"))
    with pytest.raises(FiomonError, match="no such file or folder"):
        run_files(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FiomonError, match="empty folder"):
        run_files(str(tmp_path / "empty"))
    with pytest.raises(FiomonError, match=r"no fio output among its 1 file\(s\) \(job.fio\)"):
        run_files(str(run / "*.f*"))


def test_parse_align_at() -> None:
    b, c = parse_align_at("baseline=+95s,candidate=+2m")
    assert (b.offset_ms, c.offset_ms) == (95_000, 120_000)
    b, c = parse_align_at("baseline=12:03:10,candidate=2026-11-27T14:41:55+00:00")
    assert b.time_of_day_ms == (12 * 3600 + 3 * 60 + 10) * 1000
    assert c.epoch_ms == 1_795_790_515_000
    for bad in (
        "baseline=1",
        "baseline=+1s",
        "base=+1s,candidate=+1s",
        "baseline=+x,candidate=+1s",
    ):
        with pytest.raises(ValueError, match="--align-at"):
            parse_align_at(bad)


def test_a_time_of_day_is_taken_on_the_runs_date() -> None:
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        start = 1_795_790_000_000  # 2026-11-27 14:33:20 UTC
        midnight = 1_795_737_600_000  # 2026-11-27 00:00 UTC
        assert time_of_day_at(15 * 3600 * 1000, start) == midnight + 15 * 3600 * 1000
        # 01:00 is before the start: the run went past midnight, so it is the next day's
        assert time_of_day_at(3600 * 1000, start) == midnight + 86_400_000 + 3600 * 1000
        # a minute before the start still counts as that day (a point at the first record)
        assert time_of_day_at((14 * 3600 + 33 * 60) * 1000, start) == start - 20_000
    finally:
        del os.environ["TZ"]
        time.tzset()


def test_mover_ratio_by_hand() -> None:
    b = (np.array([100.0]), np.array([90.0]), np.array([110.0]))
    c = (np.array([150.0]), np.array([140.0]), np.array([170.0]))
    ratio, low, high = mover_ratio(b, c)
    assert ratio[0] == pytest.approx(1.5)
    lr = math.log(1.5)
    assert low[0] == pytest.approx(
        math.exp(lr - math.hypot(math.log(150 / 140), math.log(110 / 100)))
    )
    assert high[0] == pytest.approx(
        math.exp(lr + math.hypot(math.log(170 / 150), math.log(100 / 90)))
    )
    assert significant(low, high)[0]
    # An unbounded side leaves the ratio unbounded there, and decides nothing.
    nan = np.array([np.nan])
    _, low, high = mover_ratio((b[0], b[1], nan), c)
    assert math.isnan(low[0]) and not math.isnan(high[0])
    assert not significant(low, high)[0]
    lo, hi = hull(
        np.array([0.9, 0.8]), np.array([1.1, np.nan]), np.array([0.95, 0.7]), np.array([1.2, 1.0])
    )
    assert lo.tolist() == [0.9, 0.7]
    assert hi[0] == 1.2 and math.isnan(hi[1])


def test_bootstrap_is_seeded_and_brackets_the_ratio() -> None:
    layout = BinLayout()
    rng = np.random.default_rng(7)
    base = np.zeros((12, 40))
    base[:, :30] = rng.poisson(50.0, size=(12, 30))
    cand = np.zeros_like(base)
    cand[:, 3:33] = base[:, :30]  # every latency three bins higher
    runs = [
        bootstrap_ratio(
            (base, layout, 600),
            (cand, layout, 600),
            (50.0, 90.0),
            level=0.95,
            resamples=500,
            rng=np.random.default_rng(1),
        )
        for _ in range(2)
    ]
    assert np.array_equal(runs[0][0], runs[1][0])
    low, high = runs[0]
    assert (low > 1.0).all() and (high > low).all()


def test_above_counts_counts_from_the_thresholds_bin_up() -> None:
    lower, upper = BinLayout().edges_ns()
    h = np.zeros((1, len(lower)))
    h[0, 700] = 5
    h[0, 701] = 3
    h[0, 702] = 2
    mid = (lower[701] + upper[701]) / 2
    assert above_counts(h, upper, mid)[0] == 5  # bin 701 counts whole
    assert above_counts(h, upper, upper[701])[0] == 5  # its upper edge is still bin 701
    assert above_counts(h, upper, upper[701] + 1)[0] == 2
    assert above_counts(h, upper, lower[700] - 1)[0] == 10


def test_trimmed_hist_sums_equal_full_sums() -> None:
    rng = np.random.default_rng(3)
    full = np.zeros(BinLayout().nbins)
    h = Hist()
    for _ in range(20):
        x = np.zeros_like(full)
        a = int(rng.integers(0, len(full) - 50))
        x[a : a + 50] = rng.poisson(2.0, 50)
        full += x
        h.add(x)
    assert h.total == full.sum()
    back = np.zeros_like(full)
    back[h.lo : h.lo + len(h.counts)] = h.counts
    assert np.array_equal(back, full)
    g = Hist()
    g.add_trimmed(h)
    assert g.lo == h.lo and np.array_equal(g.counts, h.counts)


def test_first_and_last_windows_a_run_covers_in_part_are_marked(runs: dict[str, Path]) -> None:
    """The simulated runs last 60 s from their hosts' phases: the 60-70 s window holds the
    last fraction of a second; every full window is not partial."""
    result = _compare(runs["base"], runs["same"])
    windows = [v for v in result.verdicts if not v.whole_run]
    assert {v.window_start_s for v in windows if v.partial} == {60.0}
    assert all(not v.partial for v in windows if (v.window_end_s or 0) <= 60)
    assert not any(v.partial for v in result.verdicts if v.whole_run)
    assert all(v.to_json()["partial"] is v.partial for v in result.verdicts)
