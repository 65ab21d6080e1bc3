"""Benchmark: ``fiomon plot`` against ``fiomon report`` on the report benchmark's data.

16 hist logs x 600 one-second records per direction (``bench_report.make_dataset``,
cached). Times, each in a fresh child process (median of ``--repeat``, peak RSS):

* ``fiomon report --format jsonl`` (to /dev/null), with and without ``--per-host``;
* ``fiomon plot -o run.html``, with and without ``--per-host``, and the HTML's size;
* ``fiomon plot -o run.png`` (matplotlib) once, when matplotlib is installed.

The target: plot within 2x of report, HTML under 5 MB. Usage::

    python benchmarks/bench_plot.py [--repeat 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_report import make_dataset, measure


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "fiomon-bench")
    args = ap.parse_args()
    paths = [str(p) for p in make_dataset(args.dir / "data")]
    out = args.dir / "plot"
    out.mkdir(parents=True, exist_ok=True)
    fiomon = [sys.executable, "-m", "fiomon"]
    results = {}
    for hosts in ([], ["--per-host"]):
        tag = " --per-host" if hosts else ""
        rep, _ = measure(
            f"report{tag}", [*fiomon, "report", "--format", "jsonl", *hosts, *paths], args.repeat
        )
        html = out / f"run{'-hosts' if hosts else ''}.html"
        plot, _ = measure(
            f"plot .html{tag}",
            [*fiomon, "plot", *hosts, "--sla", "1ms", *paths, "-o", str(html)],
            args.repeat,
        )
        size = html.stat().st_size / 1e6
        results[tag] = (rep, plot, size)
        print(f"  plot/report{tag}: {plot / rep:.2f}x; HTML {size:.2f} MB ({html})")
    if importlib.util.find_spec("matplotlib") is not None:
        png = out / "run.png"
        measure("plot .png --per-host", [*fiomon, "plot", "--per-host", *paths, "-o", str(png)], 1)
    worst = max(p / r for r, p, _ in results.values())
    biggest = max(s for _, _, s in results.values())
    print(f"worst plot/report {worst:.2f}x (target <= 2x); largest HTML {biggest:.2f} MB (< 5)")
    return 0 if worst <= 2 and biggest < 5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
