"""Benchmark: ``fiomon report`` against fio's own hist tools, on the same data, in one run.

Writes (once, cached) 16 hist logs x 600 one-second records per direction (read and write,
1856 bins, about 100 MB) and times, each in a fresh child process with its peak RSS from
``wait4``:

* ``fiomon report`` (jsonl to /dev/null);
* ``fio-histo-log-pctiles.py`` and ``fiologparser_hist.py`` as Debian's fio package ships
  them (gzipped in /usr/share/doc/fio); fiologparser_hist needs pandas, installed into a
  throwaway venv when the running interpreter lacks it;
* the floor: numpy alone parsing the same text (``np.loadtxt`` on every file).

Prints the median wall time of each (``--repeat`` runs of fiomon and the floor, fewer of
the slow reference tools), peak memory, and the ratios. Usage::

    python benchmarks/bench_report.py [--repeat 5] [--ref-repeat 1] [--dir DIR]
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fiomon.tools.simulate import JobSpec, LatencyModel, format_line, records

HOSTS = 16
RECORDS = 600
REF_DIR = Path("/usr/share/doc/fio")


def make_dataset(folder: Path) -> list[Path]:
    """16 hist logs x 600 records per direction (cached in ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"host{h:02d}_clat_hist.1.log" for h in range(HOSTS)]
    if all(p.exists() for p in paths):
        return paths
    rng = np.random.default_rng(7)
    model = LatencyModel(head_mean_ns=300_000, head_sd_ns=80_000, tail_share=0.05)
    for h, path in enumerate(paths):
        spec = JobSpec(f"host{h:02d}", 1, iops=2000, phase_ms=int(rng.integers(0, 1000)))
        tmp = path.with_suffix(".tmp")
        with tmp.open("w") as fh:
            for end, d, counts, _ in records(
                spec,
                start_ms=1_795_000_000_000,
                seconds=RECORDS,
                interval_ms=1000,
                model=model,
                rng=rng,
            ):
                fh.write(format_line(end, d, 4096, counts))
        tmp.rename(path)
        print(f"  wrote {path.name} ({path.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)
    return paths


def run(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        msg = f"{cmd[:3]} failed ({proc.returncode}): {err[-500:]}"
        raise RuntimeError(msg)
    return wall, usage.ru_maxrss / 1024


def python_with_pandas(scratch: Path) -> str:
    """An interpreter that can import pandas (a throwaway venv if need be)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import pandas"], capture_output=True, check=False
    )
    if probe.returncode == 0:
        return sys.executable
    venv = scratch / "pandas-venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "numpy", "pandas"], check=True)
    return str(venv / "bin" / "python")


def unpack(name: str, scratch: Path) -> Path:
    src = REF_DIR / f"{name}.gz"
    if not src.exists():
        msg = f"{src} is missing: apt-get install fio"
        raise SystemExit(msg)
    dst = scratch / name
    with gzip.open(src, "rb") as fin, dst.open("wb") as fout:
        shutil.copyfileobj(fin, fout)
    return dst


FLOOR = """
import sys, numpy as np
for p in sys.argv[1:]:
    np.loadtxt(p, delimiter=",", dtype=np.int64)
"""


def measure(name: str, cmd: list[str], repeat: int) -> tuple[float, float]:
    walls, rss = [], []
    for _ in range(repeat):
        w, r = run(cmd)
        walls.append(w)
        rss.append(r)
    med = statistics.median(walls)
    print(
        f"{name:28s} median {med:8.3f} s  (runs: {', '.join(f'{w:.3f}' for w in walls)})"
        f"  peak RSS {max(rss):7.1f} MB"
    )
    return med, max(rss)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs of fiomon and the floor")
    ap.add_argument("--ref-repeat", type=int, default=1, help="runs of each reference tool")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "fiomon-bench")
    args = ap.parse_args()
    scratch = args.dir
    print(
        f"data set: {HOSTS} hist logs x {RECORDS} records per direction (read, write), "
        f"1856 bins, in {scratch}",
        file=sys.stderr,
    )
    paths = make_dataset(scratch / "data")
    size = sum(p.stat().st_size for p in paths) / 1e6
    files = [str(p) for p in paths]
    print(
        f"input: {len(paths)} files, {size:.1f} MB, {len(paths) * RECORDS * 2} records, "
        f"{os.cpu_count()} cores"
    )
    fiomon = [sys.executable, "-m", "fiomon", "report", "--format", "jsonl", "--quiet", *files]
    ours, ours_rss = measure("fiomon report", fiomon, args.repeat)
    floor, floor_rss = measure(
        "numpy loadtxt floor", [sys.executable, "-c", FLOOR, *files], args.repeat
    )
    pct = unpack("fio-histo-log-pctiles.py", scratch)
    t_pct, r_pct = measure(
        "fio-histo-log-pctiles.py", [sys.executable, str(pct), *files], args.ref_repeat
    )
    flp = unpack("fiologparser_hist.py", scratch)
    t_flp, r_flp = measure(
        "fiologparser_hist.py", [python_with_pandas(scratch), str(flp), *files], args.ref_repeat
    )
    print()
    print(f"speed-up vs fio-histo-log-pctiles.py: {t_pct / ours:6.1f}x (target >= 30x)")
    print(f"speed-up vs fiologparser_hist.py:     {t_flp / ours:6.1f}x (target >= 60x)")
    print(f"fiomon / numpy parse floor:           {ours / floor:6.2f}x (target <= 2x)")
    print(
        f"peak RSS: fiomon {ours_rss:.0f} MB, pctiles {r_pct:.0f} MB, "
        f"fiologparser_hist {r_flp:.0f} MB, floor {floor_rss:.0f} MB"
    )
    ok = (
        t_pct / ours >= 30
        and t_flp / ours >= 60
        and ours / floor <= 2
        and ours_rss < min(r_pct, r_flp)
    )
    print("targets met" if ok else "TARGETS NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
