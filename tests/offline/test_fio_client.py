"""fio's client/server mode: the one json+ document ``fio --client`` writes at the end."""

from __future__ import annotations

import contextlib
import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fiomon.fio.fiojson import JsonStatusParser
from fiomon.fio.problems import ProblemLog
from tests.conftest import DEADLINE_S, FIXTURES, free_port

CLIENT = FIXTURES / "fio333_client_status.json"


def listening(ip: str, port: int) -> bool:
    """Whether a TCP socket on ``ip:port`` is in LISTEN state (from /proc/net/tcp)."""
    want = f"{int.from_bytes(bytes(map(int, ip.split('.'))), 'little'):08X}:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == want and fields[3] == "0A":
            return True
    return False


@contextlib.contextmanager
def fio_servers(fio_bin: str, ips: Sequence[str]) -> Iterator[int]:
    """``fio --server`` on each of ``ips`` at one free port (yielded), stopped at the end.

    fio --client gives up on a server that is not listening yet (and may still exit 0 with
    the other's results): this waits until every socket is in LISTEN.
    """
    servers: list[subprocess.Popen[bytes]] = []
    port = free_port()
    try:
        for ip in ips:
            servers.append(
                subprocess.Popen(
                    [fio_bin, f"--server=ip:{ip},{port}"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for ip in ips:
            deadline = time.monotonic() + DEADLINE_S
            while not listening(ip, port):
                assert time.monotonic() < deadline, f"fio --server on {ip}:{port} not listening"
                time.sleep(0.05)
        yield port
    finally:
        for s in servers:
            s.terminate()
            s.wait(DEADLINE_S)


def _fiomon(*args: str | Path) -> list[dict[str, Any]]:
    """``fiomon ARGS`` (jsonl output) as a list of rows; it must succeed."""
    r = subprocess.run(
        [sys.executable, "-m", "fiomon", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def _summary(paths: list[Path], percentiles: list[float]) -> dict[str, dict[str, Any]]:
    """``fiomon summary --format json`` per operation: ios and percentiles_ns."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fiomon",
            "summary",
            "--format",
            "json",
            "--percentiles",
            ",".join(f"{p:g}" for p in percentiles),
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return {str(op["operation"]): op for op in json.loads(r.stdout)}


def load(path: Path = CLIENT) -> dict[str, Any]:
    text = path.read_text()
    doc, _ = json.JSONDecoder().raw_decode(text, text.find("{"))
    assert isinstance(doc, dict)
    return doc


def final_ios(doc: dict[str, Any]) -> dict[str, int]:
    """Ground truth: the jobs' own total_ios in the last interval, per server."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in doc["client_stats"]:
        if e["jobname"] != "All clients":
            by_key.setdefault((e["hostname"], e["jobname"]), []).append(e)
    out: dict[str, int] = {}
    for (host, _), entries in by_key.items():
        end = max(e["job_runtime"] for e in entries)
        # numjobs: the last interval's entries of one name (runtimes within a few ms)
        last = [e for e in entries[-8:] if e["job_runtime"] >= end - 50]
        ios = sum(e[d]["total_ios"] for e in last for d in ("read", "write", "trim"))
        out[host] = out.get(host, 0) + ios
    return out


def parse(doc: dict[str, Any]) -> tuple[dict[str, int], JsonStatusParser]:
    p = JsonStatusParser("client.json", host="file-label", problems=ProblemLog())
    batch = p.feed(json.dumps(doc).encode() + b"\n")
    p.finish()
    per_host: dict[str, int] = {}
    if batch is not None:
        samples = batch.samples()
        for i, s in enumerate(batch.streams):
            n = int(samples[batch.stream_idx == i].sum())
            per_host[s.host] = per_host.get(s.host, 0) + n
    return per_host, p


def test_every_jobs_total_ios_counted_once_per_server() -> None:
    doc = load()
    per_host, p = parse(doc)
    assert per_host == final_ios(doc)  # both servers, numjobs=2 on one of them
    assert p.problems.counts["aggregate"] >= 1  # "All clients" is not counted
    assert "restart" not in p.problems.counts


def test_all_clients_with_bins_and_duplicated_entries_are_not_double_counted() -> None:
    doc = load()
    entries = doc["client_stats"]
    total = copy.deepcopy(next(e for e in entries if e["jobname"] != "All clients"))
    total["jobname"] = "All clients"  # other fio versions give it bins
    doc["client_stats"] = [*entries, total]
    per_host, _ = parse(doc)
    assert per_host == final_ios(load())


def test_a_server_that_ran_its_job_again_is_a_new_stream() -> None:
    doc = load()
    host = doc["client_stats"][0]["hostname"]
    again = [copy.deepcopy(e) for e in doc["client_stats"] if e.get("hostname") == host]
    for e in again:
        e["job_runtime"] = max(1, e["job_runtime"] - 2000)  # runtime went back
    doc["client_stats"] = doc["client_stats"] + again[:2]
    per_host, p = parse(doc)
    assert per_host[host] > final_ios(load())[host]  # the second run's I/Os are added
    assert p.problems.counts["restart"] >= 1


def test_a_truncated_client_document_is_reported(tmp_path: Path) -> None:
    text = CLIENT.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: len(text) // 2])
    r = subprocess.run(
        [sys.executable, "-m", "fiomon", "report", str(cut)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 1
    assert "incomplete" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.fio
def test_two_fio_servers_on_loopback(tmp_path: Path, fio_bin: str) -> None:
    """fio --server on 127.0.0.2 and 127.0.0.3, one fio --client run with json+ output."""
    with fio_servers(fio_bin, ("127.0.0.2", "127.0.0.3")) as port:
        job = tmp_path / "job.fio"
        job.write_text(
            "[j]\nioengine=psync\nrw=randrw\nbs=4k\nsize=4m\n"
            f"filename={tmp_path}/data\ntime_based\nruntime=5\nrate_iops=100\n"
            "write_hist_log=h\nlog_hist_msec=250\nlog_unix_epoch=1\n"
        )
        out = tmp_path / "out.json"
        cmd = [fio_bin]
        for ip in ("127.0.0.2", "127.0.0.3"):
            cmd += [f"--client=ip:{ip},{port}", str(job)]
        cmd += ["--status-interval=1", "--output-format=json+", f"--output={out}"]
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr
    per_host, _ = parse(load(out))
    assert per_host == final_ios(load(out))
    assert set(per_host) == {"127.0.0.2", "127.0.0.3"}
    hist = sorted(tmp_path.glob("h_clat_hist.*.log.*"))
    assert len(hist) == 2
    # The report on the client's json+: each server's final total_ios, once.
    rows = _fiomon("report", "--per-host", "--format", "jsonl", "--directions", "all", out)
    counted: dict[str, float] = {}
    for row in rows:  # a record split between two quanta leaves fractions in each
        if row["scope"] == "host" and row["direction"] == "all":
            host = str(row["host"])
            counted[host] = counted.get(host, 0.0) + float(row["samples"])
    assert {h: round(n, 6) for h, n in counted.items()} == per_host
    # --per-host on the controller's hist logs names the servers from fio's suffix.
    rows = _fiomon("report", "--per-host", "--format", "jsonl", *hist)
    assert {row["host"] for row in rows if row["scope"] == "host"} == {"127.0.0.2", "127.0.0.3"}
    # Both views of the run agree: the hist logs lack only each job's last partial
    # interval (fio never logs it), m I/Os of the json+'s n. So the json+ q-quantile lies
    # between the hist logs' quantiles at ranks (q n - m) / (n - m) and q n / (n - m),
    # widened by one of fio's bins (1/64 of an octave: 1.1 %) for the interpolation.
    from_json = _summary([out], [50, 90])
    for d in ("read", "write"):
        n = int(from_json[d]["ios"])
        m = n - int(_summary(hist, [50])[d]["ios"])
        assert 0 <= m <= 0.1 * n, (d, n, m)  # the last of 20 intervals (+ jitter)
        for q in (50.0, 90.0):
            lo = max(0.0, (q / 100 * n - m) / (n - m) * 100)
            hi = min(100.0, q / 100 * n / (n - m) * 100)
            h = _summary(hist, sorted({lo, hi}))[d]["percentiles_ns"]
            value = from_json[d]["percentiles_ns"][f"{q:g}"]
            low, high = h[f"{lo:g}"] * (1 - 0.011), h[f"{hi:g}"] * (1 + 0.011)
            print(f"client/server {d} p{q:g}: json+ {value} in [{low:.0f}, {high:.0f}] (m={m})")
            assert low <= value <= high, (d, q, value, low, high)


def test_per_io_logs_of_two_fio_servers_and_one_truth(tmp_path: Path, fio_bin: str) -> None:
    """fio --client with write_lat_log: each server's P_clat.N.log.<server>, N from 1.

    The client's json+ is the same I/Os as both servers' per-I/O logs (left out, exact
    count); a server's hist logs are not the same I/Os as the other server's per-I/O logs
    of the same ``N`` (an error, where they were left out: half the I/Os, exit 0).
    """
    ips = ("127.0.0.2", "127.0.0.3")
    with fio_servers(fio_bin, ips) as port:
        job = tmp_path / "job.fio"
        job.write_text(
            "[j]\nioengine=psync\nrw=randrw\nbs=4k\nsize=1m\n"
            f"filename={tmp_path}/data\ntime_based\nruntime=2\nrate_iops=100\n"
            "write_lat_log=p\nlog_avg_msec=0\nwrite_hist_log=p\nlog_hist_msec=250\n"
        )
        out = tmp_path / "out.json"
        cmd = [fio_bin]
        for ip in ips:
            cmd += [f"--client=ip:{ip},{port}", str(job)]
        cmd += ["--status-interval=1", "--output-format=json+", f"--output={out}"]
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr
    truth = final_ios(load(out))
    assert set(truth) == set(ips)
    clat = {ip: tmp_path / f"p_clat.1.log.{ip}" for ip in ips}
    lines = {ip: len(p.read_text().splitlines()) for ip, p in clat.items()}
    assert lines == truth
    rows = _fiomon(
        "report", "--per-host", "--format", "jsonl", "--directions", "all", out, *clat.values()
    )
    counted: dict[str, float] = {}
    for row in rows:
        if row["scope"] == "host":
            counted[str(row["host"])] = counted.get(str(row["host"]), 0) + row["samples"]
    assert counted == truth
    hist = sorted(tmp_path.glob("p_clat_hist.1.log.*"))
    assert len(hist) == 2
    r2 = subprocess.run(
        [sys.executable, "-m", "fiomon", "report", clat[ips[0]], *hist],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert r2.returncode == 2, r2.stdout
    assert f"p_clat_hist.1.log.{ips[1]}" in r2.stderr
