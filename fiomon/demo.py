"""``fiomon demo``: a simulated cluster through the real engine, with no setup.

This first version is offline: it writes genuine fio-format hist logs for a simulated
cluster (default 8 hosts x 4 jobs, normal head plus power-law tail) with a storage-node
failure window in which some hosts' latencies rise tenfold, then runs the same pipeline as
``fiomon report`` over them and prints the cluster's percentiles per quantum. The live
version (agents, broker, aggregator) builds on this simulator.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TextIO

from fiomon.report import ReportOptions, run_report
from fiomon.simulate import write_cluster


def run_demo(
    *,
    hosts: int = 8,
    jobs: int = 4,
    seconds: int = 30,
    keep: Path | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Simulate, report, explain; returns the exit code.

    Args:
        hosts: simulated client hosts.
        jobs: fio jobs per host.
        seconds: simulated run length.
        keep: write the logs here (kept) instead of a temporary folder.
        out: where the report goes.
        err: where the narration goes.
    """
    slow_from, slow_to = seconds // 3, seconds // 3 + max(3, seconds // 5)
    slow_hosts = max(1, hosts // 4)
    with tempfile.TemporaryDirectory(prefix="fiomon-demo-") as tmp:
        folder = keep or Path(tmp)
        err.write(
            f"fiomon demo: simulating {hosts} hosts x {jobs} fio jobs for {seconds} s; "
            f"a storage node fails from {slow_from} s to {slow_to} s, slowing "
            f"{slow_hosts} host(s) tenfold\n"
        )
        paths = write_cluster(
            folder,
            hosts=hosts,
            jobs_per_host=jobs,
            seconds=seconds,
            slow_hosts=slow_hosts,
            slow_window_s=(slow_from, slow_to),
        )
        err.write(
            f"fiomon demo: wrote {len(paths)} hist logs to {folder}; equivalent "
            f"command: fiomon report --directions read {folder}/*/*.log\n"
        )
        opts = ReportOptions(directions=("read", "write"), fmt="table")
        summary = run_report(paths, opts, out, err)
        err.write(
            f"fiomon demo: {summary.records} records merged into {summary.quanta} "
            f"quanta (phase {summary.phase_ms} ms); watch p99 rise during the failure\n"
        )
    return 0 if summary.records else 1
