"""Benchmark: aggregator throughput through a real Mosquitto, with zero loss required.

A load generator plays ``--hosts`` agents of ``--jobs`` fio jobs each: every second each
host publishes one message (QoS 1, the wire format) holding a read and a write record per
job, as an agent following a json+ stream does. A real ``fiomon aggregator`` process
(lateness 5 s, host scope on) consumes them. After ``--seconds`` the script reads the
aggregator's ``/metrics`` and prints:

* records per second sent and received, and every record accounted for (received =
  sent; no duplicates, gaps or refusals);
* the quantum close delay, median and p99 (from ``fiomon_quantum_close_delay_seconds``);
* the aggregator's CPU (per cent of one core) and peak RSS.

Targets (issue 4): >= 50,000 records/s, close delay p99 <= lateness + 0.5 s, RSS <= 300 MB
with 1000 hosts x 16 jobs. Usage::

    python benchmarks/bench_aggregator.py [--hosts 1000] [--jobs 25] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiomqtt
import numpy as np
from _support import cpu_seconds, free_port, peak_rss_mb, start_broker
from prometheus_client.parser import text_string_to_metric_families

from fiomon.bins import BinLayout
from fiomon.model import RecordBatch, StreamInfo
from fiomon.wire import encode

PREFIX = "fiomonbench"


def host_batch(host: int, jobs: int, end_ms: int, rng: np.random.Generator) -> RecordBatch:
    """One second of ``jobs`` jobs (a read and a write record each), ~40 non-zero bins."""
    n = 2 * jobs
    nnz = 40
    bins = np.sort(rng.choice(np.arange(600, 1100), size=(n, nnz), replace=True), axis=1)
    flat_bins: list[int] = []
    indptr = [0]
    for row in bins:
        u = np.unique(row)
        flat_bins.extend(u.tolist())
        indptr.append(indptr[-1] + len(u))
    counts = rng.integers(1, 20, len(flat_bins))
    labels = tuple(StreamInfo(f"h{host}", f"/var/lib/fio/run.json:{j}:job{j}") for j in range(jobs))
    return RecordBatch(
        layout=BinLayout(),
        streams=labels,
        stream_idx=np.repeat(np.arange(jobs, dtype=np.int32), 2),
        direction=np.tile(np.array([0, 1], np.int8), jobs),
        start_ms=np.full(n, end_ms - 1000, np.int64),
        end_ms=np.full(n, end_ms, np.int64),
        nbytes=np.full(n, 4096 * 100, np.int64),
        indptr=np.asarray(indptr, np.int64),
        bins=np.asarray(flat_bins, np.int32),
        counts=counts.astype(np.int64),
    )


async def generate(port: int, hosts: int, jobs: int, seconds: int) -> tuple[int, float]:
    """Publish for ``seconds``; returns (records sent, seconds spent)."""
    rng = np.random.default_rng(1)
    # Pre-build each host's batch shape once; only times and seqs change per second.
    templates = [host_batch(h, jobs, 0, rng) for h in range(hosts)]
    quiet = logging.getLogger("bench-load")
    quiet.setLevel(logging.ERROR)  # aiomqtt warns about every pending publish past 10
    client = aiomqtt.Client(
        "127.0.0.1",
        port,
        identifier="bench-load",
        max_inflight_messages=1000,
        timeout=60,
        logger=quiet,
    )
    sent = 0
    async with client:
        sem = asyncio.Semaphore(800)

        async def pub(topic: str, payload: bytes) -> None:
            async with sem:
                await client.publish(topic, payload, qos=1)

        t0 = time.time()
        base = int(t0 * 1000) // 1000 * 1000
        for s in range(seconds):
            end = base + 1000 * (s + 1)
            await asyncio.sleep(max(0.0, end / 1000 - time.time()))
            tasks = []
            for h, tpl in enumerate(templates):
                batch = RecordBatch(
                    layout=tpl.layout,
                    streams=tpl.streams,
                    stream_idx=tpl.stream_idx,
                    direction=tpl.direction,
                    start_ms=tpl.start_ms + end,
                    end_ms=tpl.end_ms + end,
                    nbytes=tpl.nbytes,
                    indptr=tpl.indptr,
                    bins=tpl.bins,
                    counts=tpl.counts,
                )
                payload = encode(f"h{h}", "/var/lib/fio/run.json@1", s * len(batch), batch)
                tasks.append(asyncio.create_task(pub(f"{PREFIX}/v1/h{h}/records", payload)))
                sent += len(batch)
            await asyncio.gather(*tasks)
        return sent, time.time() - t0


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            out.setdefault(smp.name, {})[tuple(sorted(smp.labels.items()))] = smp.value
    return out


def quantile_from_buckets(buckets: dict[tuple[tuple[str, str], ...], float], q: float) -> float:
    pairs = sorted((float(dict(k)["le"]), v) for k, v in buckets.items())
    total = pairs[-1][1]
    for le, c in pairs:
        if c >= q * total:
            return le
    return float("inf")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=25, help="fio jobs per host (2 records/s each)")
    ap.add_argument("--seconds", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        broker, mport = start_broker(
            folder,
            # Queue limits sized so QoS 1 telemetry is not dropped (REFERENCE.md §5).
            "max_queued_messages 1000000\nmax_queued_bytes 1073741824\n"
            "max_inflight_messages 1000\n",
        )
        hport = free_port()
        cfg = folder / "aggregator.yaml"
        cfg.write_text(
            f"broker: {{port: {mport}}}\ntopic_prefix: {PREFIX}\nclient_id: bench-aggregator\n"
            f"quantum: 1s\nlateness: 5s\nalign: epoch\nlisten: 127.0.0.1:{hport}\n"
            f"max_hosts: {max(1000, args.hosts)}\nquanta_file: {folder / 'quanta.jsonl'}\n"
        )
        agg = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fiomon",
                "aggregator",
                "--config",
                str(cfg),
                "--log-level",
                "warning",
            ]
        )
        try:
            time.sleep(2.0)
            c0, t0 = cpu_seconds(agg.pid), time.time()
            sent, spent = asyncio.run(generate(mport, args.hosts, args.jobs, args.seconds))
            time.sleep(7.0)  # lateness + a tick: every quantum closed
            c1, t1 = cpu_seconds(agg.pid), time.time()
            m = scrape(hport)
            rss = peak_rss_mb(agg.pid)
        finally:
            agg.terminate()
            agg.wait(30)
            broker.terminate()
            broker.wait(10)
    rec = {dict(k).get("result", ""): v for k, v in m.get("fiomon_records_total", {}).items()}
    lost = sum(m.get("fiomon_lost_records_total", {}).values())
    invalid = sum(m.get("fiomon_invalid_messages_total", {}).values())
    delays = {k: v for k, v in m.get("fiomon_quantum_close_delay_seconds_bucket", {}).items()}
    print(
        f"load: {args.hosts} hosts x {args.jobs} jobs x 2 records/s for {args.seconds} s "
        f"= {sent} records ({sent / spent:,.0f} records/s offered)"
    )
    received = rec.get("received", 0.0)
    print(
        f"received {received:,.0f} ({received / spent:,.0f} records/s); duplicates "
        f"{rec.get('duplicate', 0):.0f}, lost {lost:.0f}, invalid messages {invalid:.0f}, "
        f"{'ZERO LOSS' if received == sent and lost == 0 else 'LOSS'}"
    )
    if delays:
        print(
            f"quantum close delay: median <= {quantile_from_buckets(delays, 0.5):g} s, "
            f"p99 <= {quantile_from_buckets(delays, 0.99):g} s (target <= 5.5 s)"
        )
    print(f"aggregator CPU {100 * (c1 - c0) / (t1 - t0):.0f} % of one core, peak RSS {rss:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
