"""Which of fio's latencies an offline run reads (``--latency``), and the inputs that hold it.

fio measures three latencies of every I/O: completion (``clat``, submission to
completion), submission (``slat``, the time to hand the I/O to the kernel; asynchronous
engines only) and total (``lat`` = ``slat`` + ``clat``, what the application waits).
A run of ``fiomon report``, ``summary``, ``fit`` or ``plot`` reads one of them:

=====================  =========================================================
input                  kinds it holds
=====================  =========================================================
json+ status stream    ``clat`` (``clat_ns`` bins); ``lat`` with fio's
                       ``lat_percentiles=1`` (``lat_ns``); ``slat`` with
                       ``slat_percentiles=1`` on an asynchronous engine (``slat_ns``)
hist log               ``clat`` only (``NAME_clat_hist.N.log``, whatever its name says)
per-I/O latency log    its name's: ``NAME_clat.N.log``, ``NAME_lat.N.log``,
                       ``NAME_slat.N.log`` (``write_lat_log`` writes all three)
=====================  =========================================================

With ``--latency K`` (:func:`resolve_latency` with ``chosen``): per-I/O logs of the
other kinds are left out (said on stderr), hist logs are refused unless ``K`` is ``clat``
(where a json+ stream of the same jobs is given, it is read instead: :func:`hist_logs`),
and a json+ stream without ``K``'s bins is refused by its parser naming the fio option.
Without it, the kind is one every input can give: ``clat`` where it can (a job's
``P_clat``, ``P_lat`` and ``P_slat`` logs together are three views of the same I/Os: the
others are left out with a note), else the one kind they share (``P_lat`` logs alone:
``lat``). Inputs that share none (``P_lat`` logs of one job beside ``P_clat`` logs of
another, ``lat`` logs beside hist logs or beside a json+ stream without ``lat_ns`` bins)
are refused, naming each file, what it holds, and the flag.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fiomon.errors import UsageError
from fiomon.fio.iolog import iolog_kind
from fiomon.fio.parsers import PER_IO_LOG_NAME, SNIFF_BYTES, sniff
from fiomon.model import LATENCY_KINDS, LatencyKind
from fiomon.offline.sources import _decoded, _last_document, _log_content

LATENCY_NAMES: dict[LatencyKind, str] = {
    "clat": "completion latency",
    "lat": "total latency",
    "slat": "submission latency",
}
LATENCY_HELP = (
    "which of fio's latencies to read: clat (completion, the default; hist logs hold "
    "only it), lat (total = submission + completion: json+ lat_ns bins, written with fio's "
    "lat_percentiles=1, or NAME_lat.N.log per-I/O logs) or slat (submission: json+ slat_ns "
    "bins with slat_percentiles=1 on an asynchronous ioengine such as libaio or io_uring, or "
    "NAME_slat.N.log). Default: clat where every input holds it, else the one kind they all "
    "hold (lat logs alone: lat). Per-I/O logs of the other kinds (write_lat_log writes all "
    "three) are left out with a note; inputs that share no kind (one job's lat log beside "
    "another's clat log, lat logs beside hist logs) are refused"
)
_MAX_LISTED = 6  # files named per kind in a message
_IOLOG_NAME = re.compile(r"^(.*)_(?:clat|lat|slat)\.")  # the kind in NAME_KIND.N.log


def _head(path: Path) -> bytes:
    try:
        with path.open("rb") as fh:
            return fh.read(SNIFF_BYTES)
    except OSError:
        return b""  # the command reports an unreadable file itself


def is_hist_log(path: Path) -> bool:
    """Whether ``path`` is read as a hist log (by content; fio's per-I/O logs by name aside)."""
    return not PER_IO_LOG_NAME.search(path.name) and sniff(_head(path)) == "hist"


def json_kinds(path: Path) -> frozenset[LatencyKind]:
    """The kinds whose bins a json+ file's last document holds (any job, any direction)."""
    try:
        with _decoded(path) as fh:
            doc = _last_document(fh, fh.seek(0, 2))
    except OSError:
        return frozenset()
    jobs = doc.get("jobs") if doc is not None else None
    if doc is not None and not isinstance(jobs, list):
        jobs = doc.get("client_stats")
    found: set[LatencyKind] = set()
    for job in jobs if isinstance(jobs, list) else []:
        for section in job.values() if isinstance(job, dict) else ():
            if not isinstance(section, dict):
                continue
            for kind in LATENCY_KINDS:
                lat = section.get(f"{kind}_ns")
                if isinstance(lat, dict) and isinstance(lat.get("bins"), dict) and lat["bins"]:
                    found.add(kind)
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class Latency:
    """The kind a run reads and the inputs left to read.

    Args:
        kind: the latency read.
        paths: the inputs, less per-I/O logs of other kinds.
        notes: what to tell the user (files left out, the kind taken from the logs).
    """

    kind: LatencyKind
    paths: list[Path]
    notes: list[str] = field(default_factory=list)


def resolve_latency(paths: Sequence[Path], chosen: LatencyKind | None) -> Latency:
    """The latency kind of a run over ``paths`` (``chosen``: ``--latency``, None if not given).

    Raises:
        UsageError: the inputs cannot give one kind without ``--latency`` (naming each
            file's kinds), or none is left of the chosen kind.
    """
    logs = {p: k for p in paths if (k := iolog_kind(p)) is not None}
    if chosen is not None:
        other = [p for p, k in logs.items() if k != chosen]
        kept = [p for p in paths if p not in set(other)]
        if not kept:
            msg = (
                f"--latency {chosen}: no input holds {LATENCY_NAMES[chosen]} ({chosen}); the "
                f"per-I/O logs given are {', '.join(sorted(set(logs.values())))}"
            )
            raise UsageError([msg])
        return Latency(chosen, kept, _left_out(chosen, other))
    if not logs:
        return Latency("clat", list(paths))
    # What each input can give: a job's per-I/O logs (one per kind, fio writes all three),
    # a json+ stream's bins, a hist log's clat.
    jobs: dict[tuple[str, str], set[LatencyKind]] = {}
    holds: dict[Path, str] = {}
    for p, k in logs.items():
        jobs.setdefault((str(p.parent), _IOLOG_NAME.sub(r"\1_#.", p.name, count=1)), set()).add(k)
        holds[p] = f"{k} (per-I/O log)"
    can: list[frozenset[LatencyKind]] = [frozenset(ks) for ks in jobs.values()]
    for p in paths:
        if p in logs:
            continue
        head = _head(p)
        if not head.strip():
            continue
        if sniff(head) == "json":
            have = json_kinds(p)
            if have:  # none: refused by its parser, with the reason
                can.append(have)
                bins = ", ".join(f"{k}_ns" for k in LATENCY_KINDS if k in have)
                holds[p] = f"{'/'.join(k for k in LATENCY_KINDS if k in have)} (json+ {bins} bins)"
        elif not PER_IO_LOG_NAME.search(p.name):
            can.append(frozenset({"clat"}))
            holds[p] = "clat (hist log: clat only)"
    common = frozenset.intersection(*can)
    kind = next((k for k in LATENCY_KINDS if k in common), None)
    if kind is None:
        lines = [f"  {p}: {what}" for p, what in list(holds.items())[: _MAX_LISTED * 3]]
        more = len(holds) - len(lines)
        msg = (
            "these inputs hold different fio latencies, and a run reads one:\n"
            + "\n".join(lines)
            + (f"\n  ... and {more} more" if more > 0 else "")
            + "\nChoose one with --latency clat|lat|slat (per-I/O logs of other kinds are "
            "then left out; hist logs are read for clat only)"
        )
        raise UsageError([msg])
    notes = [] if kind == "clat" else [f"note: --latency {kind}: the one kind every input holds"]
    other = [p for p, k in logs.items() if k != kind]
    kept = [p for p in paths if p not in set(other)]
    return Latency(kind, kept, notes + _left_out(kind, other))


def _left_out(kind: LatencyKind, other: Sequence[Path]) -> list[str]:
    """The note for per-I/O logs of other kinds than ``kind`` (none: no note)."""
    if not other:
        return []
    return [
        f"note: --latency {kind}: not reading {len(other)} per-I/O log(s) of other latency "
        f"kinds (fio's write_lat_log writes all three of the same I/Os): {_listing(other)}"
    ]


def hist_logs(paths: Sequence[Path], kind: LatencyKind) -> tuple[list[Path], list[str]]:
    """Refuse the hist logs among ``paths`` for a ``kind`` other than ``clat``.

    Called on the inputs left after the pairing (:func:`fiomon.offline.sources.
    choose_sources` with ``json``): a hist log whose json+ stream is given was left out
    already, since the stream holds the other kinds too. A hist log that holds no I/O at
    all (fio writes zeros with ``clat_percentiles=0``) is left out with a note.

    Returns:
        The paths to read, and notes for the user.

    Raises:
        UsageError: naming every hist log that holds I/Os, and what holds ``kind`` instead.
    """
    if kind == "clat":
        return list(paths), []
    hist = [p for p in paths if is_hist_log(p)]
    empty = [p for p in hist if _holds_nothing(p)]
    hist = [p for p in hist if p not in empty]
    if hist:
        option = "lat_percentiles=1" if kind == "lat" else "slat_percentiles=1"
        msg = (
            f"--latency {kind}: hist logs hold completion latency (clat) only, and no json+ "
            f"stream given holds their jobs: {_listing(hist)}; give the jobs' json+ status "
            f"stream (fio run with {option}) or their NAME_{kind}.N.log per-I/O logs "
            "(write_lat_log=NAME, log_avg_msec=0), or read clat (--latency clat)"
        )
        raise UsageError([msg])
    notes = (
        [f"--latency {kind}: not reading {len(empty)} hist log(s) of no I/O: {_listing(empty)}"]
        if empty
        else []
    )
    return [p for p in paths if p not in empty], notes


def _holds_nothing(path: Path) -> bool:
    """Whether a hist log's records count no I/O (None content: unreadable, not nothing)."""
    content = _log_content(path, "")
    return content is not None and not content.hist.any()


def _listing(paths: Sequence[Path]) -> str:
    names = ", ".join(str(p) for p in paths[:_MAX_LISTED])
    return names + (f" ... ({len(paths)} in all)" if len(paths) > _MAX_LISTED else "")
