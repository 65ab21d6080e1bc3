"""Following fio's output files while they grow: streams, identity, sequence numbers.

A :class:`Follower` watches glob patterns and turns what fio appends into messages. The
unit of identity is a **stream**: one content lineage of one file, with consecutive
sequence numbers from 0 and an id that comes from its content,
``<path>@<digest of the file's head through its first record>`` (:func:`_content_key`),
given when its first record goes out.

Identity rules (``agents/README.md`` states them for users):

* **Ids survive lost state.** The same file read again from byte 0 (positions damaged,
  emptied or deleted, a stream forgotten) gives the same ``(agent, stream, seq)``, so the
  aggregator drops the resend as duplicates. Other content at the same path has another
  first record (fio stamps it), hence another id; should a rewrite repeat the first
  record of a lineage this process knows, it gets ``<path>@<generation>`` instead, so an
  id is never reused for other content.
* **Kind by content, once the head tells it.** A file is not read while its first bytes
  are blank, or text with no json document or hist-log record yet (fio's ``note:`` lines,
  ``json+,normal``'s header): :func:`head_tells_kind` waits, then
  :func:`fiomon.fio.parsers.sniff` decides on the whole head.

* **Appends** continue the stream. Only complete lines and complete JSON documents
  become records; the parsers keep a partial one for later.
* **Content decides.** A stream lasts exactly while the bytes already read are still the
  start of the file (:class:`~fiomon.agent.fileprint.Fingerprint`). Truncation, a rewrite in
  place (same inode, any size, same first bytes or not) or a copy over the file end the
  stream; the file's content is read from byte 0 as a new stream. The old content is
  gone, so nothing is drained from it.
* **Renames keep the stream.** A file held open is known by device and inode (which
  cannot be reused while it is open): renamed to a name the patterns match, it is the
  same stream under its new name; renamed to a name they do not match, it is followed
  under that name (also across a restart) until it has been quiet for
  ``rename_grace_s``. A file that then appears under the old name is a new stream.
* **Copies are not new data.** A new file that starts with exactly the bytes a known
  stream read (``cp`` of a result, ``mv`` across file systems) is a copy: followed, not
  published, and compared with its original as either grows. Once it stops being a
  prefix of the original or equal to it (a byte differs, or it outgrows an original that
  is gone or quiet), it is its own stream: the bytes both share are the original's (it
  published their records), and only the records after them are published.
* **Deleted** files are drained to their end through the descriptor still open, a
  bounded amount per poll.
* **Restarts and closed files.** A file not held open (after a restart, or closed to stay
  under ``max_open_files``) is the same stream again only if its first ``length`` bytes
  still hash to the saved SHA-1; it is then re-read from byte 0 (parsing is
  deterministic, so no parser state is saved) and records below the acknowledged
  sequence number are skipped, not resent.
* **One truth per I/O** (:mod:`fiomon.fio.overlap`): a hist log that a followed json+ stream
  covers (its name, its time, and its jobs' cumulative bins hold the log's counts) is
  followed but not published. The decision is taken once per stream, before its first
  record goes out. Its records are held (at most ``HOLD_S``) while a json+ stream has not
  yet written its first document, or one that names the log has not yet dumped at or
  after the log's last record and has not ended (both files quiet for ``STREAM_QUIET_S``
  and twice its dump spacing). A log published first (the hold ran out) is the truth for
  its job: a stream whose later dump shows that job skips it (logged, counted in
  ``jobs_skipped``; after a restart the published logs are read back so the re-read
  stream skips the same jobs). A stream without histogram bins (plain json) covers
  nothing.

A relative-time hist log (``log_unix_epoch=0``) is placed on the wall clock by one
estimate per stream, logged once: fio writes hist logs when the job exits, so the file's
modification time is taken as the wall-clock time of its last record.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import logging
import os
import re
import resource
import stat
import time
import zlib
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from fiomon.agent.fileprint import BLOCK, HEAD, Fingerprint
from fiomon.agent.positions import LEGACY_PREFIX, FollowState, Resume
from fiomon.agent.spool import Outgoing
from fiomon.agent.treeglob import TreeGlob, is_recursive
from fiomon.config import RUN_DIR
from fiomon.fio.clientlog import client_log_host, filed_by_pbench, looks_like_running_sums
from fiomon.fio.decode import container, fio_log_store
from fiomon.fio.fiojson import JsonStatusParser
from fiomon.fio.fiolog import EPOCH_MS_MIN, MAX_LINE_BYTES, HistLogOptions, HistLogParser
from fiomon.fio.overlap import (
    Declaration,
    JobContent,
    LogContent,
    claims,
    explained_by,
    is_grouped,
    job_contents,
    log_content,
)
from fiomon.fio.parsers import (
    FIO_STORE_REFUSAL,
    SNIFF_BYTES,
    Kind,
    ParserOptions,
    RecordParser,
    hist_log_kind_refusal,
    open_parser,
    sniff,
)
from fiomon.fio.problems import Problem, ProblemLog
from fiomon.model import LatencyKind, RecordBatch
from fiomon.wire import MAX_TIME_MS, split, wire_id

log = logging.getLogger("fiomon.agent")

READ_BYTES = 4 * 1024 * 1024  # per file per poll: one busy file cannot starve the others
POLL_BUDGET = 64 * 1024 * 1024  # per poll over all files: a poll (and SIGTERM) stays short
FULL_VERIFY_BYTES = 1 << 20  # prefixes this small are checked in full on every change
ROTATE_BYTES = 256 << 10  # larger ones: this much more per change, in rotation
FULL_VERIFY_MAX = 256 << 20  # ... and in full after a quiet spell, up to this size
QUIET_S = 5.0  # a change after this much quiet is checked in full (rewrite, not append)
IDLE_CLOSE_S = 2.0  # at the descriptor cap, a stream this quiet may be closed for another
FORGET_S = 3600.0  # a closed stream not seen at any watched path for this long is forgotten
MAX_GONE = 10_000  # deleted streams remembered (to recognise copies of them)
# Longest a hist log waits for json+ streams to declare their jobs: fio writes a job's log
# when the job exits, and a stream's first dump comes a status interval after fio started
# (a 35 s interval and a job of a few seconds left 30 s short, and the stream then had to
# drop that job's last partial interval); a minute covers the intervals people use.
HOLD_S = 60.0
# A json+ stream whose file has not changed for this long, and for twice the spacing of its
# dumps, has written its last dump (fio exited or stalled): a hist log whose time goes
# past that dump no longer waits for it (the hold would otherwise run to HOLD_S, records
# reaching the aggregator a minute late). Should it dump again after all, it skips the
# jobs whose logs went out first, so one truth per I/O holds either way.
STREAM_QUIET_S = 5.0
HOLD_RECORDS = 100_000  # a hist log held longer than this many records is decided at once
MAX_PAIRED_LOGS = 4096  # covered and published hist logs remembered for pairing
MAX_ENDED_STREAMS = 64  # ended json+ streams whose last dump still pairs hist logs
RESCAN_S = 5.0  # full rescan (and stat of closed files) at least this often
TEXT_HEAD_MAX = 1 << 20  # text before the first record that the kind waits for, at most
KEY_MIN = 256  # a content id digests the file's head through a line ending this far in
KEY_READ = 1 << 20  # ... found within this much of the file's start
PBENCH_PROBE_BYTES = 4 << 20  # of a log in clients/<server>/ read to tell running sums
# max_message_size bounds the MQTT packet, which also carries a fixed header, the topic
# and a packet id; payloads are cut this much shorter (a broker's max_packet_size or an
# aggregator's limit set to the agent's size still takes every message).
PACKET_OVERHEAD = 1024
RESERVED_FDS = 64  # descriptors left for MQTT, the spool, positions (half, if the limit is low)


@dataclass(slots=True)
class _Stream:
    """A stream whose file is held open."""

    stream: str
    path: str
    fd: int
    dev: int
    ino: int
    opened_at: float
    print: Fingerprint = field(default_factory=Fingerprint)
    size: int = 0  # fstat when last examined
    mtime_ns: int = 0
    changed_at: float = 0.0  # monotonic s of the last change seen
    next_seq: int = 0
    skip_below: int = 0  # records already sent (or acknowledged, after a restart)
    acked_floor: int = 0  # acknowledged before this run (saved positions)
    time_offset_ms: int | None = None
    parser: RecordParser | None = None
    kind: Kind | None = None  # from the first bytes (fiomon.fio.parsers.sniff)
    head: bytes = b""  # the first bytes that told its kind (_kind_head)
    text_logged: bool = False  # said that it starts with text and no record yet
    started: bool = False  # a parser was chosen
    decided: bool = False  # whether it is published is settled
    covered_by: str | None = None  # not published: that stream holds its I/Os
    orphan_since: float | None = None  # renamed to a name the patterns do not match
    deleted: bool = False  # unlinked: drained to its end, then closed
    declared: Declaration | None = None  # a closed json+ stream's, kept on reopening
    named: bool = True  # False: a provisional id, replaced by the content id (_name)
    copy_of: str | None = None  # a copy of that stream (not published while it holds)
    copy_checked: int = 0  # bytes of the copy found equal to the original's
    held: list[RecordBatch] = field(default_factory=list)  # a hist log's, while undecided
    problems: ProblemLog = field(default_factory=lambda: ProblemLog(keep_per_kind=5))
    counted: Counter[str] = field(default_factory=Counter)
    run: str | None = None  # its run label, set when it first publishes

    def declaration(self) -> Declaration | None:
        if isinstance(self.parser, JsonStatusParser):
            return self.parser.declaration(self.stream)
        return self.declared


@dataclass(slots=True)
class _Closed:
    """A stream whose file is not held open (see :class:`~fiomon.agent.positions.Resume`)."""

    resume: Resume
    skip_below: int  # records already sent or acknowledged
    replay: bool  # loaded from disk: unacknowledged records may be waiting in the file
    seen_at: float  # monotonic s when last found at a watched path


@dataclass(slots=True)
class FollowStats:
    """Counters of a :class:`Follower` (published in the agent's heartbeat)."""

    files_followed: int = 0
    files_closed: int = 0
    generations: int = 0
    bytes_read: int = 0
    records_read: int = 0
    records_skipped_replay: int = 0
    files_refused: int = 0  # fio --client hist logs (see clientlog), compressed files, and
    # hist logs when the agent's latency is not clat: never published
    files_covered: int = 0
    jobs_skipped: int = 0  # json+ jobs not published: their hist logs went out first
    files_copies: int = 0
    copies_diverged: int = 0  # copies that stopped being one (then published as their own)
    renames: int = 0
    rewrites: int = 0
    open_errors: int = 0
    read_errors: int = 0
    files_waiting: int = 0
    logs_held: int = 0  # hist logs whose records wait to know if a json+ stream holds them
    patterns_idle: int = 0
    problems: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Pattern:
    pattern: str
    matched_at: float
    warned: bool = False
    folder_mtime: int | None = None  # of its folder at the last scan (None: always scan)
    paths: list[str] = field(default_factory=list)
    tree: TreeGlob | None = None  # a recursive (``**``) pattern's cached tree
    truncated: bool = False  # its tree was larger than a scan visits (reported once)
    escaped: set[str] = field(default_factory=set)  # links out of its root (reported once each)
    tree_due: float = 0.0  # perf_counter time of its next scan (big trees: at most 10 % busy)


class Follower:
    """Follows every file matching ``patterns`` and turns new data into messages.

    Not thread-safe: call :meth:`poll` and :meth:`state` from one thread at a time.

    Args:
        patterns: glob patterns (json+ status files and hist logs, told apart by content).
        agent: agent id written into every message.
        max_message_bytes: cap on one encoded message, bytes (:func:`fiomon.wire.split`
            sizes them; a record too big even alone goes alone).
        state: what the positions file held at start (see :mod:`fiomon.agent.positions`).
        log_hist_msec: hist logs' interval, or None to infer it.
        max_open_files: descriptors held at most (also kept below the process limit).
        max_line_bytes: longer hist-log lines are skipped and counted.
        max_document_bytes: larger json+ documents are skipped and counted.
        rename_grace_s: how long a file renamed out of the patterns is still followed.
        pattern_idle_s: a pattern that matched nothing for this long is reported once.
        clock: monotonic seconds (injected for tests).
        wall_s: wall-clock epoch seconds (generation numbers, rename grace across restarts).
        exclude: folders whose files are never followed (the agent's own state directory,
            should a pattern reach into it).
        run: every message's run label (``{dir}``: the followed file's folder name when
            it first publishes), or None for none.
        latency: the latency kind published (json+ ``<kind>_ns`` bins; every message says
            it); hist logs hold clat only and are refused, logged once and counted
            (``files_refused``), with another kind.
    """

    def __init__(
        self,
        patterns: tuple[str, ...],
        *,
        agent: str,
        max_message_bytes: int,
        state: FollowState | None = None,
        log_hist_msec: int | None = None,
        max_open_files: int = 256,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_document_bytes: int = 32 << 20,
        rename_grace_s: float = 60.0,
        pattern_idle_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_s: Callable[[], float] = time.time,
        exclude: tuple[str, ...] = (),
        run: str | None = None,
        latency: LatencyKind = "clat",
    ) -> None:
        self.patterns = patterns
        self.run = run
        self.latency: LatencyKind = latency
        self._refused: set[str] = set()
        self._exclude = tuple(os.path.realpath(e).rstrip("/") + "/" for e in exclude)
        self.agent = agent
        self.max_message_bytes = max_message_bytes
        self.log_hist_msec = log_hist_msec
        self.max_line_bytes = max_line_bytes
        self.max_document_bytes = max_document_bytes
        self.rename_grace_s = rename_grace_s
        self.pattern_idle_s = pattern_idle_s
        self._clock = clock
        self._wall_s = wall_s
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        limit = (
            soft - min(RESERVED_FDS, soft // 2)
            if soft != resource.RLIM_INFINITY
            else max_open_files
        )
        self.max_open_files = max(1, min(max_open_files, limit))
        state = state or FollowState()
        self._next_gen = state.next_generation
        now = clock()
        self._open: dict[str, _Stream] = {}
        self._closed: dict[str, _Closed] = {
            s: _Closed(r, r.acked_seq, replay=True, seen_at=now) for s, r in state.streams.items()
        }
        self._patterns = [
            _Pattern(p, now, tree=TreeGlob(p) if is_recursive(p) else None) for p in patterns
        ]
        self._rescan_at = 0.0
        self._waiting_logged = False
        self.changes = 0  # bumped whenever what :meth:`state` returns may have changed
        self._open_failed: set[str] = set()
        self._read_failed: set[str] = set()
        self._budget = POLL_BUDGET
        self._heads: dict[str, list[str]] | None = None  # head key -> streams, per poll
        self._retired: set[str] = set()  # ids of lineages that ended (never reused)
        self.stats = FollowStats()
        self._covered_logs: list[LogContent] = []  # hist logs covered, in decision order
        self._covered_by: dict[str, str] = {}  # covered hist log path -> its json+ stream
        self._published_logs: list[LogContent] = []  # hist logs published (pairing)
        self._held_content: dict[str, tuple[int, LogContent]] = {}  # per held stream
        # json+ streams' parsers, open or recently ended (a truncated stream's last dump
        # still tells which logs of that run it holds), and their jobs' bins by document
        self._json_parsers: dict[str, JsonStatusParser] = {}
        self._read_back: set[str] = set()  # published hist logs read back after a restart
        self._json_content: dict[str, tuple[int, tuple[JobContent, ...], bool]] = {}

    def set_patterns(self, patterns: tuple[str, ...]) -> None:
        """Follow ``patterns`` from the next discovering poll on (the agent's SIGHUP).

        Patterns kept keep their state; files only the dropped patterns matched are then
        handled as files renamed out of ``watch`` (followed until quiet for the grace).
        """
        now = self._clock()
        old = {p.pattern: p for p in self._patterns}
        self.patterns = patterns
        self._patterns = [
            old.get(p) or _Pattern(p, now, tree=TreeGlob(p) if is_recursive(p) else None)
            for p in patterns
        ]
        self._rescan_at = 0.0  # expand them all at the next poll

    # -- polling -------------------------------------------------------------------------

    def poll(self, *, discover: bool = True, final: bool = False) -> Iterator[Outgoing]:
        """Read what is new in every followed file.

        Args:
            discover: also expand the patterns: start following new files, notice renames
                and deletions, and reopen closed streams whose files changed.
            final: also finish the parsers (at shutdown nothing more will come).
        """
        now = self._clock()
        self._budget = POLL_BUDGET
        self._heads = None
        if discover:
            self._discover(now)
        for s in self._open.values():
            if s.kind is None:
                s.kind = _sniff(s.fd)
        # json+ streams first: their declarations decide which hist logs they cover.
        for s in sorted(self._open.values(), key=lambda s: (s.kind != "json", s.path)):
            if self._budget <= 0:
                break  # the rest next poll: reading stays bounded per call
            if self._open.get(s.stream) is s:  # not finished by another's read meanwhile
                yield from self._advance(s, now)
        if final:
            for s in list(self._open.values()):
                yield from self._finish(s)
        self._update_counts()

    def _discover(self, now: float) -> None:
        matched = self._glob(now)
        if matched is None:
            return  # no watched folder changed since the last scan
        by_inode = {(s.dev, s.ino): s for s in self._open.values()}
        claimed: set[str] = set()
        fresh: list[tuple[str, os.stat_result]] = []
        for path in sorted(matched):
            st = matched[path]
            s = by_inode.get((st.st_dev, st.st_ino))
            if s is None:
                fresh.append((path, st))
                continue
            if s.stream in claimed:
                continue  # a second name (hard link) of a file already followed
            claimed.add(s.stream)
            old = matched.get(s.path)
            if s.path != path and (old is None or (old.st_dev, old.st_ino) != (s.dev, s.ino)):
                log.info("%s: renamed to %s; still stream %s", s.path, path, s.stream)
                self.stats.renames += 1
                s.path = path
                self.changes += 1
            if s.orphan_since is not None:
                log.info("%s: matches the watch patterns again (stream %s)", path, s.stream)
                s.orphan_since = None
                self.changes += 1
        for s in [s for s in self._open.values() if s.stream not in claimed]:
            self._unclaimed(s, now)
        fresh += self._orphans_to_resume(matched)
        closed_at: dict[tuple[int, int], list[_Closed]] = {}
        for c in self._closed.values():
            if not c.resume.gone:
                closed_at.setdefault((c.resume.dev, c.resume.ino), []).append(c)
        waiting = 0
        placed: set[str] = set()
        # json+ streams first: under the descriptor cap they get the free slots, and their
        # declarations are known before the hist logs they cover are read.
        fresh.sort(key=lambda item: _sniff_path(item[0]) != "json")
        for path, st in fresh:
            if not self._place(path, st, closed_at.get((st.st_dev, st.st_ino), []), placed, now):
                waiting += 1
        self.stats.files_waiting = waiting
        if waiting and not self._waiting_logged:
            log.warning(
                "%d files wait for a descriptor: %d are held open (max_open_files); they are "
                "read as soon as followed files go quiet",
                waiting,
                len(self._open),
            )
        self._waiting_logged = waiting > 0
        self._open_failed &= set(matched)
        self._forget(now)

    def _forget(self, now: float) -> None:
        """Drop closed streams unseen for FORGET_S, and the oldest deleted ones past MAX_GONE."""
        for stream, c in list(self._closed.items()):
            if now - c.seen_at > FORGET_S:
                del self._closed[stream]
                self.changes += 1
        gone = sorted(
            (k for k, c in self._closed.items() if c.resume.gone),
            key=lambda k: self._closed[k].seen_at,
        )
        for stream in gone[: max(0, len(gone) - MAX_GONE)]:
            del self._closed[stream]
            self.changes += 1

    def _refuse_client_log(self, path: str, *, pbench: bool = False) -> None:
        """Say once per file why a hist log of ``fio --client`` is not followed.

        fio writes those on the controller when each job ends, every server's under the
        controller's host, as running sums (see :mod:`fiomon.fio.clientlog`): the agent
        cannot publish them as live records of their hosts. ``fiomon report`` reads them.
        ``pbench``: known by its place (``clients/<server>/``) and its running sums, fio's
        ``.<server>`` suffix being gone.
        """
        if path in self._refused:
            return
        self._refused.add(path)
        self.stats.files_refused += 1
        server = Path(path).parent.name if pbench else client_log_host(Path(path))
        log.warning(
            "%s: a hist log written by fio --client (server %s%s), at the end of the run: "
            "not published (use fiomon report on it; for live records run fio on each host "
            "with an agent beside it, see README 'fio's client/server mode')",
            path,
            server,
            "; filed by pbench-fio, its running sums recognised by content" if pbench else "",
        )

    def _pbench_client_log(self, s: _Stream) -> bool:
        """Whether ``s`` is a fio --client log as pbench-fio files it (place and content).

        Such a log is written whole when the run ends; its first records tell
        (:func:`fiomon.fio.clientlog.looks_like_running_sums`). A log elsewhere, or one whose
        records are intervals, is followed as usual.
        """
        if not filed_by_pbench(Path(s.path)):
            return False
        try:
            data = os.pread(s.fd, PBENCH_PROBE_BYTES, 0)
        except OSError:
            return False
        parser = HistLogParser(s.path, options=self._parser_options(s).hist)
        batches = [b for b in (parser.feed(data), parser.finish()) if b is not None and len(b)]
        if not batches:
            return False
        return bool(looks_like_running_sums(RecordBatch.concat(batches), pbench=True))

    def _refuse_packed(self, s: _Stream, packed: str | None) -> None:
        """Say once why a compressed file is followed but never published.

        fio writes its logs and status streams uncompressed while it runs; a compressed
        one was made after the run (``gzip`` of a log the agent already published, which
        would count its I/Os twice) or is fio's own ``log_store_compressed`` store, which
        is not a readable log. ``fiomon report`` reads the former and names the fix for
        the latter.
        """
        s.decided = True
        self.stats.files_refused += 1
        if packed is not None:
            log.warning(
                "%s: %s-compressed, made after the run: not published (its records, if "
                "fio wrote them here, went out from the uncompressed file; fiomon report "
                "reads compressed logs offline)",
                s.path,
                packed,
            )
        else:
            log.warning("%s: %s", s.path, FIO_STORE_REFUSAL)

    def _glob(self, now: float) -> dict[str, os.stat_result] | None:
        """Regular files matching the patterns, with their stat; None if nothing changed.

        A pattern whose folder has no wildcards is re-expanded only when that folder's
        modification time changed (entries created, renamed or removed), or every
        ``RESCAN_S``; a full rescan also notices closed files that grew.
        """
        full = now >= self._rescan_at
        changed = full or self.stats.files_waiting > 0 or bool(self._open_failed)
        for pat in self._patterns:
            if pat.tree is not None:
                # one stat per folder of the tree; listings only of folders that changed
                changed = self._refresh_tree(pat, pat.tree) or changed
                continue
            folder = os.path.dirname(pat.pattern) or "."
            if any(c in folder for c in "*?["):
                changed = True  # no cache for wildcard folders
                continue
            try:
                mtime: int | None = os.stat(folder).st_mtime_ns
            except OSError:
                mtime = None
            if mtime is None or mtime != pat.folder_mtime:
                changed = True
            pat.folder_mtime = mtime
        if not changed:
            return None
        if full:
            self._rescan_at = now + RESCAN_S
        found: dict[str, os.stat_result] = {}
        for pat in self._patterns:
            n = 0
            paths = pat.tree.paths if pat.tree is not None else glob.glob(pat.pattern)
            for path in paths:
                if self._exclude and os.path.realpath(path).startswith(self._exclude):
                    continue
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if client_log_host(Path(path)) is not None:
                    self._refuse_client_log(path)
                    continue
                found[path] = st
                n += 1
            self._note_matches(pat, n, now)
        self.stats.patterns_idle = sum(p.warned for p in self._patterns)
        return found

    def _refresh_tree(self, pat: _Pattern, tree: TreeGlob) -> bool:
        """Scan a recursive pattern's tree again; whether what it matches may have changed."""
        start = time.perf_counter()
        if start < pat.tree_due:
            return False
        changed = tree.refresh()
        # A tree whose scan takes T is scanned again after 9 T at the earliest: one core
        # spends at most a tenth of its time on it (20 000 folders: ~100 ms, so every ~1 s).
        pat.tree_due = start + 10 * (time.perf_counter() - start)
        if tree.truncated and not pat.truncated:
            log.warning(
                "watch pattern %r: the tree under %s has more than %d folders; the rest are "
                "not scanned (narrow the pattern)",
                pat.pattern,
                tree.root,
                tree.max_folders,
            )
        pat.truncated = tree.truncated
        for link in sorted(tree.escaped - pat.escaped):
            log.warning(
                "watch pattern %r: %s links out of %s (to %s); ** does not follow it (its "
                "files may be another host's: watch that folder with a pattern of its own)",
                pat.pattern,
                link,
                tree.root,
                os.path.realpath(link),
            )
        pat.escaped = set(tree.escaped)
        return changed

    def _note_matches(self, pat: _Pattern, n: int, now: float) -> None:
        """Report once when a pattern has matched nothing for ``pattern_idle_s``."""
        if n:
            if pat.warned:
                log.info("watch pattern %r matches %d files again", pat.pattern, n)
            pat.matched_at, pat.warned = now, False
        elif not pat.warned and now - pat.matched_at >= self.pattern_idle_s:
            pat.warned = True
            folder = pat.tree.root if pat.tree else os.path.dirname(pat.pattern) or "."
            exists = (pat.tree is None and any(c in folder for c in "*?[")) or os.path.isdir(folder)
            why = "" if exists else f" (folder {folder} does not exist)"
            log.warning(
                "watch pattern %r has matched no file for %.0f s%s",
                pat.pattern,
                now - pat.matched_at,
                why,
            )

    def _unclaimed(self, s: _Stream, now: float) -> None:
        """An open stream whose file no watched path names any more."""
        try:
            nlink = os.fstat(s.fd).st_nlink
        except OSError:
            nlink = 0
        if nlink == 0:
            if not s.deleted:
                s.deleted = True
                log.info("%s: removed; stream %s is drained to its end", s.path, s.stream)
        elif s.orphan_since is None:
            s.orphan_since = now
            s.path = _fd_path(s.fd) or s.path
            self.stats.renames += 1
            self.changes += 1
            log.info(
                "renamed to %s, a name the watch patterns do not match; stream %s is followed "
                "until it has been quiet for %.0f s",
                s.path,
                s.stream,
                self.rename_grace_s,
            )

    def _orphans_to_resume(
        self, matched: dict[str, os.stat_result]
    ) -> list[tuple[str, os.stat_result]]:
        """Closed streams renamed out of the patterns, still in their grace period."""
        wall_ms = int(self._wall_s() * 1000)
        out = []
        for c in self._closed.values():
            r = c.resume
            if r.orphan_until_ms is None or r.orphan_until_ms <= wall_ms or r.path in matched:
                continue
            try:
                st = os.stat(r.path)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (r.dev, r.ino):
                out.append((r.path, st))
        return out

    def _place(
        self,
        path: str,
        st: os.stat_result,
        closed: list[_Closed],
        placed: set[str],
        now: float,
    ) -> bool:
        """A path no open stream holds: a closed stream's file, or a new stream.

        Args:
            path: the path.
            st: its stat.
            closed: closed streams last seen on the same device and inode.
            placed: closed streams already found at another path in this discovery.
            now: monotonic seconds.

        Returns False when no descriptor is free (the path waits for the next discovery).
        """
        for c in closed:
            r = c.resume
            if r.stream in placed:
                return True  # a second name (hard link, symlink) of the same file
            placed.add(r.stream)
            c.seen_at = now
            unchanged = (
                (st.st_size, st.st_mtime_ns) == (r.size, r.mtime_ns) == (r.length, r.mtime_ns)
            )
            if unchanged and c.skip_below >= r.records and not r.sha1.startswith(LEGACY_PREFIX):
                if r.path != path and not os.path.exists(r.path):
                    log.info("%s: renamed to %s; still stream %s", r.path, path, r.stream)
                    r.path = path
                    self.changes += 1
                return True  # nothing new in it: stays closed
        if not self._free_slot(now):
            return False
        fd = self._open_fd(path)
        if fd is None:
            return True
        try:
            fst = os.fstat(fd)
            key = (fst.st_dev, fst.st_ino)  # the path may have changed since the glob
            if key in {(s.dev, s.ino) for s in self._open.values()}:
                os.close(fd)  # renamed into place between glob and open: already ours
                return True
            same = [c for c in self._closed.values() if (c.resume.dev, c.resume.ino) == key]
            for c in same:
                if not c.resume.gone and self._same_content(fd, c.resume):
                    self._reopen(c, path, fd, fst, now)
                    return True
            for c in same:  # its bytes changed while it was not followed
                if c.resume.gone:
                    continue
                log.info(
                    "%s: changed while not followed (stream %s ends); new stream",
                    path,
                    c.resume.stream,
                )
                self.stats.rewrites += 1
                self._closed.pop(c.resume.stream, None)
                self._retire(c.resume.stream)
            self._new_stream(path, fd, fst, now)
        except OSError as exc:
            os.close(fd)
            log.warning("%s: cannot read (%s); will retry", path, exc.strerror or exc)
        return True

    def _copy_of(self, s: _Stream) -> str | None:
        """The stream whose read bytes ``s``'s new file starts with (or that starts with it).

        Known streams are found by the CRC-32 of their first 4 KiB (an index built once
        per poll), then compared byte for byte (open) or by SHA-1 (closed).
        """
        if self._heads is None:
            self._heads = {}
            for o in self._open.values():
                if o.print.length:
                    self._heads.setdefault(o.print.head, []).append(o.stream)
            for c in self._closed.values():
                if c.resume.head and c.resume.length:
                    self._heads.setdefault(c.resume.head, []).append(c.resume.stream)
        size = os.fstat(s.fd).st_size
        head = os.pread(s.fd, HEAD, 0)
        for n in {min(len(head), HEAD), HEAD}:
            key = f"{n}:{zlib.crc32(head[:n]):08x}"
            for stream in self._heads.get(key, []):
                if stream != s.stream and self._holds_same(s.fd, size, stream, n):
                    return stream
        return None

    def _holds_same(self, fd: int, size: int, stream: str, head: int) -> bool:
        """Whether the file at ``fd`` and what ``stream`` read agree on all the shorter one."""
        o = self._open.get(stream)
        if o is not None:
            n = min(size, o.print.length)
            # A short shared head is no evidence unless both are that short (equal files).
            return (n >= HEAD or n == size == o.print.length) and _same_bytes(fd, o.fd, n)
        c = self._closed.get(stream)
        if c is None or size < c.resume.length or (head < HEAD and size != c.resume.length):
            return False
        fp = Fingerprint.of_file(fd, c.resume.length)
        return fp is not None and fp.hexdigest() == c.resume.sha1

    def _open_fd(self, path: str) -> int | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            self.stats.open_errors += 1
            if path not in self._open_failed:
                self._open_failed.add(path)
                hint = (
                    " (the process is out of file descriptors)"
                    if exc.errno in (errno.EMFILE, errno.ENFILE)
                    else ""
                )
                log.warning("%s: cannot open (%s)%s; will retry", path, exc.strerror, hint)
            return None
        self._open_failed.discard(path)
        return fd

    def _free_slot(self, now: float) -> bool:
        """Whether a descriptor may be opened, closing the quietest idle stream if needed."""
        if len(self._open) < self.max_open_files:
            return True
        idle = [s for s in self._open.values() if now - s.changed_at >= IDLE_CLOSE_S]
        if not idle:
            return False
        self._close_quietly(min(idle, key=lambda s: s.changed_at), now)
        return True

    def _same_content(self, fd: int, r: Resume) -> bool:
        """Whether the open file still starts with the bytes ``r`` says were read."""
        if r.sha1.startswith(LEGACY_PREFIX):  # version-1 positions: a 64-byte head digest
            head = os.pread(fd, 64, 0)
            digest = hashlib.blake2b(head, digest_size=16).hexdigest()
            return digest == r.sha1[len(LEGACY_PREFIX) :]
        fp = Fingerprint.of_file(fd, r.length)
        return fp is not None and fp.hexdigest() == r.sha1

    def _reopen(self, c: _Closed, path: str, fd: int, st: os.stat_result, now: float) -> None:
        r = c.resume
        if r.path != path:
            log.info("%s: renamed to %s; still stream %s", r.path, path, r.stream)
            self.stats.renames += 1
        self._closed.pop(r.stream, None)
        self.changes += 1
        s = _Stream(r.stream, path, fd, st.st_dev, st.st_ino, now, changed_at=now)
        s.named = r.records > 0 or r.acked_seq > 0  # nothing went out yet: content id then
        s.skip_below = c.skip_below
        s.acked_floor = r.acked_seq
        s.time_offset_ms = r.time_offset_ms
        s.covered_by = r.covered_by
        s.copy_of = r.covered_by if r.copy else None
        s.decided = r.covered_by is not None or c.skip_below > 0
        if r.orphan_until_ms is not None:
            s.orphan_since = now
        if r.declares:
            s.declared = _declaration(r)
        if c.replay and c.skip_below:
            log.info("%s: resuming stream %s after seq %d", path, r.stream, c.skip_below - 1)
        self._open[s.stream] = s

    def _new_stream(self, path: str, fd: int, st: os.stat_result, now: float) -> _Stream:
        gen = max(self._next_gen, int(self._wall_s()))
        self._next_gen = gen + 1
        stream = wire_id(f"{path}@{gen}")  # provisional (and the fallback): see _name
        s = _Stream(stream, path, fd, st.st_dev, st.st_ino, now, changed_at=now, named=False)
        self._open[s.stream] = s
        self.changes += 1
        self.stats.generations += 1
        return s

    # -- reading and parsing ---------------------------------------------------------------

    def _advance(self, s: _Stream, now: float) -> Iterator[Outgoing]:
        """Check ``s``'s file is still what was read, then read what is new."""
        try:
            st = os.fstat(s.fd)
            reason = self._changed(s, st, now)
        except OSError as exc:
            log.warning("%s: cannot read (%s); will retry", s.path, exc.strerror or exc)
            return
        if reason is not None:
            self.stats.rewrites += 1
            log.info(
                "%s: %s; stream %s ends after %d bytes and the file is read again as a new stream",
                s.path,
                reason,
                s.stream,
                s.print.length,
            )
            self._open.pop(s.stream, None)  # its content is gone: nothing to drain
            self._retire(s.stream)
            orphan, deleted = s.orphan_since, s.deleted
            s = self._new_stream(s.path, s.fd, st, now)
            s.orphan_since, s.deleted = orphan, deleted
        if s.copy_of is not None:
            try:
                shared = self._copy_diverged(s, now)
                if shared is not None:
                    self._own_stream(s, shared)
            except OSError as exc:
                log.warning("%s: cannot compare with its original (%s)", s.path, exc)
        if (
            not s.decided
            and s.kind == "hist"
            and self.latency == "clat"  # (with another kind, hist logs are refused)
            and self._declarations_pending(s, now)
        ):
            return  # wait for the json+ streams to say which jobs they cover
        try:
            at_end = yield from self._read(s)
        except OSError as exc:  # EIO and the like: the file is the truth, try again later
            self.stats.read_errors += 1
            if s.stream not in self._read_failed:
                self._read_failed.add(s.stream)
                log.warning("%s: read failed (%s); will retry", s.path, exc.strerror or exc)
            return
        self._read_failed.discard(s.stream)
        if not s.decided and s.held:
            yield from self._release(s)
        if s.deleted and at_end:
            yield from self._finish(s, deleted=True)
        elif s.orphan_since is not None and now - max(s.changed_at, s.orphan_since) >= (
            self.rename_grace_s
        ):
            log.info("%s: quiet for %.0f s after a rename; closed", s.path, self.rename_grace_s)
            yield from self._finish(s)

    def _changed(self, s: _Stream, st: os.stat_result, now: float) -> str | None:
        """Why ``s``'s file no longer starts with what was read, or None.

        Raises:
            OSError: the check could not read the file (nothing is marked as seen then).
        """
        if (st.st_size, st.st_mtime_ns) == (s.size, s.mtime_ns):
            return None
        n = s.print.length
        if st.st_size < n:
            reason: str | None = "truncated"
        else:
            quiet = now - s.changed_at
            full = n <= FULL_VERIFY_BYTES or (quiet >= QUIET_S and n <= FULL_VERIFY_MAX)
            holds = not n or s.print.holds(s.fd, full=full, budget=ROTATE_BYTES)
            reason = None if holds else "rewritten in place"
        s.size, s.mtime_ns, s.changed_at = st.st_size, st.st_mtime_ns, now
        return reason

    def _read(self, s: _Stream, *, budget: bool = True) -> Generator[Outgoing, None, bool]:
        """Read up to READ_BYTES (and the poll's budget); returns whether EOF was reached."""
        limit = min(READ_BYTES, self._budget) if budget else READ_BYTES
        if not s.started and s.print.length == 0:
            head = self._kind_head(s)
            if head is None:
                return False  # nothing read: its first bytes do not tell its kind yet
            s.head = head
        while limit > 0:
            chunk = os.pread(s.fd, min(READ_BYTES, limit), s.print.length)
            if not chunk:
                return True
            s.print.update(chunk)
            self.changes += 1
            self.stats.bytes_read += len(chunk)
            limit -= len(chunk)
            self._budget -= len(chunk)
            if not s.started:
                if not s.decided and s.skip_below == 0:
                    original = self._copy_of(s)
                    if original is not None:
                        yield from self._copied(s, original)
                self._start_parsing(s, s.head if len(s.head) > len(chunk) else chunk)
                s.head = b""
                if self._heads is not None:
                    self._heads.setdefault(s.print.head, []).append(s.stream)
            if s.parser is not None:
                yield from self._emit(s, s.parser.feed(chunk))
                self._collect_problems(s)
        return False

    def _kind_head(self, s: _Stream) -> bytes | None:
        """``s``'s first bytes once they tell its kind (:func:`head_tells_kind`), else None.

        Text and no record yet (fio's ``note:`` lines or ``json+,normal``'s header before
        the first document, still being written) waits, said once after ``QUIET_S`` of
        quiet; past ``TEXT_HEAD_MAX`` bytes of it the parsers decide (and report it).

        Raises:
            OSError: the file could not be read.
        """
        head = os.pread(s.fd, SNIFF_BYTES, 0)
        if len(head) == SNIFF_BYTES and not head_tells_kind(head):
            head = os.pread(s.fd, TEXT_HEAD_MAX, 0)
        if head_tells_kind(head) or len(head) >= TEXT_HEAD_MAX:
            return head
        if head.strip() and not s.text_logged and self._clock() - s.changed_at >= QUIET_S:
            s.text_logged = True
            log.warning(
                "%s: starts with %d bytes of text and no json document or hist-log record "
                "yet: waiting for one (read once the file holds one)",
                s.path,
                len(head),
            )
        return None

    def _copied(self, s: _Stream, original: str) -> Iterator[Outgoing]:
        """``s``'s file starts with what ``original`` read: a copy, or the same file moved.

        A copy of a deleted file (``mv`` across file systems) continues its stream: what
        was published is not again, what follows is. A copy of a file that still exists
        is not published at all (the original publishes those I/Os).
        """
        o = self._open.get(original)
        if o is not None and o.deleted:  # moved in this very poll: finish the old file first
            while not (yield from self._read(o, budget=False)):
                pass
            yield from self._finish(o, deleted=True)
        c = self._closed.get(original)
        if c is None or not c.resume.gone:
            s.decided, s.covered_by, s.copy_of, s.copy_checked = True, original, original, 0
            self.stats.files_copies += 1
            log.info("%s: a copy of what stream %s read: followed, not published", s.path, original)
            return
        r = c.resume
        del self._open[s.stream]
        del self._closed[original]
        s.stream, s.named = original, True
        self._open[s.stream] = s
        s.skip_below, s.acked_floor = c.skip_below, r.acked_seq
        s.covered_by, s.time_offset_ms = r.covered_by, r.time_offset_ms
        s.decided = r.covered_by is not None or c.skip_below > 0
        if r.declares:
            s.declared = _declaration(r)
        self.stats.renames += 1
        self.changes += 1
        log.info(
            "%s: %s moved here (its content, and more); still stream %s", s.path, r.path, original
        )

    def _copy_diverged(self, s: _Stream, now: float) -> int | None:
        """None while ``s`` (a copy) is a prefix of its original or equal to it.

        Otherwise the length of what both share: they differ at that byte, or the copy is
        longer than an original that is gone, closed or quiet (``QUIET_S``). New bytes of
        either are compared once (up to ``ROTATE_BYTES`` per poll).

        Raises:
            OSError: a file could not be read.
        """
        o = self._open.get(s.copy_of or "")
        c = self._closed.get(s.copy_of or "")
        fd, own = (o.fd, False) if o is not None else (None, False)  # deleted: still readable
        if fd is None and c is not None and not c.resume.gone:
            with contextlib.suppress(OSError):
                fd, own = os.open(c.resume.path, os.O_RDONLY | os.O_CLOEXEC), True
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != (c.resume.dev, c.resume.ino):
                    os.close(fd)
                    fd, own = None, False
        try:
            size = os.fstat(s.fd).st_size
            if fd is None:  # the original is gone: what the copy holds past it is its own
                if c is None and not s.copy_checked:  # forgotten (or rewritten) before any
                    s.copy_checked = size  # comparison: what the copy holds is taken as its
                known = max(s.copy_checked, c.resume.length if c is not None else 0)
                return known if size > known else None
            o_size = os.fstat(fd).st_size
            pos, end = s.copy_checked, min(size, o_size)
            limit = pos + ROTATE_BYTES
            while pos < end and pos < limit:
                step = min(BLOCK, end - pos)
                x, y = os.pread(s.fd, step, pos), os.pread(fd, step, pos)
                if x != y or len(x) != step:
                    return pos + next(
                        (i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b),
                        min(len(x), len(y)),
                    )
                pos += step
            s.copy_checked = pos
            quiet = o is None or o.deleted or now - o.changed_at >= QUIET_S
            if pos == end and size > o_size and quiet:
                return o_size
            return None
        finally:
            if own and fd is not None:
                os.close(fd)

    def _own_stream(self, s: _Stream, shared: int) -> None:
        """``s`` is no longer a copy: publish what follows the ``shared`` bytes.

        Those bytes are the original's (it published their records), so ``s`` is read
        again from byte 0 and the records they hold are skipped, not sent.

        Raises:
            OSError: the file could not be read (``s`` is then still a copy).
        """
        original = s.copy_of
        skip = self._records_in(s, shared) if shared else 0  # may raise: nothing changed yet
        s.copy_of, s.covered_by, s.decided = None, None, False
        s.kind = _sniff(s.fd)
        s.print, s.started, s.parser, s.head = Fingerprint(), False, None, b""
        s.next_seq = 0
        s.skip_below = s.acked_floor = skip  # saved: a restart skips them too
        self._heads = None
        self.stats.copies_diverged += 1
        self.changes += 1
        log.info(
            "%s: no longer a copy of stream %s (its bytes differ from byte %d on): "
            "published as its own stream, after the %d records the shared bytes hold",
            s.path,
            original,
            shared,
            skip,
        )

    def _records_in(self, s: _Stream, length: int) -> int:
        """How many records the first ``length`` bytes of ``s``'s file give."""
        head = os.pread(s.fd, SNIFF_BYTES, 0)
        if not head.strip():
            return 0
        parser = open_parser(head, s.path, ProblemLog(keep_per_kind=0), self._parser_options(s))
        n = pos = 0
        while pos < length:
            chunk = os.pread(s.fd, min(READ_BYTES, length - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            batch = parser.feed(chunk)
            if batch is not None and len(batch):
                ok = (batch.start_ms >= 0) & (batch.end_ms < MAX_TIME_MS)
                n += int((ok & (batch.end_ms >= batch.start_ms)).sum())
        return n

    def _start_parsing(self, s: _Stream, first: bytes) -> None:
        s.started = True
        if s.covered_by is not None:
            return  # a copy, or a hist log another stream covers: followed, never parsed
        packed = container(first)
        if packed != "plain" or fio_log_store(first):
            self._refuse_packed(s, packed if packed != "plain" else None)
            return
        s.kind = "json" if sniff(first) == "json" else "hist"
        if s.kind == "hist" and self.latency != "clat":
            s.decided = True
            self.stats.files_refused += 1
            log.warning("%s: not published: %s", s.path, hist_log_kind_refusal(self.latency))
            return
        if s.kind == "hist" and self._pbench_client_log(s):
            s.decided = True
            self._refuse_client_log(s.path, pbench=True)
            return
        if s.kind == "json":
            s.decided = True
        elif s.time_offset_ms is None:
            s.time_offset_ms = self._relative_offset(s)
        s.parser = open_parser(first, s.path, s.problems, self._parser_options(s))
        if isinstance(s.parser, JsonStatusParser):
            parser = s.parser
            parser.on_document = lambda doc: self._skip_published(s, parser, doc)
            self._json_parsers[s.stream] = parser
            ended = [k for k in self._json_parsers if k not in self._open]
            for k in ended[: max(0, len(ended) - MAX_ENDED_STREAMS)]:
                del self._json_parsers[k]
                self._json_content.pop(k, None)

    def _parser_options(self, s: _Stream) -> ParserOptions:
        return ParserOptions(
            host=self.agent,
            hist=HistLogOptions(
                interval_ms=self.log_hist_msec,
                time_offset_ms=s.time_offset_ms or 0,
                max_line_bytes=self.max_line_bytes,
            ),
            max_document_bytes=self.max_document_bytes,
            client_logs=False,  # refused by name before they are opened
            latency=self.latency,
        )

    def _declarations_pending(self, s: _Stream, now: float) -> bool:
        """Whether a json+ stream may still declare ``s``'s hist log (hold it, for a while)."""
        if now - s.opened_at >= HOLD_S:
            return False
        for o in self._open.values():
            if o.kind is None:
                return True  # empty for now: fio creates its json+ output before writing
            if o.kind == "json" and (
                not isinstance(o.parser, JsonStatusParser) or not o.parser.splitter.documents
            ):
                return True
        return False

    def _decide(self, s: _Stream, *, force: bool = False) -> bool | None:
        """Settle whether ``s`` (a hist log, records held) is published.

        True if it is covered, False if it is published, None while a json+ stream that
        may hold its I/Os has not yet dumped past its last record (at most ``HOLD_S``).
        """
        epoch = s.parser is not None and s.parser.time_kind == "epoch"
        try:
            complete = os.fstat(s.fd).st_size <= s.print.length
        except OSError:
            complete = False
        cached = self._held_content.get(s.stream)
        if cached is None or cached[0] != len(s.held):  # new records: sum them again
            lc = log_content(s.path, s.held, epoch=epoch)
            if lc is None:
                return None
            self._held_content[s.stream] = (len(s.held), lc)
            if len(self._held_content) > MAX_PAIRED_LOGS:  # streams that ended undecided
                for k in [k for k in self._held_content if k not in self._open]:
                    del self._held_content[k]
        else:
            lc = cached[1]
        lc = replace(lc, complete=complete)
        end = max(int(b.end_ms.max()) for b in s.held)
        decls: list[Declaration] = []
        # fio creates its output before writing: a file of unknown kind may be a stream
        pending = any(
            o.kind is None or (o.kind == "json" and o.parser is None and o.covered_by is None)
            for o in self._open.values()
            if o is not s
        )
        for stream, parser in self._json_parsers.items():
            o = self._open.get(stream)
            live = o is not None and o.parser is parser
            if not parser.splitter.documents:
                pending = pending or live
                continue
            d = self._json_declaration(stream, parser)
            if (
                live
                and d.names_log(s.path)
                and d.overlaps(lc.span)
                and (d.at_ms or 0) < end
                and not self._dumps_ended(o, parser, s)  # (o is not None when live)
            ):
                pending = True  # its next dump may show this log's I/Os
            decls.append(d)
        held = sum(len(b) for b in s.held)
        if pending and not force and self._clock() - s.opened_at < HOLD_S and held < HOLD_RECORDS:
            return None
        s.decided = True
        self._held_content.pop(s.stream, None)
        # earlier decisions hold their share of the streams still known (in order)
        covered = [
            c
            for c in self._covered_logs
            if c.path != s.path and self._covered_by.get(c.path) in self._json_parsers
        ]
        by = claims([*covered, lc], decls, ordered=False).get(s.path, ("", frozenset()))[0]
        if not by:
            # A json+ stream closed before this run (its bins unknown until it is read
            # again): its name and time decide, as before content was compared.
            for c in self._closed.values():
                r = c.resume
                if r.declares and r.records and not r.gone and r.stream not in self._json_parsers:
                    d = _declaration(r)
                    if d.names_log(s.path) and d.overlaps(lc.span):
                        by = r.stream
                        break
        if not by:
            self._remember(self._published_logs, lc)
            return False
        s.covered_by = by
        self._remember(self._covered_logs, lc)
        self._covered_by = {c.path: self._covered_by.get(c.path, by) for c in self._covered_logs}
        self._covered_by[lc.path] = by
        self.stats.files_covered += 1
        self.changes += 1
        s.parser = None
        log.info(
            "%s: not published: the json+ stream %s holds the same I/Os (it declares this "
            "hist log's name, covers its time, and its jobs' bins hold the log's counts)",
            s.path,
            s.covered_by,
        )
        return True

    def _dumps_ended(self, o: _Stream | None, parser: JsonStatusParser, s: _Stream) -> bool:
        """Whether json+ stream ``o`` will dump no more while hist log ``s`` waits for it.

        Both files unchanged for ``STREAM_QUIET_S`` and for twice the stream's dump spacing
        (fio writes a job's hist log at the job's exit and its final dump at its own, so a
        stream that holds the log dumps soon after the log was written).
        """
        if o is None:
            return True
        quiet = max(STREAM_QUIET_S, 2 * parser.dump_interval_ms / 1000)
        now = self._clock()
        return now - o.changed_at >= quiet and now - s.changed_at >= quiet

    def _json_declaration(self, stream: str, parser: JsonStatusParser) -> Declaration:
        """A json+ stream's declaration with its jobs' bins from its latest dump."""
        d = parser.declaration(stream)
        doc = parser.last_document
        if doc is None:
            return d
        cached = self._json_content.get(stream)
        if cached is None or cached[0] != id(doc):
            cached = self._json_content[stream] = (id(doc), job_contents(doc), is_grouped(doc))
        ts = doc.get("timestamp_ms")
        at = ts if isinstance(ts, int) and not isinstance(ts, bool) else None
        return replace(d, jobs=cached[1], at_ms=at, grouped=cached[2])

    def _remember(self, logs: list[LogContent], lc: LogContent) -> None:
        """Keep a decided log's sums (not its records) for later pairing, the newest ones."""
        logs[:] = [c for c in logs if c.path != lc.path][-(MAX_PAIRED_LOGS - 1) :]
        logs.append(replace(lc, upto=None))

    def _release(self, s: _Stream, *, force: bool = False) -> Iterator[Outgoing]:
        """Decide a hist log whose records are held; publish them unless it is covered."""
        verdict = self._decide(s, force=force)
        if verdict is None:
            return
        held, s.held = s.held, []
        if not verdict:
            for batch in held:
                yield from self._publish(s, batch)

    def _skip_published(self, s: _Stream, parser: JsonStatusParser, doc: dict[str, object]) -> None:
        """Before a json+ dump becomes records: skip jobs whose hist logs went out first."""
        d = parser.declaration(s.stream)
        if parser.splitter.documents <= 1:  # its first dump (again, after a restart)
            self._read_back_published(d)
        if not self._published_logs:
            return
        logs = [c for c in self._published_logs if d.names_log(c.path)]
        if not logs:
            return
        content = self._json_content[s.stream] = (id(doc), job_contents(doc), is_grouped(doc))
        ts = doc.get("timestamp_ms")
        at = ts if isinstance(ts, int) and not isinstance(ts, bool) else None
        d = replace(d, jobs=content[1], at_ms=at, grouped=content[2])
        new = explained_by(d, logs) - parser.skip_jobs
        if not new:
            return
        parser.skip_jobs = parser.skip_jobs | new
        self.stats.jobs_skipped += len(new)
        self.changes += 1
        log.warning(
            "%s: not publishing job(s) %s of stream %s: hist logs published before its dump "
            "showed them hold the same I/Os (%s)",
            s.path,
            ", ".join(str(p) for p in sorted(new)),
            s.stream,
            ", ".join(c.path for c in logs[:4]),
        )

    def _read_back_published(self, d: Declaration) -> None:
        """Sums of hist logs published before this agent started that ``d`` names.

        Which jobs a stream skipped is not saved: after a restart the stream is read again
        from its start, and its first dump must skip the same jobs, so the logs that went
        out before are read back (once each) from their files.
        """
        earlier = [
            (c.resume.path, c.resume.time_offset_ms)
            for c in self._closed.values()
            if c.resume.records and c.resume.covered_by is None and not c.resume.declares
        ]
        earlier += [
            (o.path, o.time_offset_ms)
            for o in self._open.values()
            if o.kind == "hist" and o.decided and o.covered_by is None and o.acked_floor
        ]
        for path, offset in earlier:
            if path in self._read_back or not d.names_log(path):
                continue
            self._read_back.add(path)
            lc = _read_log_content(path, offset or 0, self.log_hist_msec, self.max_line_bytes)
            if lc is not None:
                self._remember(self._published_logs, lc)

    def _relative_offset(self, s: _Stream) -> int:
        """Wall-clock offset for a relative-time log (0 for an epoch-stamped one)."""
        st = os.fstat(s.fd)
        tail = os.pread(s.fd, 65536, max(0, st.st_size - 65536))
        lines = [ln for ln in tail.split(b"\n") if ln.strip()]
        try:
            stamp = int(lines[-1].split(b",", 1)[0]) if lines else EPOCH_MS_MIN
        except ValueError:
            return 0
        if stamp >= EPOCH_MS_MIN:
            return 0
        offset = int(st.st_mtime * 1000) - stamp
        log.warning(
            "%s: relative timestamps (log_unix_epoch=0); placed on the wall clock by taking the "
            "file's modification time as the time of its last record (offset %d ms); hosts "
            "cannot be aligned exactly",
            s.path,
            offset,
        )
        return offset

    def _finish(self, s: _Stream, *, deleted: bool = False) -> Iterator[Outgoing]:
        """Flush ``s``'s parser and close it (deleted, quiet after a rename, or final).

        Its fingerprint is kept as a closed stream: finding the file again (renamed back,
        after a restart, or a copy of it) neither resends nor re-counts it.
        """
        if s.parser is not None:
            yield from self._emit(s, s.parser.finish())
            self._collect_problems(s)
        if not s.decided and s.held:
            yield from self._release(s, force=True)
        self._open.pop(s.stream, None)
        self.changes += 1
        r = self._resume(s, s.acked_floor)
        r.gone, r.orphan_until_ms = deleted, None
        self._closed[s.stream] = _Closed(r, s.next_seq, replay=False, seen_at=self._clock())
        os.close(s.fd)

    def _close_quietly(self, s: _Stream, now: float) -> None:
        """Close a quiet stream's descriptor; it is reopened (and re-read) if it changes."""
        self._open.pop(s.stream, None)
        self.changes += 1
        self._closed[s.stream] = _Closed(
            self._resume(s, s.acked_floor), max(s.skip_below, s.next_seq), False, now
        )
        os.close(s.fd)

    def _collect_problems(self, s: _Stream) -> None:
        for p in s.problems.kept:
            _log_problem(p)
        s.problems.kept.clear()  # counts stay: past keep_per_kind a kind is only counted
        for kind, n in s.problems.counts.items():
            new = n - s.counted[kind]
            if new:
                self.stats.problems[kind] = self.stats.problems.get(kind, 0) + new
                s.counted[kind] = n

    def _emit(self, s: _Stream, batch: RecordBatch | None) -> Iterator[Outgoing]:
        if batch is None or not len(batch):
            return
        if not s.decided:  # a hist log: held until it is known whether a stream covers it
            s.held.append(batch)
            yield from self._release(s)
            return
        yield from self._publish(s, batch)

    def _publish(self, s: _Stream, batch: RecordBatch) -> Iterator[Outgoing]:
        # Times the wire cannot carry (a stamp of 18 digits, a relative log placed before
        # 1970) are bad input like any other: counted, never a crash.
        ok = (batch.start_ms >= 0) & (batch.end_ms < MAX_TIME_MS) & (batch.end_ms >= batch.start_ms)
        if not ok.all():
            bad = int((~ok).sum())
            s.problems.report(s.path, 0, "time-range", f"{bad} records with times out of range")
            self._collect_problems(s)
            batch = batch.select(ok)
            if not len(batch):
                return
        if not s.named:
            self._name(s)
        n = len(batch)
        first = s.next_seq
        s.next_seq += n
        self.stats.records_read += n
        if s.next_seq <= s.skip_below:
            self.stats.records_skipped_replay += n
            return
        if first < s.skip_below:
            keep = np.arange(first, first + n) >= s.skip_below
            self.stats.records_skipped_replay += int((~keep).sum())
            batch = batch.select(keep)
            first = s.skip_below
        yield from self._messages(s.stream, first, batch, self._run_of(s))

    def _run_of(self, s: _Stream) -> str | None:
        """The stream's run label: the template with ``{dir}`` filled from its path, once."""
        if self.run is not None and s.run is None:
            s.run = run_label(self.run, s.path)
        return s.run

    def _retire(self, stream: str) -> None:
        """``stream``'s lineage ended: its id is never given to other content (this run)."""
        if len(self._retired) >= MAX_GONE:
            self._retired.clear()  # bounded; a clash then costs only a generation id
        self._retired.add(stream)

    def _name(self, s: _Stream) -> None:
        """Give ``s`` its content id, ``<path>@<digest of its first record's bytes>``.

        Called before its first record goes out. The same file read again from byte 0
        (after its positions were lost) gets the same id, so the aggregator drops what it
        already had as duplicates. An id another lineage holds or held in this run (a
        rewrite with the same first record) is not reused: ``s`` keeps its generation id.
        """
        s.named = True
        try:
            key = _content_key(s.fd, is_json=s.kind == "json")
        except OSError:
            return
        digest = hashlib.blake2b(key, digest_size=8).hexdigest()
        stream = wire_id(f"{s.path}@{digest}")
        if stream in self._open or stream in self._closed or stream in self._retired:
            log.info(
                "%s: its first record matches stream %s, which held other content: "
                "published as stream %s",
                s.path,
                stream,
                s.stream,
            )
            return
        old = s.stream
        del self._open[old]
        s.stream = stream
        self._open[stream] = s
        # The pairing state knows a json+ stream by its id: a renamed live stream must not
        # look ended (it would stop holding the hist logs its next dump may explain).
        if old in self._json_parsers:
            self._json_parsers[stream] = self._json_parsers.pop(old)
        if old in self._json_content:
            self._json_content[stream] = self._json_content.pop(old)
        if old in self._held_content:
            self._held_content[stream] = self._held_content.pop(old)
        self._covered_by = {k: stream if v == old else v for k, v in self._covered_by.items()}
        for o in self._open.values():
            if o.covered_by == old:
                o.covered_by = stream
        self._heads = None  # it listed the provisional id
        self.changes += 1

    def _messages(
        self, stream: str, first: int, batch: RecordBatch, run: str | None = None
    ) -> Iterator[Outgoing]:
        """``batch`` as messages under the size cap, records in order (the wire sizes them)."""
        cap = self.max_message_bytes - PACKET_OVERHEAD
        for part in split(self.agent, stream, first, batch, cap, run=run, latency=self.latency):
            yield Outgoing(stream, part.first_seq, part.records, part.payload)

    # -- state -----------------------------------------------------------------------------

    def _resume(self, s: _Stream, acked: int) -> Resume:
        d = s.declaration()
        until = None
        if s.orphan_since is not None:  # the rest of its grace period, on the wall clock
            left = self.rename_grace_s - (self._clock() - max(s.changed_at, s.orphan_since))
            until = int((self._wall_s() + max(0.0, left)) * 1000)
        return Resume(
            stream=s.stream,
            path=s.path,
            dev=s.dev,
            ino=s.ino,
            length=s.print.length,
            sha1=s.print.hexdigest(),
            records=s.next_seq,
            acked_seq=acked,
            time_offset_ms=s.time_offset_ms,
            covered_by=s.covered_by,
            copy=s.copy_of is not None,
            declares=tuple(sorted(d.names)) if d is not None else (),
            span_ms=(d.first_ms, d.last_ms)
            if d is not None and d.first_ms is not None and d.last_ms is not None
            else None,
            slack_ms=d.slack_ms if d is not None else 0,
            head=s.print.head,
            size=s.size,
            mtime_ns=s.mtime_ns,
            orphan_until_ms=until,
        )

    def state(self, acked: dict[str, int]) -> FollowState:
        """What to save, given the acknowledged sequence number of each stream."""
        out = FollowState(next_generation=self._next_gen)
        for stream, c in self._closed.items():
            r = c.resume
            r.acked_seq = max(r.acked_seq, acked.get(stream, 0))
            out.streams[stream] = r
        for stream, s in self._open.items():
            if s.kind is None and s.print.length == 0:
                continue  # nothing read yet
            out.streams[stream] = self._resume(s, max(s.acked_floor, acked.get(stream, 0)))
        return out

    def streams(self) -> set[str]:
        """Ids of every stream still known (open or closed)."""
        return set(self._open) | set(self._closed)

    def _update_counts(self) -> None:
        self.stats.files_followed = len(self._open)
        self.stats.files_closed = len(self._closed)
        self.stats.logs_held = sum(1 for s in self._open.values() if s.held and not s.decided)

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every descriptor."""
        for s in self._open.values():
            os.close(s.fd)
        self._open.clear()


def run_label(template: str, path: str) -> str:
    r"""The run label of a file at ``path``: ``template`` with ``{dir}`` its folder's name.

    ``{dir:N}`` is the name of the folder N levels above the file's folder (``?`` above the
    path's first folder). Control characters a folder name may hold (a newline) are
    written as ``\xNN``: they would split the table's ``# run:`` line and CSV rows
    downstream.
    """
    folders = os.path.dirname(os.path.abspath(path)).split(os.sep)

    def name(m: re.Match[str]) -> str:
        up = int(m.group(1) or 0)
        folder = folders[-1 - up] if up < len(folders) - 1 else "?"
        return "".join(f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c for c in folder)

    return wire_id(RUN_DIR.sub(name, template))


def _declaration(r: Resume) -> Declaration:
    """A closed json+ stream's declaration, as saved."""
    first, last = r.span_ms if r.span_ms is not None else (None, None)
    return Declaration(r.stream, frozenset(r.declares), first, last, r.slack_ms)


def _content_key(fd: int, *, is_json: bool) -> bytes:
    """The bytes a stream's content id digests: its head through its first record.

    That is the file's start through the end of the first line that ends at least
    ``KEY_MIN`` bytes into the content (a json+ stream's content starts at its first
    document, after any text fio printed before it): a hist log's first record (its
    stamp and bins), a json+ stream's ``timestamp_ms``. Read before the first record goes
    out, when those bytes are in the file; a file shorter than that then (a hist log of
    a few coarse records) uses its complete lines.

    Raises:
        OSError: the file could not be read.
    """
    head = os.pread(fd, KEY_READ, 0)
    anchor = len(head) - len(head.lstrip())
    if is_json and not head.startswith(b"{", anchor):
        brace = head.find(b"\n{")
        anchor = brace + 1 if brace >= 0 else anchor
    end = head.find(b"\n", anchor + KEY_MIN - 1)
    if end < 0:
        end = head.rfind(b"\n")
    return head[: end + 1] if end >= anchor else head


READ_BACK_BYTES = 256 << 20  # how much of a published hist log is read back to pair it


def _read_log_content(
    path: str, offset_ms: int, interval_ms: int | None, max_line_bytes: int
) -> LogContent | None:
    """A hist log's sums, read from its file (None: unreadable or no records)."""
    parser = HistLogParser(
        path,
        options=HistLogOptions(
            interval_ms=interval_ms, time_offset_ms=offset_ms, max_line_bytes=max_line_bytes
        ),
    )
    batches = []
    try:
        with open(path, "rb") as fh:
            while fh.tell() < READ_BACK_BYTES and (chunk := fh.read(READ_BYTES)):
                batches.append(parser.feed(chunk))
    except OSError:
        return None
    batches.append(parser.finish())
    lc = log_content(path, batches, epoch=parser.time_kind == "epoch")
    return None if lc is None else replace(lc, upto=None)


def _fd_path(fd: int) -> str | None:
    """The current name of an open file (Linux), or None."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return None if target.endswith(" (deleted)") else target


def _same_bytes(a: int, b: int, n: int) -> bool:
    """Whether two open files hold the same first ``n`` bytes."""
    pos = 0
    while pos < n:
        step = min(1 << 20, n - pos)
        x, y = os.pread(a, step, pos), os.pread(b, step, pos)
        if x != y or len(x) != step:
            return False
        pos += step
    return n > 0


def _sniff_path(path: str) -> str | None:
    """:func:`_sniff` of a file not held open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _sniff(fd)
    finally:
        os.close(fd)


def _sniff(fd: int) -> Kind | None:
    """``json`` or ``hist`` from a file's first bytes (None while they do not tell)."""
    try:
        head = os.pread(fd, SNIFF_BYTES, 0)
        if len(head) == SNIFF_BYTES and not head_tells_kind(head):
            head = os.pread(fd, TEXT_HEAD_MAX, 0)
    except OSError:
        return None
    return sniff(head) if head_tells_kind(head) or len(head) >= TEXT_HEAD_MAX else None


_BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")


def head_tells_kind(head: bytes) -> bool:
    """Whether a file's first bytes say enough for :func:`fiomon.fio.parsers.sniff` to decide.

    A file still being written may so far hold only blanks, or text fio prints before its
    first json+ document (``note:`` lines on stdout, the ``json+,normal`` header). The
    kind is told once the first non-blank line starts a json document (``{``) or a
    hist-log record (a digit), or once a later line starts a document.
    """
    text = head
    for bom in _BOMS:
        text = text.removeprefix(bom)
    text = text.replace(b"\x00", b"")  # UTF-16: its ASCII is what tells
    body = text.lstrip()
    if not body:
        return False
    if body[:1] == b"{" or body[:1].isdigit():
        return True
    if container(head) != "plain" or fio_log_store(head):
        return True  # compressed: refused (Follower._refuse_packed)
    return b"\n{" in body


def _log_problem(p: Problem) -> None:
    if p.warning:
        log.warning("%s", p)
    else:
        log.warning("skipped: %s", p)
