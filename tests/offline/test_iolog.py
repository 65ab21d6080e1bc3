"""Per-I/O latency logs as input: exact rows from real fio's P_clat.N.log files.

Every case runs real fio (short rate-limited jobs) with ``write_lat_log`` and
``log_avg_msec=0`` and checks ``fiomon report`` against the raw lines, read here with
plain Python: per quantum the sample count equals the lines in it, and every percentile
is the nearest-rank order statistic (between the order statistics around ``p n / 100``).
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fiomon.errors import FiomonError
from fiomon.fio import iolog
from fiomon.fio.iolog import IoLogReader
from fiomon.fio.problems import ProblemLog
from fiomon.offline.exact import ExactReader
from fiomon.offline.iosources import choose_iologs
from fiomon.offline.quanta import QuantaOptions
from tests.conftest import DEADLINE_S
from tests.fiorun import fiomon, last_document, total_ios

pytestmark = pytest.mark.fio

PCTS = (50.0, 90.0, 99.0, 99.9)
DIRS = {0: "read", 1: "write", 2: "trim"}

THREE_JOBS = """[global]
ioengine=psync
bs=4k
size=1m
filename={data}
time_based
log_unix_epoch={epoch}
log_avg_msec={avg}
write_lat_log={prefix}
{extra}
[rand]
rw=randrw
rate_iops=300,200
runtime=2
log_offset=1
log_prio=1
[reads]
rw=randread
rate_iops=400
runtime=2
[burst]
rw=randwrite
rate_iops=1500
startdelay=1
runtime=1
log_offset=1
"""


@dataclass(frozen=True)
class Line:
    """One raw line of a per-I/O log."""

    time_ms: int
    value_ns: int
    ddir: int
    bs: int


def read_lines(path: Path) -> list[Line]:
    """A per-I/O log read the plain way (fio's hex priority column ignored)."""
    opener: Any = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt") as fh:
        for raw in fh:
            f = [x.strip() for x in raw.split(",")]
            out.append(Line(int(f[0]), int(f[1]), int(f[2]), int(f[3])))
    return out


def run_fio(fio_bin: str, folder: Path, *, epoch: int = 1, avg: int = 0, extra: str = "") -> Path:
    """The three jobs in ``folder`` (json+ in out.json); returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "three.fio"
    job.write_text(
        THREE_JOBS.format(data=folder / "data", epoch=epoch, avg=avg, prefix="lat", extra=extra)
    )
    subprocess.run(
        [fio_bin, str(job), "--output-format=json+", f"--output={folder / 'out.json'}"],
        cwd=folder,
        check=True,
        capture_output=True,
        timeout=DEADLINE_S,
    )
    return folder


@pytest.fixture(scope="module")
def epoch_run(tmp_path_factory: pytest.TempPathFactory, fio_bin: str) -> Path:
    """Three jobs (random read/write, reads, a burst of writes), epoch stamps."""
    return run_fio(fio_bin, tmp_path_factory.mktemp("epoch"))


def report(*args: str | Path) -> tuple[list[dict[str, Any]], str]:
    """``fiomon report --format jsonl`` rows and stderr."""
    r = fiomon("report", "--format", "jsonl", *args)
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines() if x.strip()], r.stderr


def clat_logs(folder: Path) -> list[Path]:
    logs = sorted(folder.glob("lat_clat.*.log"))
    assert len(logs) == 3, list(folder.iterdir())
    return logs


def rows_match_lines(rows: list[dict[str, Any]], lines_by_host: dict[str, list[Line]]) -> int:
    """Check every row against the raw lines; returns the rows checked."""
    checked = 0
    for row in rows:
        host = row["host"]
        lines: Iterator[Line] = (
            (x for ls in lines_by_host.values() for x in ls)
            if host is None
            else iter(lines_by_host[host])
        )
        vals = np.array(
            [
                x.value_ns
                for x in lines
                if row["start_ms"] < x.time_ms <= row["end_ms"]
                and (row["direction"] == "all" or DIRS[x.ddir] == row["direction"])
            ],
            dtype=np.int64,
        )
        n = len(vals)
        assert row["samples"] == n, row
        if row["iops"] is not None:  # every I/O of these jobs moves bs=4k
            assert row["bytes_per_second"] == pytest.approx(4096 * row["iops"])
        s = np.sort(vals)
        assert row["min_ns"] == s[0]
        assert row["max_ns"] == s[-1]
        assert math.isclose(row["mean_ns"], float(vals.mean()), rel_tol=1e-9)
        for p in PCTS:
            got = row["percentiles_ns"][f"{p:g}"]
            rank = p * n / 100
            below = s[max(1, math.floor(rank)) - 1]
            above = s[min(n, max(1, math.ceil(rank))) - 1]
            assert below <= got <= above, (row, p)
            assert got == np.quantile(vals, p / 100, method="inverted_cdf"), (row, p)
            lo, hi = row["percentiles_ci_ns"][f"{p:g}"]
            assert lo is None or lo <= got
            assert hi is None or got <= hi
        checked += 1
    return checked


def test_every_quantum_is_exact_on_three_real_jobs(epoch_run: Path) -> None:
    """Random read/write, reads and a burst: counts = lines, percentiles = order statistics."""
    logs = clat_logs(epoch_run)
    # one folder: one host (lat); each job its own "host" by a pattern
    rows, err = report(
        "--quantum", "250ms", "--per-host", "--host-from", r"regex:clat\.(\d)", *logs
    )
    lines = {p.name.split(".")[1]: read_lines(p) for p in logs}
    assert {r["host"] for r in rows if r["scope"] == "host"} == set(lines)
    checked = rows_match_lines(rows, lines)
    total = sum(len(v) for v in lines.values())
    counted = sum(r["samples"] for r in rows if r["scope"] == "cluster" and r["direction"] == "all")
    print(f"three jobs: {checked} rows checked, {total} lines, {counted} counted")
    assert counted == total == total_ios(epoch_run / "out.json")
    assert {r["direction"] for r in rows} == {"read", "write", "all"}
    # the burst: the quanta of its second hold many more writes than the others
    writes = [r["samples"] for r in rows if r["scope"] == "cluster" and r["direction"] == "write"]
    assert max(writes) > 3 * min(writes)
    assert "skipped" not in err


def test_other_latency_kinds_are_left_out_with_a_note(epoch_run: Path) -> None:
    """Given lat, clat and slat logs of the same jobs, clat counts once (the default kind)."""
    logs = sorted(epoch_run.glob("lat_*.log"))
    rows, err = report("--directions", "all", *logs)
    assert sum(r["samples"] for r in rows) == total_ios(epoch_run / "out.json")
    assert "other latency kinds" in err
    assert "lat_lat.1.log" in err


def test_one_truth_with_json_and_hist_logs_of_the_same_jobs(tmp_path: Path, fio_bin: str) -> None:
    """json+, hist logs and per-I/O logs of the same jobs: each I/O counted once (exact)."""
    run = run_fio(fio_bin, tmp_path / "run", extra="write_hist_log=lat\nlog_hist_msec=250")
    files = sorted(p for p in run.iterdir() if p.suffix in (".json", ".log"))
    assert any("_clat_hist." in p.name for p in files)
    rows, err = report("--directions", "all", *files)
    truth = total_ios(run / "out.json")
    assert sum(r["samples"] for r in rows) == truth
    assert "out.json" in err
    assert "lat_clat_hist.1.log" in err
    # --source json reads the stream instead; exactly fio's count too
    rows, _ = report("--directions", "all", "--source", "json", *files)
    assert round(sum(r["samples"] for r in rows)) == truth
    # a hist log of a job without a per-I/O log cannot join exact rows: an error naming it
    other = tmp_path / "other"
    other.mkdir()
    hist = next(p for p in files if "_clat_hist." in p.name)
    shutil.copy(hist, other / hist.name)
    r = fiomon("report", *clat_logs(run), other / hist.name)
    assert r.returncode != 0
    assert str(other / hist.name) in r.stderr
    assert "--source" in r.stderr


def test_relative_stamps(tmp_path: Path, fio_bin: str) -> None:
    """log_unix_epoch=0: quanta in time since the job's start, counts still exact."""
    run = run_fio(fio_bin, tmp_path / "rel", epoch=0)
    logs = clat_logs(run)
    rows, _ = report("--quantum", "500ms", *logs)
    assert rows[0]["start_ms"] < 1000
    lines = {"": [x for p in logs for x in read_lines(p)]}
    rows_match_lines([{**r, "host": None} for r in rows], {"": lines[""]})


def test_compressed_logs_give_the_same_rows(epoch_run: Path, tmp_path: Path) -> None:
    """gzip-compressed per-I/O logs read as the plain ones."""
    logs = clat_logs(epoch_run)
    packed = []
    for p in logs:
        gz = tmp_path / (p.name + ".gz")
        gz.write_bytes(gzip.compress(p.read_bytes()))
        packed.append(gz)
    plain, _ = report("--quantum", "250ms", *logs)
    zipped, _ = report("--quantum", "250ms", *packed)
    assert plain == zipped


def test_fio_log_store_is_refused_with_the_inflate_command(tmp_path: Path, fio_bin: str) -> None:
    """log_store_compressed=1 writes zlib structs (.fz): refused, naming fio --inflate-log."""
    run = run_fio(fio_bin, tmp_path / "fz", extra="log_compression=64k\nlog_store_compressed=1")
    stores = sorted(run.glob("lat_clat.*.log.fz"))
    assert stores, list(run.iterdir())
    r = fiomon("report", stores[0])
    assert r.returncode != 0
    assert "--inflate-log" in r.stderr


def test_averaged_logs_give_mean_and_max_with_a_note(tmp_path: Path, fio_bin: str) -> None:
    """log_avg_msec=100: rows of window means, no percentiles, and the note on stderr."""
    run = run_fio(fio_bin, tmp_path / "avg", avg=100)
    logs = clat_logs(run)
    rows, err = report("--quantum", "500ms", *logs)
    assert "percentiles cannot come from averages" in err
    assert rows
    lines = [x for p in logs for x in read_lines(p)]
    assert all(x.bs == 0 for x in lines)  # fio's averaged lines
    for r in rows:
        assert r["percentiles_ns"] == {}
        vals = [
            x.value_ns
            for x in lines
            if r["start_ms"] < x.time_ms <= r["end_ms"]
            and (r["direction"] == "all" or DIRS[x.ddir] == r["direction"])
        ]
        assert r["samples"] == len(vals)
        assert r["max_ns"] == max(vals)
        assert math.isclose(r["mean_ns"], sum(vals) / len(vals))
    # log_max_value=1: the rows' max is the largest I/O of the quantum (fio's window max)
    mx = run_fio(fio_bin, tmp_path / "max", avg=100, extra="log_max_value=1")
    rows, err = report("--quantum", "500ms", "--directions", "all", *clat_logs(mx))
    assert "log_max_value" in err
    assert all(r["max_ns"] > 0 for r in rows)


def test_fit_refuses_averaged_logs(tmp_path: Path, fio_bin: str) -> None:
    """log_avg_msec=10: hundreds of window means, which fit must not take for I/Os."""
    logs = clat_logs(run_fio(fio_bin, tmp_path / "avg", avg=10))
    assert sum(len(read_lines(p)) for p in logs) >= 300  # enough "I/Os" to fit
    for per_quantum in ([], ["--per-quantum", "1s"]):
        r = fiomon("fit", *per_quantum, *logs)
        assert r.returncode == 1, r.stdout
        assert "averaged log" in r.stderr
        assert "I/Os" not in r.stdout


def test_a_bad_line_is_named_and_skipped(epoch_run: Path, tmp_path: Path) -> None:
    """Garbage in line 7 of a log: named file:line on stderr, every other line counted."""
    src = clat_logs(epoch_run)[0]
    text = src.read_text().splitlines(keepends=True)
    text[6] = "12x, 3\n"
    bad = tmp_path / src.name
    bad.write_text("".join(text))
    rows, err = report("--directions", "all", bad)
    assert f"{bad}:7" in err
    assert sum(r["samples"] for r in rows) == len(text) - 1


def test_plot_and_fit_take_per_io_logs(epoch_run: Path, tmp_path: Path) -> None:
    """plot (HTML and PNG) and fit read the logs; each row's hist bins every one of its I/Os."""
    logs = clat_logs(epoch_run)
    for name in ("run.html", "run.png"):
        r = fiomon("plot", *logs, "-o", tmp_path / name)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / name).stat().st_size > 10_000
    opts = QuantaOptions(quantum_ms=250, keep_hists=True)
    with ExactReader(logs, opts) as reader:
        rows = [row for rows in reader.chunks() for row in rows]
    assert rows
    for row in rows:
        assert row.hist is not None
        assert row.hist.sum() == row.stats.samples
    lines = [x for p in logs for x in read_lines(p)]
    r = fiomon("fit", *logs)
    assert r.returncode == 0, r.stderr
    reads = sum(1 for x in lines if x.ddir == 0)
    assert f"read: {reads:,} I/Os" in r.stdout


def test_the_reader_streams_in_pieces_and_names_bad_lines(
    epoch_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads of 1 kB: the same columns as one read, and bad lines named by their number."""
    src = clat_logs(epoch_run)[0]  # rw job: offset and hex priority columns
    text = src.read_text().splitlines(keepends=True)
    text[49] = "1, 2, 3\n"
    text[120] = "-5" + text[120][text[120].index(",") :]
    bad = tmp_path / src.name
    bad.write_text("".join(text))
    whole = IoLogReader(bad, problems=ProblemLog())
    assert whole.columns == 6
    assert whole.has_offset
    assert whole.has_prio
    one = list(whole.chunks())
    monkeypatch.setattr(iolog, "READ_BYTES", 1000)
    problems = ProblemLog()
    small = IoLogReader(bad, problems=problems)
    pieces = list(small.chunks())
    assert len(pieces) > len(one)
    for name in ("time_ms", "value_ns", "ddir", "bs", "offset", "prio"):
        a = np.concatenate([getattr(c, name) for c in one])
        b = np.concatenate([getattr(c, name) for c in pieces])
        assert np.array_equal(a, b), name
    raw = [x for i, x in enumerate(read_lines(src)) if i not in (49, 120)]
    assert np.array_equal(np.concatenate([c.value_ns for c in pieces]), [x.value_ns for x in raw])
    named = [str(p) for p in problems.kept]
    assert named == [
        f"{bad}:50: has 3 fields, expected 6",
        f"{bad}:121: negative value '-5' in field 1",
    ]
    assert small.lines == len(text)


def test_source_iolog_log_unit_and_spans(epoch_run: Path) -> None:
    """--source iolog reads only the per-I/O logs; --log-unit us scales; spans merge rows."""
    files = sorted(p for p in epoch_run.iterdir() if p.suffix in (".json", ".log"))
    rows, err = report("--directions", "all", "--source", "iolog", *files)
    assert sum(r["samples"] for r in rows) == total_ios(epoch_run / "out.json")
    assert "--source iolog: not reading 1" in err  # the json+ stream
    logs = clat_logs(epoch_run)
    ns, _ = report("--directions", "all", *logs)
    us, _ = report("--directions", "all", "--log-unit", "us", *logs)
    assert [r["max_ns"] for r in us] == [1000 * r["max_ns"] for r in ns]
    spans, _ = report("--directions", "all", "--quantum", "250ms", "--target-error", "50%", *logs)
    assert sum(r["samples"] for r in spans) == sum(r["samples"] for r in ns)
    assert all("target_met" in r for r in spans)


def test_per_job_logs_0_one_file_holding_every_job(tmp_path: Path, fio_bin: str) -> None:
    """per_job_logs=0: fio appends the jobs to P_clat.log, time starting again: all exact."""
    run = tmp_path / "pj"
    run.mkdir()
    subprocess.run(
        [
            fio_bin,
            "--name=j",
            f"--filename={run / 'data'}",
            "--size=1m",
            "--bs=4k",
            "--rw=randrw",
            "--rate_iops=150,100",
            "--time_based",
            "--runtime=2",
            "--numjobs=3",
            "--per_job_logs=0",
            "--write_lat_log=pj",
            "--log_avg_msec=0",
            "--output-format=json",
            f"--output={run / 'out.json'}",
        ],
        cwd=run,
        check=True,
        capture_output=True,
        timeout=DEADLINE_S,
    )
    log = run / "pj_clat.log"
    lines = read_lines(log)
    assert any(b.time_ms < a.time_ms - 1000 for a, b in itertools.pairwise(lines))
    rows, err = report("--quantum", "500ms", log)
    assert "late" not in err
    assert sum(r["samples"] for r in rows if r["direction"] == "all") == len(lines)
    assert len(lines) == total_ios(run / "out.json")
    rows_match_lines(rows, {"": lines})
    assert max(r["streams"] for r in rows) == 3  # each job a stream of its own


def test_the_latency_kind_picks_the_logs_and_kinds_never_mix(epoch_run: Path) -> None:
    """--latency lat reads P_lat.N.log (total latency, >= clat); mixing kinds is refused."""
    logs = sorted(epoch_run.glob("lat_*.log"))
    chosen, notes, exact = choose_iologs(logs, None, "lat")
    assert exact
    assert [p.name for p in chosen] == [f"lat_lat.{n}.log" for n in (1, 2, 3)]
    assert any("lat_clat.1.log" in n and "lat_slat.1.log" in n for n in notes)
    opts = QuantaOptions(quantum_ms=500, directions=("all",), latency="lat")
    with ExactReader(chosen, opts) as reader:
        total = [r for rows in reader.chunks() for r in rows]
    with ExactReader(clat_logs(epoch_run), QuantaOptions(quantum_ms=500, directions=("all",))) as r:
        comp = [r for rows in r.chunks() for r in rows]
    assert [r.stats.samples for r in total] == [r.stats.samples for r in comp]
    assert all(t.stats.min_ns >= c.stats.min_ns for t, c in zip(total, comp, strict=True))
    with pytest.raises(FiomonError, match=r"--latency") as exc:
        ExactReader([*clat_logs(epoch_run), chosen[0]], QuantaOptions())
    assert "lat_lat.1.log" in str(exc.value)
    with pytest.raises(FiomonError, match=r"--latency clat"):
        ExactReader(chosen, QuantaOptions())


def test_latency_never_drops_a_job_whose_chosen_kind_is_not_given(epoch_run: Path) -> None:
    """--latency lat with job 1's clat log and job 2's lat log: an error, not job 2 alone.

    Leaving ``lat_clat.1.log`` out as "the same I/Os" would be silently wrong: its job's
    ``lat_lat.1.log`` is not among the inputs, so its I/Os would be counted nowhere.
    """
    clat1, lat2 = epoch_run / "lat_clat.1.log", epoch_run / "lat_lat.2.log"
    r = fiomon("report", "--format", "jsonl", "--latency", "lat", clat1, lat2)
    assert r.returncode == 2, r.stdout
    assert "lat_clat.1.log: clat (per-I/O log; lat_lat.1.log not given)" in r.stderr
    # with job 1's lat log given too, its clat log is the same I/Os: left out, exact count
    lat1 = epoch_run / "lat_lat.1.log"
    rows, err = report("--directions", "all", "--latency", "lat", clat1, lat1, lat2)
    assert sum(r["samples"] for r in rows) == len(read_lines(lat1)) + len(read_lines(lat2))
    assert "lat_clat.1.log" in err


def test_a_group_reporting_stream_is_not_left_out_for_one_thread_log(
    tmp_path: Path, fio_bin: str
) -> None:
    """numjobs=3 group_reporting: one json+ entry, three per-I/O logs (one per thread).

    The stream is the same I/Os as all three logs, not as ``P_clat.1.log`` alone: given
    with that one log, leaving it out would report a third of fio's I/Os with exit 0.
    """
    subprocess.run(
        [
            fio_bin,
            "--name=g",
            "--ioengine=psync",
            "--rw=randread",
            "--bs=4k",
            "--size=1m",
            f"--filename={tmp_path / 'data'}",
            "--time_based",
            "--runtime=1",
            "--rate_iops=100",
            "--numjobs=3",
            "--group_reporting",
            "--write_lat_log=g",
            "--log_avg_msec=0",
            "--output-format=json+",
            "--status-interval=1",
            f"--output={tmp_path / 'out.json'}",
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=DEADLINE_S,
    )
    stream = tmp_path / "out.json"
    assert len(last_document(stream)["jobs"]) == 1  # the three threads in one entry
    logs = sorted(tmp_path.glob("g_clat.*.log"))
    assert len(logs) == 3
    r = fiomon("report", stream, logs[0])
    assert r.returncode == 2, r.stdout
    assert "out.json" in r.stderr
    rows, err = report("--directions", "all", stream, *logs)
    assert sum(r["samples"] for r in rows) == total_ios(stream)
    assert "not reading" in err


def fio_randread(fio_bin: str, folder: Path, runtime: int, *opts: str) -> None:
    """One psync random-read job at 100 IOPS in ``folder`` writing ``p_clat.1.log`` (and
    p_lat, p_slat); ``opts`` are more fio options."""
    subprocess.run(
        [
            fio_bin,
            "--name=j",
            "--ioengine=psync",
            "--rw=randread",
            "--bs=4k",
            "--size=1m",
            f"--filename={folder / 'data'}",
            "--time_based",
            f"--runtime={runtime}",
            "--rate_iops=100",
            "--write_lat_log=p",
            "--log_avg_msec=0",
            *opts,
        ],
        cwd=folder,
        check=True,
        capture_output=True,
        timeout=DEADLINE_S,
    )


def test_a_stream_of_an_earlier_run_in_the_folder_is_not_left_out(
    tmp_path: Path, fio_bin: str
) -> None:
    """fio run twice in one folder: the second run's per-I/O logs replace the first's.

    The first run's json+ (a.json) names the same job numbers but not the same I/Os: left
    out as "the same I/Os" its I/Os were counted nowhere, exit 0. Its bins' count tells.
    """
    for out, runtime in (("a.json", 1), ("b.json", 2)):
        fio_randread(
            fio_bin,
            tmp_path,
            runtime,
            "--output-format=json+",
            f"--output={tmp_path / out}",
        )
    log = tmp_path / "p_clat.1.log"
    assert len(read_lines(log)) == total_ios(tmp_path / "b.json") != total_ios(tmp_path / "a.json")
    r = fiomon("report", tmp_path / "a.json", tmp_path / "b.json", log)
    assert r.returncode == 2, r.stdout
    assert "a.json: its bins count" in r.stderr
    rows, err = report("--directions", "all", tmp_path / "b.json", log)
    assert sum(r["samples"] for r in rows) == total_ios(tmp_path / "b.json")
    assert "b.json" in err


def test_a_hist_log_of_an_earlier_run_in_the_folder_is_not_left_out(
    tmp_path: Path, fio_bin: str
) -> None:
    """Run 1 wrote h_clat_hist.1.log, run 2 (same folder) p_clat.1.log: not the same I/Os.

    Same folder, same job number: left out as "the same I/Os", run 1's I/Os were counted
    nowhere (exit 0). Its count tells: a hist log lacks at most its last partial interval.
    """
    for runtime, opts in ((2, ["--write_hist_log=h", "--log_hist_msec=250"]), (1, [])):
        fio_randread(fio_bin, tmp_path, runtime, *opts)
    hist = tmp_path / "h_clat_hist.1.log"
    r = fiomon("report", tmp_path / "p_clat.1.log", hist)
    assert r.returncode == 2, r.stdout
    assert f"{hist}: its I/O count" in r.stderr


def test_other_files_beside_per_io_logs_are_named_for_what_they_are(
    epoch_run: Path, tmp_path: Path
) -> None:
    """`fiomon report *` in a run folder: the job file is named as no json+, not as I/Os.

    And an empty out.json (fio killed before it wrote) holds no I/O: left out with a note,
    where it was an error claiming it held I/Os no per-I/O log holds.
    """
    r = fiomon("report", *clat_logs(epoch_run), epoch_run / "three.fio")
    assert r.returncode == 2, r.stdout
    assert "three.fio: no json+ bins in it" in r.stderr
    shutil.copytree(epoch_run, tmp_path / "run")
    empty = tmp_path / "run" / "empty.json"
    empty.write_bytes(b"")
    rows, err = report("--directions", "all", *clat_logs(tmp_path / "run"), empty)
    assert sum(r["samples"] for r in rows) == total_ios(epoch_run / "out.json")
    assert "empty.json: empty" in err


def test_spans_of_per_io_logs_keep_the_exact_min_mean_and_max(epoch_run: Path) -> None:
    """--target-error spans merge the rows' binned values for percentiles, but min, mean and
    max are the rows' exact ones (a span said max 381us for a largest I/O of 378.8us)."""
    logs = clat_logs(epoch_run)
    lines = [x for p in logs for x in read_lines(p)]
    spans, _ = report("--directions", "all", "--quantum", "250ms", "--target-error", "1%", *logs)
    assert spans
    for r in spans:
        v = [x.value_ns for x in lines if r["start_ms"] < x.time_ms <= r["end_ms"]]
        assert r["samples"] == len(v)
        assert (r["min_ns"], r["max_ns"]) == (min(v), max(v))
        assert math.isclose(r["mean_ns"], sum(v) / len(v), rel_tol=1e-9)
        assert all(min(v) <= p <= max(v) for p in r["percentiles_ns"].values())


def test_a_four_column_log_says_its_values_are_read_as_ns(epoch_run: Path, tmp_path: Path) -> None:
    """fio 2.x wrote 4 columns in us, fio >= 3 ns: the file cannot say which, fiomon says so."""
    real = clat_logs(epoch_run)[0]
    old = tmp_path / "old_clat.1.log"  # fio 3.33's lines cut to fio 2.x's 4 columns
    lines = real.read_text().splitlines()
    old.write_text("".join(", ".join(x.split(", ")[:4]) + "\n" for x in lines))
    five, err5 = report("--directions", "all", real)
    four, err4 = report("--directions", "all", old)
    assert "--log-unit" not in err5
    assert err4.count("values read as ns") == 1, err4
    assert "pass --log-unit us for a fio 2.x log" in err4
    assert [r["percentiles_ns"] for r in four] == [r["percentiles_ns"] for r in five]
    us, err_us = report("--directions", "all", "--log-unit", "us", old)
    assert "--log-unit" not in err_us
    assert [r["max_ns"] for r in us] == [1000 * r["max_ns"] for r in four]
