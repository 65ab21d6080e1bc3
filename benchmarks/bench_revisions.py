"""Benchmark: what revisions cost the aggregator (CPU, memory), checked exact.

The aggregator's own work, in this process (the messages of ``bench_aggregator.py``:
``--hosts`` hosts x ``--jobs`` jobs, a read and a write record per job and second, about
40 non-zero bins each, counts x1..x8 per host and second): decode, dedup, merge, close,
write the quanta file, build the snapshot. Three runs per repetition:

* ``off``: ``revise_within: 0`` (no closed quanta kept);
* ``on``: the default horizon (10 min), every record in time (closed quanta kept);
* ``late``: the same, with ``--late-share`` of the hosts' records arriving
  ``--late-ms`` after the others (past the 5 s lateness, so every quantum is revised).

It prints the CPU per second of load (``time.process_time``, median of ``--repeat``),
the kept quanta's memory per host and minute of horizon (the engine's own count of its
arrays), and the correctness counters: rows, revision rows, quanta revised, late (beyond
the horizon) and merged records, and EXACT when the latest revision of every row of the
``late`` run's quanta file equals the ``on`` run's row (samples, percentiles, bounds,
rates, streams).

Usage::

    python benchmarks/bench_revisions.py --hosts 1000 --jobs 25 --seconds 30 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_confidence import T0, payloads

from fiomon.aggregator.merger import AggregatorCore
from fiomon.config import AggregatorConfig

Row = dict[str, Any]
IGNORED = ("revision", "revised_at", "late_records", "complete")


def run(
    msgs: list[list[tuple[str, bytes]]], *, horizon_ms: int, late: set[str], late_ms: int
) -> tuple[float, dict[str, Any], list[Row]]:
    """CPU seconds over all of ``msgs``, the counters, and the quanta file's rows."""
    with tempfile.TemporaryDirectory() as tmp:
        quanta = Path(tmp) / "quanta.jsonl"
        clock = [T0]
        cfg = AggregatorConfig(
            align="epoch", lateness_ms=5000, quanta_file=quanta, revise_within_ms=horizon_ms
        )
        core = AggregatorCore(cfg, now_ms=lambda: clock[0])
        core.restore()
        held: list[tuple[int, tuple[str, bytes]]] = []
        kept_bytes = kept_quanta = 0
        t0 = time.process_time()
        for s, second_msgs in enumerate(msgs):
            now = T0 + 1000 * (s + 1) + 300
            clock[0] = now
            out = [m for m in second_msgs if m[0] not in late]
            held += [(now + late_ms, m) for m in second_msgs if m[0] in late]
            out += [m for t, m in held if t <= now]
            held = [(t, m) for t, m in held if t > now]
            core.receive(out)
            core.tick()
            if core.engine is not None and core.engine.kept_bytes > kept_bytes:
                kept_bytes, kept_quanta = core.engine.kept_bytes, core.engine.kept_quanta
        core.receive([m for _, m in held])
        core.tick()
        core.flush()
        core.close()
        cpu = time.process_time() - t0
        rows = [json.loads(line) for line in quanta.open()]
        counts = {
            "late": sum(core.counts.late.values()),
            "merged": sum(core.counts.late_merged.values()),
            "quanta_revised": core.counts.quanta_revised,
            "kept_bytes": kept_bytes,
            "kept_quanta": kept_quanta,
        }
    return cpu, counts, rows


def key(r: Row) -> tuple[Any, ...]:
    return (r["end_ms"], r["scope"], r["host"], r["direction"])


def latest(rows: list[Row]) -> dict[tuple[Any, ...], Row]:
    out: dict[tuple[Any, ...], Row] = {}
    for r in rows:
        k = key(r)
        if k not in out or r["revision"] >= out[k]["revision"]:
            out[k] = r
    return out


def differing(got: list[Row], want: list[Row]) -> int:
    """Keys whose latest revision differs from ``want`` (missing and extra included)."""
    g, w = latest(got), latest(want)
    bad = len(set(g) ^ set(w))
    for k in set(g) & set(w):
        a = {f: v for f, v in g[k].items() if f not in IGNORED}
        b = {f: v for f, v in w[k].items() if f not in IGNORED}
        bad += a != b
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=25)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--late-share", type=float, default=0.1)
    ap.add_argument("--late-ms", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    # The late run's first closes lack the late hosts (each logged): the counters say it.
    logging.getLogger("fiomon").setLevel(logging.ERROR)
    msgs = payloads(args.hosts, args.jobs, args.seconds, args.seed)
    late = {f"h{h}" for h in range(0, args.hosts, max(1, round(1 / args.late_share)))}
    modes: dict[str, dict[str, Any]] = {
        "off": {"horizon_ms": 0, "late": set(), "late_ms": 0},
        "on": {"horizon_ms": 600_000, "late": set(), "late_ms": 0},
        "late": {"horizon_ms": 600_000, "late": late, "late_ms": args.late_ms},
    }
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    counts: dict[str, dict[str, Any]] = {}
    rows: dict[str, list[Row]] = {}
    run(msgs[:3], horizon_ms=0, late=set(), late_ms=0)  # warm-up: imports, caches
    for _ in range(args.repeat):
        for m, kw in modes.items():
            secs, counts[m], rows[m] = run(msgs, **kw)
            cpu[m].append(secs / args.seconds)
    print(
        f"{args.hosts} hosts x {args.jobs} jobs x 2 records/s, {args.seconds} s; "
        f"late: {len(late)} hosts {args.late_ms} ms behind (lateness 5000 ms); "
        f"CPU per second of load, median of {args.repeat} (min):"
    )
    for m in modes:
        c = counts[m]
        revs = sum(1 for r in rows[m] if r.get("revised_at") is not None)
        print(
            f"  {m:5s} {1e3 * statistics.median(cpu[m]):7.1f} ms ({1e3 * min(cpu[m]):.1f}); "
            f"rows {len(rows[m])}, revision rows {revs}, quanta revised {c['quanta_revised']}, "
            f"late {c['late']}, merged {c['merged']}"
        )
    on, off, lt = (statistics.median(cpu[m]) for m in ("on", "off", "late"))
    kept = counts["on"]
    per_host_min = kept["kept_bytes"] / max(kept["kept_quanta"], 1) * 60 / args.hosts
    print(
        f"  kept quanta: {kept['kept_bytes'] / 2**20:.1f} MiB for {kept['kept_quanta']} quanta "
        f"= {per_host_min / 1024:.0f} KiB per host and minute of horizon "
        f"({per_host_min * 10 * 1000 / 2**30:.2f} GiB for 1000 hosts x 10 min)"
    )
    journal = sum(len(m[1]) for sec in msgs for m in sec) / args.hosts / args.seconds * 60
    print(
        f"  journal kept for the horizon: {journal / 1024:.0f} KiB per host and minute "
        f"(the messages' bytes; {journal * 10 * 1000 / 2**30:.2f} GiB for 1000 hosts x 10 min)"
    )
    print(
        f"  CPU: keeping closed quanta {100 * (on / off - 1):+.1f} %, late data "
        f"{100 * (lt / on - 1):+.1f} % over in time"
    )
    bad = differing(rows["late"], rows["on"])
    lost = counts["late"]["late"]
    print(
        f"  {'EXACT' if not bad else f'NOT EXACT ({bad} keys differ)'}: latest revisions of "
        f"the late run vs the in-time run; {'NO LOSS' if not lost else f'{lost} LATE'}"
    )
    return 0 if not bad and not lost else 1


if __name__ == "__main__":
    raise SystemExit(main())
