"""A :class:`CompareResult` built by hand: known numbers, gaps, open intervals, verdicts.

Two directions (read, write), the cluster and two hosts, four percentiles, six 10 s
windows. The candidate's read p99 is 1.6x the baseline's in the windows starting at 20
and 30 s (significant, ratio > 1) and its read p50 0.8x in the one at 50 s (significant,
ratio < 1); the baseline has no write window at 20 s (a gap); p99.9's high side is
unbounded in the candidate's read windows at 10 and 40 s (so is the ratio's high side)
and its low side in the one at 0 s (so is the ratio's low side).
"""

from __future__ import annotations

from pathlib import Path

from fiomon.histogram import pct_key
from fiomon.offline.compare.model import (
    CompareOptions,
    CompareResult,
    HostShare,
    Interval,
    RunInfo,
    RunName,
    Verdict,
    WindowPoint,
)
from fiomon.offline.quanta import QuantaOptions

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
BASE_NS = {"50": 300_000.0, "90": 620_000.0, "99": 2_100_000.0, "99.9": 5_300_000.0}
WINDOWS = [(float(s), float(s + 10)) for s in range(0, 60, 10)]
SLOWER = {("read", "99", 20.0), ("read", "99", 30.0)}  # candidate 1.6x
FASTER = {("read", "50", 50.0)}  # candidate 0.8x
MISSING = {("baseline", "write", 20.0)}
OPEN_HIGH = {("candidate", "read", 10.0), ("candidate", "read", 40.0)}  # p99.9's high side
OPEN_LOW = {("candidate", "read", 0.0)}  # p99.9's low side
HOSTS = ("h1", "h2")
START_MS = 1_795_000_000_000


def _value(run: RunName, direction: str, key: str, start: float, wobble: float) -> float:
    v = BASE_NS[key] * (1.0 if direction == "read" else 1.4) * wobble
    if run == "candidate" and (direction, key, start) in SLOWER:
        v *= 1.6
    if run == "candidate" and (direction, key, start) in FASTER:
        v *= 0.8
    return v


def _interval(run: RunName, direction: str, key: str, start: float, v: float) -> Interval:
    width = {"50": 0.03, "90": 0.05, "99": 0.12, "99.9": 0.3}[key]
    lo: float | None = v * (1 - width)
    hi: float | None = v * (1 + width)
    if key == "99.9" and (run, direction, start) in OPEN_HIGH:
        hi = None
    if key == "99.9" and (run, direction, start) in OPEN_LOW:
        lo = None
    return lo, hi


def _points(run: RunName, direction: str, host_share: float) -> list[WindowPoint]:
    out = []
    for i, (start, end) in enumerate(WINDOWS):
        if (run, direction, start) in MISSING:
            continue
        wobble = 1.0 + 0.02 * ((i * 7 + (run == "candidate") * 3) % 5 - 2)
        values = {k: _value(run, direction, k, start, wobble) for k in BASE_NS}
        ios = round((2000 if run == "baseline" else 1900) * host_share) + i
        out.append(
            WindowPoint(
                start_s=start,
                end_s=end,
                ios=ios,
                iops=ios / 10.0,
                covered_s=10.0,
                values_ns=values,
                ci_ns={k: _interval(run, direction, k, start, v) for k, v in values.items()},
            )
        )
    return out


def _verdict(
    b: WindowPoint | None,
    c: WindowPoint | None,
    key: str,
    where: tuple[str, str | None, str],
    window: tuple[float, float] | None,
) -> Verdict:
    scope, host, direction = where
    bv = b.values_ns[key] if b else None
    cv = c.values_ns[key] if c else None
    ratio = cv / bv if bv and cv else None
    lo: float | None = None
    hi: float | None = None
    if ratio is not None:
        lo, hi = ratio * 0.9, ratio * 1.1
        bci = b.ci_ns[key] if b else (None, None)
        cci = c.ci_ns[key] if c else (None, None)
        if cci[1] is None or bci[0] is None:
            hi = None
        if cci[0] is None or bci[1] is None:
            lo = None
    significant = (lo is not None and lo > 1) or (hi is not None and hi < 1)
    hosts: tuple[HostShare, ...] = ()
    if scope == "cluster" and significant and ratio is not None and ratio > 1:
        hosts = (HostShare("h1", 90, 0.9, 0.5), HostShare("h2", 10, 0.1, 0.5))
    return Verdict(
        window_start_s=None if window is None else window[0],
        window_end_s=None if window is None else window[1],
        scope=scope,  # type: ignore[arg-type]
        host=host,
        direction=direction,
        percentile=float(key),
        baseline_ns=bv,
        candidate_ns=cv,
        baseline_ci_ns=b.ci_ns[key] if b else (None, None),
        candidate_ci_ns=c.ci_ns[key] if c else (None, None),
        baseline_ios=b.ios if b else 0,
        candidate_ios=c.ios if c else 0,
        ratio=ratio,
        ratio_ci=(lo, hi),
        significant=significant,
        method="mover" if window else "mover+bootstrap",
        hosts=hosts,
    )


def hand_result(*, per_host: bool = True) -> CompareResult:
    """The result described in the module docstring (hosts too when ``per_host``)."""
    opts = CompareOptions(quanta=QuantaOptions(percentiles=PERCENTILES, per_host=per_host))
    runs = {
        name: RunInfo(
            name=name,
            spec=f"runs/{name}/",
            files=tuple(Path(f"runs/{name}/{h}/job_clat_hist.1.log") for h in HOSTS),
            ios=24_000,
            hosts=HOSTS,
            relative=False,
            origin_ms=START_MS + (5000 if name == "candidate" else 0),
            start_ms=START_MS,
            end_ms=START_MS + 60_000,
        )
        for name in ("baseline", "candidate")
    }
    result = CompareResult(
        options=opts,
        baseline=runs["baseline"],
        candidate=runs["candidate"],
        notes=["the candidate's alignment point was moved 0.2 s to its quantum grid"],
    )
    scopes: list[tuple[str, str | None, float]] = [("cluster", None, 1.0)]
    if per_host:
        scopes += [("host", h, 0.5) for h in HOSTS]
    windows: list[Verdict] = []
    whole: list[Verdict] = []
    for scope, host, share in scopes:
        for direction in ("read", "write"):
            pts: dict[RunName, list[WindowPoint]] = {}
            for run in ("baseline", "candidate"):
                pts[run] = _points(run, direction, share)
                result.series[(run, scope, host, direction)] = pts[run]  # type: ignore[index]
            by_start = {r: {w.start_s: w for w in pts[r]} for r in pts}
            for window in WINDOWS:
                b, c = by_start["baseline"].get(window[0]), by_start["candidate"].get(window[0])
                if b is None or c is None:
                    continue
                for p in PERCENTILES:
                    windows.append(_verdict(b, c, pct_key(p), (scope, host, direction), window))
            for p in PERCENTILES:
                key = pct_key(p)
                b, c = pts["baseline"][2], pts["candidate"][2]
                whole.append(_verdict(b, c, key, (scope, host, direction), None))
    windows.sort(key=lambda v: v.window_start_s or 0.0)
    result.verdicts = windows + whole
    return result
