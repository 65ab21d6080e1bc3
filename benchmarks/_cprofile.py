"""Run ``python -m fiomon ARGS`` under cProfile timed by the main thread's CPU time.

Usage: ``python benchmarks/_cprofile.py OUT ARGS...``. Wall-clock profiles of the
aggregator mislead on a shared 2-core machine: time spent waiting for the CPU or for the
interpreter lock (the quanta file's writer thread) lands on whatever the main thread was
doing. ``time.thread_time`` counts only the main thread's own CPU.
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> None:
    """Profile ``fiomon`` with the remaining arguments; write the stats to ``argv[1]``."""
    out = sys.argv[1]
    sys.argv = ["fiomon", *sys.argv[2:]]
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    try:
        runpy.run_module("fiomon", run_name="__main__", alter_sys=True)
    finally:
        prof.disable()
        prof.dump_stats(out)


if __name__ == "__main__":
    main()
