"""Quanta files read back by ``fiomon report`` and ``fiomon plot``: revisions resolved.

The rows come from real fio runs (two hosts, reads and writes), reported as closed-quantum
JSON lines; the revised publications are those rows again with other statistics, written
by :meth:`ClosedQuantum.to_json_line` as an aggregator appends them.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from fiomon.closed import ClosedQuantum
from fiomon.errors import FiomonError
from fiomon.histogram import HistStats
from fiomon.offline.output import iso_ms
from fiomon.offline.quanta import QuantaOptions, iter_quanta
from fiomon.offline.quantafiles import parse_row, rotation_order
from tests.fiorun import fiomon, job_file, start_fio, wait_fio

REVISED_AT = 1_795_000_600_000


@dataclass(frozen=True)
class Run:
    """Two hosts' hist logs and their per-host report as closed-quantum lines."""

    logs: list[Path]
    quanta: Path
    lines: list[str]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, fio_bin: str) -> Run:
    folder = tmp_path_factory.mktemp("quantafiles")
    procs = []
    for host in ("h1", "h2"):
        job = job_file(folder / host, rw="randrw", runtime=3, iops=200)
        procs.append(start_fio(fio_bin, job, folder / host / "out.json"))
    wait_fio(procs)
    logs = sorted(folder.glob("h*/run_clat_hist.*.log"))
    assert len(logs) == 2
    r = fiomon("report", "--per-host", "--format", "jsonl", *logs)
    assert r.returncode == 0, r.stderr
    quanta = folder / "report.jsonl"
    quanta.write_text(r.stdout)
    lines = r.stdout.splitlines(keepends=True)
    assert len({json.loads(x)["end_ms"] for x in lines}) >= 3
    assert {json.loads(x)["host"] for x in lines} == {None, "h1", "h2"}
    return Run(logs, quanta, lines)


def _row(line: str) -> ClosedQuantum:
    return parse_row(json.loads(line))


def _revised(line: str, revision: int, p99_ns: float, more: float = 5.0) -> str:
    """A later publication of ``line``'s key: more samples, another p99."""
    r = _row(line)
    stats = replace(
        r.stats,
        samples=r.stats.samples + more,
        percentiles_ns={**r.stats.percentiles_ns, "99": p99_ns},
    )
    return replace(
        r, stats=stats, revision=revision, revised_at=REVISED_AT + revision, late_records=3
    ).to_json_line()


def test_a_report_of_a_quanta_file_prints_its_lines_again(run: Run) -> None:
    r = fiomon("report", "--per-host", "--format", "jsonl", run.quanta)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "".join(run.lines)
    assert r.stderr == ""
    # Without --per-host, the cluster rows; --directions, those directions.
    r = fiomon("report", "--format", "jsonl", "--directions", "read", run.quanta)
    assert r.returncode == 0, r.stderr
    want = [x for x in run.lines if '"scope":"cluster"' in x and '"direction":"read"' in x]
    assert r.stdout == "".join(want)


def test_every_format_of_a_quanta_file_matches_the_report_of_its_logs(run: Run) -> None:
    for fmt in ("table", "fiologparser"):
        of_file = fiomon("report", "--per-host", "--format", fmt, run.quanta)
        of_logs = fiomon("report", "--per-host", "--format", fmt, *run.logs)
        assert of_file.returncode == 0, of_file.stderr
        assert of_file.stdout == of_logs.stdout, fmt
    # csv: the same values (a whole 13312.0 may print as 13312 once read back).
    of_file = fiomon("report", "--per-host", "--format", "csv", run.quanta)
    of_logs = fiomon("report", "--per-host", "--format", "csv", *run.logs)
    a = list(csv.reader(io.StringIO(of_file.stdout)))
    b = list(csv.reader(io.StringIO(of_logs.stdout)))
    assert a[0] == b[0]
    assert len(a) == len(b) == len(run.lines) + 1
    for x, y in zip(a[1:], b[1:], strict=True):
        assert [_num(v) for v in x] == [_num(v) for v in y]


def _num(v: str) -> object:
    try:
        return float(v)
    except ValueError:
        return v


def test_revisions_resolve_to_the_highest_per_key_across_rotated_files(
    run: Run, tmp_path: Path
) -> None:
    lines = run.lines
    half = len(lines) // 2
    k1, k2, k3, k4 = lines[0], lines[1], lines[2], lines[3]
    older = [*lines[:half], _revised(k4, 1, 1e6)]
    newer = [
        *lines[half:],
        _revised(k1, 1, 9.5e6),  # a revision of a row in the older file
        _revised(k2, 1, 1.1e6),
        _revised(k2, 2, 2.2e6),
        _revised(k2, 1, 3.3e6),  # a stale copy of revision 1 after revision 2: loses
        _revised(k3, 1, 4.4e6),
        _revised(k3, 1, 5.5e6),  # equal revisions: the later line wins
        _revised(k4, 1, 6.6e6),  # equal to the older file's revision 1: newer file wins
    ]
    torn = _revised(lines[4], 1, 7.7e6)
    base = tmp_path / "quanta.jsonl"
    (tmp_path / "quanta.jsonl.1").write_text("".join(older))
    base.write_text("".join(newer) + torn[: len(torn) // 2])  # killed mid-line
    winners = {
        _row(k1).key: _revised(k1, 1, 9.5e6),
        _row(k2).key: _revised(k2, 2, 2.2e6),
        _row(k3).key: _revised(k3, 1, 5.5e6),
        _row(k4).key: _revised(k4, 1, 6.6e6),
    }
    want = sorted(
        (winners.get(_row(x).key, x) for x in lines), key=lambda x: int(json.loads(x)["end_ms"])
    )
    # Newest given first: the suffix, not the order given, says which file is older.
    r = fiomon("report", "--per-host", "--format", "jsonl", base, tmp_path / "quanta.jsonl.1")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "".join(want)
    torn_no = len(newer) + 1
    assert f"{base}:{torn_no}: torn last line skipped" in r.stderr
    # The table shows the revised value of k1's p99 (9.5 ms), the first close's nowhere.
    r = fiomon("report", "--per-host", "--format", "csv", base, tmp_path / "quanta.jsonl.1")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == len(lines)
    first = _row(k1)
    (got,) = [
        x
        for x in rows
        if (x["end"], x["scope"], x["host"] or None, x["direction"])
        == (iso_ms(first.key[0]), *first.key[1:])
    ]
    assert float(got["p99_ms"]) == 9.5
    assert float(got["late_records"]) == 3


def test_rotation_order_reads_the_highest_suffix_first() -> None:
    got = rotation_order(
        [Path("a/q.jsonl"), Path("b.jsonl"), Path("a/q.jsonl.2"), Path("a/q.jsonl.10")]
    )
    assert got == [Path("a/q.jsonl.10"), Path("a/q.jsonl.2"), Path("a/q.jsonl"), Path("b.jsonl")]


def test_a_bad_line_is_an_error_naming_the_file_and_line(run: Run, tmp_path: Path) -> None:
    bad = tmp_path / "quanta.jsonl"
    bad.write_text("".join(run.lines[:2]) + '{"start_ms":1,"oops"\n' + "".join(run.lines[2:]))
    r = fiomon("report", "--format", "jsonl", bad)
    assert r.returncode == 1
    assert f"{bad}:3: not a JSON object" in r.stderr
    assert r.stdout == ""
    # Valid JSON that is not a row names what is wrong with it.
    obj = json.loads(run.lines[0])
    del obj["percentiles_ns"]
    bad.write_text(run.lines[0] + json.dumps(obj) + "\n")
    r = fiomon("report", bad)
    assert r.returncode == 1
    assert f"{bad}:2: not a closed-quantum row: no 'percentiles_ns'" in r.stderr


def test_a_percentile_the_rows_lack_is_an_error_naming_those_they_hold(run: Run) -> None:
    r = fiomon("report", "--percentiles", "50,99.99", run.quanta)
    assert r.returncode == 1
    assert str(run.quanta) in r.stderr
    assert "no percentile 99.99" in r.stderr
    assert "its rows hold 50, 90, 99, 99.9" in r.stderr
    # Percentiles it has: those columns only.
    r = fiomon("report", "--percentiles", "99", "--format", "jsonl", run.quanta)
    assert r.returncode == 0, r.stderr
    assert all(list(json.loads(x)["percentiles_ns"]) == ["99"] for x in r.stdout.splitlines())


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--quantum", "2s"], "--quantum 2000 ms, but the file's quanta are 1000 ms"),
        (["--align", "epoch"], "--align: another phase needs the histograms"),
        (["--target-error", "5%"], "--target-error: merging quanta into spans needs"),
        (["--confidence-level", "0.99"], "--confidence-level: another level needs"),
        (["--usbin"], "--usbin: reads fio output only"),
    ],
)
def test_options_that_need_histograms_are_refused_saying_why(
    run: Run, flags: list[str], says: str
) -> None:
    r = fiomon("report", *flags, run.quanta)
    assert r.returncode == 1, r.stdout
    assert says in r.stderr
    assert str(run.quanta) in r.stderr


def test_the_files_own_quantum_may_be_given(run: Run) -> None:
    r = fiomon("report", "--quantum", "1s", "--per-host", "--format", "jsonl", run.quanta)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "".join(run.lines)


def test_a_quanta_file_and_fio_logs_do_not_mix(run: Run) -> None:
    r = fiomon("report", run.quanta, run.logs[0])
    assert r.returncode == 2
    assert "cannot mix a quanta file" in r.stderr
    assert str(run.quanta) in r.stderr
    assert str(run.logs[0]) in r.stderr


def test_help_says_quanta_files_are_read_with_revisions_resolved() -> None:
    for cmd in ("report", "plot"):
        r = fiomon(cmd, "--help")
        assert r.returncode == 0
        text = " ".join(r.stdout.split())
        assert "quanta file" in text, cmd
        assert "highest revision" in text, cmd


def _page_data(html: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="fiomon-data">(.*?)</script>', html, re.S)
    assert m is not None
    doc: dict[str, Any] = json.loads(m.group(1))
    return doc


def _series(doc: dict[str, Any], scope: str, direction: str) -> dict[str, Any]:
    (s,) = [x for x in doc["series"] if x["scope"] == scope and x["direction"] == direction]
    assert isinstance(s, dict)
    return s


def test_plot_of_a_quanta_file_draws_the_resolved_rows(run: Run, tmp_path: Path) -> None:
    # Without revisions: the charts of the logs, quantum by quantum (no heat: no histograms).
    r = fiomon("plot", "--per-host", run.quanta, "-o", tmp_path / "file.html")
    assert r.returncode == 0, r.stderr
    s = fiomon("plot", "--per-host", *run.logs, "-o", tmp_path / "logs.html")
    assert s.returncode == 0, s.stderr
    of_file = _page_data((tmp_path / "file.html").read_text())
    of_logs = _page_data((tmp_path / "logs.html").read_text())
    assert of_file["percentiles"] == of_logs["percentiles"]
    assert len(of_file["series"]) == len(of_logs["series"])
    for a, b in zip(of_file["series"], of_logs["series"], strict=True):
        assert (a["scope"], a["host"], a["direction"], a["end"]) == (
            b["scope"],
            b["host"],
            b["direction"],
            b["end"],
        )
        assert a["p"] == b["p"]
        assert a["samples"] == b["samples"]
    # A revision of the first cluster read row: its p99 is drawn, the first close's not.
    first = next(x for x in run.lines if '"scope":"cluster"' in x and '"direction":"read"' in x)
    quanta = tmp_path / "quanta.jsonl"
    quanta.write_text("".join(run.lines) + _revised(first, 1, 12_345_678.0))
    r = fiomon("plot", quanta, "-o", tmp_path / "revised.html")
    assert r.returncode == 0, r.stderr
    doc = _page_data((tmp_path / "revised.html").read_text())
    read = _series(doc, "cluster", "read")
    before = _series(of_file, "cluster", "read")
    assert read["end"] == before["end"]
    assert read["p"]["99"][0] == 12_345_700
    assert read["p"]["99"][1:] == before["p"]["99"][1:]
    assert read["samples"][0] == before["samples"][0] + 5


def test_iter_quanta_gives_a_quanta_files_resolved_rows(run: Run, tmp_path: Path) -> None:
    first = run.lines[0]
    quanta = tmp_path / "quanta.jsonl"
    quanta.write_text("".join(run.lines) + _revised(first, 1, 9.5e6))
    rows = list(iter_quanta([quanta], QuantaOptions(per_host=True)))
    assert [r.to_json_line() for r in rows[1:]] == [_row(x).to_json_line() for x in run.lines[1:]]
    assert (rows[0].key, rows[0].revision) == (_row(first).key, 1)
    assert rows[0].stats.percentiles_ns["99"] == 9.5e6
    cluster = list(iter_quanta([quanta], QuantaOptions(directions=("read",))))
    assert {(r.scope, r.direction) for r in cluster} == {("cluster", "read")}
    with pytest.raises(FiomonError, match="quanta are 1000 ms"):
        list(iter_quanta([quanta], QuantaOptions(quantum_ms=2000)))


def test_summary_and_fit_name_a_quanta_file_they_cannot_read(run: Run) -> None:
    for cmd in ("summary", "fit"):
        r = fiomon(cmd, run.quanta)
        assert r.returncode == 2, cmd
        assert f"{run.quanta}: a quanta file" in r.stderr
        assert "fiomon report and fiomon plot read quanta files" in r.stderr


def test_every_field_of_a_row_reads_back_to_the_same_line() -> None:
    stats = HistStats(12.5, 1024.0, 3333.25, 9e9, {"50": 2048.0, "99.9": 9e9}, ("99.9",))
    root_row = ClosedQuantum(
        start_ms=1_795_000_000_000,
        end_ms=1_795_000_001_000,
        scope="host",
        host="h\u00e9",
        direction="mixed",
        stats=stats,
        iops=None,
        bytes_per_second=12.75,
        streams=3,
        late_records=4,
        ci_ns={"50": (1024, None), "99.9": (None, None)},
        target_met=False,
        complete=False,
        cells_missing=("cell-a", "cell-b"),
        revision=2,
        revised_at=1_795_000_500_000,
    )
    line = root_row.to_json_line()
    assert parse_row(json.loads(line)).to_json_line() == line
    old = json.loads(line)
    for added in ("revision", "revised_at", "complete"):  # lines from before these fields
        del old[added]
    back = parse_row(old)
    assert (back.revision, back.revised_at, back.complete) == (0, None, True)
