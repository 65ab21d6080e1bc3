"""``--latency clat|lat|slat`` offline, against real fio 3.33's own numbers.

fio writes total-latency bins (``lat_ns``) only with ``lat_percentiles=1`` and
submission-latency bins (``slat_ns``) only with ``slat_percentiles=1`` on an asynchronous
engine (psync records no submission latency). fiomon's whole-run percentiles of that
kind must equal fio's own (its final dump's ``percentile`` of that section) within one of
fio's bins, and count exactly its ``N`` I/Os. The run is buffered libaio, whose reads
happen inside io_submit: their submission latency is most of the total, so lat, slat and
clat lie bins apart and reading the wrong bins cannot pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fiomon.bins import plat_val_to_idx
from fiomon.fio.parsers import ParserOptions, open_parser
from fiomon.fio.problems import ProblemLog
from fiomon.model import LatencyKind
from tests.fiorun import fiomon, job_file, last_document, start_fio, wait_fio

pytestmark = pytest.mark.fio

PCTS = ("50", "90", "99", "99.9")
DIRS = ("read", "write")
LIBAIO = "ioengine=libaio\niodepth=4"  # later lines of [global] override psync


def _run(folder: Path, fio_bin: str, extra: str) -> Path:
    """A 2 s randrw job at 200 IOPS with its json+ stream (and hist logs, prefix run)."""
    job = job_file(folder, iops=200, runtime=2, rw="randrw", extra=extra)
    wait_fio([start_fio(fio_bin, job, folder / "vm.json")])
    return folder / "vm.json"


@pytest.fixture(scope="module")
def lat_run(tmp_path_factory: pytest.TempPathFactory, fio_bin: str) -> Path:
    """libaio json+ with lat_ and slat_percentiles=1 (all three kinds' bins), hist logs and
    per-I/O logs of the three kinds."""
    extra = f"{LIBAIO}\nlat_percentiles=1\nslat_percentiles=1\nwrite_lat_log=P\nlog_avg_msec=0"
    return _run(tmp_path_factory.mktemp("lat"), fio_bin, extra)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory, fio_bin: str) -> Path:
    """json+ without lat/slat_percentiles (clat_ns bins only), hist logs and per-I/O logs."""
    return _run(
        tmp_path_factory.mktemp("plain"),
        fio_bin,
        "write_lat_log=P\nlog_avg_msec=0",
    )


def _fio_truth(stream: Path, section: str) -> dict[str, tuple[int, dict[str, int]]]:
    """Per direction, fio's N and percentiles (ns) of ``section`` in its final dump."""
    job = last_document(stream)["jobs"][0]
    out = {}
    for d in DIRS:
        sec = job[d][section]
        pct = {f"{float(k):g}": int(v) for k, v in sec["percentile"].items()}
        out[d] = (int(sec["N"]), {k: pct[k] for k in PCTS})
    return out


def _same_bin(got: float, want: int) -> bool:
    """fiomon's value and fio's lie in the same fio bin or adjacent ones."""
    a, b = (int(i) for i in plat_val_to_idx(np.array([round(got), want], dtype=np.int64)))
    return abs(a - b) <= 1


def _apart(stream: Path, section: str) -> None:
    """fio's read p50 of ``section`` is bins away from its clat p50 (a discriminating run)."""
    a = _fio_truth(stream, section)["read"][1]["50"]
    b = _fio_truth(stream, "clat_ns")["read"][1]["50"]
    assert not _same_bin(a, b), f"{section} p50 {a} and clat p50 {b}: too close to tell apart"


def _check(got: dict[str, tuple[float, dict[str, float]]], truth: Any) -> None:
    for d in DIRS:
        n, pcts = truth[d]
        assert n > 300, f"fio ran too few {d}s: {n}"
        samples, mine = got[d]
        assert samples == n, (d, samples, n)
        for k in PCTS:
            assert _same_bin(mine[k], pcts[k]), (d, k, mine[k], pcts[k])


def _summary(*args: str | Path) -> dict[str, tuple[float, dict[str, float]]]:
    r = fiomon("summary", "--format", "json", "--percentiles", ",".join(PCTS), *args)
    assert r.returncode == 0, r.stderr
    return {s["operation"]: (s["ios"], s["percentiles_ns"]) for s in json.loads(r.stdout)}


def _report(
    stream: Path, *args: str, files: Sequence[Path] = ()
) -> dict[str, tuple[float, dict[str, float]]]:
    """Whole-run rows of ``files`` (default: ``stream``): one hour-long quantum that starts
    ten minutes before the stream's last dump."""
    phase = (int(last_document(stream)["timestamp_ms"]) - 600_000) % 3_600_000
    r = fiomon(
        "report",
        "--format",
        "jsonl",
        "--quantum",
        "1h",
        "--align",
        f"{phase}ms",
        "--percentiles",
        ",".join(PCTS),
        *args,
        *(files or (stream,)),
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    got = {}
    for row in rows:
        if row["direction"] in DIRS:
            assert row["direction"] not in got, "the run fell into two quanta"
            got[row["direction"]] = (row["samples"], row["percentiles_ns"])
    return got


def lat_run_files(stream: Path) -> list[Path]:
    """A stream and its hist logs."""
    return [stream, *sorted(stream.parent.glob("run_clat_hist.*.log"))]


def test_report_and_summary_lat_equal_fios_lat_percentiles(lat_run: Path) -> None:
    _apart(lat_run, "lat_ns")
    truth = _fio_truth(lat_run, "lat_ns")
    _check(_report(lat_run, "--latency", "lat"), truth)
    _check(_summary("--latency", "lat", lat_run), truth)


def test_report_and_summary_slat_equal_fios_slat_percentiles(lat_run: Path) -> None:
    _apart(lat_run, "slat_ns")
    truth = _fio_truth(lat_run, "slat_ns")
    _check(_report(lat_run, "--latency", "slat"), truth)
    _check(_summary("--latency", "slat", lat_run), truth)
    _check(_report(lat_run), _fio_truth(lat_run, "clat_ns"))  # the default: clat


def test_headers_name_the_latency(lat_run: Path) -> None:
    table = fiomon("report", "--latency", "lat", lat_run)
    assert table.returncode == 0, table.stderr
    assert "lat p99" in table.stdout
    assert "# lat = total latency" in table.stdout
    csv = fiomon("report", "--latency", "lat", "--format", "csv", lat_run)
    assert "lat_p99_ms" in csv.stdout.splitlines()[0]
    summary = fiomon("summary", "--latency", "lat", lat_run)
    assert "lat percentiles" in summary.stdout, summary.stdout
    plain = fiomon("report", "--format", "csv", lat_run)
    assert plain.stdout.splitlines()[0].count("lat_") == 0  # clat: the columns as before
    fit = fiomon("fit", "--latency", "lat", lat_run)
    assert fit.returncode == 0, fit.stderr
    assert fit.stdout.startswith("read (lat): ")
    page = lat_run.parent / "lat.html"
    plot = fiomon("plot", "--latency", "lat", lat_run, "-o", page)
    assert plot.returncode == 0, plot.stderr
    assert "vm.json · lat (total latency)" in page.read_text()


def test_lat_without_lat_percentiles_is_a_specific_error(plain_run: Path) -> None:
    for cmd in ("report", "summary", "fit"):
        r = fiomon(cmd, "--latency", "lat", plain_run)
        assert r.returncode != 0, cmd
        assert str(plain_run) in r.stderr, r.stderr
        assert "lat_percentiles=1" in r.stderr, r.stderr
        assert "its clat_ns bins are read with --latency clat" in r.stderr, r.stderr


def test_slat_without_slat_percentiles_is_a_specific_error(plain_run: Path) -> None:
    r = fiomon("report", "--latency", "slat", plain_run)
    assert r.returncode != 0
    assert f"{plain_run}: fio JSON without submission-latency histograms" in r.stderr, r.stderr
    assert "slat_percentiles=1" in r.stderr
    assert "asynchronous ioengines" in r.stderr


def test_hist_logs_with_lat_are_refused_by_name(plain_run: Path) -> None:
    logs = sorted(plain_run.parent.glob("run_clat_hist.*.log"))
    assert logs
    r = fiomon("report", "--latency", "lat", *logs)
    assert r.returncode != 0
    assert "hist logs hold completion latency (clat) only" in r.stderr, r.stderr
    assert all(str(p) in r.stderr for p in logs), r.stderr
    r = fiomon("report", "--latency", "lat", "--source", "hist", *lat_run_files(plain_run))
    assert r.returncode != 0
    assert "--source hist with --latency lat: hist logs hold clat only" in r.stderr, r.stderr


def test_lat_takes_the_json_stream_over_its_hist_logs(lat_run: Path) -> None:
    files = lat_run_files(lat_run)
    assert len(files) == 2
    r = fiomon("report", "--latency", "lat", "--format", "jsonl", "--directions", "all", *files)
    assert r.returncode == 0, r.stderr
    assert "--latency lat: not reading 1 hist log(s) the json+ streams cover" in r.stderr
    # Rows split a dump's records between quanta by time: float sums, exact to rounding.
    n = round(sum(json.loads(ln)["samples"] for ln in r.stdout.splitlines() if ln.strip()), 3)
    truth = _fio_truth(lat_run, "lat_ns")
    assert n == sum(truth[d][0] for d in DIRS), (n, truth, r.stderr)
    r = fiomon("report", "--latency", "lat", "--source", "hist", *files)
    assert r.returncode != 0
    assert "hist logs hold clat only" in r.stderr, r.stderr


def test_per_io_logs_by_kind(lat_run: Path) -> None:
    """write_lat_log's three logs of one job: --latency picks one; alone, a kind is its own."""
    folder = lat_run.parent
    logs = [folder / f"P_{k}.1.log" for k in ("clat", "lat", "slat")]
    for kind, section in (("lat", "lat_ns"), ("slat", "slat_ns"), ("clat", "clat_ns")):
        truth = _fio_truth(lat_run, section)
        _check(_report(lat_run, "--latency", kind, files=logs), truth)
        # with the json+ stream and hist log of the same job: the per-I/O log, exact, counts
        _check(_report(lat_run, "--latency", kind, files=[*logs, *lat_run_files(lat_run)]), truth)
    r = fiomon("report", *logs)  # the three views of the same I/Os: clat, a note
    assert r.returncode == 0, r.stderr
    assert "not reading 2 per-I/O log(s) of other latency kinds" in r.stderr, r.stderr
    r = fiomon("report", logs[1])  # lat logs alone are lat
    assert r.returncode == 0, r.stderr
    assert "note: --latency lat: the one kind every input holds" in r.stderr
    assert "lat p99" in r.stdout


def test_mixing_kinds_is_refused_naming_files_and_flag(plain_run: Path, lat_run: Path) -> None:
    folder = plain_run.parent
    clat, lat = folder / "P_clat.1.log", folder / "P_lat.1.log"
    assert clat.is_file() and lat.is_file()
    cases = [
        [clat, lat_run.parent / "P_lat.1.log"],  # a job's clat log, another job's lat log
        [plain_run, lat],  # a json+ without lat_ns bins beside lat logs
        [lat, folder / "run_clat_hist.1.log"],  # lat logs beside a (clat) hist log
    ]
    for files in cases:
        r = fiomon("report", *files)
        assert r.returncode != 0, files
        assert "these inputs hold different fio latencies" in r.stderr, r.stderr
        assert all(f"  {f}: " in r.stderr for f in files), r.stderr
        assert "--latency clat|lat|slat" in r.stderr


def test_agent_parser_takes_the_kind(lat_run: Path, plain_run: Path) -> None:
    """The parser the agent opens: lat bins by option; a hist log refused for lat."""
    data = lat_run.read_bytes()
    kinds: tuple[tuple[LatencyKind, str], ...] = (("lat", "lat_ns"), ("slat", "slat_ns"))
    for kind, section in (*kinds, ("clat", "clat_ns")):
        problems = ProblemLog()
        parser = open_parser(data[:4096], str(lat_run), problems, ParserOptions(latency=kind))
        batches = [parser.feed(data), parser.finish()]
        n = sum(int(b.counts.sum()) for b in batches if b is not None)
        assert n == sum(v[0] for v in _fio_truth(lat_run, section).values())
    log = plain_run.parent / "run_clat_hist.1.log"
    parser = open_parser(
        log.read_bytes()[:4096], str(log), ProblemLog(), ParserOptions(latency="lat")
    )
    assert parser.feed(log.read_bytes()) is None
    assert parser.refusal is not None
    assert "completion latency (clat) only" in parser.refusal
