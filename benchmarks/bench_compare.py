"""Benchmark: how good ``fiomon compare`` is (calibration) and what it costs (speed).

**Calibration** (``--pairs``, ``--detect-pairs``): the same simulated pairs as
``tests/offline/test_compare_calibration.py`` (its pairs are the first ones here), in
process: the share of window verdicts flagged at 95 % on equal runs per level (200, 2,000,
20,000 I/Os per window per direction) and percentile, the whole-run lines' share, and the
detection rate of a 1.3x slowdown of every host during aligned 20-40 s of 60 s, beside the
power two oracle tests of p99 would reach.

**Speed**: two runs of 16 hist logs x 600 one-second records per direction (1856 bins,
about 104 MB each, the size of ``bench_report.py``'s run; the candidate has 4 hosts 1.5x
slower during 200-300 s), written once and cached. Times, each in a fresh child process
with its peak RSS from ``wait4``, the median of ``--repeat`` runs:

* ``fiomon compare BASELINE CANDIDATE --format jsonl``;
* ``fiomon report --format jsonl`` of each run.

The bound: compare costs at most 1.20x both reports together. Correctness counters: the
I/Os each program read per run and direction against the generator's, the verdicts and
whole-run lines. Usage::

    python benchmarks/bench_compare.py [--pairs 100] [--detect-pairs 60] [--repeat 3]
        [--dir DIR] [--skip-calibration] [--skip-speed]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for tests.*

from fiomon.tools.simulate import JobSpec, LatencyModel, format_line, records
from tests.offline.test_compare_calibration import (
    LEVELS,
    MAX_FP,
    MODEL,
    PERCENTILES,
    SLOW,
    Count,
    Key,
    Kind,
    calibrate,
)

HOSTS = 16
RECORDS = 600
BOUND = 1.20
START_MS = 1_795_000_000_000
SLOW_HOSTS = 4
SLOW_S = (200, 300, 1.5)


# --- calibration -----------------------------------------------------------------------


def p99_power(n: int, factor: float, tail_alpha: float, level: float = 0.95) -> tuple[float, float]:
    """The power of two oracle tests of a ``factor`` slower p99, ``n`` I/Os per side.

    With a Pareto tail of exponent ``tail_alpha`` (the simulator's), ``factor`` times the
    latencies puts ``factor ** tail_alpha`` times as many I/Os above the old p99 (its tail
    starts well below p99 / factor). Both tests count the I/Os above the *true* baseline
    p99, which only an oracle knows, and reject at the two-sided ``level`` with exact
    binomial tails: a one-sample test that knows the baseline (the candidate's count is
    Binomial(n, 1 %) if nothing changed), and a two-sample test (the candidate's count
    given the sum of both counts is Binomial(sum, 1/2) if nothing changed).

    Returns:
        ``(one-sample power, two-sample power)``.
    """
    a = (1 - level) / 2
    p0, p1 = 0.01, 0.01 * factor**tail_alpha
    lgamma = np.vectorize(math.lgamma)

    def pmf(size: int, p: float) -> np.ndarray:
        k = np.arange(size + 1, dtype=np.float64)
        log = lgamma(size + 1.0) - lgamma(k + 1) - lgamma(size - k + 1)
        return np.asarray(np.exp(log + k * math.log(p) + (size - k) * math.log1p(-p)))

    def critical(null: np.ndarray) -> int:
        sf = np.cumsum(null[::-1])[::-1]  # P(K >= k)
        return int(np.argmax(sf <= a)) if (sf <= a).any() else len(null)

    pmf0, pmf1 = pmf(n, p0), pmf(n, p1)
    one = float(pmf1[critical(pmf0) :].sum())
    two = 0.0
    for total in range(1, min(int(n * p1 * 6 + 40), n) + 1):
        c = np.arange(critical(pmf(total, 0.5)), total + 1)
        two += float((pmf1[c] * pmf0[total - c]).sum())
    return one, two


def print_calibration(root: Path, pairs: int, detect_pairs: int) -> bool:
    """Run the pairs and print the table; whether the issue's targets hold."""
    print(
        f"calibration: 60 s runs, 1 s records, 10 s windows, 2 hosts, read and write; "
        f"95 %; {pairs} equal pairs per level, {detect_pairs} slowed pairs per level"
    )
    t0 = time.perf_counter()
    same = calibrate(root / "same", LEVELS, pairs, slowed=False)
    t_same = time.perf_counter() - t0
    t0 = time.perf_counter()
    slowed = calibrate(root / "slowed", LEVELS, detect_pairs, slowed=True)
    t_slow = time.perf_counter() - t0
    n_pairs = len(LEVELS) * (pairs + detect_pairs)
    print(
        f"  ({n_pairs} pairs compared in {t_same + t_slow:.1f} s, "
        f"{(t_same + t_slow) / n_pairs * 1000:.0f} ms per pair incl. writing the logs)"
    )

    def table(title: str, counts: dict[Key, Count], kind: Kind) -> None:
        print(f"\n{title}")
        print(f"  {'I/Os/window':>11s}  " + "".join(f"{f'p{q:g}':46s}" for q in PERCENTILES))
        for level in LEVELS:
            cells = [str(counts.get((kind, level, q), Count())) for q in PERCENTILES]
            print(f"  {level:11,d}  " + "".join(f"{c:46s}" for c in cells))

    table("equal runs, windows (false positives; bound 5 %):", same, "same")
    table("equal runs, whole-run lines (false positives; bound 5 %):", same, "whole")
    table(
        f"slowed windows ({SLOW[2]}x in {SLOW[0]}-{SLOW[1]} s; p99 target >= 80 % at 20,000):",
        slowed,
        "slowed",
    )
    table("windows outside the slowdown (false positives; bound 5 %):", slowed, "outside")
    print("\np99 in the slowed windows: median ratio; power of oracle tests at the same n")
    for level in LEVELS:
        c = slowed.get(("slowed", level, 99.0), Count())
        med = statistics.median(c.ratios) if c.ratios else math.nan
        one, two = p99_power(level, SLOW[2], MODEL.tail_alpha)
        print(
            f"  {level:11,d}  flagged up {c.up}/{c.total} = {100 * c.up / max(c.total, 1):5.1f} %"
            f"  median ratio {med:5.3f}  oracle: one-sample {100 * one:5.1f} %, "
            f"two-sample {100 * two:5.1f} %"
        )
    false_alarms = [c for (kind, _, _), c in [*same.items(), *slowed.items()] if kind != "slowed"]
    hit = slowed[("slowed", 20_000, 99.0)]
    ok = all(c.rate <= MAX_FP for c in false_alarms if c.total) and hit.up >= 0.8 * hit.total
    print(
        "\nfalse positives <= 5 % everywhere, >= 80 % of the slowed p99 at 20,000 flagged: "
        + ("yes" if ok else "NO")
    )
    print()
    return ok


# --- speed -----------------------------------------------------------------------------


def make_run(folder: Path, seed: int, *, slowed: bool) -> dict[str, int]:
    """16 hosts x 1 hist log x 600 records per direction (cached); I/Os per direction."""
    done = folder.with_suffix(".ios.json")  # beside the run: compare reads all of the folder
    if done.exists():
        return dict(json.loads(done.read_text()))
    rng = np.random.default_rng(seed)
    model = LatencyModel(head_mean_ns=300_000, head_sd_ns=80_000, tail_share=0.05)
    ios = {"read": 0, "write": 0}
    for h in range(HOSTS):
        spec = JobSpec(f"host{h:02d}", 1, iops=2000, phase_ms=int(rng.integers(0, 1000)))
        path = folder / spec.host / "job_clat_hist.1.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        slow = None
        if slowed and h < SLOW_HOSTS:
            slow = (START_MS + SLOW_S[0] * 1000, START_MS + SLOW_S[1] * 1000, SLOW_S[2])
        with path.open("w") as fh:
            for end, d, counts, _ in records(
                spec,
                start_ms=START_MS,
                seconds=RECORDS,
                interval_ms=1000,
                model=model,
                rng=rng,
                slow=slow,
            ):
                fh.write(format_line(end, d, 4096, counts))
                ios["write" if d else "read"] += int(counts.sum())
    done.write_text(json.dumps(ios))
    print(f"  wrote {folder} ({size_mb(folder):.1f} MB)", file=sys.stderr)
    return ios


def size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*.log")) / 1e6


def run(cmd: list[str], out: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MB) of one child process (stdout to ``out``)."""
    t0 = time.perf_counter()
    with out.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        msg = f"{cmd[2:5]} failed ({os.waitstatus_to_exitcode(status)}): {err[-800:]}"
        raise RuntimeError(msg)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure(name: str, cmd: list[str], out: Path, repeat: int) -> tuple[float, float, float]:
    """Median wall s, median CPU s, peak RSS (MB) over ``repeat`` runs."""
    walls, cpus, rss = [], [], []
    for _ in range(repeat):
        w, c, r = run(cmd, out)
        walls.append(w)
        cpus.append(c)
        rss.append(r)
    med = statistics.median(walls)
    cpu = statistics.median(cpus)
    print(
        f"{name:28s} median {med:8.3f} s  (runs: {', '.join(f'{w:.3f}' for w in walls)})"
        f"  CPU {cpu:7.3f} s  peak RSS {max(rss):7.1f} MB"
    )
    return med, cpu, max(rss)


def report_ios(out: Path) -> dict[str, float]:
    """I/Os per direction in ``fiomon report --format jsonl`` rows (cluster scope)."""
    ios = {"read": 0.0, "write": 0.0}
    for line in out.read_text().splitlines():
        row = json.loads(line)
        if row["scope"] == "cluster" and row["direction"] in ios:
            ios[row["direction"]] += row["samples"]
    return ios


def compare_counts(out: Path) -> tuple[int, int, int, dict[str, dict[str, int]]]:
    """Verdicts, whole-run lines, significant windows; whole-run I/Os per run, direction."""
    verdicts = whole = flagged = 0
    ios: dict[str, dict[str, int]] = {"baseline": {}, "candidate": {}}
    for line in out.read_text().splitlines():
        v = json.loads(line)
        verdicts += 1
        if v["window_start_s"] is None:
            whole += 1
            if v["scope"] == "cluster":
                ios["baseline"][v["direction"]] = v["baseline_ios"]
                ios["candidate"][v["direction"]] = v["candidate_ios"]
        else:
            flagged += v["significant"]
    return verdicts, whole, flagged, ios


def speed(scratch: Path, repeat: int) -> bool:
    """Time compare against two reports; print the counters; whether the bound holds."""
    base = scratch / "baseline"
    cand = scratch / "candidate"
    truth = {
        "baseline": make_run(base, 11, slowed=False),
        "candidate": make_run(cand, 12, slowed=True),
    }
    files = {name: sorted(str(p) for p in (scratch / name).rglob("*.log")) for name in truth}
    print(
        f"input: 2 runs x {HOSTS} hist logs x {RECORDS} records per direction (read, write), "
        f"1856 bins; baseline {size_mb(base):.1f} MB ({size_mb(base) / 1.048576:.1f} MiB), "
        f"candidate {size_mb(cand):.1f} MB; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} before timing"
    )
    py = [sys.executable, "-m", "fiomon"]
    out = {name: scratch / f"{name}.jsonl" for name in ("compare", "baseline", "candidate")}
    t_cmp, cpu_cmp, rss_cmp = measure(
        "fiomon compare",
        [*py, "compare", str(base), str(cand), "--format", "jsonl"],
        out["compare"],
        repeat,
    )
    t_rep, cpu_rep, rss_rep = {}, {}, {}
    for name in ("baseline", "candidate"):
        t_rep[name], cpu_rep[name], rss_rep[name] = measure(
            f"fiomon report ({name})",
            [*py, "report", "--format", "jsonl", "--quiet", *files[name]],
            out[name],
            repeat,
        )
    both = t_rep["baseline"] + t_rep["candidate"]
    ratio = t_cmp / both
    print(
        f"\ncompare / (report baseline + report candidate): {t_cmp:.3f} / {both:.3f} = "
        f"{ratio:.3f}x (bound <= {BOUND:.2f}x)"
    )
    cpu_both = cpu_rep["baseline"] + cpu_rep["candidate"]
    print(f"CPU time, the same: {cpu_cmp:.3f} / {cpu_both:.3f} = {cpu_cmp / cpu_both:.3f}x")
    print(f"peak RSS: compare {rss_cmp:.0f} MB, reports {max(rss_rep.values()):.0f} MB")
    verdicts, whole, flagged, cmp_ios = compare_counts(out["compare"])
    ok = ratio <= BOUND
    print(f"\ncompare: {verdicts} verdicts, {whole} whole-run lines, {flagged} windows significant")
    for name in ("baseline", "candidate"):
        rep = report_ios(out[name])
        for d in ("read", "write"):
            gen, got_cmp, got_rep = truth[name][d], cmp_ios[name].get(d), rep[d]
            same = got_cmp == gen and round(got_rep) == gen
            ok &= same
            print(
                f"  {name:9s} {d:5s} I/Os: generator {gen:,d}, compare {got_cmp:,}, "
                f"report {got_rep:,.0f}  {'ok' if same else 'MISMATCH'}"
            )
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=100, help="equal pairs per level")
    ap.add_argument("--detect-pairs", type=int, default=60, help="slowed pairs per level")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each timed command")
    ap.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()) / "fiomon-bench-compare"
    )
    ap.add_argument("--skip-calibration", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    ok = True
    if not args.skip_calibration:
        with tempfile.TemporaryDirectory(prefix="fiomon-calib-") as tmp:
            ok = print_calibration(Path(tmp), args.pairs, args.detect_pairs)
    if not args.skip_speed:
        ok &= speed(args.dir, args.repeat)
        print("bound met, counters agree" if ok else "BOUND NOT MET OR COUNTERS DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
