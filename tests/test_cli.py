"""``fiomon`` through its real entry point: formats, bad input, exit codes, progress."""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fiomon import __version__
from fiomon.cli import main
from fiomon.tools.demo import RESOLVE_S
from tests.conftest import DEADLINE_S, FIXTURES

HIST = FIXTURES / "fio333_randrw_clat_hist.1.log"
JSON = FIXTURES / "fio333_randrw_status.json"


def fiomon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fiomon", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_jsonl_rows_follow_the_contract() -> None:
    r = fiomon("report", "--format", "jsonl", str(HIST), str(JSON))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert rows
    keys = {
        "start_ms",
        "end_ms",
        "scope",
        "host",
        "direction",
        "samples",
        "min_ns",
        "mean_ns",
        "max_ns",
        "percentiles_ns",
        "saturated",
        "iops",
        "bytes_per_second",
        "streams",
        "late_records",
        "revision",
        "complete",
        "percentiles_ci_ns",
    }
    for row in rows:
        assert set(row) == keys
        assert row["complete"] is True  # offline: the input is what there is
        assert row["revision"] == 0  # offline: every row is a first publication
        assert set(row["percentiles_ns"]) == {"50", "90", "99", "99.9"}
        assert set(row["percentiles_ci_ns"]) == {"50", "90", "99", "99.9"}
        for k, (low, high) in row["percentiles_ci_ns"].items():
            # Bounds hold the estimate; a side the data cannot bound is null.
            assert low is None or low <= row["percentiles_ns"][k]
            assert high is None or high >= row["percentiles_ns"][k]
        assert row["scope"] == "cluster"
        assert row["end_ms"] - row["start_ms"] == 1000


def test_csv_and_table_show_the_confidence_intervals() -> None:
    r = fiomon("report", "--format", "csv", "--percentiles", "50,99.9", str(HIST))
    assert r.returncode == 0, r.stderr
    head, *lines = [ln.split(",") for ln in r.stdout.splitlines()]
    # Appended after the old columns, which keep their places.
    assert head[-4:] == ["p50_low_ms", "p50_high_ms", "p99.9_low_ms", "p99.9_high_ms"]
    assert head[-6:-4] == ["late_records", "runs"]
    col = {name: i for i, name in enumerate(head)}
    for ln in lines:
        p50 = float(ln[col["p50_ms"]])
        assert float(ln[col["p50_low_ms"]]) <= p50 <= float(ln[col["p50_high_ms"]])
    t = fiomon("report", "--ci", "--confidence-level", "90%", "--percentiles", "50", str(HIST))
    assert t.returncode == 0, t.stderr
    first, header, *_ = t.stdout.splitlines()
    assert "CI = 90% confidence interval" in first
    assert header.split()[-4:] == ["p50", "p50", "CI", "max"]
    bad = fiomon("report", "--confidence-level", "1.5", str(HIST))
    assert bad.returncode == 2
    assert "--confidence-level" in bad.stderr


def test_csv_and_table_and_per_host() -> None:
    r = fiomon(
        "report", "--format", "csv", "--per-host", "--directions", "read", str(HIST), str(JSON)
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("start,end,scope,host,direction,samples")
    hosts = {ln.split(",")[3] for ln in lines[1:]}
    # Files in one folder are named by their file names without fio's suffixes.
    assert hosts == {"", "fio333_randrw", "fio333_randrw_status"}
    t = fiomon("report", str(HIST))
    assert t.returncode == 0
    assert "p99.9" in t.stdout.splitlines()[1]


def test_fiologparser_layout() -> None:
    r = fiomon("report", "--format", "fiologparser", "--percentiles", "90,95,99", str(HIST))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "end-time, samples, min, avg, median, 90%, 95%, 99%, max"
    assert len(lines[1].split(", ")) == 9
    assert "nan" not in r.stdout
    d = fiomon("report", "--format", "fiologparser", "--directions", "read,write", str(HIST))
    assert d.stdout.splitlines()[0].startswith("end-time, dir, samples")
    assert {ln.split(", ")[1] for ln in d.stdout.splitlines()[1:]} == {"r", "w"}


BAD = {
    "empty": b"",
    "binary": bytes(range(256)) * 20,
    "truncated": HIST.read_bytes()[:-100],
    "non-numeric": HIST.read_bytes().replace(b", 0, 0,", b", x, 0,", 1),
    # Fields too long for int64 used to crash the scanner (RecursionError, IndexError).
    "digits22": HIST.read_bytes().replace(b", 0, 0,", b", " + b"7" * 22 + b", 0,", 1),
    "digits30": HIST.read_bytes().replace(b", 0\n", b", " + b"9" * 30 + b"\n", 1),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_named_never_a_traceback(tmp_path: Path, name: str) -> None:
    bad = tmp_path / f"{name}.log"
    bad.write_bytes(BAD[name])
    r = fiomon("report", str(bad), str(HIST))
    assert "Traceback" not in r.stderr
    assert r.returncode == 0, r.stderr
    assert str(bad) in r.stderr
    assert r.stdout.count("\n") > 3, "the good file is still reported"
    strict = fiomon("report", "--strict", str(bad))
    assert "Traceback" not in strict.stderr
    assert strict.returncode == 1
    assert str(bad) in strict.stderr


def test_nothing_readable_exits_1_with_reasons(tmp_path: Path) -> None:
    bad = tmp_path / "bad.log"
    bad.write_text("1, 0, 4096, " + ", ".join(["1"] * 101) + "\n")  # no fio layout has 101 bins
    r = fiomon("report", str(bad))
    assert r.returncode == 1
    assert "fit no fio layout" in r.stderr
    assert "Traceback" not in r.stderr
    # Five numbers a line: fio's lat/bw/iops logs, which are no hist logs at all.
    bad.write_text("1, 0, 4096, 1, 2\n")
    r = fiomon("report", str(bad))
    assert r.returncode == 1
    assert f"{bad}: not a histogram log: it looks like fio's latency" in r.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert fiomon("report", "--quantum", "soon", str(HIST)).returncode == 2
    assert fiomon("report", "--percentiles", "101", str(HIST)).returncode == 2
    assert fiomon("report", "--align", "sideways", str(HIST)).returncode == 2
    missing = fiomon("report", str(tmp_path / "nope.log"))
    assert missing.returncode == 1
    assert "not a readable file" in missing.stderr


def test_mixing_epoch_and_relative_is_refused(tmp_path: Path) -> None:
    rel = tmp_path / "rel.log"
    rel.write_text(
        "".join(f"{k * 1000}, 0, 4096, " + ", ".join(["1"] * 1856) + "\n" for k in range(1, 4))
    )
    r = fiomon("report", str(rel))
    assert r.returncode == 0
    assert "relative timestamps" in r.stderr
    mixed = fiomon("report", str(rel), str(HIST))
    assert mixed.returncode == 1
    assert "cannot mix epoch-stamped and relative-time inputs" in mixed.stderr


def test_progress_line_on_request() -> None:
    r = fiomon("report", "--progress", "--format", "jsonl", str(HIST))
    assert "fiomon report:" in r.stderr
    assert "MB read" in r.stderr


def test_version_and_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"fiomon {__version__}\n"
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])  # the convention; `fiomon version` stays
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"fiomon {__version__}\n"
    r = fiomon("demo", "--duration", str(RESOLVE_S), "--hosts", "4", "--jobs", "1")
    assert r.returncode == 0, r.stderr
    assert "ends before the alert can resolve" not in r.stderr
    assert "p99" in r.stdout
    assert "storage node fails" in r.stderr
    assert re.search(r"live page \(open it in a browser\): http://127\.0\.0\.1:\d+/", r.stderr)
    assert "FIRING" in r.stdout
    assert "SLA fired 1x, resolved 1x" in r.stderr  # the alert comes and goes
    short = fiomon("demo", "--duration", "4", "--hosts", "2", "--jobs", "1")
    assert short.returncode == 0, short.stderr
    assert f"(--duration {RESOLVE_S} or more shows both)" in short.stderr


def test_every_module_imports_cleanly() -> None:
    pkg = Path(__file__).resolve().parents[1] / "fiomon"
    mods = sorted(p.stem for p in pkg.glob("*.py") if p.stem != "__main__")
    code = f"import importlib\nfor m in {mods!r}: importlib.import_module('fiomon.' + m)"
    r = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.fio
def test_demo_with_real_fio_fires_and_resolves_the_sla(fio_bin: str) -> None:
    r = fiomon("demo", "--real-fio", "--duration", "15", "--hosts", "3", "--jobs", "1")
    assert r.returncode == 0, r.stderr
    assert "real fio hosts" in r.stderr
    assert "FIRING" in r.stdout
    assert "SLA fired 1x, resolved 1x" in r.stderr
    del fio_bin


@pytest.mark.fio
def test_fiomon_fio_writes_what_the_agent_and_report_need(tmp_path: Path, fio_bin: str) -> None:
    out = tmp_path / "results"
    r = fiomon(
        "fio",
        "--output-dir",
        str(out),
        "--",
        "--name=t",
        f"--filename={tmp_path / 'data.bin'}",
        "--size=4M",
        "--rw=randread",
        "--bs=4k",
        "--rate_iops=200",
        "--runtime=3",
        "--time_based",
        "--ioengine=psync",
    )
    assert r.returncode == 0, r.stderr
    status = list(out.glob("*.json"))
    hist = list(out.glob("*_clat_hist.*.log"))
    assert len(status) == 1 and len(hist) == 1
    stamps = [int(x) for x in re.findall(r'"timestamp_ms" : (\d+)', status[0].read_text())]
    assert len(stamps) >= 3
    assert len({t % 1000 for t in stamps[:-1]}) <= 3  # one phase (the exit dump is off-grid)
    # Both views of the same I/Os: refused with the choice spelled out, then one counted.
    both = fiomon("report", "--format", "jsonl", str(status[0]), str(hist[0]))
    assert both.returncode == 2
    assert str(hist[0]) in both.stderr
    assert "--source json" in both.stderr
    for choice in ("json", "hist"):
        rep = fiomon(
            "report", "--format", "jsonl", "--source", choice, str(status[0]), str(hist[0])
        )
        assert rep.returncode == 0, rep.stderr
    del fio_bin


def test_demo_stops_cleanly_on_ctrl_c() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fiomon", "demo", "--hosts", "2", "--jobs", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    # Interrupted once it is running: after its header and the first closed quantum.
    seen: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(seen) < 2:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"no quantum shown within {DEADLINE_S:g} s: {seen}"
        line = proc.stdout.readline()
        assert line, f"the demo ended early: {proc.communicate()[1]}"
        seen.append(line)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0, err
    assert "interrupted" in err and "quanta closed" in err
    assert "Traceback" not in err
    assert "p99" in seen[0] + out


def test_check_config_catches_what_the_agent_would_die_on(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"watch: ['{tmp_path}/missing/*.json']\nstate_dir: {tmp_path}/state\n"
        f"broker: {{password_file: {tmp_path}/no-such-file}}\n"
    )
    r = fiomon("check-config", str(cfg))
    assert r.returncode == 2
    assert "broker.password_file: cannot read" in r.stderr
    assert f"folder {tmp_path}/missing does not exist" in r.stderr
    agent = fiomon("agent", "--config", str(cfg))
    assert agent.returncode == 2
    assert "Traceback" not in agent.stderr
    assert "password_file" in agent.stderr
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\x00\xff\xfe" * 100)
    r = fiomon("check-config", str(binary))
    assert r.returncode == 2
    assert "not a text file" in r.stderr
    assert "Traceback" not in r.stderr


def test_check_config_refuses_alias_bombs_empty_files_and_unusable_places(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    levels = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefg", "bcdefgh", strict=True):
        levels.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    bomb.write_text("\n".join(levels) + "\nwatch: [*h]\nstate_dir: /tmp/x\n")
    r = fiomon("check-config", str(bomb))
    assert r.returncode == 2
    assert "aliases" in r.stderr
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    r = fiomon("check-config", str(empty))
    assert r.returncode == 2
    assert "empty" in r.stderr
    odd = tmp_path / "odd.yaml"
    odd.write_text(f"watch: ['{tmp_path}']\nstate_dir: /proc/fiomon-state\n")
    r = fiomon("check-config", str(odd))
    assert r.returncode == 2
    assert "proc file system" in r.stderr
    assert "is a folder" in r.stderr
    tls = tmp_path / "tls.yaml"
    not_a_cert = tmp_path / "ca.pem"
    not_a_cert.write_text("hello\n")
    tls.write_text(
        f"watch: ['{tmp_path}/*.json']\nstate_dir: {tmp_path}/s\n"
        f"broker: {{tls: {{ca_file: {not_a_cert}}}}}\n"
    )
    r = fiomon("check-config", str(tls))
    assert r.returncode == 2
    assert "holds no CA certificate" in r.stderr


def test_check_config_names_the_root_section_and_what_the_root_ignores(tmp_path: Path) -> None:
    cfg = tmp_path / "root.yaml"
    cfg.write_text(
        "align: epoch\nlateness: 10s\nroot: {cells: [cell-a, cell-b], cell_timeout: 20s}\n"
    )
    r = fiomon("check-config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "root section valid (fiomon root: cells cell-a, cell-b, cell_timeout 20 s" in r.stdout
    assert "ignores" not in r.stdout
    cfg.write_text(cfg.read_text() + "alert_topic: x/alerts\n")
    r = fiomon("check-config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith("; fiomon root ignores alert_topic")
    plain = tmp_path / "aggregator.yaml"
    plain.write_text("align: epoch\n")
    assert "root" not in fiomon("check-config", str(plain)).stdout.split(":", 1)[1]
