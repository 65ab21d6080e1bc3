"""Finished fio output files as chunked record sources for the offline report.

A :class:`FileSource` reads one file in chunks of a few MB and feeds the matching parser
(hist log or json+ stream, recognised by content). Its :attr:`FileSource.progress_ms`
says how far in time its records have reached, so the report can read files in step and
close quanta behind the slowest one, keeping memory bounded for runs of any length.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Literal, cast

from fiomon.bins import BinLayout, Unit
from fiomon.errors import ConfigError, FiomonError, InputError, OverlapError
from fiomon.fio.clientlog import ClientLogUndo, client_log_host
from fiomon.fio.decode import InputDecoder
from fiomon.fio.fiojson import JsonSplitter, JsonStatusParser
from fiomon.fio.fiolog import HistLogOptions, HistLogParser, TimeKind
from fiomon.fio.overlap import (
    Declaration,
    LogContent,
    candidates,
    claims,
    is_grouped,
    job_contents,
    log_content,
    mixture_of,
    same_host,
    why_not_covered,
)
from fiomon.fio.parsers import (
    SNIFF_BYTES,
    ClientHistLogParser,
    ParserOptions,
    RecordParser,
    open_parser,
    sniff,
)
from fiomon.fio.problems import ProblemLog
from fiomon.model import DIRECTION_LABELS, LatencyKind, RecordBatch

CHUNK_BYTES = 2 << 20  # 2 MB: ~140 MB peak for 16 files read in step (4 MB: ~215 MB, no faster)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Parsing options shared by all files of a report.

    Args:
        interval_ms: ``log_hist_msec`` of the hist logs, or ``None`` to infer it.
        group_nr: force fio's GROUP_NR.
        unit: force the bin unit of hist logs.
        strict: make the first bad line fatal.
        chunk_bytes: read size.
        skip_jobs: per json+ file, positions of jobs not to read (``--source hist``).
        log_unit: unit of per-I/O latency log values (``us``: fio 2.x logs).
        latency: which latency to read (``--latency``; :mod:`fiomon.offline.kinds`).
    """

    interval_ms: int | None = None
    group_nr: int | None = None
    unit: Unit | None = None
    strict: bool = False
    chunk_bytes: int = CHUNK_BYTES
    skip_jobs: Mapping[str, frozenset[int]] = field(default_factory=dict)
    log_unit: Literal["ns", "us"] = "ns"
    latency: LatencyKind = "clat"


class FileSource:
    """One input file, read in chunks.

    Args:
        path: the file.
        host: host label of its records.
        options: see :class:`SourceOptions`.
    """

    def __init__(self, path: Path, host: str, options: SourceOptions) -> None:
        self.path = path
        self.name = str(path)
        self.problems = ProblemLog(strict=options.strict)
        self.options = options
        self._fh = path.open("rb")
        self.size = path.stat().st_size
        self.bytes_read = 0
        self.done = False
        self.max_end_ms: int | None = None
        # The same head and sniffer as the agent's (blank bytes before a json+ document
        # do not make it a hist log here and a json+ stream there).
        head = self._fh.read(SNIFF_BYTES)
        self._fh.seek(0)
        self.parser: RecordParser = detecting_client_sums(
            open_parser(
                head,
                self.name,
                self.problems,
                ParserOptions(
                    host=host,
                    hist=HistLogOptions(options.interval_ms, options.group_nr, options.unit),
                    json_group_nr=options.group_nr,
                    skip_jobs=options.skip_jobs.get(self.name, frozenset()),
                    latency=options.latency,
                ),
            ),
            self.problems,
        )
        self.kind = self.parser.kind

    @property
    def layout(self) -> BinLayout | None:
        """Bin layout once known."""
        return self.parser.layout

    @property
    def time_kind(self) -> TimeKind | None:
        """``epoch`` or ``relative`` once known (json+ streams are always epoch)."""
        return self.parser.time_kind

    @property
    def slack_ms(self) -> int:
        """How far a later record of this file may start before :attr:`max_end_ms`."""
        return self.parser.slack_ms

    @property
    def refusal(self) -> str | None:
        """Why the file holds no readable histograms (what it is, what fixes it), or None."""
        return self.parser.refusal

    def next_batch(self) -> RecordBatch | None:
        """Parse the next chunk (the final call also finishes the parser).

        A file the parser refuses is not read further.
        """
        if self.done:
            return None
        if self.parser.refusal is not None:
            self.close()
            return None
        chunk = self._fh.read(self.options.chunk_bytes)
        self.bytes_read += len(chunk)
        if chunk:
            batch = self.parser.feed(chunk)
        else:
            self.done = True
            self._fh.close()
            batch = self.parser.finish()
        if batch is not None and len(batch):
            end = int(batch.end_ms.max())
            self.max_end_ms = end if self.max_end_ms is None else max(self.max_end_ms, end)
        return batch

    def batches(self) -> Iterator[RecordBatch]:
        """The non-empty batches still to come, read on demand."""
        while not self.done:
            batch = self.next_batch()
            if batch is not None and len(batch):
                yield batch

    def close(self) -> None:
        """Release the file handle."""
        self.done = True
        self._fh.close()


REFUSED = frozenset({"refused"})  # problem kinds an InputError reports instead


def check_one_clock(kinds: Mapping[str, TimeKind], verb: str = "report") -> None:
    """Refuse epoch-stamped and relative-time inputs together (``kinds``: per input).

    Their quanta, spans and rates would mix two clocks. ``verb`` is the command's ("report",
    "summarize") in the advice to treat them apart.

    Raises:
        FiomonError: both kinds, naming each input's.
    """
    if len(set(kinds.values())) > 1:
        listing = ", ".join(f"{n} ({k})" for n, k in kinds.items())
        msg = (
            f"cannot mix epoch-stamped and relative-time inputs: {listing}; re-run fio "
            f"with log_unix_epoch=1 or {verb} them separately"
        )
        raise FiomonError(msg)


def check_refusals(sources: Sequence[FileSource]) -> None:
    """Raise if any of ``sources`` is fio output that holds no readable histograms.

    Raises:
        InputError: naming each such file, what it is and the fio option that fixes it.
    """
    refusals: dict[str, str] = {}
    for s in sources:
        if s.refusal is not None:
            refusals[s.name] = s.refusal
    if refusals:
        raise InputError(refusals)


def detecting_client_sums(parser: RecordParser, problems: ProblemLog) -> RecordParser:
    """A local-named hist log's parser that also undoes fio --client running sums it shows.

    pbench-fio files the logs of ``fio --client`` without the server's name; their
    records tell (:func:`fiomon.fio.clientlog.looks_like_running_sums`).
    """
    if isinstance(parser, HistLogParser):
        return ClientHistLogParser(parser, ClientLogUndo(parser.source, problems, detect=True))
    return parser


HOST_FROM_HELP = (
    "how a file's host is named: auto (default: the nearest folder level whose names tell "
    "the files' folders apart, e.g. c1 and c2 in c1/results/ and c2/results/, or the level "
    "above sub-folders every host has, c1 for c1/json/ and c1/hist/; with all files in one "
    "folder, the file rule), dir (the file's folder), dir:N (the folder N levels up), "
    "file (the file name without fio's suffix: client-07 from client-07.json and "
    "client-07_clat_hist.1.log, as `fiomon fio` names them; the server from the suffix "
    "fio --client appends: 127.0.0.2 from h_clat_hist.1.log.127.0.0.2, which auto "
    "prefers wherever every file has one), or regex:PATTERN (searched in the path as "
    "given; the group named host, else group 1, else the match)"
)
# fio's hist-log suffix (per job, per_job_logs=0, compressed by fio), its per-I/O
# latency logs' (write_lat_log) and the json+ stream's, with what people add after the
# run: compression, backup and rotation suffixes.
_FIO_SUFFIX = re.compile(
    r"(_(?:clat|lat|slat)(?:_hist)?(?:\.\d+)?\.log(?:\.fz)?|\.json)"
    r"(?:\.(?:gz|bz2|xz|bak|old|orig|\d+))*$"
)


def check_host_from(how: str) -> str:
    """``how`` if it is a ``--host-from`` mode (see :data:`HOST_FROM_HELP`).

    Raises:
        ConfigError: an unknown mode, a level below 1, or a pattern that does not compile.
    """
    if how in ("auto", "dir", "file"):
        return how
    if how.startswith("dir:"):
        if not how[4:].isdigit() or int(how[4:]) < 1:
            msg = f"--host-from {how!r}: the level of dir:N is a whole number >= 1"
            raise ConfigError([msg])
        return how
    if how.startswith("regex:"):
        try:
            re.compile(how[6:])
        except re.error as exc:
            msg = f"--host-from {how!r}: not a regular expression ({exc})"
            raise ConfigError([msg]) from None
        return how
    msg = f"--host-from {how!r}: expected auto, dir, dir:N, file or regex:PATTERN"
    raise ConfigError([msg])


def _from_file(path: Path) -> str:
    client = client_log_host(path)
    if client is not None:  # fio --client names each server's log after that server
        return client
    name = _FIO_SUFFIX.sub("", path.name)
    return name if name and name != path.name else path.stem


def _from_regex(path: Path, pattern: str) -> str:
    m = re.search(pattern, str(path))
    if m is None:
        msg = f"--host-from regex:{pattern}: no host in {path}"
        raise ConfigError([msg])
    if "host" in m.re.groupindex:
        host = m.group("host")
    else:
        host = m.group(1) if m.re.groups else m.group(0)
    if not host:
        msg = f"--host-from regex:{pattern}: an empty host in {path}"
        raise ConfigError([msg])
    return str(host)


def _distinguishing_folders(paths: list[Path]) -> list[str]:
    """The nearest folder level whose names differ between the files' distinct folders."""
    folders = [p.resolve().parent for p in paths]
    distinct = sorted(set(folders))
    for level in range(max(len(f.parts) for f in distinct)):
        names = [(f, *f.parents)[level].name if level <= len(f.parents) else "" for f in distinct]
        if all(names) and len(set(names)) == len(names):
            by_folder = dict(zip(distinct, names, strict=True))
            return [by_folder[f] for f in folders]
    # Each host's results split into the same sub-folders (c1/json, c1/hist, c2/json,
    # c2/hist): the hosts are the level above them.
    for level in range(1, max(len(f.parts) for f in distinct)):
        if any(level > len(f.parents) for f in distinct):
            break
        groups: dict[Path, set[Path]] = {}
        for f in distinct:
            up = f.parents[level - 1]
            groups.setdefault(up, set()).add(f.relative_to(up))
        shapes = list(groups.values())
        if (
            len(groups) >= 2
            and all(up.name for up in groups)
            and len({up.name for up in groups}) == len(groups)
            and all(s == shapes[0] for s in shapes)
        ):
            return [f.parents[level - 1].name for f in folders]
    # No single level tells them apart (c1/x/r, c2/x/r, c1/y/r): their paths below the
    # common ancestor do.
    common = Path(os.path.commonpath(distinct))
    return [str(f.relative_to(common)) for f in folders]


def host_labels(paths: list[Path], how: str = "auto") -> list[str]:
    """Host label per file, by the ``--host-from`` mode ``how`` (see :data:`HOST_FROM_HELP`).

    Raises:
        ConfigError: a bad mode, a file the pattern of ``regex:`` does not match, or one
            without that many folders above it.
    """
    check_host_from(how)
    if how == "auto" and paths and all(client_log_host(p) for p in paths):
        return [_from_file(p) for p in paths]  # fio --client's logs name their servers
    if how == "file" or (how == "auto" and len({p.resolve().parent for p in paths}) <= 1):
        return [_from_file(p) for p in paths]
    if how == "auto":
        return _distinguishing_folders(paths)
    if how.startswith("regex:"):
        return [_from_regex(p, how[6:]) for p in paths]
    level = int(how[4:]) if how.startswith("dir:") else 1
    out = []
    for p in paths:
        parents = p.resolve().parents
        if level > len(parents) or not parents[level - 1].name:
            msg = f"--host-from {how}: {p} has no folder {level} level(s) up"
            raise ConfigError([msg])
        out.append(parents[level - 1].name)
    return out


SourceChoice = Literal["json", "hist", "both", "iolog"]
SOURCE_HELP = {
    "json": "the json+ status streams (what the agent publishes live; they hold each "
    "job's last partial interval)",
    "hist": "the hist logs (a record every log_hist_msec; fio never writes a job's last "
    "partial interval to them)",
    "both": "count both anyway (every I/O of those jobs twice)",
    "iolog": "only the per-I/O latency logs (write_lat_log with log_avg_msec=0: exact "
    "values; the default when they are given with the hist logs or json+ streams of the "
    "same jobs, which are then left out)",
}
_DECLARATION_BYTES = 64 << 20  # how far into a json+ file its first document may end
_BEYOND_DUMP_MS = 2_000  # a claimed log's records this far past its stream's last dump
_SPOOL_BYTES = 64 << 20  # a decoded json+ file held in memory for pairing, at most
_TAIL_BYTES = 4 << 20  # how much of a file's end is read for its last time stamp
_TS_RE = re.compile(rb'"timestamp_ms"\s*:\s*(\d{1,16})')


@dataclass(frozen=True, slots=True)
class _JsonInput:
    """What a json+ file says about the hist logs of its jobs."""

    path: Path
    declaration: Declaration
    ios_without_bins: int = 0  # I/Os its last dump counts in sections without bins


def _ios_without_bins(doc: dict[str, Any]) -> int:
    """I/Os a dump's jobs count (``total_ios``) in direction sections that carry no bins."""
    jobs = doc.get("jobs")
    n = 0
    for job in jobs if isinstance(jobs, list) else []:
        if not isinstance(job, dict):
            continue
        for label in DIRECTION_LABELS:
            sec = job.get(label)
            if not isinstance(sec, dict):
                continue
            ios = sec.get("total_ios")
            lat = sec.get("clat_ns") if isinstance(sec.get("clat_ns"), dict) else {}
            binned = isinstance(lat, dict) and isinstance(lat.get("bins"), dict)
            if isinstance(ios, int) and not isinstance(ios, bool) and ios > 0 and not binned:
                n += ios
    return n


def _json_input(path: Path, host: str) -> _JsonInput:
    """Declarations from a json+ file's first document; its jobs' bins from its last."""
    parser = JsonStatusParser(str(path), problems=ProblemLog())
    splitter = JsonSplitter(str(path), parser.problems, max_document_bytes=_DECLARATION_BYTES)
    with _decoded(path) as fh:
        read = 0
        found = False
        while not found and read < _DECLARATION_BYTES and (chunk := fh.read(CHUNK_BYTES)):
            read += len(chunk)
            for doc in splitter.feed(chunk):
                parser._note_declarations(doc)
                found = True
                break
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - _TAIL_BYTES))
        stamps = _TS_RE.findall(fh.read())
        last = _last_document(fh, size)
    d = parser.declaration(str(path))
    if stamps and d.first_ms is not None:
        d = replace(d, last_ms=max(int(stamps[-1]), d.last_ms or 0))
    if last is not None:
        ts = last.get("timestamp_ms")
        d = replace(
            d,
            jobs=job_contents(last),
            at_ms=ts if isinstance(ts, int) else None,
            grouped=is_grouped(last),
        )
    plain = 0 if last is None else _ios_without_bins(last)
    return _JsonInput(path, replace(d, host=host, stem=_from_file(path)), plain)


_DOC_OR_RUNTIME = re.compile(rb'\n\{|"job_runtime"\s{0,8}:\s{0,8}(\d{1,16})(?=\D)')
_MAX_RUNS = 64  # earlier runs of one appended json+ file compared, at most


def _beyond_their_stream(
    logs: Sequence[LogContent],
    claimed: Mapping[str, tuple[str, frozenset[int]]],
    decls: Sequence[Declaration],
) -> list[tuple[str, str]]:
    """Claimed logs whose records run on past their stream's last dump (log, stream).

    fio writes a finished run's last dump after its jobs' last hist-log records, so a log
    reaching :data:`_BEYOND_DUMP_MS` past it holds I/Os of another run appended to it (or
    fio was killed before its last dump: refusing ``--source hist`` then is cautious).
    """
    by_stream = {d.stream: d for d in decls}
    out = []
    for c in logs:
        if c.path not in claimed or c.end_ms is None:
            continue
        d = by_stream.get(claimed[c.path][0])
        if d is None or d.at_ms is None:
            continue
        if c.end_ms > d.at_ms + _BEYOND_DUMP_MS:
            out.append((c.path, d.stream))
    return out


def _earlier_runs(path: Path, base: Declaration) -> list[Declaration]:
    """Each earlier run's final jobs in a json+ file that fio runs appended to (``>>``).

    A run starts where the first job's ``job_runtime`` goes down; the document before is
    that run's last dump (its jobs' final bins). Found by a scan of the text, and only
    those documents decoded.
    """
    ends: list[tuple[int, int]] = []
    with _decoded(path) as fh:
        cur: int | None = 0 if fh.read(1) == b"{" else None
        fh.seek(0)
        prev: int | None = None
        cur_rt: int | None = None
        prev_rt: int | None = None
        origin, data = 0, b""
        while len(ends) < _MAX_RUNS:
            chunk = fh.read(CHUNK_BYTES)
            data += chunk
            limit = len(data) if not chunk else max(0, len(data) - 64)
            keep = max(0, limit - 64)
            for m in _DOC_OR_RUNTIME.finditer(data, 0, limit):
                keep = max(keep, m.end())
                if m.group(1) is None:
                    prev, prev_rt = cur, cur_rt
                    cur, cur_rt = origin + m.start() + 1, None
                elif cur_rt is None:
                    cur_rt = int(m.group(1))
                    restarted = prev_rt is not None and cur_rt < prev_rt
                    if restarted and prev is not None and cur is not None:
                        ends.append((prev, cur))  # the first job's runtime went down: a new run
            if not chunk:
                break
            origin += keep
            data = data[keep:]
        out = []
        for k, (start, end) in enumerate(ends):
            if end - start > _DECLARATION_BYTES:
                continue
            fh.seek(start)
            try:
                doc = json.loads(fh.read(end - start).decode("utf-8", errors="replace"))
            except (ValueError, RecursionError):
                continue
            if not isinstance(doc, dict):
                continue
            jobs = job_contents(doc)
            ts = doc.get("timestamp_ms")
            if not jobs or not isinstance(ts, int) or isinstance(ts, bool):
                continue
            first = ts - max(j.runtime_ms for j in jobs)
            out.append(
                replace(
                    base,
                    stream=f"{base.stream}, run {k + 1}",
                    names=base.names | {j.name for j in jobs},
                    first_ms=first,
                    last_ms=ts,
                    jobs=jobs,
                    at_ms=ts,
                    grouped=is_grouped(doc),
                )
            )
    return out


_COPY_HEAD_BYTES = 1 << 20  # decoded bytes compared to tell a copy of another input


def _content_key(path: Path) -> bytes | None:
    """A digest of the first :data:`_COPY_HEAD_BYTES` of ``path``'s decoded content.

    Decoded, so that ``out.json.gz`` (``gzip -k``) and ``out.json`` give the same key.
    None: unreadable, or blank (nothing to count twice).
    """
    try:
        with path.open("rb") as fh:
            raw = fh.read(_COPY_HEAD_BYTES)
            dec = InputDecoder(raw)
            if not dec.needed:
                head = raw
            else:
                out = bytearray()
                chunk = raw
                while chunk and len(out) < _COPY_HEAD_BYTES:
                    for piece in dec.feed(chunk):
                        out += piece
                    chunk = fh.read(CHUNK_BYTES) if len(out) < _COPY_HEAD_BYTES else b""
                if not chunk:
                    for piece in dec.finish():
                        out += piece
                head = bytes(out[:_COPY_HEAD_BYTES])
    except OSError:
        return None
    if not head.strip():
        return None
    return hashlib.blake2b(head, digest_size=16).digest()


def _distinct_content(paths: list[Path], notes: list[str]) -> list[Path]:
    """``paths`` less the copies of an earlier one (same decoded content), with a warning.

    A backup (``out.json.bak``), a file compressed beside its original (``gzip -k``) or a
    log filed twice (fio's suffixed name and pbench's ``clients/<server>/`` copy) holds
    the same I/Os as the file it copies: reading both counts them twice. Files are the
    same when their first MiB of decoded content is (stamps and histograms make different
    fio outputs differ within their first line); the first one given is read.
    """
    seen: dict[bytes, Path] = {}
    out = []
    for p in paths:
        key = _content_key(p)
        first = seen.setdefault(key, p) if key is not None else p
        if first is p:
            out.append(p)
        else:
            notes.append(
                f"warning: {p} holds the same content as {first} (a copy, a backup or the "
                "same file compressed): read once"
            )
    return out


def _decoded(path: Path) -> BinaryIO:
    """``path`` opened as UTF-8 bytes: compressed or UTF-16 files decoded first.

    The pairing reads a json+ file's first and last documents, seeking to its end; a
    compressed or re-encoded file cannot seek, so it is decoded once into a temporary file
    (in memory up to :data:`_SPOOL_BYTES`, on disk beyond). Plain files open as they are.
    """
    fh = path.open("rb")
    head = fh.read(SNIFF_BYTES)
    fh.seek(0)
    dec = InputDecoder(head)
    if not dec.needed:
        return fh
    out = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115 -- returned
    with fh:
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            for piece in dec.feed(chunk):
                out.write(piece)
        for piece in dec.finish():
            out.write(piece)
    out.seek(0)
    return cast("BinaryIO", out)


def _last_document(fh: BinaryIO, size: int) -> dict[str, Any] | None:
    """The last complete JSON document of a json+ file (its jobs' final bins), or None.

    Read from the end, in growing pieces: a document starts at a line that opens with
    ``{`` (fio writes each at the start of a line).
    """
    decoder = json.JSONDecoder()
    want = _TAIL_BYTES
    while True:
        start = max(0, size - want)
        fh.seek(start)
        text = fh.read(size - start).decode("utf-8", errors="replace")
        pos = len(text)
        while (pos := text.rfind("{", 0, pos)) >= 0:
            if pos and text[pos - 1] != "\n":
                continue
            try:
                doc, _ = decoder.raw_decode(text, pos)
            except (ValueError, RecursionError):
                continue
            if isinstance(doc, dict) and (
                isinstance(doc.get("jobs"), list) or isinstance(doc.get("client_stats"), list)
            ):
                return doc
        if start == 0 or want >= _DECLARATION_BYTES:
            return None
        want *= 4


def _log_content(path: Path, host: str) -> LogContent | None:
    """A hist log's summed histogram, read as the report reads it (client sums undone)."""
    problems = ProblemLog()
    try:
        with path.open("rb") as fh:
            head = fh.read(SNIFF_BYTES)
            if sniff(head) != "hist":
                return None
            parser = detecting_client_sums(open_parser(head, str(path), problems), problems)
            fh.seek(0)
            batches = [parser.feed(chunk) for chunk in iter(lambda: fh.read(CHUNK_BYTES), b"")]
    except OSError:
        return None
    batches.append(parser.finish())
    epoch = parser.time_kind == "epoch"
    return log_content(str(path), batches, epoch=epoch, host=host)


def _host_folders(paths: Sequence[Path]) -> list[str]:
    """Each file's folder, resolved: the host identity pairing compares (rule b)."""
    out = []
    for p in paths:
        try:
            out.append(str(p.resolve().parent))
        except (OSError, RuntimeError):
            out.append(str(p.parent))
    return out


def choose_sources(
    paths: Sequence[Path], choice: SourceChoice | None
) -> tuple[list[Path], list[str], dict[str, frozenset[int]]]:
    """The inputs to read, so that no I/O is counted twice (:mod:`fiomon.fio.overlap`).

    Args:
        paths: the files given, in order.
        choice: which view to keep where a json+ stream and hist logs describe the same
            jobs; None when the user did not say.

    Returns:
        The paths to read (in the given order, each file once), notes for the user, and
        per json+ file the positions of jobs not to read (``--source hist``: the jobs
        whose hist logs are given; the stream's other jobs still count).

    Raises:
        OverlapError: both views of the same jobs were given and ``choice`` is None.
    """
    unique: list[Path] = []
    seen: dict[tuple[int, int], Path] = {}
    notes: list[str] = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            unique.append(p)  # reported as unreadable by the command itself
            continue
        first = seen.setdefault((st.st_dev, st.st_ino), p)
        if first is p:
            unique.append(p)
        else:
            notes.append(f"warning: {p} is {first} again: read once")
    unique = _distinct_content(unique, notes)
    folders = dict(zip(map(str, unique), _host_folders(unique), strict=True))
    json_inputs: list[_JsonInput] = []
    for p in unique:
        try:
            with p.open("rb") as fh:
                is_json = sniff(fh.read(SNIFF_BYTES)) == "json"
        except OSError:
            continue
        if is_json:
            json_inputs.append(_json_input(p, folders[str(p)]))
    decls = [j.declaration for j in json_inputs]
    json_paths = {j.path for j in json_inputs}
    logs = [
        c
        for p in unique
        if p not in json_paths
        and any(d.jobs and d.names_log(str(p)) for d in decls)
        and (c := _log_content(p, folders[str(p)])) is not None
    ]
    claimed = claims(logs, decls)
    runs: dict[str, list[str]] = {str(j.path): [j.declaration.stream] for j in json_inputs}
    run_of = {j.declaration.stream: str(j.path) for j in json_inputs}
    loose = [c for c in logs if c.path not in claimed]
    if loose:  # fio runs appended to one json+ file (>>): each run's last dump compared
        more: list[Declaration] = []
        for i, j in enumerate(json_inputs):
            d = j.declaration
            if not d.jobs or not any(
                any(x is d for x in candidates(c, decls, logs)) for c in loose
            ):
                continue
            earlier = _earlier_runs(j.path, d)
            if earlier:  # the last run's time starts at its own first dump
                end = d.at_ms if d.at_ms is not None else d.last_ms
                start = None if end is None else end - max(job.runtime_ms for job in d.jobs)
                decls[i] = replace(d, first_ms=start)
            for r in earlier:
                more.append(r)
                runs[str(j.path)].append(r.stream)
                run_of[r.stream] = str(j.path)
        if more:
            decls = decls + more
            claimed = claims(logs, decls)
    covered: dict[str, list[Path]] = {}
    held: dict[str, set[int]] = {}
    for p in unique:
        if str(p) in claimed:
            by, positions = claimed[str(p)]
            covered.setdefault(run_of.get(by, by), []).append(p)
            held.setdefault(by, set()).update(positions)
    plain: set[str] = set()  # streams without bins whose jobs' hist logs are given
    for j in json_inputs:
        d = j.declaration
        if d.names and not d.jobs and j.ios_without_bins:
            own = [
                p
                for p in unique
                if p not in json_paths
                and d.names_log(str(p))
                and same_host(d.host, folders[str(p)])
            ]
            if own:
                plain.add(d.stream)
                notes.append(
                    f"note: {d.stream}: its jobs' {j.ios_without_bins} I/Os carry no "
                    "histogram bins (plain json, not json+): not read; they are counted from "
                    f"their {len(own)} hist log(s) given beside it"
                )
    mixtures: dict[str, tuple[str, ...]] = {}  # log -> the streams that hold it together
    for c in logs:
        if c.path in claimed:
            continue
        mixture = mixture_of(c, decls)
        if mixture:
            mixtures[c.path] = tuple(dict.fromkeys(run_of.get(m, m) for m in mixture))
        else:
            notes.append(
                f"note: {c.path} is read as I/Os of its own: no json+ stream given holds "
                f"them ({why_not_covered(c, decls, logs)})"
            )
    if plain:
        unique = [p for p in unique if str(p) not in plain]
    if mixtures and choice == "hist":
        msg = (
            "--source hist cannot be exact here: these hist logs hold the I/Os of several "
            "json+ streams at once (runs at the same time writing one log, per_job_logs=0), "
            "and a log cannot be split between them:\n"
            + "\n".join(f"  {log} (held by {', '.join(bys)})" for log, bys in mixtures.items())
            + "\nUse --source json, or give each run's files on their own"
        )
        raise OverlapError(msg)
    if mixtures and choice == "json":
        notes.append(
            f"--source json: not reading {len(mixtures)} hist log(s) that several json+ "
            f"streams hold together: {', '.join(mixtures)}"
        )
        unique = [p for p in unique if str(p) not in mixtures]
    if mixtures and choice is None:
        for log, bys in mixtures.items():
            covered.setdefault(" + ".join(bys), []).append(Path(log))
    if not covered or choice == "both":
        if covered:
            n = sum(len(v) for v in covered.values())
            notes.append(
                f"warning: --source both: {n} hist logs and the json+ streams that cover "
                "them are both counted (every I/O of those jobs twice)"
            )
        return unique, notes, {}
    if choice is None:
        lines = []
        for by, hist in covered.items():
            names = ", ".join(str(h) for h in hist[:4]) + (" ..." if len(hist) > 4 else "")
            lines.append(f"  {by} and {len(hist)} hist log(s): {names}")
        options = "\n".join(f"  --source {k:<5} {v}" for k, v in SOURCE_HELP.items())
        msg = (
            "these inputs describe the same I/Os twice: a json+ status stream and hist logs "
            "of its jobs (same host folder or a sibling folder, a write_hist_log name it "
            "declares, its time, and its jobs' bins hold the logs' counts):\n"
            + "\n".join(lines)
            + f"\nChoose one view:\n{options}"
        )
        raise OverlapError(msg)
    beyond = _beyond_their_stream(logs, claimed, decls)
    if choice == "hist" and beyond:
        msg = (
            "--source hist cannot be exact here: these hist logs hold I/Os after the last "
            "dump of the json+ stream that holds their first part (fio runs appended to one "
            "log: per_job_logs=0 or a re-run), which another stream given may hold too:\n"
            + "\n".join(f"  {log} (first part: {by})" for log, by in beyond)
            + "\nUse --source json, or give each run's files on their own"
        )
        raise OverlapError(msg)
    if choice == "json":
        drop = {str(h) for hist in covered.values() for h in hist}
        for log, by in beyond:
            notes.append(
                f"warning: --source json: not reading {log}, whose first part {by} holds; "
                "its later records (another run appended to it) count only through their "
                "own json+ stream, if it is given"
            )
        notes.append(f"--source json: not reading {len(drop)} hist log(s) the json+ streams cover")
        return [p for p in unique if str(p) not in drop], notes, {}
    skips: dict[str, frozenset[int]] = {}
    dropped: list[str] = []
    kept: set[str] = set()
    for j in json_inputs:
        streams = runs[str(j.path)]
        skip = frozenset.intersection(*(frozenset(held.get(r, ())) for r in streams))
        partial = [
            p for p, (by, positions) in claimed.items() if by in streams and not positions <= skip
        ]
        if partial:  # runs appended to one file: a job is skipped only if every run has its log
            kept.update(partial)
            notes.append(
                f"--source hist: {j.path} holds {len(streams)} fio runs appended to it; "
                f"jobs without a hist log in every run are read from it: not reading "
                f"{len(partial)} hist log(s) of those jobs"
            )
        if not skip:
            continue
        jobs = {job.position for job in j.declaration.jobs}
        if skip >= jobs:
            dropped.append(str(j.path))
        elif any(job.server is not None for job in j.declaration.jobs):
            # a fio --client stream is read whole: its covered logs are left out instead
            kept.update(str(h) for h in covered[str(j.path)])
            notes.append(
                f"--source hist: {j.path} (fio --client) has jobs without hist logs and "
                f"is read whole: not reading the {len(covered[str(j.path)])} hist log(s) it covers"
            )
        else:
            skips[str(j.path)] = skip
            notes.append(
                f"--source hist: {j.path}: not reading {len(skip)} of its "
                f"{len(jobs)} jobs (their hist logs are given)"
            )
    if dropped:
        notes.append(
            f"--source hist: not reading {len(dropped)} json+ stream(s): {', '.join(dropped)}"
        )
    return [p for p in unique if str(p) not in set(dropped) | kept], notes, skips
