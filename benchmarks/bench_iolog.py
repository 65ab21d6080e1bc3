"""Benchmark: ``fiomon report`` on fio per-I/O latency logs against fio's ``fiologparser.py``.

Writes (once, cached under ``--data-dir``) N per-I/O latency lines in fio 3.33's exact
format: ``write_lat_log=P`` with ``log_avg_msec=0`` and ``log_offset=1`` gives one line per
I/O, ``time_ms, value_ns, ddir, bs, offset, prio`` (fio 3.33 always appends the priority
column). The data: ``--files`` logs (4 hosts x 2 jobs by default, ``hostH_clat.J.log``), each
a random read/write job at ``--iops`` completions a second (Poisson arrivals, stamps in
ms since the job's start, monotone per file), 60 % reads, block sizes 4k/8k/64k, latencies
log-normal (reads about 90 us, writes about 25 us) with a 1 % slow tail and a 3-second
stall every minute. The generator keeps the per-quantum line counts per direction and every
value of a sample of quanta (``manifest.npz``), so fiomon is checked against what was
written, not against itself.

Times, each in a fresh child process (wall time and peak RSS from ``wait4``):

* ``fiomon report --format jsonl --quantum 1s --align epoch --percentiles 50,90,95,99``:
  per quantum and direction (read, write, all) the line count, min, mean, max and exact
  percentiles. Median of ``--repeat`` runs.
* ``fiologparser.py -A -i 1000`` (fio's own tool, Debian's fio package ships it as
  /usr/share/doc/fio/fiologparser.py.gz): per interval and over all directions, the line
  count, min, mean, median, p90, p95, p99 and max -- the statistics both compute. As shipped
  it reads no fio 3 per-I/O log (it unpacks exactly 4 columns; fio 3.33 writes 5 or 6) and
  ``-A`` fails on Python 3 (a float list index in its median); the benchmark applies those
  two one-line fixes and nothing else. Its ``-A`` scans every line of every file once per
  interval (its own FIXME says O(N^2)) and keeps a Python object per line, so it is timed on
  ``--ref-lines`` data sets (same generator and rates, shorter runs) and on N only when the
  fitted scaling says it finishes within ``--ref-max-s`` and ``--ref-max-gb``; otherwise its
  time and memory at N are extrapolated from the fit and printed as such.

Correctness counters: lines fiomon counted (read + write rows) = lines written; every
quantum's per-direction count = the generator's; on the sampled quanta fiomon's p50, p90,
p95, p99, min and max equal numpy's (``np.quantile(..., method="inverted_cdf")``, fio's
nearest-rank rule) on the values written, and the mean within 1e-6 relative.

Target (issue 27): fiomon >= 10x faster than fiologparser.py at N = 100 000 000, peak RSS
under 500 MB. Usage::

    python benchmarks/bench_iolog.py [--lines 100000000] [--repeat 3]
        [--ref-lines 1000000,10000000,30000000,50000000] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
REPO = Path(__file__).resolve().parent.parent
FIOLOGPARSER = Path("/usr/share/doc/fio/fiologparser.py.gz")
QUANTUM_MS = 1000
PERCENTILES = (50.0, 90.0, 95.0, 99.0)
CHUNK = 1 << 20  # lines generated and formatted at a time
SAMPLE_QUANTA = 24
GENERATOR_VERSION = 2  # bump when the data change, so cached sets are rewritten


# --------------------------------------------------------------------------- data


def _digits(col: I64) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """ASCII digits of non-negative ints, right-aligned, with the mask of the printed ones."""
    top = int(col.max(initial=0))
    width = max(1, len(str(top)))
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = (col[:, None] // powers[None, :]) % 10
    ndig = np.ones(len(col), dtype=np.int64)
    for k in range(1, width):
        ndig += col >= 10**k
    keep = np.arange(width)[None, :] >= (width - ndig)[:, None]
    return (digits + ord("0")).astype(np.uint8), keep


def format_lines(cols: list[I64]) -> bytes:
    """``a, b, c\\n`` lines as fio's ``%llu, %llu, ...`` writes them (vectorised)."""
    n = len(cols[0])
    parts: list[npt.NDArray[np.uint8]] = []
    masks: list[npt.NDArray[np.bool_]] = []
    sep = np.frombuffer(b", ", dtype=np.uint8)
    for i, col in enumerate(cols):
        d, m = _digits(col)
        parts.append(d)
        masks.append(m)
        tail = sep if i < len(cols) - 1 else np.frombuffer(b"\n", dtype=np.uint8)
        parts.append(np.broadcast_to(tail, (n, len(tail))))
        masks.append(np.ones((n, len(tail)), dtype=np.bool_))
    return np.hstack(parts)[np.hstack(masks)].tobytes()


@dataclass(frozen=True, slots=True)
class DataSet:
    """A generated set of per-I/O logs and what the generator knows about them."""

    folder: Path
    paths: list[Path]
    lines: int
    # [direction, k]: lines per direction (0 read, 1 write) in the quantum ((k-1) Q, k Q] ms:
    # fio stamps completions and fiomon's quanta hold the stamps start < t <= end
    counts: I64
    sample_quanta: I64
    samples: dict[tuple[int, int], I64]  # (k, direction) -> every value written

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.paths)


def _latency_ns(rng: np.random.Generator, ddir: I64, time_ms: I64, stall_phase_s: int) -> I64:
    """Log-normal latencies per direction, a 1 % slow tail, a 3 s stall each minute."""
    n = len(ddir)
    median = np.where(ddir == 0, 90_000.0, 25_000.0)
    sigma = np.where(ddir == 0, 0.35, 0.6)
    lat = median * np.exp(sigma * rng.standard_normal(n))
    slow = rng.random(n) < 0.01
    lat[slow] *= rng.lognormal(math.log(8.0), 0.5, int(slow.sum()))
    stall = ((time_ms // 1000 + stall_phase_s) % 60) < 3
    lat[stall] *= 4.0
    return np.maximum(lat.astype(np.int64), 1)


def make_dataset(folder: Path, lines: int, files: int, iops: int, seed: int = 27) -> DataSet:
    """Write ``lines`` per-I/O lines over ``files`` logs (cached: reused when complete)."""
    hosts = max(1, files // 2)
    names = [f"host{f % hosts}_clat.{f // hosts + 1}.log" for f in range(files)]
    paths = [folder / n for n in names]
    manifest = folder / "manifest.npz"
    params = np.array([GENERATOR_VERSION, lines, files, iops, seed, QUANTUM_MS], dtype=np.int64)
    if manifest.exists() and all(p.exists() for p in paths):
        with np.load(manifest) as z:
            if np.array_equal(z["params"], params):
                sq = z["sample_quanta"]
                samples = {(int(q), d): z[f"q{int(q)}_d{d}"] for q in sq for d in (0, 1)}
                return DataSet(folder, paths, lines, z["counts"], sq, samples)
    folder.mkdir(parents=True, exist_ok=True)
    manifest.unlink(missing_ok=True)
    rng = np.random.default_rng(seed)
    per_file = [lines // files + (1 if f < lines % files else 0) for f in range(files)]
    span_q = max(1, int(max(per_file) / iops * 1000) // QUANTUM_MS)
    sample_quanta = 1 + np.sort(
        rng.choice(max(1, span_q - 1), size=min(SAMPLE_QUANTA, max(1, span_q - 1)), replace=False)
    ).astype(np.int64)
    wanted = set(sample_quanta.tolist())
    gathered: dict[tuple[int, int], list[I64]] = {(q, d): [] for q in wanted for d in (0, 1)}
    counts = np.zeros((2, span_q + 16), dtype=np.int64)
    t0 = time.perf_counter()
    for f, path in enumerate(paths):
        clock_ms = float(rng.uniform(0.0, 5.0))  # fio's jobs start within a few ms
        stall_phase = int(rng.integers(0, 60))
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as fh:
            left = per_file[f]
            while left:
                n = min(CHUNK, left)
                left -= n
                stamps = clock_ms + np.cumsum(rng.exponential(1000.0 / iops, n))
                clock_ms = float(stamps[-1])
                time_ms = stamps.astype(np.int64)
                ddir = (rng.random(n) >= 0.6).astype(np.int64)
                bs = rng.choice(np.array([4096, 8192, 65536], dtype=np.int64), n, p=[0.8, 0.1, 0.1])
                offset = rng.integers(0, (8 << 30) // 65536, n, dtype=np.int64) * 65536
                value = _latency_ns(rng, ddir, time_ms, stall_phase)
                prio = np.zeros(n, dtype=np.int64)
                fh.write(format_lines([time_ms, value, ddir, bs, offset, prio]))
                q = (time_ms + QUANTUM_MS - 1) // QUANTUM_MS  # k of ((k-1) Q, k Q]
                if int(q[-1]) >= counts.shape[1]:
                    counts = np.pad(counts, ((0, 0), (0, int(q[-1]) + 16 - counts.shape[1])))
                for d in (0, 1):
                    sel = ddir == d
                    counts[d] += np.bincount(q[sel], minlength=counts.shape[1])
                    hit = sel & np.isin(q, sample_quanta)
                    for qq in np.unique(q[hit]).tolist():
                        gathered[(qq, d)].append(value[hit & (q == qq)])
        tmp.rename(path)
        print(
            f"  wrote {path.name}: {per_file[f]} lines, {path.stat().st_size / 1e6:.0f} MB "
            f"({time.perf_counter() - t0:.0f} s)",
            file=sys.stderr,
        )
    last = int(np.flatnonzero(counts.sum(axis=0))[-1])
    counts = counts[:, : last + 1]
    samples = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in gathered.items()}
    np.savez(
        manifest,
        params=params,
        counts=counts,
        sample_quanta=sample_quanta,
        **{f"q{q}_d{d}": v for (q, d), v in samples.items()},
    )
    return DataSet(folder, paths, lines, counts, sample_quanta, samples)


# --------------------------------------------------------------------------- running


@dataclass(frozen=True, slots=True)
class Run:
    """One child process: wall seconds, peak RSS in MB, and why it was stopped (if it was)."""

    wall_s: float
    rss_mb: float
    stopped: str | None


def run(cmd: list[str], out: Path, *, max_s: float, max_mb: float) -> Run:
    """Run ``cmd`` (stdout to ``out``), stopping it past ``max_s`` or ``max_mb`` of RSS."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with out.open("wb") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.PIPE, env=env, cwd=REPO)
        stopped: list[str] = []
        done = threading.Event()

        def watch() -> None:
            status = Path(f"/proc/{proc.pid}/status")
            while not done.wait(0.5):
                if time.perf_counter() - t0 > max_s:
                    stopped.append(f"stopped after {max_s:.0f} s")
                    proc.kill()
                    return
                try:
                    rss = next(
                        int(x.split()[1]) / 1024
                        for x in status.read_text().splitlines()
                        if x.startswith("VmRSS:")
                    )
                except (OSError, StopIteration):
                    return
                if rss > max_mb:
                    stopped.append(f"stopped at {rss / 1024:.1f} GB RSS")
                    proc.kill()
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        err = proc.stderr.read() if proc.stderr else b""
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        done.set()
        watcher.join()
    code = os.waitstatus_to_exitcode(status)
    if code != 0 and not stopped:
        msg = f"{' '.join(cmd[:4])} ... failed ({code}): {err.decode()[-800:]}"
        raise RuntimeError(msg)
    return Run(wall, usage.ru_maxrss / 1024, stopped[0] if stopped else None)


def fiomon_cmd(paths: list[Path]) -> list[str]:
    pct = ",".join(f"{p:g}" for p in PERCENTILES)
    return [
        sys.executable, "-m", "fiomon", "report", "--format", "jsonl", "--quiet",
        "--quantum", f"{QUANTUM_MS}ms", "--align", "epoch", "--percentiles", pct,
        *map(str, paths),
    ]  # fmt: skip


def unpack_fiologparser(scratch: Path) -> Path:
    """fio's fiologparser.py with the two fixes it needs for fio 3 logs on Python 3."""
    if not FIOLOGPARSER.exists():
        msg = f"{FIOLOGPARSER} is missing: apt-get install fio"
        raise SystemExit(msg)
    src = gzip.decompress(FIOLOGPARSER.read_bytes()).decode()
    fixes = [
        # fio 3.33 writes 5 columns (6 with log_offset=1): it unpacks exactly 4
        (
            "(time, value, foo, bar) = line.rstrip('\\r\\n').rsplit(', ')",
            "(time, value, foo, bar) = line.rstrip('\\r\\n').split(', ')[:4]",
        ),
        # Python 3: a float list index (it was written for Python 2's integer /)
        (
            "return float(s[(len(s)-1)/2]+s[(len(s)/2)])/2",
            "return float(s[(len(s)-1)//2]+s[(len(s)//2)])/2",
        ),
    ]
    for old, new in fixes:
        if src.count(old) != 1:
            msg = f"fiologparser.py changed: {old!r} not found once"
            raise SystemExit(msg)
        src = src.replace(old, new)
    dst = scratch / "fiologparser.py"
    dst.write_text(src)
    return dst


def fiologparser_cmd(script: Path, paths: list[Path]) -> list[str]:
    return [sys.executable, str(script), "-A", "-i", str(QUANTUM_MS), *map(str, paths)]


# --------------------------------------------------------------------------- checks


def check_fiomon(out: Path, data: DataSet) -> list[str]:
    """Compare fiomon's jsonl rows with the generator's counts and numpy's percentiles."""
    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    got = np.zeros_like(data.counts)
    by_key: dict[tuple[int, int], dict[str, Any]] = {}
    names = {"read": 0, "write": 1}
    alls = 0
    for r in rows:
        if r["scope"] != "cluster":
            continue
        if r["direction"] == "all":
            alls += r["samples"]
            continue
        d = names[r["direction"]]
        q = r["end_ms"] // QUANTUM_MS
        if r["end_ms"] % QUANTUM_MS or r["end_ms"] - r["start_ms"] != QUANTUM_MS:
            return [f"FAIL row not on the 1 s grid: {r['start_ms']}..{r['end_ms']}"]
        if q >= got.shape[1]:
            got = np.pad(got, ((0, 0), (0, q + 1 - got.shape[1])))
        got[d, q] += r["samples"]
        by_key[(q, d)] = r
    lines = int(got.sum())
    width = max(got.shape[1], data.counts.shape[1])
    want = np.pad(data.counts, ((0, 0), (0, width - data.counts.shape[1])))
    got = np.pad(got, ((0, 0), (0, width - got.shape[1])))
    bad_q = int((got != want).any(axis=0).sum())
    out_lines = [
        f"{'ok' if lines == data.lines else 'FAIL'} lines counted {lines} = written {data.lines}"
        f" (all rows: {alls})",
        f"{'ok' if bad_q == 0 else 'FAIL'} per-quantum counts equal the generator's: "
        f"{width - bad_q} of {width} quanta x 2 directions",
    ]
    checked = mismatched = 0
    for (q, d), values in data.samples.items():
        r = by_key.get((q, d))
        if r is None or len(values) == 0:
            continue
        pct = r["percentiles_ns"]
        exact = np.quantile(values, np.array(PERCENTILES) / 100, method="inverted_cdf")
        same = all(
            float(pct[f"{p:g}"]) == float(v) for p, v in zip(PERCENTILES, exact, strict=True)
        )
        same = same and r["min_ns"] == int(values.min()) and r["max_ns"] == int(values.max())
        same = same and math.isclose(r["mean_ns"], float(values.mean()), rel_tol=1e-6)
        checked += 1
        mismatched += not same
    out_lines.append(
        f"{'ok' if checked and not mismatched else 'FAIL'} p50/p90/p95/p99/min/max/mean equal "
        f"numpy (inverted_cdf) on {checked - mismatched} of {checked} sampled quanta x directions"
    )
    return out_lines


def count_fiologparser(out: Path) -> int:
    """Lines fiologparser.py counted (its ``samples`` column, summed over intervals)."""
    total = 0
    for line in out.read_text().splitlines()[1:]:
        total += int(line.split(", ")[1])
    return total


# --------------------------------------------------------------------------- main


def fit_time(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``t = a*N + c*N**2`` (parsing is linear; ``-A`` scans every line once
    per interval and the intervals grow with N at a fixed rate): (a, c)."""
    n = np.array([p[0] for p in points], dtype=np.float64)
    t = np.array([p[1] for p in points], dtype=np.float64)
    (a, c), *_ = np.linalg.lstsq(np.stack([n, n * n], axis=1), t, rcond=None)
    if c < 0:  # no quadratic term to see: linear through the origin
        return float((n @ t) / (n @ n)), 0.0
    return float(a), float(c)


def fit_memory(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``rss = b + a*N`` (a Python object per line): (b, a)."""
    n = np.array([p[0] for p in points], dtype=np.float64)
    m = np.array([p[1] for p in points], dtype=np.float64)
    (b, a), *_ = np.linalg.lstsq(np.stack([np.ones_like(n), n], axis=1), m, rcond=None)
    return float(b), float(a)


def extrapolate(ref: dict[int, Run], n: int) -> tuple[float, float]:
    """fiologparser.py's time (s) and peak RSS (MB) at ``n`` from the measured sizes."""
    a, c = fit_time([(k, v.wall_s) for k, v in ref.items()])
    b, m = fit_memory([(k, v.rss_mb) for k, v in ref.items()])
    return a * n + c * n * n, b + m * n


def parse_lines(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=100_000_000, help="N, lines in all (default 1e8)")
    ap.add_argument("--files", type=int, default=8, help="logs (hosts x jobs; default 8)")
    ap.add_argument("--iops", type=int, default=20_000, help="completions a second per log")
    ap.add_argument("--repeat", type=int, default=3, help="runs of fiomon (median)")
    ap.add_argument(
        "--ref-lines",
        type=parse_lines,
        default=[1_000_000, 10_000_000, 30_000_000, 50_000_000],
        help="comma-separated N to time fiologparser.py on (default 1e6,1e7,3e7,5e7)",
    )
    ap.add_argument("--ref-repeat", type=int, default=1, help="runs of fiologparser.py")
    ap.add_argument("--ref-max-s", type=float, default=1800, help="fiologparser.py time limit")
    ap.add_argument("--ref-max-gb", type=float, default=16, help="fiologparser.py RSS limit")
    ap.add_argument(
        "--data-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "fiomon-bench-iolog",
        help="where the logs are written and reused (about 35 bytes a line)",
    )
    args = ap.parse_args()
    scratch = args.data_dir
    scratch.mkdir(parents=True, exist_ok=True)
    need = args.lines * 38  # bytes: about 36 a line, and the smaller sets
    free = shutil.disk_usage(scratch).free
    if not (scratch / f"n{args.lines}" / "manifest.npz").exists() and need > free * 0.9:
        msg = f"{scratch}: {need / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free"
        raise SystemExit(msg)
    flp = unpack_fiologparser(scratch)
    sizes = sorted({*args.ref_lines, args.lines})
    print(
        f"fio 3.33 per-I/O clat logs (log_offset=1: time_ms, value_ns, ddir, bs, offset, prio), "
        f"{args.files} files, {args.iops} IOPS per file, quantum {QUANTUM_MS} ms; "
        f"{os.cpu_count()} cores; data in {scratch}"
    )
    print("fiomon:       " + " ".join(fiomon_cmd([Path("FILES")])[1:]))
    print(
        "fiologparser: " + " ".join(fiologparser_cmd(Path("fiologparser.py"), [Path("FILES")])[1:])
    )
    print(
        "  (fiologparser.py from Debian's fio, two fixes: split(', ')[:4] for fio 3's 5-6 "
        "columns, // in its median)"
    )
    ours: dict[int, Run] = {}
    ref: dict[int, Run] = {}
    ok = True
    for n in sizes:
        data = make_dataset(scratch / f"n{n}", n, args.files, args.iops)
        print(
            f"\nN = {n:,} lines: {len(data.paths)} files, {data.size_bytes / 1e9:.2f} GB, "
            f"{data.counts.shape[1]} quanta"
        )
        out = scratch / f"fiomon-n{n}.jsonl"
        runs = [
            run(fiomon_cmd(data.paths), out, max_s=7200, max_mb=20_000) for _ in range(args.repeat)
        ]
        walls = [r.wall_s for r in runs]
        med = Run(statistics.median(walls), max(r.rss_mb for r in runs), None)
        ours[n] = med
        print(
            f"  fiomon report      median {med.wall_s:8.2f} s  (runs: "
            f"{', '.join(f'{w:.2f}' for w in walls)})  peak RSS {med.rss_mb:7.1f} MB  "
            f"{n / med.wall_s / 1e6:.2f} M lines/s"
        )
        for line in check_fiomon(out, data):
            ok = ok and line.startswith("ok")
            print(f"    {line}")
        attempt = n in args.ref_lines
        if not attempt and len(ref) >= 2:
            est_s, est_mb = extrapolate(ref, n)
            attempt = est_s <= args.ref_max_s and est_mb <= args.ref_max_gb * 1024
        if not attempt:
            continue
        rout = scratch / f"fiologparser-n{n}.txt"
        rruns = [
            run(
                fiologparser_cmd(flp, data.paths),
                rout,
                max_s=args.ref_max_s,
                max_mb=args.ref_max_gb * 1024,
            )
            for _ in range(args.ref_repeat)
        ]
        r = Run(
            statistics.median(x.wall_s for x in rruns),
            max(x.rss_mb for x in rruns),
            next((x.stopped for x in rruns if x.stopped), None),
        )
        if r.stopped:
            print(f"  fiologparser.py    {r.stopped} ({r.wall_s:.0f} s, {r.rss_mb:.0f} MB)")
            continue
        ref[n] = r
        counted = count_fiologparser(rout)
        print(
            f"  fiologparser.py    median {r.wall_s:8.2f} s  peak RSS {r.rss_mb:7.1f} MB  "
            f"-> fiomon {r.wall_s / med.wall_s:6.1f}x faster, "
            f"{r.rss_mb / med.rss_mb:.1f}x less memory"
        )
        print(
            f"    fiologparser.py's samples column sums to {counted} of {n} lines (it keeps a "
            f"line only when the file's previous stamp is in the same interval, and counts "
            f"lines stamped on a boundary in both intervals)"
        )
    n = args.lines
    print()
    if n in ref:
        speedup, rss_ref, how = ref[n].wall_s / ours[n].wall_s, ref[n].rss_mb, "measured"
    elif len(ref) >= 2:
        est_s, est_mb = extrapolate(ref, n)
        ram_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
        speedup, rss_ref, how = est_s / ours[n].wall_s, est_mb, "extrapolated"
        a, c = fit_time([(k, v.wall_s) for k, v in ref.items()])
        b, m = fit_memory([(k, v.rss_mb) for k, v in ref.items()])
        print(
            f"fiologparser.py at N = {n:,}: not run; least-squares fits through N = "
            f"{', '.join(f'{k:,}' for k in sorted(ref))}: time = {a * 1e6:.3g} s x N/1e6 + "
            f"{c * 1e12:.3g} s x (N/1e6)^2, RSS = {b:.0f} MB + {m * 1e6:.0f} MB x N/1e6 "
            f"-> about {est_s:.0f} s ({est_s / 60:.0f} min) and {est_mb / 1024:.1f} GB "
            f"(limits {args.ref_max_s / 60:.0f} min, {args.ref_max_gb:g} GB; "
            f"this machine has {ram_gib:.0f} GiB)"
        )
    else:
        print("fiologparser.py: fewer than two sizes measured, no ratio")
        return 1
    largest = max(ref)
    print(
        f"speed-up at N = {largest:,} (measured): {ref[largest].wall_s / ours[largest].wall_s:.1f}x"
    )
    print(f"speed-up at N = {n:,} ({how}): {speedup:.1f}x (target >= 10x)")
    print(
        f"peak RSS at N = {n:,}: fiomon {ours[n].rss_mb:.0f} MB (target < 500 MB), "
        f"fiologparser.py {rss_ref:.0f} MB ({how})"
    )
    ok = ok and speedup >= 10 and ours[n].rss_mb < 500
    print("targets met" if ok else "TARGETS NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
