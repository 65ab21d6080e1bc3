"""One run's fio output read into aligned windows of merged histograms.

The rows come from the report's own engine (:func:`fiomon.offline.report.run_report` with
a sink), so a window holds exactly the I/Os of the ``fiomon report`` rows of its quanta:
the same one-truth choice of inputs, the same quantum grid, the same problems reported.
The sink keeps, per scope (cluster, each host), direction and window, the sum of the rows'
histograms, trimmed to their non-empty bins (a window costs a few KB, not fio's 1,856
bins per row), with the I/Os and the seconds the records covered (for IOPS).

Aligned time: window ``k`` covers ``[origin + k w, origin + (k + 1) w)`` of the run's own
ms, with ``origin`` on the run's quantum grid, so a quantum never straddles two windows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO, cast

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum, Scope
from fiomon.errors import FiomonError, ParseError
from fiomon.offline.compare.align import time_of_day_at
from fiomon.offline.compare.model import AlignPoint, CompareOptions, RunInfo, RunName
from fiomon.offline.iosources import is_iolog
from fiomon.offline.quanta import QuantaOptions
from fiomon.offline.quantafiles import all_quanta_files
from fiomon.offline.report import ReportOptions, run_report
from fiomon.offline.sources import SourceOptions

F64 = npt.NDArray[np.float64]
Key = tuple[Scope, str | None, str]
"""``(scope, host or None, direction)``."""


class Hist:
    """A histogram kept over its non-empty columns only (``lo`` is the first one's bin)."""

    __slots__ = ("counts", "lo")

    def __init__(self) -> None:
        self.lo = 0
        self.counts: F64 = np.zeros(0)

    def add(self, hist: npt.NDArray[np.generic]) -> None:
        """Add a full-layout histogram."""
        nz = np.flatnonzero(hist)
        if not len(nz):
            return
        a, b = int(nz[0]), int(nz[-1]) + 1
        if not len(self.counts):
            self.lo, self.counts = a, np.asarray(hist[a:b], dtype=np.float64).copy()
            return
        lo, hi = min(a, self.lo), max(b, self.lo + len(self.counts))
        if lo != self.lo or hi != self.lo + len(self.counts):
            grown = np.zeros(hi - lo)
            grown[self.lo - lo : self.lo - lo + len(self.counts)] = self.counts
            self.lo, self.counts = lo, grown
        self.counts[a - self.lo : b - self.lo] += np.asarray(hist[a:b], dtype=np.float64)

    def add_trimmed(self, other: Hist) -> None:
        """Add another trimmed histogram of the same layout."""
        if not len(other.counts):
            return
        full = np.zeros(other.lo + len(other.counts))
        full[other.lo :] = other.counts
        self.add(full)

    @property
    def total(self) -> float:
        """The I/Os it holds."""
        return float(self.counts.sum())


Exact = dict[str, tuple[float, float | None, float | None]]
"""Per percentile key: the value and its interval's sides (None: unbounded)."""


@dataclass(slots=True)
class Window:
    """One window of one scope and direction.

    ``exact``: from per-I/O logs, the window's own row's nearest-rank percentiles and
    their order-statistic intervals on the values (``fiomon report``'s exact rows),
    which the binned histogram only approximates; None otherwise.
    """

    hist: Hist = field(default_factory=Hist)
    samples: float = 0.0  # fio records split over windows leave fractions
    covered_s: float = 0.0
    exact: Exact | None = None
    rows: int = 0

    @property
    def ios(self) -> int:
        """The I/Os, rounded once (a sum of windows sums their ``samples`` first)."""
        return round(self.samples)


@dataclass(slots=True)
class RunWindows:
    """One run in windows: per key, per window index, the merged histogram.

    Args:
        info: the run (files, hosts, alignment).
        layout: its bin layout.
        windows: per :data:`Key`, per window index (negative before an ``--align-at``
            point), the window.
        quantum_ms: the quantum the rows were closed in.
    """

    info: RunInfo
    layout: BinLayout
    windows: dict[Key, dict[int, Window]]
    quantum_ms: int


class _WindowSink:
    """The rows' sink: sums each row's histogram into its window (a :class:`RowWriter`)."""

    def __init__(self, layout: BinLayout, relative: bool, place: _Placer, exact: bool) -> None:
        self.layout, self.relative, self.place, self.exact = layout, relative, place, exact
        self.windows: dict[Key, dict[int, Window]] = {}
        self.first_ms: int | None = None
        self.last_ms: int | None = None
        self.ios = 0.0  # records split over quanta leave fractions: rounded once, at the end

    def write(self, rows: Sequence[ClosedQuantum]) -> None:
        for r in rows:
            if r.hist is None:
                msg = (
                    "no histograms in the rows (averaged latency logs, log_avg_msec > 0, hold "
                    "one mean per window): compare needs percentiles"
                )
                raise FiomonError(msg)
            if self.first_ms is None:
                self.first_ms = r.start_ms
            # Rows are windows: the records end where the last one's covered time does (a
            # run's records run on from its start, or from the window's).
            end = r.end_ms
            if r.iops:
                begin = max(r.start_ms, self.place.first_ms or r.start_ms)
                end = min(r.end_ms, begin + math.ceil(r.stats.samples / r.iops * 1000))
            self.last_ms = end if self.last_ms is None else max(self.last_ms, end)
            k = self.place.window(r.start_ms)
            w = self.windows.setdefault((r.scope, r.host, r.direction), {}).setdefault(k, Window())
            w.hist.add(r.hist)
            w.rows += 1
            # Rows are the windows (regrid): one exact row is the window's exact statistics.
            w.exact = _exact(r) if self.exact and w.rows == 1 else None
            w.samples += r.stats.samples
            if r.iops:
                w.covered_s += r.stats.samples / r.iops
            if r.scope == "cluster" and r.direction != "all":
                self.ios += r.stats.samples

    def close(self) -> None:
        return None


def _exact(r: ClosedQuantum) -> Exact | None:
    """An exact row's percentiles and intervals (None: it has not all of them)."""
    out: Exact = {}
    for key, value in r.stats.percentiles_ns.items():
        low, high = (None, None) if r.ci_ns is None else r.ci_ns.get(key, (None, None))
        out[key] = (value, low, high)
    return out or None


class _Placer:
    """Maps a row's start (the run's own ms) to its window index, once the origin is known."""

    def __init__(
        self,
        name: RunName,
        window_ms: int,
        quantum_ms: int,
        shift_ms: int,
        point: AlignPoint | None,
    ) -> None:
        self.name, self.window_ms, self.quantum_ms = name, window_ms, quantum_ms
        self.shift_ms, self.point = shift_ms, point
        self.origin_ms = 0
        self.first_ms: int | None = None
        self.note: str | None = None

    def regrid(self, first_ms: int, relative: bool) -> tuple[int, int]:
        """:attr:`QuantaOptions.regrid`: fix the origin, close the rows as the windows.

        Returns ``(window_ms, phase)`` from the run's first quantum start.
        """
        self.first_ms = first_ms
        self.start(first_ms, relative)
        return self.window_ms, self.origin_ms % self.window_ms

    def start(self, first_ms: int, relative: bool) -> None:
        """Fix the origin from the run's first quantum start."""
        target = first_ms + self.shift_ms
        p = self.point
        if p is not None and p.offset_ms is not None:
            target = first_ms + p.offset_ms
        elif p is not None:
            if relative:
                msg = (
                    f"--align-at {self.name}: a wall-clock time, but the {self.name}'s logs "
                    "have relative stamps (log_unix_epoch=0): give an offset from its start "
                    "instead, e.g. +95s"
                )
                raise FiomonError(msg)
            if p.time_of_day_ms is not None:
                target = time_of_day_at(p.time_of_day_ms, first_ms)
            else:
                target = p.epoch_ms if p.epoch_ms is not None else first_ms
        # On the run's quantum grid, so that no quantum straddles two windows.
        steps = round((target - first_ms) / self.quantum_ms)
        self.origin_ms = first_ms + steps * self.quantum_ms
        if self.origin_ms != target:
            self.note = (
                f"the {self.name}'s alignment point moved {self.origin_ms - target:+d} ms "
                f"onto its quantum grid ({self.quantum_ms} ms)"
            )

    def quantum_end(self, ms: int) -> int:
        """The end of the run's quantum that holds ``ms`` (its grid starts at its first)."""
        first = self.first_ms if self.first_ms is not None else 0
        return first + -(-(ms - first) // self.quantum_ms) * self.quantum_ms

    def window(self, start_ms: int) -> int:
        return (start_ms - self.origin_ms) // self.window_ms


def read_run(
    name: RunName,
    *,
    spec: str,
    files: Sequence[Path],
    source: SourceOptions,
    opts: CompareOptions,
    err: TextIO = sys.stderr,
) -> tuple[RunWindows, list[str]]:
    """Read one run into windows; returns them and the notes for the reader.

    Raises:
        FiomonError: quanta files, averaged logs, no I/O, or an impossible alignment.
    """
    if all_quanta_files(files):
        msg = (
            f"{name} {spec}: quanta files hold closed rows, not histograms; compare reads "
            "fio's logs (hist logs, json+ streams, per-I/O latency logs)"
        )
        raise FiomonError(msg)
    exact = bool(files) and all(is_iolog(p) for p in files)
    q: QuantaOptions = dataclasses.replace(
        opts.quanta,
        source=source,
        per_host=True,  # host histograms: per-host attribution, and --per-host lines
        keep_hists=True,
        keep_host_hists=True,
        target_error=None,
        # Binned rows' percentiles go unused (each window's come from its histogram);
        # per-I/O logs' rows are exact: a window's are its row's (rows are the windows).
        percentiles=opts.quanta.percentiles if exact else (),
        regrid=None,
    )
    shift = opts.shift_ms if name == "candidate" else 0
    point = None if opts.align_at is None else opts.align_at[0 if name == "baseline" else 1]
    placer = _Placer(name, opts.window_ms, q.quantum_ms, shift, point)
    # The rows are the windows themselves (a tenth of the rows of 1 s quanta to close).
    q = dataclasses.replace(q, regrid=placer.regrid)
    holder: list[_WindowSink] = []

    def sink(layout: BinLayout, relative: bool) -> _WindowSink:
        s = _WindowSink(layout, relative, placer, exact)
        holder.append(s)
        return s

    prefix = cast("TextIO", _Prefixed(err, f"{name}: "))
    try:
        summary = run_report(files, q, io.StringIO(), prefix, opts=ReportOptions(), sink=sink)
    except ParseError:
        raise  # --strict's first bad line names its file
    except FiomonError as exc:  # which run it is
        msg = f"{name} {spec}: {exc}"
        raise FiomonError(msg) from None
    if not holder or holder[0].first_ms is None or summary.records == 0:
        msg = f"{name} {spec}: no I/O in the directions compared"
        raise FiomonError(msg)
    s = holder[0]
    _check_records(name, spec, summary.records, s.windows, opts.window_ms)
    hosts = sorted({h for (_, h, _) in s.windows if h is not None})
    info = RunInfo(
        name=name,
        spec=spec,
        files=tuple(files),
        ios=round(s.ios),
        hosts=tuple(hosts),
        relative=s.relative,
        origin_ms=placer.origin_ms,
        start_ms=placer.first_ms if placer.first_ms is not None else s.first_ms or 0,
        end_ms=placer.quantum_end(s.last_ms or 0),
        late_records=summary.late_records,
    )
    if point is not None and not info.start_ms <= placer.origin_ms <= info.end_ms:
        span = f"{_when(info.start_ms, info.relative)} .. {_when(info.end_ms, info.relative)}"
        msg = (
            f"--align-at {name}: the point ({_when(placer.origin_ms, info.relative)}) is "
            f"outside the {name} run ({span})"
        )
        raise FiomonError(msg)
    notes = [placer.note] if placer.note else []
    return RunWindows(info, s.layout, s.windows, q.quantum_ms), notes


def _check_records(
    name: RunName, spec: str, records: int, windows: dict[Key, dict[int, Window]], window_ms: int
) -> None:
    """Refuse windows that would hold shares of records, not what happened in them.

    A record longer than a window (one json+ document of a whole run, fio's
    ``--status-interval`` or ``log_hist_msec`` longer than ``--window``) is spread evenly
    over the windows it covers: each would get the same percentiles, with intervals as if
    its share of the I/Os had been seen there. Each host's direction's window with I/O
    needs a record of its own unless records are split, so fewer than half as many
    records as such windows means most records span two windows or more.

    Raises:
        FiomonError: naming the run, the counts and what to do.
    """
    needed = sum(len(ws) for (scope, _, d), ws in windows.items() if scope == "host" and d != "all")
    if records <= 0 or needed < 2 * records:
        return
    msg = (
        f"{name} {spec}: {records} fio record(s) for {needed} windows of "
        f"{window_ms / 1000:g} s (per host and direction): its records are longer than a "
        "window (json+ output without --status-interval, or a status interval or "
        "log_hist_msec longer than --window), so each window would show an even share of "
        "a record, not what happened in it; use a --window at least as long as fio's "
        "interval (the whole run for one json+ document), or re-run fio with "
        "--status-interval=1 or hist logs"
    )
    raise FiomonError(msg)


class _Prefixed(io.TextIOBase):
    """Writes each line to ``err`` with the run's name in front (which run a problem is in)."""

    def __init__(self, err: TextIO, prefix: str) -> None:
        self.err, self.prefix = err, prefix
        self._at_start = True

    def write(self, s: str) -> int:
        for part in s.splitlines(keepends=True):
            line = part
            if self._at_start and line.startswith("fiomon: "):
                line = "fiomon: " + self.prefix + line[len("fiomon: ") :]
            self.err.write(line)
            self._at_start = line.endswith("\n")
        return len(s)

    def isatty(self) -> bool:
        return self.err.isatty()

    def flush(self) -> None:
        self.err.flush()


def _when(ms: int, relative: bool) -> str:
    if relative:
        return f"{ms / 1000:g} s"
    return dt.datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")
