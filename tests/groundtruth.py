"""Ground truth from fio's per-I/O latency logs, and the comparison every change is held to.

``write_lat_log=P`` with ``log_avg_msec=0`` writes every completion to ``P_clat.N.log`` as
``time_ms, clat_ns, ddir, bs, prio`` (REFERENCE.md §1). The exact percentile of a window is
the smallest latency whose empirical CDF reaches q (numpy's ``inverted_cdf``), the same
definition fiomon interpolates towards.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

DIRS = {"read": 0, "write": 1}


@dataclass(frozen=True)
class Truth:
    """Completion time (ms), latency (ns) and direction of every I/O."""

    time_ms: npt.NDArray[np.int64]
    clat_ns: npt.NDArray[np.int64]
    ddir: npt.NDArray[np.int64]

    @classmethod
    def load(cls, paths: Iterable[Path]) -> Truth:
        arrays = [np.loadtxt(p, delimiter=",", dtype=np.int64, ndmin=2) for p in paths]
        data = np.concatenate([a for a in arrays if a.size])
        return cls(data[:, 0], data[:, 1], data[:, 2])

    def window(self, start_ms: int, end_ms: int, direction: str) -> npt.NDArray[np.int64]:
        """Latencies of I/Os of ``direction`` completed in ``(start_ms, end_ms]``."""
        sel = (self.time_ms > start_ms) & (self.time_ms <= end_ms)
        if direction != "all":
            sel &= self.ddir == DIRS[direction]
        return self.clat_ns[sel]


def exact(values: npt.NDArray[np.int64], q: float) -> float:
    return float(np.percentile(values, q, method="inverted_cdf"))


@dataclass
class Comparison:
    """Relative errors per percentile key, and the windows the input does not cover."""

    errors: dict[str, list[float]]
    uncovered: list[tuple[int, str, int, float]]


def relative_errors(
    rows: Iterable[tuple[int, int, str, dict[str, float], float | None]],
    truth: Truth,
    qs: Iterable[str],
    min_ios: int = 500,
    coverage: float = 0.05,
) -> Comparison:
    """Per percentile key, |estimate - exact| / exact over windows with >= min_ios I/Os.

    A window whose estimated I/O count differs from the true count by more than
    ``coverage`` is not a percentile comparison but missing input (fio never writes a
    job's last partial hist interval): it is listed in ``uncovered`` instead.

    Args:
        rows: (start_ms, end_ms, direction, {percentile key: estimate ns}, samples or
            None when the tool does not report a comparable count).
        truth: the per-I/O ground truth.
        qs: percentile keys to compare.
        min_ios: skip windows with fewer I/Os.
        coverage: allowed relative difference of I/O counts.
    """
    keys = list(qs)
    errs: dict[str, list[float]] = {k: [] for k in keys}
    uncovered = []
    for start, end, direction, est, samples in rows:
        vals = truth.window(start, end, direction)
        if len(vals) < min_ios:
            continue
        if samples is not None and abs(samples - len(vals)) > coverage * len(vals):
            uncovered.append((end, direction, len(vals), samples))
            continue
        for k in keys:
            ex = exact(vals, float(k))
            errs[k].append(abs(est[k] - ex) / ex)
    return Comparison(errs, uncovered)


def fiologparser_hist(tmp: Path) -> Path:
    """fio's fiologparser_hist.py as Debian ships it (gzipped in the fio docs)."""
    src = Path("/usr/share/doc/fio/fiologparser_hist.py.gz")
    if not src.exists():
        msg = f"{src} missing: the Debian fio package ships it; install fio"
        raise FileNotFoundError(msg)
    dst = tmp / "fiologparser_hist.py"
    with gzip.open(src, "rb") as fin, dst.open("wb") as fout:
        shutil.copyfileobj(fin, fout)
    return dst


def run_fiologparser(
    tool: Path, logs: list[Path], percentiles: str = "90,99"
) -> list[tuple[int, str, dict[str, float]]]:
    """Rows of fiologparser_hist.py: (end_ms, direction, {key: ns})."""
    out = subprocess.run(
        [
            sys.executable,
            str(tool),
            "--directions",
            "rw",
            "--percentiles",
            percentiles,
            "-i",
            "1000",
            *map(str, logs),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    keys = ["50", *percentiles.split(",")]
    rows = []
    for ln in out[1:]:
        f = [x.strip() for x in ln.split(",")]
        direction = {"r": "read", "w": "write"}[f[1]]
        vals = [float(x) for x in f[5 : 5 + len(keys)]]
        rows.append((int(f[0]), direction, dict(zip(keys, vals, strict=True))))
    return rows
