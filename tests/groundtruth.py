"""Ground truth from fio's per-I/O latency logs, and the comparison every change is held to.

``write_lat_log=P`` with ``log_avg_msec=0`` writes every completion to ``P_clat.N.log`` as
``time_ms, clat_ns, ddir, bs, prio`` (fio's HOWTO, "Log File Formats"). The exact
percentile of a window is the smallest latency whose empirical CDF reaches q (numpy's
``inverted_cdf``), the same definition fiomon interpolates towards.

Estimates are judged against the whole set of the sample's q-quantiles, every x with
F(x-) <= q <= F(x). That set is one value, except when q times the window's I/O count is a
whole number k: then it is the interval [x_(k), x_(k+1)], and ``inverted_cdf`` merely
picks its lower end. Rate-limited fio jobs make that the rule, not the exception (every
window of test_accuracy_fio holds exactly 2500 I/Os, so p50, p90 and p99 all fall on
whole ranks), and an estimate whose merged counts carry a thousandth of an I/O less below
x_(k) (records split over quanta in proportion to overlap) lands on x_(k+1): in a sparse
tail that was up to 15 % away from x_(k) while being a correct p99.
"""

from __future__ import annotations

import gzip
import itertools
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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


def exact_interval(
    values: npt.NDArray[np.int64], q: float, slack: float = 0.0
) -> tuple[float, float]:
    """The sample's ``q``-quantiles (``q`` in percent) as ``(low, high)``; see the module doc.

    ``slack`` widens the rank ``q * n`` by that many I/Os either way: every latency from
    the ``ceil(q * n - slack)``-th to the ``(floor(q * n + slack) + 1)``-th smallest
    (:func:`split_slack` says how far a proportional split can move the rank). With no
    slack that is the set of q-quantiles: one value, or the whole-rank pair.
    """
    ordered = np.sort(values)
    n = len(ordered)
    rank = q / 100 * n
    eps = 1e-9 * n
    low = min(n - 1, max(0, int(np.ceil(rank - slack - eps)) - 1))
    high = min(n - 1, max(low, int(np.floor(rank + slack + eps))))
    if slack == 0.0 and abs(rank - round(rank)) >= eps:  # not a whole rank: one value
        high = low
    return float(ordered[low]), float(ordered[high])


@dataclass(frozen=True)
class JobLogs:
    """One fio job's hist-log records and its per-I/O truth (the same job's two logs).

    Per direction: each record's span ``(previous end, end]`` as fiomon reads it
    (``fiomon/fio/fiolog.py``), and which of the job's I/Os it holds. fio adds every
    completion to its histogram and to its per-I/O log in one place, in completion order,
    and a record holds the I/Os since the previous one: so record ``i`` holds the next
    ``count_i`` lines of that direction in the per-I/O log. Their completion stamps may
    fall after the record's own stamp (a loaded machine logs it late), which is why
    membership is by count, not by time.
    """

    spans: dict[int, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]  # ddir -> starts, ends
    members: dict[int, list[npt.NDArray[np.int64]]]  # ddir -> per record, its I/Os' times
    truth: Truth

    @classmethod
    def load(cls, hist_log: Path, lat_log: Path, interval_ms: int = 1000) -> JobLogs:
        """The first record spans ``interval_ms``; the others from the previous end."""
        data = np.loadtxt(hist_log, delimiter=",", dtype=np.float64, ndmin=2)
        stamps, ddirs, counts = (
            data[:, 0].astype(np.int64),
            data[:, 1].astype(np.int64),
            np.rint(data[:, 3:].sum(axis=1)).astype(np.int64),
        )
        truth = Truth.load([lat_log])
        spans, members = {}, {}
        for d in DIRS.values():
            sel = ddirs == d
            ends, n = stamps[sel], counts[sel]
            if not len(ends):
                continue
            spans[d] = (np.concatenate([[ends[0] - interval_ms], ends[:-1]]), ends)
            times = truth.time_ms[truth.ddir == d]
            bounds = np.concatenate([[0], np.cumsum(n)])
            members[d] = [times[a:b] for a, b in itertools.pairwise(bounds.tolist())]
        return cls(spans, members, truth)


def split_slack(jobs: Iterable[JobLogs], start_ms: int, end_ms: int, direction: str) -> float:
    """How many I/Os' worth the window's rank can move when records are split by overlap.

    A fio record ``r`` of ``N`` I/Os that straddles the window's edge, with a fraction ``f``
    of its time inside, is merged as ``f`` of each of its I/Os, as if they had completed
    evenly; really ``k`` of them completed inside. At any latency ``x`` the merged count
    below ``x`` then differs from the true one by at most ``(1 - f) * N + (N - k)`` (the
    record is mostly inside) and at most ``f * N + k`` (mostly outside); the sum over the
    window's records bounds how far the percentile's rank can move. ``N`` and ``k`` come
    from the per-I/O log (the record's own I/Os, :class:`JobLogs`), so the bound is what
    the input allows, not a tolerance: a stall that bunches a record's I/Os at one end (a
    loaded machine) widens it, regular records keep it at a few I/Os in thousands. A
    record wholly inside or outside the window by its span can still hold I/Os completed
    on the other side of the edge (logged late): those count too (``f`` is 1 or 0).
    """
    d = DIRS[direction]
    total = 0.0
    for job in jobs:
        if d not in job.spans:
            continue
        starts, ends = job.spans[d]
        for s0, e0, ios in zip(starts.tolist(), ends.tolist(), job.members[d], strict=True):
            inside = min(e0, end_ms) - max(s0, start_ms)
            f = min(1.0, max(0.0, inside / (e0 - s0)))
            n = len(ios)
            k = int(np.count_nonzero((ios > start_ms) & (ios <= end_ms)))
            total += min((1 - f) * n + (n - k), f * n + k)
    return total


@dataclass
class Comparison:
    """Relative errors per percentile key, and the windows the input does not cover."""

    errors: dict[str, list[float]]
    uncovered: list[tuple[int, str, int, float]]


def relative_errors(
    rows: Iterable[tuple[int, int, str, dict[str, float], float | None]],
    truth: Truth,
    qs: Iterable[str],
    *,
    min_ios: int = 500,
    coverage: float = 0.05,
    truth_kind: Literal["interval", "lower"] = "interval",
    jobs: Iterable[JobLogs] | None = None,
) -> Comparison:
    """Per percentile key, the estimate's relative distance to the exact quantiles.

    With ``truth_kind="interval"`` that is 0 inside :func:`exact_interval`, else the
    distance to its nearer end relative to that end; with ``"lower"``, the distance to its
    lower end (numpy's ``inverted_cdf``), for ranking two tools by the same point. Only
    windows with >= min_ios I/Os count.

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
        truth_kind: what an estimate is measured against (see above).
        jobs: with ``truth_kind="interval"``, widen each window's interval by the rank
            slack of the proportional split (:func:`split_slack` over these jobs' logs).
    """
    job_list = list(jobs) if jobs is not None else []
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
        slack = split_slack(job_list, start, end, direction) if job_list else 0.0
        for k in keys:
            low, high = exact_interval(vals, float(k), slack)
            if truth_kind == "lower":
                high = low
            e = est[k]
            errs[k].append((low - e) / low if e < low else (e - high) / high if e > high else 0.0)
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
