"""Which inputs to read when per-I/O latency logs are among them (one truth per I/O).

fio's per-I/O logs (``P_clat.N.log``, ``P_lat.N.log``, ``P_slat.N.log``) hold every I/O of
job ``N``; a hist log (``Q_clat_hist.N.log``) or a json+ stream of the same job holds the
same I/Os binned. Reading both would count each I/O twice, so:

* the latency kind (``--latency``, default clat) picks the per-I/O logs of that kind; the
  other kinds' logs of the same jobs are the same I/Os and are left out (a note says so);
* ``--source auto`` (the default): the per-I/O logs are exact and win. A hist log is the
  same job's when it is in the same host folder (or one inside it) with the same job
  number ``N`` (of the same server with ``fio --client``: fio's ``.<server>`` suffix),
  counting the I/Os of that job's per-I/O log less at most its last interval; a
  json+ stream is when it is in the same host folder, every one of its jobs has a per-I/O
  log there (``group_reporting``: every thread of an entry's ``numjobs``), and those logs
  hold as many lines as its last document's bins count I/Os (a stream of another run in
  the folder is not the same I/Os). Those are left out (a note names them); any other
  hist log or json+ stream is an error (exact rows cannot merge binned ones: report them
  apart or choose a view with ``--source``);
* ``--source iolog``: only the per-I/O logs; ``--source hist`` / ``json``: none of them
  (then the hist/json pairing of :func:`fiomon.offline.sources.choose_sources` applies).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fiomon.errors import OverlapError
from fiomon.fio.clientlog import client_log_host
from fiomon.fio.decode import InputDecoder
from fiomon.fio.iolog import IoLogReader, iolog_kind, rate_log
from fiomon.fio.overlap import hist_log_thread, numjobs, same_host
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


def _json_jobs(path: Path) -> tuple[list[tuple[str | None, int]], int] | None:
    """The fio threads of a json+ stream, (server, ``N``) of each, and its I/Os (None: cannot tell).

    The I/Os are those its last document's bins count (every job, every direction).

    The server is that of a ``fio --client`` document's entry (its logs carry fio's
    ``.<server>`` suffix, thread numbers start at 1 on every server), else None.
    ``group_reporting`` folds a job's ``numjobs`` threads into one entry, while each thread
    writes its own ``P_clat.N.log``: an entry stands for ``numjobs`` threads when fewer
    entries than that carry its name.
    """
    from fiomon.offline.sources import _decoded, _json_input, _last_document  # noqa: PLC0415

    try:
        d = _json_input(path, _folder(path)).declaration
        with _decoded(path) as fh:
            last = _last_document(fh, fh.seek(0, 2))
    except (OSError, ValueError):
        return None
    if not d.jobs:
        return None
    ios = int(sum(int(j.hist.sum()) for j in d.jobs))
    if any(j.server is not None for j in d.jobs):
        return [(j.server, (j.thread or 0) + 1) for j in d.jobs], ios
    n = max(len(d.jobs), _threads(last) if last is not None else 0)
    return [(None, k) for k in range(1, n + 1)], ios


def _lines(path: Path) -> int:
    """The lines of a (possibly compressed) per-I/O log: one per I/O."""
    from fiomon.offline.sources import CHUNK_BYTES  # noqa: PLC0415 -- one piece size

    with path.open("rb") as fh:
        dec = InputDecoder(fh.read(SNIFF_BYTES))
        fh.seek(0)
        n = 0
        last = b"\n"
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            for piece in dec.feed(chunk) if dec.needed else (chunk,):
                n += piece.count(b"\n")
                last = piece[-1:] or last
        for piece in dec.finish() if dec.needed else ():
            n += piece.count(b"\n")
            last = piece[-1:] or last
    return n + (last != b"\n")


def _threads(doc: Mapping[str, Any]) -> int:
    """The fio threads a document's ``jobs`` entries stand for (0: not a ``jobs`` document)."""
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        return 0  # fio --client: client_stats, one entry per thread and server
    glob = doc.get("global options")
    entries: dict[str, int] = {}
    threads: dict[str, int] = {}
    for job in jobs:
        if not isinstance(job, dict):
            continue
        name = str(job.get("jobname"))
        entries[name] = entries.get(name, 0) + 1
        threads[name] = max(threads.get(name, 1), numjobs(job.get("job options"), glob))
    return sum(max(n, threads[name]) for name, n in entries.items())


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
    empty = [p for p in others if _blank(p)]
    if empty:
        notes.append(f"note: not reading {_names(empty)}: empty (no I/O in it)")
    why: dict[Path, str] = {}
    covered, uncovered = _covered(chosen, [p for p in others if p not in empty], why)
    if uncovered:
        reasons = "".join(f" ({p}: {why[p]})" for p in uncovered[:4] if p in why)
        msg = (
            "per-I/O latency logs (exact values) cannot be merged with the histograms of "
            "other jobs: these hist logs / json+ streams hold I/Os no per-I/O log given "
            f"holds: {_names(uncovered)}{reasons}. Report them separately, or choose one "
            "view: --source iolog (only the per-I/O logs), --source hist or --source json"
        )
        raise OverlapError(msg)
    if covered:
        notes.append(
            f"note: not reading {_names(covered)}: the same I/Os as the per-I/O logs given "
            "(same host folder and job), which are exact (--source hist|json reads the "
            "histograms instead)"
        )
    return chosen + rates, notes, True


def _covered(
    iologs: list[Path], others: list[Path], why: dict[Path, str]
) -> tuple[list[Path], list[Path]]:
    """``others`` split into the ones the per-I/O logs hold the I/Os of, and the rest.

    ``why`` gets the reason for a json+ stream whose jobs' logs are there but whose I/O
    count is not theirs.
    """
    threads = [(p, _folder(p), iolog_thread(p), client_log_host(p)) for p in iologs]

    def holders(folder: str, n: int | None, server: str | None) -> list[Path]:
        # fio --client: a server's logs hold its threads only (N starts at 1 on each)
        return [
            p
            for p, f, t, s in threads
            if same_host(folder, f) and (t is None or n == t) and (server is None or server == s)
        ]

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
            # Every thread has its log there, and they hold as many I/Os as the stream's
            # bins (a stream of another run in the folder is not the same I/Os).
            jobs = _json_jobs(p)
            found = [holders(folder, n, server) for server, n in (jobs[0] if jobs else [])]
            ok = jobs is not None and all(found)
            if jobs is None:
                why[p] = "no json+ bins in it (plain json, fio's text, or not fio output)"
            if ok and jobs is not None:
                logs = {q for h in found for q in h}
                lines = sum(_lines(q) for q in logs)
                ok = lines == jobs[1]
                if not ok:
                    why[p] = (
                        f"its bins count {jobs[1]} I/Os, the per-I/O logs of its jobs there "
                        f"{lines}: not the same I/Os (another run's, or cut short)"
                    )
        else:
            n = hist_log_thread(str(p))
            mine = holders(folder, n, client_log_host(p))
            ok = bool(mine) and _hist_fits(p, folder, [q for q in mine if iolog_thread(q) == n])
            if mine and not ok:
                why[p] = "its I/O count is not that of the per-I/O log of its job there"
        (covered if ok else uncovered).append(p)
    return covered, uncovered


def _hist_fits(path: Path, folder: str, logs: Sequence[Path]) -> bool:
    """Whether hist log ``path`` counts what the per-I/O ``logs`` of its job hold.

    fio's hist log lacks only the job's last partial interval (never written): at most
    about one record's I/Os fewer than the per-I/O log's lines, never more. A hist log
    of an earlier run left in the folder (the next run replaced the per-I/O logs) does not
    fit. Without a log of its own job (a ``per_job_logs=0`` log holds every job), or when
    the hist log cannot be read here, the name decides.
    """
    from fiomon.offline.sources import _log_content  # noqa: PLC0415 -- one reader

    content = _log_content(path, folder) if logs else None
    if content is None:
        return True
    ios = int(content.hist.sum())
    lines = sum(_lines(q) for q in logs)
    return ios <= lines <= ios + 2 * content.max_record + _HIST_SLACK


_HIST_SLACK = 16  # I/Os: jitter around the last partial interval


def _blank(path: Path) -> bool:
    """Whether a file holds nothing but blanks (fio killed before writing: no I/O to count)."""
    try:
        with path.open("rb") as fh:
            return not fh.read(SNIFF_BYTES).strip() and not fh.read(1)
    except OSError:
        return False


def _names(paths: Sequence[Path]) -> str:
    shown = ", ".join(str(p) for p in paths[:4])
    return shown + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
