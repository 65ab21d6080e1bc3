"""Benchmark: partials per cell and quantum, and the exact root's CPU per quantum.

Each of ``--cells`` cells closes ``--quanta`` quanta of ``--hosts`` hosts; per host two
rows (``read`` and ``all``) with ``--bins`` non-zero bins each, plus its cluster rows
(what a cell with ``per_host`` sends). Measured with ``time.process_time`` (CPU, not
disturbed by other processes as a wall clock is): the cell's split + encode per quantum,
and the root's decode + merge and close (statistics with confidence bounds) per quantum.
``--no-host-rows`` sends cluster rows only (a root without host scope needs no more).

Usage::

    python benchmarks/bench_root.py --hosts 500 --cells 2 --quanta 5 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fiomon.bins import BinLayout
from fiomon.closed import Scope
from fiomon.partials import PartialRow, RawPartial, encode, split
from fiomon.root.merger import RootMerger

LAY = BinLayout()
Q = 1000
T0 = 1_795_000_000_000


def _part(
    rng: np.random.Generator, end: int, host: str | None, direction: str, bins: int
) -> RawPartial:
    hist = np.zeros(LAY.nbins)
    hist[rng.choice(np.arange(600, 1000), bins, replace=False)] = rng.random(bins) * 100
    scope: Scope = "cluster" if host is None else "host"
    return RawPartial(end - Q, end, scope, host, direction, hist, end - Q, end, 1e6, 2)


def run(args: argparse.Namespace) -> tuple[float, float, float, float, int, int]:
    """One run: KiB per cell-quantum, ms of CPU (encode per cell, merge, close), rows per
    quantum, and rows not complete (every cell sent every quantum: must be 0)."""
    rng = np.random.default_rng(1)
    payloads: list[bytes] = []
    t_enc = 0.0
    for c in range(args.cells):
        seq = 0  # each cell numbers its messages one after another, as its outbox does
        for q in range(1, args.quanta + 1):
            end = T0 + q * Q
            rows = [PartialRow(_part(rng, end, None, d, args.bins)) for d in ("read", "all")]
            if not args.no_host_rows:
                rows += [
                    PartialRow(_part(rng, end, f"c{c}h{i}", d, args.bins))
                    for i in range(args.hosts)
                    for d in ("read", "all")
                ]
            t = time.process_time()
            msgs = split(
                cell=f"c{c}",
                first_seq=seq,
                layout=LAY,
                closed_through_ms=end,
                rows=rows,
                max_bytes=1 << 20,
            )
            seq += len(msgs)
            payloads += [encode(m) for m in msgs]
            t_enc += time.process_time() - t
    root = RootMerger(
        quantum_ms=Q,
        lateness_ms=5000,
        percentiles=(50, 90, 99, 99.9),
        confidence_level=0.95,
        per_host=True,
        cells=[f"c{c}" for c in range(args.cells)],
        cell_timeout_ms=30_000,
        now_ms=T0,
    )
    t = time.process_time()
    for p in payloads:
        root.receive(p, T0, cell=None)  # (the payload's name: a benchmark has no topics)
    t_merge = time.process_time() - t
    t = time.process_time()
    rows_out = root.close(T0 + args.quanta * Q)
    t_close = time.process_time() - t
    n = args.cells * args.quanta
    return (
        sum(map(len, payloads)) / n / 1024,
        t_enc / n * 1000,
        t_merge / args.quanta * 1000,
        t_close / args.quanta * 1000,
        len(rows_out) // args.quanta,
        sum(not r.complete for r in rows_out),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=500, help="hosts per cell")
    ap.add_argument("--cells", type=int, default=2)
    ap.add_argument("--quanta", type=int, default=5)
    ap.add_argument("--bins", type=int, default=150, help="non-zero bins per row")
    ap.add_argument("--no-host-rows", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    runs = [run(args) for _ in range(args.repeat)]
    kib, enc, merge, close, rows, _ = (statistics.median(x) for x in zip(*runs, strict=True))
    incomplete = max(r[5] for r in runs)
    print(
        f"{args.hosts} hosts/cell x {args.cells} cells: {kib:.0f} KiB per cell-quantum; "
        f"cell split+encode {enc:.1f} ms CPU per quantum; root per quantum ({rows:.0f} rows): "
        f"decode+merge {merge:.1f} ms, close {close:.1f} ms CPU (median of {args.repeat}); "
        f"rows not complete: {incomplete}"
    )


if __name__ == "__main__":
    main()
