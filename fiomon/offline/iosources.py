"""Which inputs to read when per-I/O latency logs are among them (one truth per I/O).

fio's per-I/O logs (``P_clat.N.log``, ``P_lat.N.log``, ``P_slat.N.log``) hold every I/O of
job ``N``; a hist log (``Q_clat_hist.N.log``) or a json+ stream of the same job holds the
same I/Os binned. Reading both would count each I/O twice, so:

* the latency kind (``--latency``, default clat) picks the per-I/O logs of that kind; the
  other kinds' logs of the same jobs are the same I/Os and are left out (a note says so);
* ``--source auto`` (the default): the per-I/O logs are exact and win. A hist log is the
  same job's when it is in the same host folder (or one inside it) with the same job
  number ``N``; a json+ stream is when it is in the same host folder and every one of its
  jobs has a per-I/O log there. Those are left out (a note names them); any other hist log
  or json+ stream is an error (exact rows cannot merge binned ones: report them apart or
  choose a view with ``--source``);
* ``--source iolog``: only the per-I/O logs; ``--source hist`` / ``json``: none of them
  (then the hist/json pairing of :func:`fiomon.offline.sources.choose_sources` applies).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from fiomon.errors import OverlapError
from fiomon.fio.iolog import IoLogReader, iolog_kind, rate_log
from fiomon.fio.overlap import hist_log_thread, same_host
from fiomon.fio.parsers import SNIFF_BYTES, sniff
from fiomon.model import LatencyKind

_THREAD = re.compile(r"_(?:clat|lat|slat)\.(\d+)\.log(?:\.|$)")


def is_iolog(path: Path) -> bool:
    """Whether ``path`` is a per-I/O (or averaged) latency log: a lat-log name, 4-6 columns."""
    if iolog_kind(path) is None:
        return False
    try:
        r = IoLogReader(path)
    except OSError:
        return False
    return r.refusal is None  # an empty one too (fio wrote no line: slat of psync)


def iolog_thread(path: Path) -> int | None:
    """The job number ``N`` of ``P_clat.N.log`` (None: ``per_job_logs=0``, every job)."""
    m = _THREAD.search(path.name)
    return int(m.group(1)) if m else None


def _folder(p: Path) -> str:
    try:
        return str(p.resolve().parent)
    except (OSError, RuntimeError):
        return str(p.parent)


def _json_jobs(path: Path) -> int | None:
    """The number of jobs of a json+ stream's first document (None: cannot tell)."""
    from fiomon.offline.sources import _json_input  # noqa: PLC0415 -- one reader

    try:
        d = _json_input(path, _folder(path)).declaration
    except (OSError, ValueError):
        return None
    return len(d.jobs) or None


def choose_iologs(
    paths: Sequence[Path], choice: str | None, latency: LatencyKind = "clat"
) -> tuple[list[Path], list[str], bool]:
    """The inputs to read when per-I/O logs may be among ``paths``.

    Returns:
        The paths, notes for stderr, and whether the paths are per-I/O logs (exact).

    Raises:
        OverlapError: per-I/O logs and hist logs / json+ streams of other jobs given
            together without ``--source``; ``--source iolog`` without per-I/O logs.
    """
    seen: set[str] = set()
    unique: list[Path] = []
    for p in paths:
        key = _folder(p) + "/" + p.name
        if key not in seen:
            seen.add(key)
            unique.append(p)
    iologs = [p for p in unique if is_iolog(p)]
    if not iologs:
        if choice == "iolog":
            msg = (
                "--source iolog: no per-I/O latency log among the inputs (fio's "
                "write_lat_log=P with log_avg_msec=0 writes P_clat.N.log, P_lat.N.log, "
                "P_slat.N.log)"
            )
            raise OverlapError(msg)
        return list(paths), [], False
    # fio's bw/iops logs stay in the inputs, to be refused by name whichever reader reads.
    rates = [p for p in unique if rate_log(p) is not None]
    others = [p for p in unique if p not in iologs and p not in rates]
    chosen = [p for p in iologs if iolog_kind(p) == latency]
    notes: list[str] = []
    left = [p for p in iologs if p not in chosen]
    if left:
        notes.append(
            f"note: --latency {latency}: not reading {len(left)} per-I/O log(s) of other "
            f"latency kinds (the same I/Os): {_names(left)}"
        )
    if choice in ("hist", "json") or not chosen:
        if not chosen and not others:
            kinds = sorted({str(iolog_kind(p)) for p in iologs})
            msg = (
                f"no per-I/O {latency} log among the inputs (they are {', '.join(kinds)} logs: "
                f"choose the kind with --latency {'|'.join(kinds)})"
            )
            raise OverlapError(msg)
        if chosen:
            notes.append(f"note: --source {choice}: not reading {len(chosen)} per-I/O log(s)")
        return others + rates, notes, False
    if choice == "iolog":
        if others:
            notes.append(
                f"note: --source iolog: not reading {len(others)} hist log(s) / json+ "
                f"stream(s): {_names(others)}"
            )
        return chosen + rates, notes, True
    if choice == "both" and others:
        msg = (
            "--source both cannot count per-I/O latency logs (exact values) together with "
            f"histograms ({_names(others)}): choose --source iolog, hist or json"
        )
        raise OverlapError(msg)
    covered, uncovered = _covered(chosen, others)
    if uncovered:
        msg = (
            "per-I/O latency logs (exact values) cannot be merged with the histograms of "
            "other jobs: these hist logs / json+ streams hold I/Os no per-I/O log given "
            f"holds: {_names(uncovered)}. Report them separately, or choose one view: "
            "--source iolog (only the per-I/O logs), --source hist or --source json"
        )
        raise OverlapError(msg)
    if covered:
        notes.append(
            f"note: not reading {_names(covered)}: the same I/Os as the per-I/O logs given "
            "(same host folder and job), which are exact (--source hist|json reads the "
            "histograms instead)"
        )
    return chosen + rates, notes, True


def _covered(iologs: list[Path], others: list[Path]) -> tuple[list[Path], list[Path]]:
    """``others`` split into the ones the per-I/O logs hold the I/Os of, and the rest."""
    threads: list[tuple[str, int | None]] = [(_folder(p), iolog_thread(p)) for p in iologs]

    def holds(folder: str, n: int | None) -> bool:
        return any(same_host(folder, f) and (t is None or n == t) for f, t in threads)

    covered: list[Path] = []
    uncovered: list[Path] = []
    for p in others:
        folder = _folder(p)
        try:
            with p.open("rb") as fh:
                kind = sniff(fh.read(SNIFF_BYTES))
        except OSError:
            uncovered.append(p)
            continue
        if kind == "json":
            jobs = _json_jobs(p)
            ok = jobs is not None and all(holds(folder, n) for n in range(1, jobs + 1))
        else:
            n = hist_log_thread(str(p))
            ok = holds(folder, n)
        (covered if ok else uncovered).append(p)
    return covered, uncovered


def _names(paths: Sequence[Path]) -> str:
    shown = ", ".join(str(p) for p in paths[:4])
    return shown + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
