"""What ``fiomon compare`` computes: its options and its verdicts (pure data).

Times in the results are **aligned seconds**: 0 is the baseline's and the candidate's
alignment point (each run's first quantum start by default; ``--shift`` moves the
candidate's; ``--align-at`` names one instant in each run). Latencies are ns.

A :class:`Verdict` compares one percentile of one direction (and scope) in one window, or
over the whole run (``window_start_s is None``): the two values, their order-statistic
intervals, the ratio candidate/baseline and its interval at the confidence level.
``significant`` is true when that interval excludes 1. A side the data cannot bound is
``None`` (an interval open on that side), never an invented number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fiomon.closed import Scope
from fiomon.offline.quanta import QuantaOptions

RunName = Literal["baseline", "candidate"]
Bound = float | None
Interval = tuple[Bound, Bound]
DEFAULT_WINDOW_MS = 10_000
DEFAULT_RESAMPLES = 2000


@dataclass(frozen=True, slots=True)
class AlignPoint:
    """An instant of one run that aligned time 0 maps to (``--align-at``).

    One of the three is given.

    Args:
        epoch_ms: a wall-clock instant (epoch ms); the run's logs must carry epoch stamps.
        offset_ms: ms since the run's own start (its first quantum's start).
        time_of_day_ms: ms since local midnight, on the date the run covers (the first
            such instant from a minute before the run's start on); epoch stamps only.
    """

    epoch_ms: int | None = None
    offset_ms: int | None = None
    time_of_day_ms: int | None = None


@dataclass(frozen=True, slots=True)
class CompareOptions:
    """How to compare (``fiomon compare --help``).

    Args:
        quanta: what ``fiomon report`` computes from each run (quantum, percentiles,
            directions, per_host, host naming, source, confidence level, latency kind).
        window_ms: window length, a multiple of the quantum.
        shift_ms: the candidate's alignment point is this much after its own start
            (``--shift``), a multiple of the quantum; 0 with ``align_at``.
        align_at: ``(baseline, candidate)`` instants aligned to 0 (``--align-at``).
        resamples: bootstrap resamples of the whole-run lines.
        seed: of the bootstrap (the same inputs give the same output).
    """

    quanta: QuantaOptions = field(default_factory=QuantaOptions)
    window_ms: int = DEFAULT_WINDOW_MS
    shift_ms: int = 0
    align_at: tuple[AlignPoint, AlignPoint] | None = None
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 1


@dataclass(frozen=True, slots=True)
class HostShare:
    """One candidate host's part in a tail that got worse (per-host attribution).

    Args:
        host: the host label.
        above: its I/Os in the window at or above the bin of the baseline's percentile
            value (:func:`fiomon.histogram.bin_of`, as the live tail shares count).
        share: ``above`` over all hosts' (0..1).
        io_share: its I/Os over all hosts' in the window (0..1): a host whose ``share``
            is far above its ``io_share`` carries the regression.
    """

    host: str
    above: int
    share: float
    io_share: float

    def to_json(self) -> dict[str, Any]:
        """The jsonl object."""
        return {
            "host": self.host,
            "above": self.above,
            "share": round(self.share, 4),
            "io_share": round(self.io_share, 4),
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    """One window (or the whole run) x scope x direction x percentile.

    Args:
        window_start_s: aligned start of the window, s; ``None`` for the whole run.
        window_end_s: aligned end, s; ``None`` for the whole run.
        scope: ``cluster`` or ``host``.
        host: the host of host scope, else ``None``.
        direction: ``read``, ``write``, ``trim``, ``mixed`` or ``all``.
        percentile: e.g. ``99.0``.
        baseline_ns: the baseline's value (``None``: no I/O there).
        candidate_ns: the candidate's.
        baseline_ci_ns: the baseline value's order-statistic interval.
        candidate_ci_ns: the candidate value's.
        baseline_ios: I/Os of the baseline in the window (scope, direction).
        candidate_ios: the candidate's.
        ratio: ``candidate_ns / baseline_ns`` (``None`` if either is missing).
        ratio_ci: its interval at the level; a ``None`` side is unbounded.
        significant: the interval excludes 1 (both its sides needed for that are bounded).
        method: how ``ratio_ci`` was built: ``mover`` or ``mover+bootstrap``.
        hosts: cluster verdicts that are significant with ``ratio > 1``: the candidate's
            hosts by their share of the I/Os above the baseline's value, largest first.
        partial: a run's records cover less than 90 % of the window (its first or last:
            fio starting or stopping, fewer I/Os); ``False`` for whole-run lines.
    """

    window_start_s: float | None
    window_end_s: float | None
    scope: Scope
    host: str | None
    direction: str
    percentile: float
    baseline_ns: float | None
    candidate_ns: float | None
    baseline_ci_ns: Interval
    candidate_ci_ns: Interval
    baseline_ios: int
    candidate_ios: int
    ratio: float | None
    ratio_ci: Interval
    significant: bool
    method: str
    hosts: tuple[HostShare, ...] = ()
    partial: bool = False

    @property
    def whole_run(self) -> bool:
        """Whether this is a whole-run line."""
        return self.window_start_s is None

    def to_json(self) -> dict[str, Any]:
        """The jsonl object (the issue's keys first, then the supporting ones)."""
        return {
            "window_start_s": self.window_start_s,
            "window_end_s": self.window_end_s,
            "direction": self.direction,
            "percentile": self.percentile,
            "baseline_ns": _num(self.baseline_ns),
            "candidate_ns": _num(self.candidate_ns),
            "ratio": _num(self.ratio, 5),
            "ratio_ci": [_num(self.ratio_ci[0], 5), _num(self.ratio_ci[1], 5)],
            "significant": self.significant,
            "scope": self.scope,
            "host": self.host,
            "baseline_ci_ns": [_num(x) for x in self.baseline_ci_ns],
            "candidate_ci_ns": [_num(x) for x in self.candidate_ci_ns],
            "baseline_ios": self.baseline_ios,
            "candidate_ios": self.candidate_ios,
            "method": self.method,
            "hosts": [h.to_json() for h in self.hosts],
            "partial": self.partial,
        }


@dataclass(frozen=True, slots=True)
class WindowPoint:
    """One run's window for the charts: I/Os, IOPS and each percentile with its interval.

    Args:
        start_s: aligned start, s.
        end_s: aligned end, s.
        ios: I/Os in the window.
        iops: ``ios`` per second the run's records cover in the window.
        covered_s: the seconds the run's records cover in the window.
        values_ns: per percentile key (``"99"``), the value, ns.
        ci_ns: per percentile key, the interval (``None`` sides unbounded).
    """

    start_s: float
    end_s: float
    ios: int
    iops: float
    covered_s: float
    values_ns: dict[str, float]
    ci_ns: dict[str, Interval]


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What one run was: its files and how it was aligned.

    Args:
        name: ``baseline`` or ``candidate``.
        spec: what the user gave (a file, a folder or a glob).
        files: the files read (after the one-truth choice).
        ios: I/Os read, every direction row of ``all`` excluded.
        hosts: host labels (``--host-from``).
        relative: the logs' stamps are relative (no wall clock).
        origin_ms: the run's own ms (epoch or relative) that aligned 0 is.
        start_ms: the run's first quantum start (its own ms).
        end_ms: its last quantum end.
        late_records: records the reader could not place (out of order).
    """

    name: RunName
    spec: str
    files: tuple[Path, ...]
    ios: int
    hosts: tuple[str, ...]
    relative: bool
    origin_ms: int
    start_ms: int
    end_ms: int
    late_records: int = 0


SeriesKey = tuple[RunName, Scope, str | None, str]
"""``(run, scope, host or None, direction)``."""


@dataclass(slots=True)
class CompareResult:
    """Everything ``fiomon compare`` prints or draws.

    Args:
        options: as given.
        baseline: the baseline run.
        candidate: the candidate run.
        verdicts: window lines in time order (scope, host, direction, percentile within a
            window), then the whole-run lines.
        series: per run, scope, host and direction, its windows (charts).
        notes: things the reader should know (hosts in one run only, windows one run
            lacks, a rounded alignment), one sentence each.
    """

    options: CompareOptions
    baseline: RunInfo
    candidate: RunInfo
    verdicts: list[Verdict] = field(default_factory=list)
    series: dict[SeriesKey, list[WindowPoint]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def level(self) -> float:
        """The confidence level of every interval."""
        return self.options.quanta.confidence_level


def _num(x: float | None, digits: int = 6) -> float | None:
    """A JSON number with ``digits`` significant digits (``None`` stays)."""
    if x is None:
        return None
    return float(f"{x:.{digits}g}")
