"""What ``fiomon report`` prints for people and spreadsheets: ISO times, ms, scaling units."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from pathlib import Path

import numpy as np
import pytest

from fiomon.bins import plat_val_to_idx
from fiomon.offline.output import iso_ms, ms, scaled
from fiomon.tools.simulate import format_line
from tests.fiorun import fiomon

FIXTURES = Path(__file__).parent.parent / "fixtures"
HIST = FIXTURES / "fio333_randrw_clat_hist.1.log"
T0 = 1_795_347_291_000


def test_csv_has_iso_times_and_ms_that_match_the_jsonl_exactly() -> None:
    c = fiomon("report", "--format", "csv", "--per-host", str(HIST))
    j = fiomon("report", "--format", "jsonl", "--per-host", str(HIST))
    assert c.returncode == 0, c.stderr
    rows = list(csv.DictReader(io.StringIO(c.stdout)))
    objs = [json.loads(x) for x in j.stdout.splitlines()]
    assert len(rows) == len(objs) > 3
    assert list(rows[0])[:10] == [
        "start",
        "end",
        "scope",
        "host",
        "direction",
        "samples",
        "iops",
        "bytes_per_second",
        "min_ms",
        "mean_ms",
    ]
    for row, obj in zip(rows, objs, strict=True):
        end = dt.datetime.fromisoformat(row["end"])
        assert row["end"].endswith("Z")
        assert end.tzinfo == dt.UTC
        assert round(end.timestamp() * 1000) == obj["end_ms"]
        assert round(dt.datetime.fromisoformat(row["start"]).timestamp() * 1000) == obj["start_ms"]
        for k, ns in obj["percentiles_ns"].items():
            assert float(row[f"p{k}_ms"]) * 1e6 == pytest.approx(ns, abs=0.5)  # ns resolution
        for k, (low, high) in obj["percentiles_ci_ns"].items():
            assert row[f"p{k}_low_ms"] == ms(low)
            assert row[f"p{k}_high_ms"] == ms(high)
        assert float(row["max_ms"]) * 1e6 == pytest.approx(obj["max_ns"], abs=0.5)
        assert "e" not in row["p50_ms"]  # no exponents, whatever the size


def test_csv_of_logs_without_epoch_times_counts_seconds_from_the_start(tmp_path: Path) -> None:
    counts = np.zeros(1856, dtype=np.int64)
    counts[700] = 10
    log = tmp_path / "rel_clat_hist.1.log"
    log.write_text("".join(format_line(1000 * (i + 1), 0, 4096, counts) for i in range(3)))
    r = fiomon("report", "--format", "csv", str(log))
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [x["end_s"] for x in rows if x["direction"] == "read"] == ["1.000", "2.000", "3.000"]


def test_formatting_helpers() -> None:
    assert iso_ms(1_795_347_291_835) == "2026-11-22T11:34:51.835Z"
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert ms(63_616.0) == "0.063616"
    assert ms(5_000_000.0) == "5"
    assert ms(None) == ""
    assert [scaled(v) for v in (850, 6_500, 43_000, 999_700, 1.07e6, 2.41e9)] == [
        "850ns",
        "6.50us",
        "43.0us",
        "1.00ms",
        "1.07ms",
        "2.41s",
    ]


def test_table_latencies_scale_with_each_value(tmp_path: Path) -> None:
    """A run whose p99 goes from µs to seconds: each cell in its own unit."""
    fast = np.zeros(1856, dtype=np.int64)
    fast[plat_val_to_idx(np.array([40_000]))[0]] = 1000  # 40 µs
    slow = fast.copy()
    slow[plat_val_to_idx(np.array([2_500_000_000]))[0]] = 100  # 2.5 s
    log = tmp_path / "h_clat_hist.1.log"
    log.write_text(format_line(T0 + 1000, 0, 4096, fast) + format_line(T0 + 2000, 0, 4096, slow))
    r = fiomon("report", "--directions", "read", "--percentiles", "50,99", str(log))
    assert r.returncode == 0, r.stderr
    head, cols, _date, first, second = r.stdout.splitlines()
    assert "latencies with their units" in head
    assert cols.split()[-3:] == ["p50", "p99", "max"]
    p50, p99, top = first.split()[-3:]
    assert (p50[-2:], p99[-2:], top[-2:]) == ("us", "us", "us")
    assert p50.startswith("40.") or p50.startswith("39.")
    p50, p99, top = second.split()[-3:]
    assert p50.endswith("us")
    assert p99.endswith("s") and not p99.endswith(("us", "ms", "ns"))
    assert 2.4 <= float(p99[:-1]) <= 2.7


def test_run_labels_the_rows_of_fio_output_in_every_format() -> None:
    j = fiomon("report", "--format", "jsonl", "--run", "nightly-42", str(HIST))
    assert j.returncode == 0, j.stderr
    assert {tuple(json.loads(x)["runs"]) for x in j.stdout.splitlines()} == {("nightly-42",)}
    c = fiomon("report", "--format", "csv", "--run", "nightly-42", str(HIST))
    assert {row["runs"] for row in csv.DictReader(io.StringIO(c.stdout))} == {"nightly-42"}
    t = fiomon("report", "--run", "nightly-42", str(HIST))
    assert t.stdout.splitlines()[2] == "# run: nightly-42"
    plain = fiomon("report", "--format", "csv", str(HIST))
    assert {row["runs"] for row in csv.DictReader(io.StringIO(plain.stdout))} == {""}
    bad = fiomon("report", "--run", "", str(HIST))
    assert bad.returncode == 2
    assert "run label" in bad.stderr


def test_fiomon_fio_name_is_one_folder_name(tmp_path: Path) -> None:
    from fiomon.tools.runfio import run_folder  # noqa: PLC0415

    assert run_folder(tmp_path, None) == tmp_path
    assert run_folder(tmp_path, "nightly-42") == tmp_path / "nightly-42"
    for bad in ("", "..", "a/b", "a\nb", "tab\there"):
        with pytest.raises(ValueError, match="one folder name"):
            run_folder(tmp_path, bad)
    r = fiomon("fio", "--name", "a/b", "--output-dir", tmp_path, "--", "job.fio")
    assert r.returncode == 2
    assert "--name must be one folder name" in r.stderr
