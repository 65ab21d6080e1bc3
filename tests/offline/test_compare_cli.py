"""``fiomon compare`` as a newcomer meets it: its writers, its flags and its refusals.

The writers are checked on results built by hand (every order and flattening rule, with
numbers chosen so a wrong rule shows); the command runs on real fio output: two short
runs of one job compared with the README's own command, and a third run with relative
stamps and averaged latency logs for the refusals. Every bad call must end in one
message naming the problem and exit code 2 (the command line) or 1 (the input), never a
traceback.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fiomon.cli import main
from fiomon.offline.compare.align import duration_ms, parse_point
from fiomon.offline.compare.model import (
    AlignPoint,
    CompareOptions,
    CompareResult,
    HostShare,
    RunInfo,
    Verdict,
)
from fiomon.offline.compare.output import (
    CSV_COLUMNS,
    csv_row,
    write_csv,
    write_jsonl,
    write_table,
)
from fiomon.offline.output import scaled
from fiomon.offline.quanta import QuantaOptions
from tests.conftest import DEADLINE_S

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_795_347_290_000  # 2026-11-22 11:34:50 UTC


def verdict(
    start: float | None,
    pct: float,
    ratio: float | None,
    ci: tuple[float | None, float | None],
    *,
    direction: str = "read",
    significant: bool = False,
    hosts: tuple[HostShare, ...] = (),
    host: str | None = None,
) -> Verdict:
    base = 100_000.0 * pct
    return Verdict(
        window_start_s=start,
        window_end_s=None if start is None else start + 10,
        scope="cluster" if host is None else "host",
        host=host,
        direction=direction,
        percentile=pct,
        baseline_ns=base,
        candidate_ns=None if ratio is None else base * ratio,
        baseline_ci_ns=(base * 0.9, base * 1.1),
        candidate_ci_ns=(None, None if ratio is None else base * ratio * 1.2),
        baseline_ios=1000,
        candidate_ios=990,
        ratio=ratio,
        ratio_ci=ci,
        significant=significant,
        method="mover" if start is not None else "mover+bootstrap",
        hosts=hosts,
    )


def run_info(name: str, spec: str, *, origin_ms: int = T0, relative: bool = False) -> RunInfo:
    return RunInfo(
        name="baseline" if name == "baseline" else "candidate",
        spec=spec,
        files=(Path(f"{spec}/a_clat_hist.1.log"), Path(f"{spec}/b_clat_hist.1.log")),
        ios=12_345,
        hosts=("h1", "h2"),
        relative=relative,
        origin_ms=origin_ms,
        start_ms=T0,
        end_ms=T0 + 30_000,
    )


@pytest.fixture
def result() -> CompareResult:
    """Windows given out of time order, whole-run lines between them (the writers sort)."""
    h = (HostShare("h2", 40, 0.82, 0.5), HostShare("h1", 9, 0.18, 0.5))
    verdicts = [
        verdict(20.0, 99, 1.2, (1.05, 1.4), significant=True),
        verdict(None, 50, 0.97, (0.9, 1.01)),
        verdict(0.0, 50, 1.01, (0.98, 1.04)),
        verdict(0.0, 99, 1.5, (1.2, 1.9), significant=True, hosts=h),
        verdict(10.0, 50, 0.9, (0.85, 0.95), significant=True),
        verdict(10.0, 99, 0.7, (0.6, 0.8), significant=True),
        verdict(20.0, 50, 1.03, (0.9, None)),
        verdict(None, 99, 1.21, (1.05, 1.4), significant=True),
    ]
    return CompareResult(
        options=CompareOptions(QuantaOptions(percentiles=(50.0, 99.0))),
        baseline=run_info("baseline", "runs/before"),
        candidate=run_info("candidate", "runs/after/*.log", origin_ms=T0 + 5000),
        verdicts=verdicts,
        notes=["host h3 is in the candidate only"],
    )


def jsonl(result: CompareResult) -> list[dict[str, Any]]:
    out = io.StringIO()
    write_jsonl(result, out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def table(result: CompareResult, *, all_windows: bool = False) -> str:
    out = io.StringIO()
    write_table(result, out, all_windows=all_windows)
    return out.getvalue()


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local time zone is UTC (``--align-at`` reads local times)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


# -- writers --------------------------------------------------------------------------------


def test_jsonl_puts_windows_in_time_order_then_the_whole_run_lines(
    result: CompareResult,
) -> None:
    objs = jsonl(result)
    starts = [o["window_start_s"] for o in objs]
    assert starts == [0.0, 0.0, 10.0, 10.0, 20.0, 20.0, None, None]
    # Within a window the engine's order (percentile 50 before 99 here) is kept.
    assert [o["percentile"] for o in objs[:2]] == [50, 99]
    assert list(objs[0])[:9] == [
        "window_start_s",
        "window_end_s",
        "direction",
        "percentile",
        "baseline_ns",
        "candidate_ns",
        "ratio",
        "ratio_ci",
        "significant",
    ]
    assert objs[-1]["window_end_s"] is None
    assert objs[-1]["method"] == "mover+bootstrap"
    assert objs[5]["ratio_ci"] == [0.9, None]  # an unbounded side stays null


def test_csv_holds_the_jsonl_numbers_flattened(result: CompareResult) -> None:
    out = io.StringIO()
    write_csv(result, out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert tuple(rows[0]) == CSV_COLUMNS
    objs = jsonl(result)
    assert len(rows) == len(objs) == 8
    for row, obj in zip(rows, objs, strict=True):
        for key in ("window_start_s", "baseline_ns", "candidate_ns", "ratio"):
            want = obj[key]
            assert (float(row[key]) if row[key] else None) == want, key
        for key, (low, high) in [
            ("ratio_ci", obj["ratio_ci"]),
            ("baseline_ci", obj["baseline_ci_ns"]),
            ("candidate_ci", obj["candidate_ci_ns"]),
        ]:
            unit = "_ns" if key != "ratio_ci" else ""
            got = [row[f"{key}_low{unit}"], row[f"{key}_high{unit}"]]
            assert [float(x) if x else None for x in got] == [low, high], key
        assert row["significant"] == ("true" if obj["significant"] else "false")
        assert int(row["baseline_ios"]) == obj["baseline_ios"]
    assert rows[1]["hosts"] == "h2:0.82;h1:0.18"
    assert rows[0]["hosts"] == ""
    assert rows[-1]["window_start_s"] == rows[-1]["window_end_s"] == ""


@pytest.mark.usefixtures("utc")
def test_table_says_what_was_compared_then_the_whole_run_then_the_worst_windows(
    result: CompareResult,
) -> None:
    text = table(result)
    head, whole, flagged, foot = text.split("\n\n")
    assert "# baseline: runs/before: 2 files, 12,345 I/Os, 2 hosts (h1, h2)\n" in head
    assert "#   start 2026-11-22 11:34:50 UTC; 0 = its start\n" in head
    assert "# candidate: runs/after/*.log: 2 files" in head
    assert "0 = 2026-11-22 11:34:55 UTC (+5 s)\n" in head  # aligned 5 s after its start
    assert "# note: host h3 is in the candidate only" in head
    assert "intervals at 95 %" in head
    assert "block bootstrap over windows (2000 resamples)" in head  # the whole run's method
    lines = whole.splitlines()
    assert lines[0].startswith("whole run")
    assert lines[1].split() == ["dir", "pct", "baseline", "candidate", "ratio", "95", "%", "CI",
                                "verdict"]  # fmt: skip
    assert lines[2].split() == ["read", "p50", "5.00ms", "4.85ms", "0.97", "[0.90,", "1.01]", "-"]
    assert lines[3].split()[-1] == "worse"
    # Regressions by ratio descending, then improvements by ratio ascending.
    rows = flagged.splitlines()[2:]
    assert [r.split()[0] for r in rows] == ["0", "20", "10", "10"]
    # "0 .. 10  read  p99  15.0ms  22.5ms  1.50  [1.20, 1.90]  worse  hosts"
    assert [r.split()[7] for r in rows] == ["1.50", "1.20", "0.70", "0.90"]
    assert [r.split()[10] for r in rows] == ["worse", "worse", "better", "better"]
    assert rows[0].endswith("h2 82% (50%), h1 18% (50%)")
    assert "6 window verdicts at 95 %: about 0.3 flagged by chance alone" in foot
    assert "?" not in flagged  # no unbounded side shown, so no footnote for one
    assert "'?' in an interval" not in foot


def test_table_all_shows_every_window_in_time_order_and_explains_question_marks(
    result: CompareResult,
) -> None:
    text = table(result, all_windows=True)
    block = text.split("\n\n")[2].splitlines()
    assert block[0].startswith("every window (6 verdicts, 4 significant)")
    assert [r.split()[0] for r in block[2:]] == ["0", "0", "10", "10", "20", "20"]
    assert "[0.90, ?]" in block[7]
    assert "'?' in an interval" in text


def test_table_with_host_scope_has_a_host_column_and_no_significant_window_says_so() -> None:
    r = CompareResult(
        options=CompareOptions(),
        baseline=run_info("baseline", "a", relative=True),
        candidate=run_info("candidate", "b", relative=True),
        verdicts=[
            verdict(0.0, 99, 1.0, (0.9, 1.1)),
            verdict(0.0, 99, 1.0, (0.9, 1.1), host="h1"),
            verdict(None, 99, 1.0, (0.9, 1.1), host="h1"),
        ],
    )
    text = table(r)
    assert "relative stamps (no wall clock)" in text
    assert "significant windows: none of 2 verdicts" in text
    whole = text.split("\n\n")[1].splitlines()
    assert whole[1].split()[0] == "host"
    assert whole[2].split()[0] == "h1"


# -- the flags' own parsers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [("95s", 95_000), ("1m30s", 90_000), ("250ms", 250), ("1.5s", 1500), ("2", 2000),
     ("1h", 3_600_000), ("1m30", None), ("s", None), ("", None), ("1.0005s", None)],
)  # fmt: skip
def test_durations_of_align_at_and_shift_add_their_pieces(text: str, ms: int | None) -> None:
    assert duration_ms(text) == ms


def test_align_at_times_are_offsets_wall_clock_times_or_iso_datetimes() -> None:
    assert parse_point("+1m30s") == AlignPoint(offset_ms=90_000)
    assert parse_point("12:03:10.5") == AlignPoint(time_of_day_ms=43_390_500)
    assert parse_point("00:00:01.250") == AlignPoint(time_of_day_ms=1250)
    assert parse_point("2026-11-22T11:34:50+00:00") == AlignPoint(epoch_ms=T0)
    for bad in ("12:61:00", "24:00:00", "noon", "95s", "+", "12:03"):
        assert parse_point(bad) is None, bad


# -- bad calls that the flags alone decide (exit 2, before any file is read) ----------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--window", "1500ms"], "--window 1.5s is not a multiple of --quantum 1s"),
        (["--quantum", "2s", "--window", "5s"], "--window 5s is not a multiple of --quantum 2s"),
        (["--shift", "250ms"], "--shift 0.25s is not a multiple of --quantum 1s"),
        (["--shift", "soon"], "--shift: 'soon' is not a duration"),
        (["--align-at", "baseline=12:03:10"], "--align-at: expected baseline=T,candidate=T"),
        (["--align-at", "baseline=12:03:10,candidate=later"], "got 'baseline=12:03:10,cand"),
        (["--align-at", "baseline=+1s,baseline=+2s"], "--align-at: expected baseline=T"),
        (["--shift", "5s", "--align-at", "baseline=+1s,candidate=+2s"], "not allowed with"),
        (["-o", "cmp.pdf"], "-o cmp.pdf: the extension must be .html, .png or .svg"),
        (["--format", "html"], "invalid choice: 'html'"),
        (["--align", "sideways"], "align: 'sideways' is not a duration"),
    ],
)
def test_bad_flags_are_usage_errors_naming_the_flag(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = [str(tmp_path / "missing-a"), str(tmp_path / "missing-b")]
    try:
        code = main(["compare", *argv, *runs])
    except SystemExit as exc:  # argparse's own checks
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err
    assert "missing-a" not in err  # decided before the runs are looked at


# -- real fio: the README's command on two runs, and the refusals -----------------------------

JOB = """[global]
ioengine=psync
rw=randread
bs=4k
size=1m
filename={data}
time_based
runtime={runtime}
rate_iops=300
log_hist_msec=1000
log_unix_epoch={epoch}
{extra}
[j]
"""
RUNTIME_S = 12


@dataclass(frozen=True)
class Runs:
    """Two 12 s runs of one job (``runs/before``, ``runs/after``) and a 3 s odd one."""

    cwd: Path
    relative_hist: Path  # log_unix_epoch=0
    averaged_lat: Path  # log_avg_msec=500


@pytest.fixture(scope="module")
def runs(fio_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The job files sit beside the runs' folders, not in them (a folder is read whole)."""
    cwd = tmp_path_factory.mktemp("compare")
    procs = []
    for name, runtime, epoch, extra in [
        ("before", RUNTIME_S, 1, ""),
        ("after", RUNTIME_S, 1, ""),
        ("odd", 3, 0, "write_lat_log=avg\nlog_avg_msec=500\n"),
    ]:
        folder = cwd / "runs" / name
        folder.mkdir(parents=True)
        job = cwd / f"{name}.fio"
        data = cwd / f"{name}.data"
        more = f"write_hist_log={name}\n{extra}"
        job.write_text(JOB.format(data=data, runtime=runtime, epoch=epoch, extra=more))
        cmd = [fio_bin, str(job), f"--output={cwd / name}.out"]
        procs.append(subprocess.Popen(cmd, cwd=folder, stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=RUNTIME_S * 10)
        assert p.returncode == 0, err
    odd = cwd / "runs" / "odd"
    return Runs(cwd, odd / "odd_clat_hist.1.log", odd / "avg_clat.1.log")


def readme_command() -> list[str]:
    """The first ``fiomon compare`` command of the README's "Comparing two runs" (its args)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Comparing two runs", 1)[1].split("\n## ", 1)[0]
    line = next(x for x in section.splitlines() if x.startswith("fiomon compare "))
    return shlex.split(line.split(" # ")[0])[2:]


def compare(runs: Runs, *args: str, tz: str = "UTC") -> subprocess.CompletedProcess[str]:
    """``fiomon compare ARGS`` in the runs' folder."""
    return subprocess.run(
        [sys.executable, "-m", "fiomon", "compare", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 2,
        check=False,
        cwd=runs.cwd,
        env={**os.environ, "TZ": tz, "PYTHONPATH": str(ROOT)},
    )


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r.stdout


KEYS = {
    "window_start_s": (float, type(None)),
    "window_end_s": (float, type(None)),
    "direction": (str,),
    "percentile": (float,),
    "baseline_ns": (float, type(None)),
    "candidate_ns": (float, type(None)),
    "ratio": (float, type(None)),
    "ratio_ci": (list,),
    "significant": (bool,),
    "scope": (str,),
    "host": (str, type(None)),
    "baseline_ci_ns": (list,),
    "candidate_ci_ns": (list,),
    "baseline_ios": (int,),
    "candidate_ios": (int,),
    "method": (str,),
    "hosts": (list,),
    "partial": (bool,),
}


def test_the_readme_command_prints_what_was_compared_and_the_whole_run(runs: Runs) -> None:
    argv = readme_command()
    assert argv[-2:] == ["runs/before", "runs/after"]
    text = ok(compare(runs, *argv))
    lines = text.splitlines()
    assert lines[0].startswith("# baseline: runs/before: 1 file, ")
    assert any(x.startswith("# candidate: runs/after: 1 file, ") for x in lines[:6])
    assert "# windows of 10 s of aligned time" in text
    # The whole-run block: one line per direction and percentile, the jsonl's values.
    whole = text.split("\n\n")[1].splitlines()
    assert whole[0].startswith("whole run")
    objs = [json.loads(x) for x in ok(compare(runs, *argv, "--format", "jsonl")).splitlines()]
    expect = [o for o in objs if o["window_start_s"] is None]
    assert len(whole) - 2 == len(expect) == 2 * 4  # read and all x 50, 90, 99, 99.9
    for row, o in zip(whole[2:], expect, strict=True):
        cells = row.split()
        assert cells[:2] == [o["direction"], f"p{o['percentile']:g}"]
        assert cells[2:4] == [scaled(o["baseline_ns"]), scaled(o["candidate_ns"])]
        assert cells[-1] == (
            "-" if not o["significant"] else "worse" if o["ratio"] > 1 else "better"
        )
    assert any(x.startswith("# ") and "window verdicts at 95 %: about" in x for x in lines[-6:])


def test_jsonl_lines_carry_the_keys_with_their_types_windows_in_time_order(runs: Runs) -> None:
    r = compare(runs, "--window", "2s", "--format", "jsonl", "runs/before", "runs/after")
    objs = [json.loads(x) for x in ok(r).splitlines()]
    for o in objs:
        assert list(o) == list(KEYS)
        for key, types in KEYS.items():
            assert isinstance(o[key], types), (key, o[key])
        assert len(o["ratio_ci"]) == len(o["baseline_ci_ns"]) == 2
    windows = [o for o in objs if o["window_start_s"] is not None]
    whole = [o for o in objs if o["window_start_s"] is None]
    assert objs == windows + whole  # windows first
    starts = [o["window_start_s"] for o in windows]
    assert starts == sorted(starts)
    assert len(set(starts)) >= RUNTIME_S // 2 - 1  # 2 s windows over 12 s runs
    assert all(o["window_end_s"] - o["window_start_s"] == 2.0 for o in windows)
    assert all(o["window_start_s"] % 2 == 0 for o in windows)
    assert {(o["direction"], o["percentile"]) for o in whole} == {
        (d, p) for d in ("read", "all") for p in (50.0, 90.0, 99.0, 99.9)
    }
    assert all(o["window_end_s"] is None and o["scope"] == "cluster" for o in whole)
    for o in windows:  # 300 IOPS: every 2 s window of both runs holds I/O
        assert o["baseline_ios"] > 0 and o["candidate_ios"] > 0, o
        assert o["ratio"] == pytest.approx(o["candidate_ns"] / o["baseline_ns"], rel=1e-4)


def test_csv_parses_to_the_jsonl_numbers(runs: Runs) -> None:
    args = ("--window", "4s", "runs/before", "runs/after")
    objs = [json.loads(x) for x in ok(compare(runs, *args, "--format", "jsonl")).splitlines()]
    rows = list(csv.DictReader(io.StringIO(ok(compare(runs, *args, "--format", "csv")))))
    assert len(rows) == len(objs) > 8
    for row, o in zip(rows, objs, strict=True):
        assert row == csv_row(o)
        for key in ("baseline_ns", "candidate_ns", "ratio"):
            assert (float(row[key]) if row[key] else None) == o[key]


def test_all_prints_every_window(runs: Runs) -> None:
    args = ("--window", "4s", "--percentiles", "50,99", "--directions", "read")
    text = ok(compare(runs, *args, "--all", "runs/before", "runs/after"))
    block = text.split("\n\n")[2].splitlines()
    objs = ok(compare(runs, *args, "--format", "jsonl", "runs/before", "runs/after"))
    n = sum(1 for x in objs.splitlines() if json.loads(x)["window_start_s"] is not None)
    assert block[0].startswith(f"every window ({n} verdicts")
    assert len(block) == n + 2


def test_align_at_a_wall_clock_time_moves_the_baseline_s_zero(runs: Runs) -> None:
    objs = [
        json.loads(x)
        for x in ok(compare(runs, "--format", "jsonl", "runs/before", "runs/after")).splitlines()
    ]
    assert objs
    first = next(
        int(line.split(",")[0])
        for line in (runs.cwd / "runs/before/before_clat_hist.1.log").read_text().splitlines()
    )
    at = dt.datetime.fromtimestamp(first / 1000 + 4, tz=dt.UTC).strftime("%H:%M:%S")
    text = ok(
        compare(runs, "--align-at", f"baseline={at},candidate=+4s", "runs/before", "runs/after")
    )
    head = text.split("\n\n")[0]
    # The baseline's 0 is 4 s after its first stamp, the end of its first 1 s record (so
    # 5 s after its start, or 4 s where the grid is nearer); the candidate's 4 s after its start.
    assert head.count(" s)\n") == 2, head
    assert "(+4 s)\n# windows" in head, head


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["runs/nothing", "runs/after"], 1, "runs/nothing: no such file or folder"),
        (["runs/before/*.nolog", "runs/after"], 1, "runs/before/*.nolog: no file matches"),
        (["q.jsonl", "runs/after"], 2, "baseline: q.jsonl: a quanta file"),
        (["runs/after", "AVG"], 1, "averaged"),
        (["--align-at", "baseline=+0s,candidate=12:00:00", "runs/after", "REL"], 1,
         "--align-at candidate: a wall-clock time, but the candidate's logs have relative"),
        (["--window", "2500ms", "runs/before", "runs/after"], 2,
         "--window 2.5s is not a multiple of --quantum 1s"),
        (["-o", "cmp.jpg", "runs/before", "runs/after"], 2, "the extension must be .html"),
    ],
)  # fmt: skip
def test_bad_input_is_one_message_and_an_exit_code(
    runs: Runs, args: list[str], code: int, message: str
) -> None:
    quanta = runs.cwd / "q.jsonl"
    if not quanta.exists():
        quanta.write_text(_report_jsonl(runs))
    args = [
        str(runs.averaged_lat) if a == "AVG" else str(runs.relative_hist) if a == "REL" else a
        for a in args
    ]
    r = compare(runs, *args)
    assert r.returncode == code, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""


def _report_jsonl(runs: Runs) -> str:
    log = "runs/before/before_clat_hist.1.log"
    r = subprocess.run(
        [sys.executable, "-m", "fiomon", "report", "--format", "jsonl", log],
        capture_output=True,
        text=True,
        check=True,
        cwd=runs.cwd,
        timeout=DEADLINE_S,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return r.stdout


def test_o_draws_the_page_and_still_prints_the_verdicts(runs: Runs) -> None:
    """-o needs :mod:`fiomon.offline.compare.page` (helper "page"'s branch)."""
    r = compare(runs, "--format", "jsonl", "-o", "cmp.html", "runs/before", "runs/after")
    assert json.loads(ok(r).splitlines()[0])["window_start_s"] == 0.0
    assert "fiomon compare: wrote cmp.html" in r.stderr
    page = (runs.cwd / "cmp.html").read_text()
    assert page.lstrip().lower().startswith("<!doctype html")
    assert "runs/before vs runs/after" in page  # the default title
