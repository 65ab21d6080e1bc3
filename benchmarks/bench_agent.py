"""Benchmark: the agent's footprint on a client host, and the hist-line parse cost.

1. A json+ status stream of 64 fio jobs (built from a real fio 3.33 document in
   ``tests/fixtures``, cumulative bins growing like a running job) is appended once per
   ``--interval`` for ``--seconds``, as ``fio --status-interval=1`` would. A real
   ``fiomon agent`` process follows it into a real Mosquitto started here. Printed: the
   agent's CPU in per cent of one core over the steady part (from /proc utime+stime), its
   peak RSS (VmHWM), and the bytes and records it handled.
2. Parsing one 1859-column hist-log line with :class:`~fiomon.fiolog.HistLogParser`
   (median over ``--lines`` single-line feeds, as the agent sees a log growing).

Targets (issue 3): CPU <= 2 % of one core, RSS <= 80 MB, <= 50 us per line. Usage::

    python benchmarks/bench_agent.py [--seconds 30] [--jobs 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _support import cpu_seconds, peak_rss_mb, start_broker

from fiomon.fiolog import HistLogOptions, HistLogParser
from fiomon.simulate import format_line

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "fixtures" / "fio333_randrw_status.json"


def template_job() -> dict[str, object]:
    """The first job of the first document of a real fio 3.33 json+ stream."""
    doc, _ = json.JSONDecoder().raw_decode(TEMPLATE.read_text())
    job: dict[str, object] = doc["jobs"][0]
    return job


def document(job: dict[str, object], jobs: int, tick: int, now_ms: int) -> str:
    """One status dump: ``jobs`` copies of the template with cumulative bins grown ``tick``x."""
    entries = []
    for j in range(jobs):
        e = json.loads(json.dumps(job))
        e["jobname"] = f"job{j}"
        e["job_runtime"] = 1000 * (tick + 1)
        for d in ("read", "write"):
            sec = e[d]
            bins = sec["clat_ns"]["bins"]
            sec["clat_ns"]["bins"] = {k: v * (tick + 1) for k, v in bins.items()}
            sec["io_bytes"] = sec["io_bytes"] * (tick + 1)
        entries.append(e)
    doc = {
        "fio version": "fio-3.33",
        "timestamp": now_ms // 1000,
        "timestamp_ms": now_ms,
        "time": time.ctime(now_ms / 1000),
        "jobs": entries,
    }
    return json.dumps(doc, indent=2) + "\n"


def bench_agent(seconds: int, jobs: int, interval: float) -> None:
    job = template_job()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        broker, port = start_broker(folder)
        stream = folder / "run.json"
        cfg = folder / "agent.yaml"
        cfg.write_text(
            f"broker: {{port: {port}}}\nhost: bench\nwatch: ['{stream}']\n"
            f"state_dir: {folder / 'state'}\n"
        )
        agent = subprocess.Popen(
            [sys.executable, "-m", "fiomon", "agent", "--config", str(cfg), "--log-level", "error"]
        )
        try:
            time.sleep(1.5)  # interpreter and imports: not steady-state cost
            docs = []
            t_start = time.monotonic()
            c0 = cpu_seconds(agent.pid)
            written = 0
            for tick in range(seconds):
                now_ms = time.time_ns() // 1_000_000
                text = document(job, jobs, tick, now_ms)
                with stream.open("a") as fh:
                    fh.write(text)
                written += len(text)
                docs.append(now_ms)
                time.sleep(max(0.0, t_start + (tick + 1) * interval - time.monotonic()))
            time.sleep(1.0)
            c1 = cpu_seconds(agent.pid)
            wall = time.monotonic() - t_start
            rss = peak_rss_mb(agent.pid)
        finally:
            agent.terminate()
            agent.wait(20)
            broker.terminate()
            broker.wait(10)
    cpu = 100 * (c1 - c0) / wall
    print(
        f"agent: {jobs} jobs, one json+ dump every {interval:g} s for {seconds} s "
        f"({written / 1e6:.1f} MB, {written / seconds / 1e3:.0f} kB per dump, "
        f"{seconds * jobs * 2} records)"
    )
    print(f"  CPU  {cpu:5.2f} % of one core (target <= 2 %)")
    print(f"  RSS  {rss:5.1f} MB peak (target <= 80 MB)")


def bench_line(lines: int) -> None:
    rng = np.random.default_rng(3)
    counts = np.zeros(1856, dtype=np.int64)
    counts[500:900] = rng.integers(0, 50, 400)
    text = [
        format_line(1_795_000_000_000 + 1000 * (i + 1), i % 2, 4096, counts).encode()
        for i in range(lines)
    ]
    parser = HistLogParser("bench", options=HistLogOptions(interval_ms=1000))
    times = []
    for raw in text:
        t = time.perf_counter()
        parser.feed(raw)
        times.append(time.perf_counter() - t)
    alone = statistics.median(times[10:]) * 1e6
    bulk_text = b"".join(text)
    runs = []
    for _ in range(5):
        parser = HistLogParser("bench", options=HistLogOptions(interval_ms=1000))
        t = time.perf_counter()
        parser.feed(bulk_text)
        runs.append((time.perf_counter() - t) / len(text))
    bulk = statistics.median(runs) * 1e6
    print(f"hist line (1859 columns, {len(text[0])} bytes), target <= 50 us:")
    print(f"  {bulk:5.1f} us per line when a log arrives in bulk (fio writes them at job exit)")
    print(f"  {alone:5.1f} us per line when each line is fed alone (a log growing line by line)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=30, help="dumps to write (default 30)")
    ap.add_argument("--jobs", type=int, default=64, help="fio jobs per dump (default 64)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between dumps")
    ap.add_argument("--lines", type=int, default=500, help="hist lines to time")
    args = ap.parse_args()
    bench_line(args.lines)
    bench_agent(args.seconds, args.jobs, args.interval)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
