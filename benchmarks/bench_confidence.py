"""Benchmark: what the confidence intervals cost the aggregator, in CPU, at a site's load.

The aggregator's own work on ``--hosts`` hosts x ``--jobs`` jobs (the messages of
``bench_aggregator.py``: a read and a write record per job and second, about 40 non-zero
bins each), run in this process with and without ``confidence_level``: decode, dedup,
merge, close every quantum (cluster and host rows), write the quanta file (its writer
thread is in this process too) and build the metrics snapshot. The broker and the network
are left out, so the CPU is that of the code the intervals change, measured with
``time.process_time`` (not disturbed by other processes' load as a wall clock is); the
real aggregator also spends CPU in paho, so its relative cost is a little lower. Each
host's I/O counts vary from second to second (x1..x8, drawn per host), so the sample sizes
the exact binomial ranks see vary as a real cluster's do. Runs alternate (off, on, off,
on, ...) and the medians are compared.

Usage::

    python benchmarks/bench_confidence.py --hosts 300 --jobs 25 --seconds 20 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_aggregator import TEMPLATES, second, templates

from fiomon.aggregator.merger import AggregatorCore
from fiomon.config import AggregatorConfig
from fiomon.wire import encode

T0 = 1_700_000_000_000


def payloads(hosts: int, jobs: int, seconds: int, seed: int) -> list[list[tuple[str, bytes]]]:
    """Per second, every host's message (encoded once, before anything is timed)."""
    tpls = templates(jobs, seed)
    rng = np.random.default_rng(seed)
    out = []
    for s in range(seconds):
        factors = rng.integers(1, 9, size=hosts)
        out.append(
            [
                (
                    f"h{h}",
                    encode(
                        f"h{h}",
                        "s@1",
                        s,
                        second(tpls[h % TEMPLATES], T0 + 1000 * (s + 1), int(factors[h])),
                    ),
                )
                for h in range(hosts)
            ]
        )
    return out


def run(msgs: list[list[tuple[str, bytes]]], level: float | None) -> tuple[float, int]:
    """CPU seconds of the aggregator's work over all of ``msgs``, and the rows written."""
    with tempfile.TemporaryDirectory() as tmp:
        quanta = Path(tmp) / "quanta.jsonl"
        clock = [T0]
        cfg = AggregatorConfig(
            align="epoch",
            lateness_ms=5000,
            quanta_file=quanta,
            confidence_level=level,
        )
        core = AggregatorCore(cfg, now_ms=lambda: clock[0])
        core.restore()
        t0 = time.process_time()
        for s, second_msgs in enumerate(msgs):
            clock[0] = T0 + 1000 * (s + 1) + 300
            core.receive(second_msgs)
            core.tick()
        core.flush()
        core.close()
        cpu = time.process_time() - t0
        rows = sum(1 for _ in quanta.open())
    return cpu, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=25)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--level", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    msgs = payloads(args.hosts, args.jobs, args.seconds, args.seed)
    cpu: dict[float | None, list[float]] = {None: [], args.level: []}
    rows: dict[float | None, int] = {}
    run(msgs, None)  # warm-up: imports, caches
    for _ in range(args.repeat):
        for level in (None, args.level):
            c, rows[level] = run(msgs, level)
            cpu[level].append(c / args.seconds)
    off, on = (statistics.median(cpu[k]) for k in (None, args.level))
    print(
        f"{args.hosts} hosts x {args.jobs} jobs x 2 records/s, {args.seconds} s, "
        f"{rows[None]} rows; CPU per second of load, median of {args.repeat} (min):"
    )
    for name, k in (("without intervals", None), (f"confidence_level {args.level:g}", args.level)):
        print(f"  {name:24s} {1e3 * statistics.median(cpu[k]):7.1f} ms ({1e3 * min(cpu[k]):.1f})")
    print(
        f"  cost of the intervals: {100 * (on / off - 1):+.1f} % (min: "
        f"{100 * (min(cpu[args.level]) / min(cpu[None]) - 1):+.1f} %)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
