"""Both runs read, aligned into windows and judged: :func:`run_compare`.

Per scope (cluster; each host both runs have, with ``--per-host``), direction and window,
each run's percentiles and their order-statistic intervals come from the window's merged
histogram (the rule and the bounds of ``fiomon report``'s rows); the ratio's interval is
:func:`fiomon.offline.compare.stats.mover_ratio`. Whole-run lines merge the windows both
runs have and add the paired block bootstrap. See :mod:`fiomon.offline.compare.stats` for
the method and why.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import lzma
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import numpy.typing as npt

from fiomon.closed import Scope
from fiomon.confidence import summarize_with_bounds
from fiomon.errors import FiomonError
from fiomon.fio.iolog import iolog_kind, rate_log
from fiomon.fio.parsers import fio_json_head
from fiomon.histogram import pct_key
from fiomon.offline.compare.model import (
    CompareOptions,
    CompareResult,
    HostShare,
    Interval,
    RunName,
    Verdict,
    WindowPoint,
)
from fiomon.offline.compare.stats import (
    MIN_BOOTSTRAP_WINDOWS,
    above_counts,
    bootstrap_ratio,
    hull,
    mover_ratio,
    significant,
)
from fiomon.offline.compare.windows import Key, RunWindows, Window, read_run
from fiomon.offline.quantafiles import is_quanta_file
from fiomon.offline.sources import SourceOptions

F64 = npt.NDArray[np.float64]
PARTIAL = 0.9
"""A window a run's records cover less of than this share is marked partial."""


@dataclass(frozen=True, slots=True)
class RunInput:
    """One run as the command line resolved it.

    Args:
        name: ``baseline`` or ``candidate``.
        spec: what the user gave (for messages).
        files: the files to read (after the one-truth choice of ``_read_inputs``).
        source: how to parse them (its ``skip_jobs`` are this run's).
    """

    name: RunName
    spec: str
    files: tuple[Path, ...]
    source: SourceOptions


def run_files(spec: str, skipped: list[Path] | None = None) -> list[Path]:
    """The files of one run: a file, a folder (recursively, hidden ones skipped) or a glob.

    From a folder or a glob only fio's output is taken (:func:`is_fio_output`): a run
    folder also holds the job file, fio's text output, its bw/iops logs and maybe the data
    file itself; those go to ``skipped`` (for a note). A file named alone is always taken.

    Raises:
        FiomonError: nothing there, or nothing of fio's, naming the spec.
    """
    path = Path(spec)
    if path.is_file():
        return [path]
    if path.is_dir():
        found = sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not found:
            msg = f"{spec}: an empty folder"
            raise FiomonError(msg)
    elif glob.has_magic(spec):
        found = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
        if not found:
            msg = f"{spec}: no file matches"
            raise FiomonError(msg)
    else:
        msg = f"{spec}: no such file or folder"
        raise FiomonError(msg)
    taken = [p for p in found if is_fio_output(p)]
    if skipped is not None:
        skipped.extend(p for p in found if p not in set(taken))
    if not taken:
        names = ", ".join(p.name for p in found[:5]) + (", ..." if len(found) > 5 else "")
        msg = (
            f"{spec}: no fio output among its {len(found)} file(s) ({names}): compare reads "
            "hist logs (write_hist_log), per-I/O latency logs (write_lat_log) and json+ "
            "output (--output-format=json+)"
        )
        raise FiomonError(msg)
    return taken


_HEAD_BYTES = 64 << 10


def _head(path: Path) -> bytes:
    """The first :data:`_HEAD_BYTES` of a file, decompressed by its suffix."""
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as fh:
            return fh.read(_HEAD_BYTES)
    if path.suffix == ".bz2":
        with bz2.open(path, "rb") as fh:
            return fh.read(_HEAD_BYTES)
    if path.suffix == ".xz":
        with lzma.open(path, "rb") as fh:
            return fh.read(_HEAD_BYTES)
    with path.open("rb") as fh:
        return fh.read(_HEAD_BYTES)


def is_fio_output(path: Path) -> bool:
    """Whether a file found in a run's folder is fio output compare reads.

    By name: hist logs (``_clat_hist.N.log``, also compressed or with fio --client's
    ``.<host>``) and per-I/O latency logs (``_clat.N.log``, ``_lat.``, ``_slat.``); fio's
    bw and iops logs are not latency. Else by content: a fio JSON document in the first
    64 KiB (json+ output, whatever its name), or a quanta file (taken, so that it is
    refused by name rather than left out in silence).
    """
    if "_hist." in path.name or iolog_kind(path) is not None:
        return True
    if rate_log(path) is not None:
        return False
    if is_quanta_file(path):
        return True
    try:
        head = _head(path)
    except (OSError, EOFError, lzma.LZMAError):
        return False
    return fio_json_head(head)


def run_compare(
    baseline: RunInput, candidate: RunInput, opts: CompareOptions, err: TextIO = sys.stderr
) -> CompareResult:
    """Read both runs, align them and judge every window (see :mod:`.model`).

    Raises:
        FiomonError: a run cannot be read, has no I/O, or the alignment is impossible.
    """
    q = opts.quanta
    if opts.window_ms <= 0 or opts.window_ms % q.quantum_ms:
        msg = (
            f"the window ({opts.window_ms} ms) must be a multiple of the quantum "
            f"({q.quantum_ms} ms)"
        )
        raise FiomonError(msg)
    if opts.shift_ms % q.quantum_ms:
        msg = (
            f"the shift ({opts.shift_ms} ms) must be a multiple of the quantum ({q.quantum_ms} ms)"
        )
        raise FiomonError(msg)
    runs = []
    notes: list[str] = []
    for r in (baseline, candidate):
        windows, more = read_run(
            r.name, spec=r.spec, files=r.files, source=r.source, opts=opts, err=err
        )
        runs.append(windows)
        notes += more
    b, c = runs
    result = CompareResult(options=opts, baseline=b.info, candidate=c.info, notes=notes)
    _Judge(b, c, opts, result).run()
    return result


class _Judge:
    """Fills a :class:`CompareResult` from the two runs' windows."""

    def __init__(
        self, b: RunWindows, c: RunWindows, opts: CompareOptions, result: CompareResult
    ) -> None:
        self.b, self.c, self.opts, self.result = b, c, opts, result
        self.pcts = tuple(opts.quanta.percentiles)
        self.keys_p = [pct_key(p) for p in self.pcts]
        self.level = opts.quanta.confidence_level
        self.w_s = opts.window_ms / 1000.0
        self.rng = np.random.default_rng(opts.seed)

    def run(self) -> None:
        dirs = [
            d
            for d in self.opts.quanta.directions
            if ("cluster", None, d) in self.b.windows and ("cluster", None, d) in self.c.windows
        ]
        for run, other in ((self.b, self.c), (self.c, self.b)):
            only = [
                d
                for d in self.opts.quanta.directions
                if ("cluster", None, d) in run.windows and ("cluster", None, d) not in other.windows
            ]
            if only:
                self.result.notes.append(
                    f"only the {run.info.name} has I/O in {', '.join(only)}: not compared"
                )
        if "all" in dirs and not self._same_mix():
            dirs.remove("all")
            self.result.notes.append(
                "all: not compared, the runs hold I/O of other directions (compare the "
                "directions both have)"
            )
        if not dirs:
            msg = "the two runs have no direction with I/O in common (--directions)"
            raise FiomonError(msg)
        keys: list[Key] = [("cluster", None, d) for d in dirs]
        if self.opts.quanta.per_host:
            hb, hc = set(self.b.info.hosts), set(self.c.info.hosts)
            for name, alone in (("baseline", hb - hc), ("candidate", hc - hb)):
                if alone:
                    self.result.notes.append(
                        f"hosts only in the {name}: {', '.join(sorted(alone))} (no host lines)"
                    )
            keys += [("host", h, d) for h in sorted(hb & hc) for d in dirs]
        window_lines: list[tuple[int, int, Verdict]] = []
        whole: list[Verdict] = []
        for order, key in enumerate(keys):
            lines, total = self._key(key)
            window_lines += [(k, order, v) for k, v in lines]
            whole += total
        if not whole:
            msg = "the two runs share no window: check the alignment (--shift, --align-at)"
            raise FiomonError(msg)
        window_lines.sort(key=lambda t: (t[0], t[1]))
        self.result.verdicts = [v for _, _, v in window_lines] + whole
        self._coverage_notes(dirs[0])

    def _same_mix(self) -> bool:
        """Whether ``all`` means the same directions in both runs.

        If not, it would compare, say, a read-only baseline with a candidate's reads and
        writes. Unknown when a direction was not read (``--directions``) or a run reports
        ``mixed`` (unified_rw_reporting: reads and writes in one): then taken as the same.
        """
        own = ("read", "write", "trim")
        if not {*own, "mixed"} <= set(self.opts.quanta.directions):
            return True
        held = [{d for d in own if ("cluster", None, d) in r.windows} for r in (self.b, self.c)]
        mixed = any(("cluster", None, "mixed") in r.windows for r in (self.b, self.c))
        return mixed or held[0] == held[1]

    def _coverage_notes(self, d: str) -> None:
        key: Key = ("cluster", None, d)
        wb, wc = set(self.b.windows[key]), set(self.c.windows[key])
        for name, only in (("baseline", wb - wc), ("candidate", wc - wb)):
            if only:
                self.result.notes.append(
                    f"{len(only)} {d} window(s) only in the {name} "
                    f"({min(only) * self.w_s:g} .. {(max(only) + 1) * self.w_s:g} s): "
                    "no ratio there, and not in the whole-run lines"
                )

    def _stats(self, run: RunWindows, windows: Sequence[Window]) -> tuple[F64, F64, F64]:
        """Values, lows and highs ``(len(windows), len(pcts))`` of the windows' histograms."""
        h, first = _matrix([w.hist.lo for w in windows], [w.hist.counts for w in windows])
        stats, low, high = summarize_with_bounds(
            h, run.layout, self.pcts, level=self.level, first_bin=first
        )
        vals = np.full((len(windows), len(self.pcts)), np.nan)
        for i, s in enumerate(stats):
            if s is not None:
                vals[i] = [s.percentiles_ns[k] for k in self.keys_p]
        for i, w in enumerate(windows):
            if w.exact is None:
                continue
            # Per-I/O logs: the nearest rank of the values and its order-statistic interval
            # (report's exact rows), not the binned approximation.
            for j, key in enumerate(self.keys_p):
                if key in w.exact:
                    v, lo, hi = w.exact[key]
                    vals[i, j] = v
                    low[i, j] = np.nan if lo is None else lo
                    high[i, j] = np.nan if hi is None else hi
        return vals, low, high

    def _key(self, key: Key) -> tuple[list[tuple[int, Verdict]], list[Verdict]]:
        scope, host, d = key
        bw, cw = self.b.windows[key], self.c.windows[key]
        ks = sorted(set(bw) | set(cw))
        empty = Window()
        bwin = [bw.get(k, empty) for k in ks]
        cwin = [cw.get(k, empty) for k in ks]
        bs, cs = self._stats(self.b, bwin), self._stats(self.c, cwin)
        for run, wins, st in ((self.b, bwin, bs), (self.c, cwin, cs)):
            self.result.series[(run.info.name, scope, host, d)] = [
                self._point(k, w, st, i)
                for i, (k, w) in enumerate(zip(ks, wins, strict=True))
                if w.ios
            ]
        ratio, low, high = mover_ratio(bs, cs)
        sig = significant(low, high)
        lines = []
        for i, k in enumerate(ks):
            for j, p in enumerate(self.pcts):
                hosts: tuple[HostShare, ...] = ()
                if scope == "cluster" and sig[i, j] and ratio[i, j] > 1:
                    hosts = self._attribute(d, [k], float(bs[0][i, j]))
                lines.append(
                    (
                        k,
                        self._verdict(
                            (k * self.w_s, (k + 1) * self.w_s),
                            key,
                            p,
                            base=(bs[0][i, j], bs[1][i, j], bs[2][i, j], bwin[i].ios),
                            cand=(cs[0][i, j], cs[1][i, j], cs[2][i, j], cwin[i].ios),
                            judged=(ratio[i, j], low[i, j], high[i, j], bool(sig[i, j])),
                            method="mover",
                            hosts=hosts,
                            partial=min(bwin[i].covered_s, cwin[i].covered_s) < PARTIAL * self.w_s,
                        ),
                    )
                )
        common = [k for k in ks if k in bw and k in cw]
        return lines, self._whole(key, common)

    def _whole(self, key: Key, common: list[int]) -> list[Verdict]:
        if not common:
            return []
        scope, _, d = key
        bwin = [self.b.windows[key][k] for k in common]
        cwin = [self.c.windows[key][k] for k in common]
        merged = []
        for run, wins in ((self.b, bwin), (self.c, cwin)):
            m = Window()
            for w in wins:
                m.hist.add_trimmed(w.hist)
                m.samples += w.samples
            merged.append((run, m))
        (_, mb), (_, mc) = merged
        bs, cs = self._stats(self.b, [mb]), self._stats(self.c, [mc])
        ratio, low, high = mover_ratio(bs, cs)
        method = "mover"
        if len(common) >= MIN_BOOTSTRAP_WINDOWS and self.opts.resamples > 0:
            hb, fb = _matrix([w.hist.lo for w in bwin], [w.hist.counts for w in bwin])
            hc, fc = _matrix([w.hist.lo for w in cwin], [w.hist.counts for w in cwin])
            blo, bhi = self._bootstrap(hb, fb, hc, fc)
            low, high = hull(low, high, blo[None, :], bhi[None, :])
            method = "mover+bootstrap"
        sig = significant(low, high)
        out = []
        for j, p in enumerate(self.pcts):
            hosts: tuple[HostShare, ...] = ()
            if scope == "cluster" and sig[0, j] and ratio[0, j] > 1:
                hosts = self._attribute(d, common, float(bs[0][0, j]))
            out.append(
                self._verdict(
                    (None, None),
                    key,
                    p,
                    base=(bs[0][0, j], bs[1][0, j], bs[2][0, j], mb.ios),
                    cand=(cs[0][0, j], cs[1][0, j], cs[2][0, j], mc.ios),
                    judged=(ratio[0, j], low[0, j], high[0, j], bool(sig[0, j])),
                    method=method,
                    hosts=hosts,
                )
            )
        return out

    def _bootstrap(self, hb: F64, fb: int, hc: F64, fc: int) -> tuple[F64, F64]:
        return bootstrap_ratio(
            (hb, self.b.layout, fb),
            (hc, self.c.layout, fc),
            self.pcts,
            level=self.level,
            resamples=self.opts.resamples,
            rng=self.rng,
        )

    def _attribute(self, d: str, ks: Sequence[int], threshold_ns: float) -> tuple[HostShare, ...]:
        """The candidate's hosts by their share of the I/Os above ``threshold_ns``."""
        if math.isnan(threshold_ns):
            return ()
        _, upper = self.c.layout.edges_ns()
        above: dict[str, float] = {}
        ios: dict[str, float] = {}
        for h in self.c.info.hosts:
            wins = self.c.windows.get(("host", h, d), {})
            got = [wins[k] for k in ks if k in wins]
            if not got:
                continue
            hist, first = _matrix([w.hist.lo for w in got], [w.hist.counts for w in got])
            total = hist.sum(axis=0)[None, :]
            above[h] = float(
                above_counts(total, upper[first : first + total.shape[1]], threshold_ns)[0]
            )
            ios[h] = sum(w.samples for w in got)
        all_above = sum(above.values())
        all_ios = sum(ios.values())
        if all_above <= 0 or all_ios <= 0:
            return ()
        shares = [HostShare(h, round(a), a / all_above, ios[h] / all_ios) for h, a in above.items()]
        return tuple(sorted(shares, key=lambda s: (-s.share, s.host)))

    def _point(self, k: int, w: Window, st: tuple[F64, F64, F64], i: int) -> WindowPoint:
        vals, low, high = st
        return WindowPoint(
            start_s=k * self.w_s,
            end_s=(k + 1) * self.w_s,
            ios=w.ios,
            iops=w.ios / w.covered_s if w.covered_s > 0 else w.ios / self.w_s,
            covered_s=w.covered_s,
            values_ns={key: float(vals[i, j]) for j, key in enumerate(self.keys_p)},
            ci_ns={key: (_side(low[i, j]), _side(high[i, j])) for j, key in enumerate(self.keys_p)},
        )

    def _verdict(
        self,
        window: tuple[float | None, float | None],
        key: Key,
        p: float,
        *,
        base: tuple[float, float, float, int],
        cand: tuple[float, float, float, int],
        judged: tuple[float, float, float, bool],
        method: str,
        hosts: tuple[HostShare, ...],
        partial: bool = False,
    ) -> Verdict:
        scope: Scope = key[0]
        ratio, low, high, sig = judged
        return Verdict(
            window_start_s=window[0],
            window_end_s=window[1],
            scope=scope,
            host=key[1],
            direction=key[2],
            percentile=p,
            baseline_ns=_side(base[0]),
            candidate_ns=_side(cand[0]),
            baseline_ci_ns=_interval(base[1], base[2]),
            candidate_ci_ns=_interval(cand[1], cand[2]),
            baseline_ios=base[3],
            candidate_ios=cand[3],
            ratio=_side(ratio),
            ratio_ci=_interval(low, high),
            significant=sig,
            method=method,
            hosts=hosts,
            partial=partial,
        )


def _side(x: float) -> float | None:
    return None if math.isnan(x) or math.isinf(x) else float(x)


def _interval(low: float, high: float) -> Interval:
    return _side(low), _side(high)


def _matrix(los: Sequence[int], counts: Sequence[F64]) -> tuple[F64, int]:
    """Trimmed histograms as one ``(rows, width)`` matrix and its first layout column."""
    spans = [(lo, lo + len(c)) for lo, c in zip(los, counts, strict=True) if len(c)]
    if not spans:
        return np.zeros((len(counts), 1)), 0
    first = min(a for a, _ in spans)
    last = max(b for _, b in spans)
    out = np.zeros((len(counts), last - first))
    for i, (lo, c) in enumerate(zip(los, counts, strict=True)):
        if len(c):
            out[i, lo - first : lo - first + len(c)] = c
    return out, first
