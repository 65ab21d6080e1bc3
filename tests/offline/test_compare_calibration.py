"""``fiomon compare`` is calibrated: few false alarms on equal runs, a real slowdown found.

Pairs of runs are written with the simulator (:mod:`fiomon.tools.simulate`: normal head
plus Pareto tail, drawn per I/O and binned as fio does) and compared in process with
:func:`fiomon.offline.compare.run.run_compare`: 60 s runs, 1 s hist records, 10 s windows,
2 hosts x 2 jobs (one reads, one writes: independent draws, so two verdicts per window
and percentile), at 200, 2,000 and 20,000 I/Os per window per direction, cluster-wide.

* **False positives.** Baseline and candidate come from the same :class:`LatencyModel`
  with different seeds; every host has its own record phase, as on a real cluster, so the
  records straddle quantum and window boundaries and are split. At 95 %, at most 5 % of
  the window verdicts of each level and percentile may be flagged (over >= 300 verdicts,
  the six full windows of each run; the stub after 60 s, at most a second of records
  that the hosts' phases leave there, is not a window of that level). p99 of 200 I/Os
  rests on the ~2 I/Os above it: no upper bound exists, so neither side of the ratio's
  interval does and it is never flagged; that is counted apart. Whole-run lines of the
  same pairs: at most 5 % flagged too.
* **Detection.** The candidate's hosts are all 1.3x slower (every I/O, so p99 is 30 %
  higher) during 20-40 s. Here every host is at phase 0 (records end on the second), so
  aligned time is time since the start and exactly windows 20-30 and 30-40 are slowed
  (with random phases aligned 0 is the first quantum's start, up to a second before the
  first record, and the last slowed second falls into window 40-50). At 20,000 I/Os per window
  at least 80 % of those windows' p99 verdicts are flagged with ratio > 1, none with
  ratio < 1, and the windows outside are flagged no more often than equal runs are.
  At 2,000 I/Os p99 rests on ~20 I/Os: no two-sample test reaches 80 % there (an exact
  test on the counts above the *true* baseline p99 reaches 64 %, a one-sample test that
  knows the baseline 93 %; benchmarks/bench_compare.py prints them), so the test asks
  for clearly more than chance (>= 25 %) and the benchmark states the rate. With a
  lighter tail (Pareto exponent 6 instead of 2.5) the same 2,000 I/Os suffice: >= 80 %
  is asserted there (99.8 % measured over 100 pairs).

* **Counts.** Every I/O the simulator wrote is in ``RunInfo.ios`` and the whole-run
  lines, also when records straddle quanta and are split in fractions.

``benchmarks/bench_compare.py`` prints the same table over more pairs.
"""

from __future__ import annotations

import io
import math
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from fiomon.offline.compare.model import CompareOptions, Verdict
from fiomon.offline.compare.run import RunInput, run_compare, run_files
from fiomon.offline.quanta import QuantaOptions
from fiomon.offline.sources import SourceOptions
from fiomon.tools.simulate import JobSpec, LatencyModel, format_line, records

LEVELS = (200, 2_000, 20_000)
"""I/Os per window per direction, cluster-wide."""
PERCENTILES = (50.0, 90.0, 99.0)
HOSTS = 2
SECONDS = 60
WINDOW_S = 10
INTERVAL_MS = 1000
START_MS = 1_795_000_000_000
SLOW = (20, 40, 1.3)
"""Detection: aligned seconds ``[from, to)`` and the latency factor."""
MODEL = LatencyModel()
OPTIONS = CompareOptions(
    quanta=QuantaOptions(percentiles=PERCENTILES, directions=("read", "write")),
    window_ms=WINDOW_S * 1000,
)
MAX_FP = 0.05
PAIRS = 25
"""Pairs per level in this test: 25 x 6 windows x 2 directions = 300 window verdicts."""
WRITE_LAG_MS = 7
"""The simulator stamps a job's write lines this much after its read lines."""

Kind = Literal["same", "whole", "slowed", "outside"]
"""``same``: windows of equal runs; ``whole``: their whole-run lines; ``slowed`` and
``outside``: the windows of a pair with a slowed candidate, inside and outside the slowdown."""


def slowed_records(slow: tuple[int, int, float], lag_ms: int) -> Callable[[int], float]:
    """``records``' ``factor_at`` for the records covering ``[from_s, to_s)`` after the start.

    ``records`` passes the read line's stamp; a write line is stamped ``lag_ms`` later.
    """
    lo_ms, hi_ms, factor = START_MS + slow[0] * 1000, START_MS + slow[1] * 1000, slow[2]

    def factor_at(end_ms: int) -> float:
        end_ms += lag_ms
        return factor if lo_ms <= end_ms - INTERVAL_MS and end_ms <= hi_ms else 1.0

    return factor_at


def write_run(
    folder: Path,
    ios_per_window: int,
    rng: np.random.Generator,
    *,
    in_phase: bool = False,
    slow: tuple[int, int, float] | None = None,
    model: LatencyModel = MODEL,
) -> dict[int, int]:
    """One simulated run: ``HOSTS`` folders, each a reading and a writing job; I/Os per direction.

    Args:
        folder: where to write (``client-01/job_clat_hist.1.log`` reads, ``.2.log`` writes).
        ios_per_window: I/Os per window per direction over all hosts (Poisson per record).
        rng: random source.
        in_phase: every record covers a whole second from the start (fio's phase 0 on
            every host); else each host has a random phase, as ``write_cluster`` gives it.
        slow: ``(from_s, to_s, factor)``: the records that cover ``[from_s, to_s)`` after
            the start are ``factor`` times slower (meant with ``in_phase``).
        model: the latency model.
    """
    iops = ios_per_window / WINDOW_S / HOSTS
    ios = {0: 0, 1: 0}
    for h in range(HOSTS):
        host_dir = folder / f"client-{h + 1:02d}"
        host_dir.mkdir(parents=True)
        phase = 0 if in_phase else int(rng.integers(0, INTERVAL_MS))
        for d in (0, 1):
            lag = WRITE_LAG_MS if d else 0
            factor_at = None if slow is None else slowed_records(slow, lag)
            lines = []
            for end, _, counts, _ in records(
                JobSpec(host_dir.name, d + 1, iops, phase, (d,)),
                start_ms=START_MS - lag,  # the write lines on the read lines' stamps
                seconds=SECONDS,
                interval_ms=INTERVAL_MS,
                model=model,
                rng=rng,
                factor_at=factor_at,
            ):
                lines.append(format_line(end, d, 4096, counts))
                ios[d] += int(counts.sum())
            (host_dir / f"job_clat_hist.{d + 1}.log").write_text("".join(lines))
    return ios


def run_input(name: Literal["baseline", "candidate"], folder: Path) -> RunInput:
    """A run as ``fiomon compare`` resolves a folder."""
    return RunInput(name, str(folder), tuple(run_files(str(folder))), SourceOptions())


@dataclass(slots=True)
class Count:
    """Verdicts of one kind, level and percentile.

    Args:
        flagged: significant ones.
        up: significant with ratio > 1.
        total: all.
        unbounded: those whose ratio interval has no side at all (never significant).
        ratios: the ratios seen (for the slowed windows' median).
    """

    flagged: int = 0
    up: int = 0
    total: int = 0
    unbounded: int = 0
    ratios: list[float] = field(default_factory=list)

    def add(self, v: Verdict) -> None:
        """Count one verdict."""
        self.total += 1
        self.flagged += v.significant
        self.up += v.significant and v.ratio is not None and v.ratio > 1
        self.unbounded += v.ratio_ci == (None, None)
        if v.ratio is not None:
            self.ratios.append(v.ratio)

    @property
    def rate(self) -> float:
        """Share flagged (NaN with no verdicts)."""
        return self.flagged / self.total if self.total else math.nan

    def __str__(self) -> str:
        text = f"flagged {self.flagged}/{self.total} = {100 * self.rate:.1f} %"
        if self.flagged != self.up:
            text += f" ({self.up} with ratio > 1)"
        if self.unbounded:
            text += f"; {self.unbounded} unbounded"
        return text


Key = tuple[Kind, int, float]
"""``(kind, I/Os per window, percentile)``."""


def tally(
    counts: dict[Key, Count], verdicts: Iterable[Verdict], level: int, *, slowed: bool
) -> None:
    """Add one pair's cluster verdicts to ``counts``."""
    for v in verdicts:
        if v.scope != "cluster":
            continue
        if v.window_start_s is None:
            kind: Kind = "whole"
        elif v.window_end_s is None or v.window_start_s < 0 or v.window_end_s > SECONDS:
            continue  # the stub after the last full window
        elif not slowed:
            kind = "same"
        elif SLOW[0] <= v.window_start_s and v.window_end_s <= SLOW[1]:
            kind = "slowed"
        else:
            kind = "outside"
        if slowed and kind == "whole":
            continue
        counts.setdefault((kind, level, v.percentile), Count()).add(v)


def compare_pair(
    root: Path, level: int, pair: int, *, slowed: bool, model: LatencyModel = MODEL
) -> list[Verdict]:
    """Write a baseline and a candidate run, compare them; the verdicts (files removed)."""
    folder = root / f"{'slow' if slowed else 'same'}-{level}-{pair}"
    base, cand = folder / "baseline", folder / "candidate"
    # one seed per (level, pair, kind): every pair independent of every other
    rng = np.random.default_rng([level, pair, int(slowed)])
    write_run(base, level, rng, in_phase=slowed, model=model)
    write_run(cand, level, rng, in_phase=slowed, slow=SLOW if slowed else None, model=model)
    result = run_compare(
        run_input("baseline", base), run_input("candidate", cand), OPTIONS, io.StringIO()
    )
    shutil.rmtree(folder)
    return result.verdicts


def calibrate(
    root: Path, levels: Iterable[int], pairs: int, *, slowed: bool, model: LatencyModel = MODEL
) -> dict[Key, Count]:
    """``pairs`` independent pairs per level, tallied."""
    counts: dict[Key, Count] = {}
    for level in levels:
        for pair in range(pairs):
            verdicts = compare_pair(root, level, pair, slowed=slowed, model=model)
            tally(counts, verdicts, level, slowed=slowed)
    return counts


@pytest.fixture(scope="module")
def same(tmp_path_factory: pytest.TempPathFactory) -> dict[Key, Count]:
    """Equal-distribution pairs at every level."""
    return calibrate(tmp_path_factory.mktemp("same"), LEVELS, PAIRS, slowed=False)


@pytest.fixture(scope="module")
def slowed(tmp_path_factory: pytest.TempPathFactory) -> dict[Key, Count]:
    """Pairs whose candidate is 1.3x slower in aligned 20-40 s, at 2,000 and 20,000 I/Os."""
    return calibrate(tmp_path_factory.mktemp("slowed"), LEVELS[1:], PAIRS, slowed=True)


@pytest.mark.parametrize("level", LEVELS)
def test_equal_runs_flag_at_most_5_percent_of_windows(same: dict[Key, Count], level: int) -> None:
    for q in PERCENTILES:
        c = same["same", level, q]
        assert c.total >= 300, c
        if level == 200 and q == 99.0:
            continue  # the next test
        assert c.unbounded == 0, f"p{q:g} at {level} I/Os: {c}"
        assert c.rate <= MAX_FP, f"p{q:g} at {level} I/Os per window: {c}"


def test_p99_of_200_ios_has_no_upper_bound_so_is_never_flagged(same: dict[Key, Count]) -> None:
    c = same["same", 200, 99.0]
    assert c.total >= 300
    assert c.unbounded == c.total, c
    assert c.flagged == 0, c


def test_whole_run_lines_of_equal_runs_flag_at_most_5_percent(same: dict[Key, Count]) -> None:
    for q in PERCENTILES:
        lines = [c for (kind, _, p), c in same.items() if kind == "whole" and p == q]
        flagged, total = sum(c.flagged for c in lines), sum(c.total for c in lines)
        assert total == len(LEVELS) * PAIRS * 2, q
        assert flagged / total <= MAX_FP, f"p{q:g}: {[str(c) for c in lines]}"


def test_p99_30_percent_higher_for_20_s_is_flagged_there_and_only_there(
    slowed: dict[Key, Count],
) -> None:
    hit = slowed["slowed", 20_000, 99.0]
    assert hit.total == PAIRS * 2 * 2
    assert hit.up >= 0.8 * hit.total, hit
    assert hit.flagged == hit.up, hit  # never "faster"
    assert 1.2 < float(np.median(hit.ratios)) < 1.4, hit
    some = slowed["slowed", 2_000, 99.0]
    assert some.flagged == some.up, some
    assert some.up >= 0.25 * some.total, some  # see the module docstring: 80 % is out of reach
    for level in LEVELS[1:]:
        for q in PERCENTILES:
            # every I/O 1.3x slower moves the head too: p50 and p90 are plain to see
            if q < 99.0:
                seen = slowed["slowed", level, q]
                assert seen.up == seen.total, f"p{q:g} at {level} I/Os in 20-40 s: {seen}"
            out = slowed["outside", level, q]
            assert out.total == PAIRS * 4 * 2
            assert out.rate <= MAX_FP, f"p{q:g} at {level} I/Os outside 20-40 s: {out}"


def test_at_2000_ios_a_lighter_tail_is_found_80_percent_of_the_time(tmp_path: Path) -> None:
    """The 2,000 I/O level's shortfall above is the Pareto tail's, not the method's: with a
    tail of exponent 6 instead of 2.5 (p99's I/Os lie closer together, so 20 of them say
    more), the same 1.3x slowdown of p99 is flagged in at least 80 % of the slowed windows,
    and equal runs still flag at most 5 %."""
    light = LatencyModel(tail_alpha=6.0)
    slow = calibrate(tmp_path / "slow", [2_000], PAIRS, slowed=True, model=light)
    same = calibrate(tmp_path / "same", [2_000], PAIRS, slowed=False, model=light)
    hit = slow["slowed", 2_000, 99.0]
    assert hit.total == PAIRS * 2 * 2
    assert hit.up >= 0.8 * hit.total, hit
    assert hit.flagged == hit.up, hit
    for q in PERCENTILES:
        assert slow["outside", 2_000, q].rate <= MAX_FP, slow["outside", 2_000, q]
        assert same["same", 2_000, q].rate <= MAX_FP, same["same", 2_000, q]


@pytest.mark.parametrize("in_phase", [True, False], ids=["in-phase", "split-records"])
def test_every_io_the_simulator_wrote_is_counted(tmp_path: Path, *, in_phase: bool) -> None:
    # Records straddling quanta are split in fractions: the counts must still add up.
    rng = np.random.default_rng(7)
    written = {n: write_run(tmp_path / n, 2_000, rng, in_phase=in_phase) for n in ("b", "c")}
    result = run_compare(
        run_input("baseline", tmp_path / "b"),
        run_input("candidate", tmp_path / "c"),
        OPTIONS,
        io.StringIO(),
    )
    read = (result.baseline.ios, result.candidate.ios)
    assert read == (sum(written["b"].values()), sum(written["c"].values())), written
    for v in result.verdicts:
        if v.whole_run and v.scope == "cluster":
            d = 0 if v.direction == "read" else 1
            got = (v.baseline_ios, v.candidate_ios)
            assert got == (written["b"][d], written["c"][d]), f"{v.direction} p{v.percentile:g}"
