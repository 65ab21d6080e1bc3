"""One truth per I/O: which hist logs describe the same I/Os as a json+ status stream.

fio can write both views of a job: the json+ stream (``--status-interval``, cumulative
histograms, live) and hist logs (``write_hist_log=PREFIX``, written when the job exits).
Counting both counts every I/O twice; pairing a log with the wrong stream loses a run.
The rule fiomon applies everywhere (offline and in the agent), by identity, not by name:

* A json+ stream *declares* the hist logs of its jobs: the ``write_hist_log`` values
  under ``global options`` (command line and ``[global]``) and each job's ``job
  options``, its job names (a bare ``write_hist_log`` names the logs after the job), and
  each job's cumulative histogram (:class:`JobContent`). A stream whose jobs carry no
  histogram bins (plain ``--output-format=json``) declares nothing: its hist logs are
  always read.
* A hist log is *covered* by (holds the same I/Os as) a stream only when all of these
  hold:

  a. **name**: the log's file name is what fio makes of a declared prefix
     (``PREFIX_clat_hist.N.log``, ``PREFIX_clat_hist.log`` with ``per_job_logs=0``,
     ``.fz`` when compressed, ``.<host>`` appended by client/server mode; only the
     prefix's last path component is compared, since fio's working directory changes
     the folders), and its thread number ``N`` is job position ``N - 1`` of the stream
     (of the log's server in a ``fio --client`` document: the server named by fio's
     suffix, or by the folder pbench-fio files it in, ``clients/<server>/``).
     ``per_job_logs=0`` writes one log for all jobs of the prefix: it is compared with
     their sum. ``group_reporting`` folds a job's threads into one json entry while
     each thread keeps its log: any entry of that name may claim it. Offline, also
     the names collecting results gives (:meth:`Declaration.log_names`): the prefix
     ends with a declared name after ``-``, ``_`` or ``.`` (``client-01-run`` for
     ``run``), or is the stream file's stem, alone or before a separator (``node1``
     for ``node1.json``, as ``fiomon fio`` names them: any job, thread ``N`` still job
     ``N - 1``). What precedes the declared name is the log's *tag*: a stream whose
     stem agrees with it (``client-01-out.json``) is offered the log alone, and a
     stream whose stem agrees with another log's tag or names another of the tag's
     series (``client-02-out.json``) never takes it;
  b. **host**: offline, the log and the stream are in the same folder, or one inside
     the other (``client-01/`` and ``client-02/`` never pair, even with the same
     prefix). Only where no stream there names the log, a stream in a *sibling*
     folder may hold it (``client-01/json/`` for ``client-01/hist/``) if that folder
     holds no log the stream names and the two names are not of one series
     (``client-01`` and ``client-02``, ``run1`` and ``run2``: :func:`sibling_folders`);
     the agent follows one host and compares fio's own names only;
  c. **content**: the log's histogram summed over its records and directions, in the
     log's bins (``log_hist_coarseness``), is bin by bin at most the job's final
     cumulative json+ histogram (``clat_ns`` bins, summed over directions, so a
     ``mixed``-only stream compares too; where a job carries only ``lat_ns`` bins the
     totals are compared), and all the logs one job explains sum to at most its
     histogram. For a job's one log the difference must also be no more than fio's
     missing last partial interval (:func:`slack_ios`). Where the stream's last dump
     is older than the log's last record (the agent, when a run's output was
     truncated by the next run before the final dump was read), the log's records
     through that dump are compared with it, and may miss only the interval then in
     progress. A log no stream explains is not covered;
  d. **time**: the log's records overlap the time the stream covers (first dump
     minus the job's runtime, to its last dump), give or take ``slack_ms``. Logs with
     relative stamps cannot be placed: the content decides for them.

Offline, a json+ file fio runs were appended to (``>>``) holds several runs: where a
log it names pairs with nothing, each earlier run's last dump (the document before the
first job's runtime goes down) is a declaration of its own, with that run's time.

Examples (real fio 3.33): three hosts run one job file with ``write_hist_log=run`` and
their results are collected in ``client-01/``, ``client-02/``, ``client-03/``: each
host's logs pair with its own stream only (b); collected into one folder as
``client-01-out.json`` and ``client-01-run_clat_hist.N.log``, ... (a: the tag), or into
``client-01/json/`` and ``client-01/hist/``, ... (b: sibling folders), the same. Two
runs with the same prefix, at the same time, in two folders on one host: a log pairs
with the stream whose job holds its I/Os (c), the other run's log is read.
``--status-interval=35`` with a job that ends before the first dump: the agent holds
the log until the stream's first dump shows that job, then covers it; had it already
published the log (after ``HOLD_S``), the stream skips that job (:func:`explained_by`).
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout, coarsen_hist, plat_val_to_idx
from fiomon.errors import LayoutError
from fiomon.fio.clientlog import client_log_host

_HIST_NAME = re.compile(
    r"^(?P<prefix>.+)_clat_hist(?:\.(?P<thread>\d+))?\.log(?:\.fz)?(?:\.[^/]+)?$"
)
MIN_SLACK_MS = 10_000
_DIRECTION_KEYS = ("read", "write", "trim")
_MAX_KEY = 1 << 40  # a json+ bin key beyond this (ns) is not fio's

I64 = npt.NDArray[np.int64]


@functools.lru_cache(maxsize=4096)
def hist_log_name(path: str) -> str | None:
    """The prefix part of a fio hist log's file name (``h`` for ``h_clat_hist.2.log``)."""
    m = _HIST_NAME.match(os.path.basename(path))
    return m.group("prefix") if m else None


def hist_log_thread(path: str) -> int | None:
    """The fio thread number of a hist log (2 for ``h_clat_hist.2.log``; None without one)."""
    m = _HIST_NAME.match(os.path.basename(path))
    return int(m.group("thread")) if m and m.group("thread") else None


def prefix_name(declared: str) -> str:
    """The last path component of a declared ``write_hist_log`` value."""
    return os.path.basename(os.path.normpath(declared)) if declared else ""


@dataclass(frozen=True, slots=True)
class JobContent:
    """One job entry of a json+ dump, as far as pairing needs it.

    Args:
        position: its index in the dump's ``jobs``.
        name: the hist-log name prefix it writes.
        hist: cumulative counts per fine bin (fio 3's 1856), summed over directions.
        total_only: the bins are total latency (``lat_ns``, no ``clat_ns`` bins): only
            the totals compare with a hist log (which holds completion latency).
        runtime_ms: the job's ``job_runtime``.
        server: in a ``fio --client`` document, the server that ran it.
        thread: in a ``fio --client`` document, its thread's index on that server (the
            ``N - 1`` of its logs); else None (``position`` is).
    """

    position: int
    name: str
    hist: I64
    total_only: bool = False
    runtime_ms: int = 0
    server: str | None = None
    thread: int | None = None


@dataclass(frozen=True, slots=True)
class Declaration:
    """What one json+ stream says about the hist logs of its jobs.

    Args:
        stream: its name (the agent's stream id, or the file offline).
        names: hist-log name prefixes it declares (prefix last components, job names).
        first_ms: earliest time its I/Os cover (first dump minus job runtime), or None.
        last_ms: its last dump, or None.
        slack_ms: how far outside that span a covered hist log may reach.
        jobs: each job's cumulative histogram at ``at_ms`` (empty: no bins, so the
            stream declares nothing and covers no log).
        at_ms: the dump ``jobs`` come from.
        grouped: ``group_reporting``: an entry folds several threads, each with its log.
        host: offline, the host folder of the stream (None: not compared).
    """

    stream: str
    names: frozenset[str]
    first_ms: int | None = None
    last_ms: int | None = None
    slack_ms: int = MIN_SLACK_MS
    jobs: tuple[JobContent, ...] = ()
    at_ms: int | None = None
    grouped: bool = False
    host: str | None = None
    stem: str | None = None

    def log_names(self, hist_path: str) -> frozenset[str]:
        """Rule a (name only): the declared names a log's file name stands for (none: {}).

        fio's own name (the prefix is a declared name) everywhere; offline (``stem`` set)
        also what collecting results makes of it: the prefix ends with a declared name
        after a separator (``client-01-run`` for ``run``), or is the stream file's own
        stem, alone or followed by a separator (``node1`` for ``node1.json``: any job).
        """
        name = hist_log_name(hist_path)
        if name is None:
            return frozenset()
        if name in self.names:
            return frozenset({name})
        if self.stem is None:
            return frozenset()
        tagged = frozenset(d for d in self.names if _tag(name, d) is not None)
        if tagged:
            return tagged
        if _agrees(name, self.stem) and name.startswith(self.stem):
            return self.names | {j.name for j in self.jobs}
        return frozenset()

    def names_log(self, hist_path: str) -> bool:
        """Rule a (name only): the log's file name is one this stream's jobs write."""
        return bool(self.log_names(hist_path))

    def log_tag(self, hist_path: str) -> str | None:
        """What collecting added to a log's name before the declared one, if anything.

        ``client-01`` for ``client-01-run_clat_hist.1.log`` (declared ``run``), ``node1``
        for ``node1_clat_hist.1.log`` beside ``node1.json``; None for fio's own name.
        """
        name = hist_log_name(hist_path)
        if name is None or name in self.names or self.stem is None:
            return None
        tags = [t for d in self.names if (t := _tag(name, d)) is not None]
        if tags:
            return min(tags, key=len)
        return self.stem if _agrees(name, self.stem) and name.startswith(self.stem) else None

    def overlaps(self, span: tuple[int, int] | None) -> bool:
        """Rule d: the log's epoch span meets the stream's time (None: cannot tell, yes)."""
        if span is None or self.first_ms is None or self.last_ms is None:
            return True
        first, last = span
        return first <= self.last_ms + self.slack_ms and last >= self.first_ms - self.slack_ms


@dataclass(frozen=True, slots=True)
class LogContent:
    """A hist log, as far as pairing needs it.

    Args:
        path: the log.
        hist: its records' counts summed over records and directions, in ``layout``.
        layout: its bin layout.
        span: epoch ms of its first record's start and last record's end (None when
            its stamps are relative).
        max_record: the most I/Os one time stamp held (all directions): the scale of
            the last partial interval fio never writes.
        complete: all of the file was read (the agent may decide on a first part).
        host: offline, its host folder (None: not compared).
        end_ms: its last record's end (placed on the wall clock), or None.
        upto: its counts summed over the records that end at or before a time (the
            agent, where a stream's last dump is older than the log's end), or None.
    """

    path: str
    hist: I64
    layout: BinLayout
    span: tuple[int, int] | None = None
    max_record: int = 0
    complete: bool = True
    host: str | None = None
    end_ms: int | None = None
    upto: Callable[[int], I64] | None = None

    def through(self, at_ms: int | None) -> tuple[I64, bool]:
        """Its counts as a dump at ``at_ms`` can show them, and whether that is all of it.

        A job's cumulative bins at a time bound the log's counts through that time, and
        exceed them by at most the interval in progress: where the stream's last dump is
        older than the log's last record, only the records up to the dump are compared.
        """
        if at_ms is None or self.end_ms is None or at_ms >= self.end_ms or self.upto is None:
            return self.hist, True
        return self.upto(at_ms), False

    @property
    def name(self) -> str | None:
        """The prefix part of its file name."""
        return hist_log_name(self.path)

    @property
    def thread(self) -> int | None:
        """The fio thread number (None: ``per_job_logs=0``, one log for all jobs)."""
        return hist_log_thread(self.path)


def job_contents(doc: Mapping[str, Any]) -> tuple[JobContent, ...]:
    """Each job's cumulative histogram in one json+ document (jobs without bins left out).

    Bad shapes are skipped, never raised: this reads what any file claims to be.
    """
    if isinstance(doc.get("client_stats"), list) and not isinstance(doc.get("jobs"), list):
        return _client_jobs(doc)
    jobs = doc.get("jobs")
    glob_opts = doc.get("global options")
    default = glob_opts.get("write_hist_log") if isinstance(glob_opts, dict) else None
    out = []
    for pos, job in enumerate(jobs if isinstance(jobs, list) else []):
        if not isinstance(job, dict):
            continue
        own = job.get("job options")
        prefix = own.get("write_hist_log") if isinstance(own, dict) else None
        prefix = prefix if isinstance(prefix, str) and prefix else default
        jobname = job.get("jobname")
        if isinstance(prefix, str) and prefix:
            name = prefix_name(prefix)
        elif isinstance(jobname, str) and jobname:
            name = jobname
        else:
            continue
        hist, total_only = _job_hist(job)
        if hist is None:
            continue
        rt = job.get("job_runtime")
        runtime = rt if isinstance(rt, int) and not isinstance(rt, bool) and rt >= 0 else 0
        out.append(JobContent(pos, name, hist, total_only, runtime))
    return tuple(out)


_SAME_INTERVAL_MS = 50  # client entries this close in runtime belong to one interval


def _client_jobs(doc: Mapping[str, Any]) -> tuple[JobContent, ...]:
    """Each server's jobs in a ``fio --client`` document, from their last entries.

    ``client_stats`` lists, interval by interval, one cumulative entry per job per server
    (the threads of one job one after another); the last interval's entries are final.
    """
    glob_opts = doc.get("global options")
    default = glob_opts.get("write_hist_log") if isinstance(glob_opts, dict) else None
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in doc["client_stats"]:
        if not isinstance(e, dict) or e.get("jobname") == "All clients":
            continue
        host, name, rt = e.get("hostname"), e.get("jobname"), e.get("job_runtime")
        if isinstance(host, str) and isinstance(name, str) and isinstance(rt, int):
            by_key.setdefault((host, name), []).append(e)
    out: list[JobContent] = []
    threads: dict[str, int] = {}
    for (host, _), entries in by_key.items():
        end = entries[-1]["job_runtime"]
        last = []
        for e in reversed(entries):
            if abs(e["job_runtime"] - end) > _SAME_INTERVAL_MS:
                break
            last.append(e)
        for e in reversed(last):
            own = e.get("job options")
            prefix = own.get("write_hist_log") if isinstance(own, dict) else None
            prefix = prefix if isinstance(prefix, str) and prefix else default
            name = prefix_name(prefix) if isinstance(prefix, str) and prefix else e["jobname"]
            hist, total_only = _job_hist(e)
            thread = threads.get(host, 0)
            threads[host] = thread + 1
            if hist is not None:
                out.append(
                    JobContent(len(out), name, hist, total_only, e["job_runtime"], host, thread)
                )
    return tuple(out)


def is_grouped(doc: Mapping[str, Any]) -> bool:
    """Whether the document's jobs use ``group_reporting`` (entries fold threads).

    fio 3.33 lists ``group_reporting`` in neither ``global options`` nor ``job options``
    when it is given on the command line or in a job section; it shows as a job whose
    ``numjobs`` exceeds the entries of its name (each thread is an entry otherwise).
    """
    glob = doc.get("global options")
    sections = [glob]
    jobs = doc.get("jobs")
    entries = [j for j in jobs if isinstance(j, dict)] if isinstance(jobs, list) else []
    sections += [j.get("job options") for j in entries]
    if any(
        isinstance(s, dict) and str(s.get("group_reporting", "0")) not in ("0", "false")
        for s in sections
    ):
        return True
    names: dict[str, int] = {}
    for j in entries:
        names[str(j.get("jobname"))] = names.get(str(j.get("jobname")), 0) + 1
    return any(numjobs(j.get("job options"), glob) > names[str(j.get("jobname"))] for j in entries)


def numjobs(*sections: object) -> int:
    """``numjobs`` of a job's options, else the global options' (1: not set or unreadable)."""
    for section in sections:
        value = section.get("numjobs") if isinstance(section, dict) else None
        if value is not None:
            try:
                return max(1, int(str(value)))
            except ValueError:
                return 1
    return 1


def _job_hist(job: Mapping[str, Any]) -> tuple[I64 | None, bool]:
    """A job's bins summed over directions (fine bins), and whether they are lat_ns."""
    for keys in (_DIRECTION_KEYS, ("mixed",)):  # unified_rw_reporting=both: not twice
        for lat_key, total_only in (("clat_ns", False), ("lat_ns", True)):
            dense = np.zeros(BinLayout().fine_nbins, dtype=np.int64)
            found = False
            for d in keys:
                section = job.get(d)
                lat = section.get(lat_key) if isinstance(section, dict) else None
                bins = lat.get("bins") if isinstance(lat, dict) else None
                if not isinstance(bins, dict) or not bins:
                    continue
                try:
                    k = np.fromiter(map(int, bins), dtype=np.int64, count=len(bins))
                    v = np.fromiter(map(int, bins.values()), dtype=np.int64, count=len(bins))
                except (TypeError, ValueError, OverflowError):
                    continue
                if (k < 0).any() or (k > _MAX_KEY).any() or (v < 0).any() or (v > 2**53).any():
                    continue
                np.add.at(dense, plat_val_to_idx(k), v)
                found = True
            if found:
                return dense, total_only
    return None, False


_SEPARATORS = "-_."
_DIGITS = re.compile(r"\d+")


def _tag(name: str, declared: str) -> str | None:
    """``client-01`` for ``client-01-run`` and ``run``: what precedes a separator and it."""
    if not declared or len(name) <= len(declared) + 1 or not name.endswith(declared):
        return None
    cut = len(name) - len(declared) - 1
    return name[:cut] if name[cut] in _SEPARATORS else None


def _another_of_series(tag: str | None, stem: str | None) -> bool:
    """Whether a stream's stem names another of the series a log's tag is one of.

    ``client-01-out`` for the tag ``client-02``: equal but for their digits.
    """
    if not tag or not stem:
        return False
    return _agrees(_DIGITS.sub("#", tag), _DIGITS.sub("#", stem)) and not _agrees(tag, stem)


def _agrees(tag: str, stem: str) -> bool:
    """Whether a log's tag and a stream file's stem name one thing (one begins the other)."""
    if tag == stem:
        return True
    short, long = sorted((tag, stem), key=len)
    return long.startswith(short) and long[len(short)] in _SEPARATORS


def slack_ios(log: LogContent, job_total: int) -> int:
    """How many of a finished job's I/Os its complete hist log may lack.

    fio never writes a job's last partial interval, which holds at most about one full
    interval: twice the largest record, plus 2 % and 2 I/Os for rate jitter.
    """
    return 2 * log.max_record + math.ceil(0.02 * job_total) + 2


def _fold(hist: I64, layout: BinLayout) -> I64 | None:
    """Fine json+ counts in a log's bins (None: no exact common layout, e.g. fio 2 µs)."""
    try:
        folded = coarsen_hist(hist.astype(np.float64), BinLayout(), layout)
    except LayoutError:
        return None
    return np.rint(folded).astype(np.int64)


@dataclass(slots=True)
class _Capacity:
    """One job (or several jobs of one name, compared as one) of one stream."""

    decl: Declaration
    jobs: tuple[JobContent, ...]
    used: dict[BinLayout, I64] = field(default_factory=dict)
    claims: int = 0

    @property
    def total_only(self) -> bool:
        return any(j.total_only for j in self.jobs)

    def fits(self, log: LogContent, *, tight: bool) -> bool:
        """Whether ``log`` adds to what this capacity already explains, within it."""
        total: I64 = np.zeros(BinLayout().fine_nbins, dtype=np.int64)
        for j in self.jobs:
            total += j.hist
        hist, whole = log.through(self.decl.at_ms)
        if not whole and not hist.any() and log.hist.any():
            return False  # nothing of the log is old enough for the dump to show: no evidence
        used = self.used.get(log.layout)
        if self.total_only:
            have = int(total.sum()) - (0 if used is None else int(used.sum()))
            if int(hist.sum()) > have:
                return False
        else:
            folded = _fold(total, log.layout)
            if folded is None:
                return False
            need = hist if used is None else hist + used
            if len(need) != len(folded) or bool((need > folded).any()):
                return False
        if tight and (log.complete or not whole) and self.claims == 0:
            # a job's one log lacks only the interval in progress at the dump (fio never
            # writes the last one); read through the dump's time, or to its end
            return int(total.sum()) - int(hist.sum()) <= slack_ios(log, int(total.sum()))
        return True

    def claim(self, log: LogContent) -> None:
        used = self.used.get(log.layout)
        self.used[log.layout] = log.hist.copy() if used is None else used + log.hist
        self.claims += 1


def _capacities(
    decl: Declaration, log: LogContent, pool: dict[tuple[str, tuple[int, ...]], _Capacity]
) -> list[_Capacity]:
    """The capacities of ``decl`` that could hold ``log`` (rule a), shared via ``pool``."""
    names = decl.log_names(log.path)
    named = [j for j in decl.jobs if j.name in names]
    servers = {j.server for j in named if j.server is not None}
    if servers:  # fio --client: the server from fio's suffix, or pbench's clients/<host>/
        server = client_log_host(Path(log.path)) or os.path.basename(os.path.dirname(log.path))
        if server in servers:
            named = [j for j in named if j.server == server]
    thread = log.thread
    if thread is None:  # per_job_logs=0: one log for every job of that name
        groups = [tuple(named)] if named else []
    elif decl.grouped:  # group_reporting: each entry folds threads; any may hold it
        groups = [(j,) for j in named]
    else:
        groups = [
            (j,) for j in named if (j.position if j.thread is None else j.thread) == thread - 1
        ]
    out = []
    for g in groups:
        key = (decl.stream, tuple(j.position for j in g))
        out.append(pool.setdefault(key, _Capacity(decl, g)))
    return out


def candidates(
    log: LogContent, declarations: Sequence[Declaration], logs: Sequence[LogContent] = ()
) -> list[Declaration]:
    """The streams that may cover ``log`` by name and host (rules a and b), in order.

    Streams of its host (the same folder, or one inside the other) first; only where none
    of those names the log, streams in a sibling folder (``client-01/json/`` for a log in
    ``client-01/hist/``) whose own folder holds no log they name (a folder of streams
    only). Where collecting added a tag to the log's name (``client-01-run_...``), streams
    whose file stem agrees with that tag (``client-01-out.json``) come first and alone; a
    stream whose stem agrees with another log's tag, or names another of the tag's series
    (``client-02-out.json``), never takes it.
    """
    named = [d for d in declarations if d.jobs and d.names_log(log.path)]
    near = [d for d in named if same_host(d.host, log.host)]
    if not near:
        near = [
            d
            for d in named
            if sibling_folders(d.host, log.host)
            and not any(same_host(d.host, other.host) and d.names_log(other.path) for other in logs)
        ]
    strong = [d for d in near if (t := d.log_tag(log.path)) is None or _agrees(t, d.stem or "")]
    if strong:
        return strong
    tags = {t for other in logs for d in near if (t := d.log_tag(other.path)) is not None}
    return [
        d
        for d in near
        if not any(_agrees(t, d.stem or "") for t in tags)
        and not _another_of_series(d.log_tag(log.path), d.stem)
    ]


def claims(
    logs: Sequence[LogContent], declarations: Iterable[Declaration], *, ordered: bool = True
) -> dict[str, tuple[str, frozenset[int]]]:
    """Which stream covers which hist log (rules a to d), and the jobs that hold it.

    A log is offered to its :func:`candidates` in order; the first job that explains it
    claims it, and later logs must fit in what that job's histogram has left. Logs left
    out are not covered. The logs are taken by host, name and thread, or as given when
    not ``ordered`` (the agent: earlier decisions first).
    """
    decls = [d for d in declarations if d.jobs]
    pool: dict[tuple[str, tuple[int, ...]], _Capacity] = {}
    out: dict[str, tuple[str, frozenset[int]]] = {}
    if ordered:
        logs = sorted(logs, key=lambda g: (g.host or "", g.name or "", g.thread or 0, g.path))
    for log in logs:
        for d in candidates(log, decls, logs):
            if not d.overlaps(log.span):
                continue
            cap = next(
                (c for c in _capacities(d, log, pool) if c.fits(log, tight=not d.grouped)),
                None,
            )
            if cap is not None:
                cap.claim(log)
                out[log.path] = (d.stream, frozenset(j.position for j in cap.jobs))
                break
    return out


def mixture_of(log: LogContent, declarations: Sequence[Declaration]) -> tuple[str, ...]:
    """The streams whose jobs together hold a log that no single stream explains.

    Two runs at once with ``per_job_logs=0`` and one prefix write one log, their records
    interleaved: neither stream's bins hold it, both together do (rules a, b, d for each
    stream, rule c for their sum, short by at most each run's last partial interval).
    Such a log is theirs, not I/Os of its own. Empty: not a mixture of the streams given.
    """
    streams = [d for d in candidates(log, declarations) if d.jobs and d.overlaps(log.span)]
    if len(streams) < 2:
        return ()
    total: I64 = np.zeros(BinLayout().fine_nbins, dtype=np.int64)
    total_only = False
    for d in streams:
        names = d.log_names(log.path)
        for j in d.jobs:
            if j.name in names or not names:
                total += j.hist
                total_only = total_only or j.total_only
    have, held = int(total.sum()), int(log.hist.sum())
    if total_only:
        fits = held <= have
    else:
        folded = _fold(total, log.layout)
        fits = (
            folded is not None
            and len(folded) == len(log.hist)
            and not bool((log.hist > folded).any())
        )
    if not fits or have - held > len(streams) * slack_ios(log, have):
        return ()
    return tuple(d.stream for d in streams)


def why_not_covered(
    log: LogContent, declarations: Sequence[Declaration], logs: Sequence[LogContent] = ()
) -> str:
    """What was checked for a log no stream covers: each stream naming it, and why not."""
    named = [d for d in declarations if d.jobs and d.names_log(log.path)]
    if not named:
        return "no json+ stream given declares its name"
    offered = candidates(log, named, logs)
    near = any(same_host(d.host, log.host) for d in named)
    reasons = []
    for d in named:
        if any(x is d for x in offered):
            if not d.overlaps(log.span):
                why = "its records are outside that stream's time"
            else:
                thread = "" if log.thread is None else f" (thread {log.thread})"
                why = f"its counts do not fit in the json+ bins of that stream's job{thread}"
        elif same_host(d.host, log.host) or (sibling_folders(d.host, log.host) and not near):
            if sibling_folders(d.host, log.host):
                why = "in a sibling folder that holds hist logs of its own"
            else:
                why = f"its name's tag {d.log_tag(log.path)!r} does not name that stream"
        elif sibling_folders(d.host, log.host):
            why = "in a sibling folder, and its own folder holds a stream naming it"
        else:
            why = "another host's folder"
        reasons.append(f"{d.stream}: {why}")
    more = f"; and {len(reasons) - 3} more" if len(reasons) > 3 else ""
    return "checked " + "; ".join(reasons[:3]) + more


def assign(logs: Sequence[LogContent], declarations: Iterable[Declaration]) -> dict[str, str]:
    """Hist log -> the stream that covers it (see :func:`claims`)."""
    return {path: stream for path, (stream, _) in claims(logs, declarations).items()}


def explained_by(decl: Declaration, logs: Sequence[LogContent]) -> frozenset[int]:
    """Job positions of ``decl`` whose I/Os the (already published) ``logs`` hold.

    The stream must not publish those jobs: the logs went out first.
    """
    out: set[int] = set()
    for _, positions in claims(logs, [decl]).values():
        out |= positions
    return frozenset(out)


def same_host(a: str | None, b: str | None) -> bool:
    """Rule b: two host folders are one host when one is the other or inside it.

    ``client-01/`` and ``client-01/logs/`` are one host, ``client-01/`` and
    ``client-02/`` are not, nor are ``run1/client-01/`` and ``run2/client-01/``; None
    (the agent: one host) matches anything.
    """
    if a is None or b is None or a == b:
        return True
    return a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def sibling_folders(a: str | None, b: str | None) -> bool:
    """Two folders of one parent that split one host's results (``json/`` and ``hist/``).

    Folders whose names are two of one series (equal but for their digits: ``client-01``
    and ``client-02``, ``node1`` and ``node2``, ``run1`` and ``run2``) are hosts or runs,
    never one host's parts.
    """
    if a is None or b is None:
        return False
    a, b = a.rstrip("/"), b.rstrip("/")
    if a == b or os.path.dirname(a) != os.path.dirname(b) or os.path.dirname(a) == a:
        return False
    series = [_DIGITS.sub("#", os.path.basename(f)) for f in (a, b)]
    return series[0] != series[1]


def log_content(
    path: str,
    batches: Iterable[Any],
    *,
    epoch: bool,
    complete: bool = True,
    host: str | None = None,
) -> LogContent | None:
    """A :class:`LogContent` from a hist log's record batches (None: no records).

    ``batches`` are :class:`fiomon.model.RecordBatch` (kept ``Any`` here so that this
    module stays free of the record model).
    """
    total: I64 | None = None
    layout: BinLayout | None = None
    first = last = None
    per_stamp: dict[int, int] = {}
    kept: list[Any] = []
    for b in batches:
        if b is None or not len(b):
            continue
        if total is None or layout is None:
            layout = b.layout
            total = np.zeros(layout.nbins, dtype=np.int64)
        elif b.layout != layout:
            continue
        kept.append(b)
        # sparse sums: a held log may have many records of 1856 bins each
        total += np.bincount(b.bins, weights=b.counts, minlength=layout.nbins).astype(np.int64)
        for end, n in zip(b.end_ms.tolist(), b.samples().tolist(), strict=True):
            per_stamp[end] = per_stamp.get(end, 0) + int(n)
        lo, hi = int(b.start_ms.min()), int(b.end_ms.max())
        first = lo if first is None else min(first, lo)
        last = hi if last is None else max(last, hi)
    if total is None or layout is None or first is None or last is None:
        return None
    span = (first, last) if epoch else None
    nbins = layout.nbins

    def upto(at_ms: int) -> I64:
        out: I64 = np.zeros(nbins, dtype=np.int64)
        for b in kept:
            sel = b.select(b.end_ms <= at_ms)
            out += np.bincount(sel.bins, weights=sel.counts, minlength=nbins).astype(np.int64)
        return out

    stamp = max(per_stamp.values(), default=0)
    return LogContent(path, total, layout, span, stamp, complete, host, last, upto)
