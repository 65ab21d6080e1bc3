"""fio ``--output-format=json+ --status-interval=N`` streams to :class:`RecordBatch` records.

fio appends one full JSON document per status interval; the file as a
whole is not JSON. Each job's ``clat_ns.bins`` maps bin *midpoints* (ns) to counts that are
*cumulative* since the job started. So:

* :class:`JsonSplitter` cuts the stream into documents incrementally, waits for a
  half-written last document, and skips text between documents (fio's notes, its
  normal output with ``--output-format=json+,normal``: one warning per file);
* :class:`JsonStatusParser` maps midpoints back to fio bin indices (``plat_val_to_idx``) and
  differences successive dumps per job and direction. The record of dump ``k`` covers
  ``(timestamp_ms[k-1], timestamp_ms[k]]``; the first dump of a job covers its
  ``job_runtime``. A count that decreases means the job restarted (a new run writing the
  same file): a new stream begins, whose first record is the new cumulative histogram.
  The final dump at exit carries the partial last interval that hist logs never write.

Jobs are identified by position in ``jobs`` and name, since ``numjobs`` repeats names.

Directions are the job's ``read``, ``write`` and ``trim`` sections, or its ``mixed``
section (``unified_rw_reporting=1``: :attr:`Direction.MIXED`); with
``unified_rw_reporting=both`` a job has all four and ``mixed``, their sum, is ignored. A
file whose sections count I/Os but carry no bins (plain ``--output-format=json``) gives no
records and is refused (:attr:`JsonStatusParser.refusal`, with its number of I/Os).

The latency kind (:data:`~fiomon.model.LatencyKind`) picks the bins read: ``clat_ns``
(completion latency, always written by json+), ``lat_ns`` (total latency: fio 3.33 writes
its bins only with ``lat_percentiles=1``) or ``slat_ns`` (submission latency: only with
``slat_percentiles=1``, and only asynchronous engines such as libaio or io_uring record it;
psync's ``slat_ns`` has ``N`` 0). The same options give the bins in every
``--status-interval`` dump. A direction that did I/O without that kind's bins is counted
as :attr:`JsonStatusParser.ios_without_bins`, and a file with none is refused naming the
fio option that writes them (never another kind's bins in their place).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout, plat_val_to_idx
from fiomon.fio.overlap import MIN_SLACK_MS, Declaration, prefix_name
from fiomon.fio.problems import ProblemLog
from fiomon.model import DIRECTION_LABELS, Direction, LatencyKind, RecordBatch, StreamInfo

MAX_DOCUMENT_BYTES = 256 << 20  # a json+ dump of 1000 jobs is a few tens of MB
_MAX_TEXT_LINE = 64 << 10  # an unfinished line of text held back for its end


class JsonSplitter:
    """Incremental splitter of concatenated JSON documents.

    Args:
        source: name used in messages.
        problems: where skipped text (one warning), broken and oversized documents are
            reported.
        max_document_bytes: a pending document larger than this is dropped (reported), so a
            stream that never closes its braces cannot grow memory without bound.
    """

    def __init__(
        self,
        source: str,
        problems: ProblemLog,
        max_document_bytes: int = MAX_DOCUMENT_BYTES,
    ) -> None:
        self.source = source
        self.problems = problems
        self.max_document_bytes = max_document_bytes
        self._buf = ""
        self._pending = b""
        self._decoder = json.JSONDecoder()
        self.documents = 0
        self.text_blocks = 0  # stretches of text skipped between documents
        self._line = 1
        self._text_end = 0
        self._at_start = True

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        """Yield each document completed by ``data``."""
        raw = self._pending + data
        # Keep an incomplete UTF-8 sequence at the end for the next call.
        text = raw.decode("utf-8", errors="ignore")
        used = len(text.encode("utf-8"))
        self._pending = raw[used:] if used < len(raw) and len(raw) - used < 4 else b""
        if used < len(raw) and not self._pending:
            self.problems.report(self.source, self._line, "encoding", "bytes that are not UTF-8")
        if self._at_start and text:
            self._at_start = False
            text = text.removeprefix("\ufeff")  # a UTF-8 BOM (fiomon.fio.decode drops it too)
        self._buf += text
        yield from self._drain(final=False)

    def finish(self) -> Iterator[dict[str, Any]]:
        """End of input: a document still incomplete is reported as truncated."""
        yield from self._drain(final=True)
        self._buf = ""

    def _next_document(self, buf: str, pos: int, *, final: bool) -> int:
        """Where the next document starts from ``pos`` (-1: none in ``buf`` yet).

        Text before it (fio's ``note:`` lines, its normal report with
        ``--output-format=json+,normal``) is skipped: it holds no records, so it is one
        warning for the whole file (:attr:`text_blocks` counts the stretches). Within
        text, only a ``{`` that opens a line starts a document; an incomplete last line
        of text waits for the rest (at most :data:`_MAX_TEXT_LINE` characters).
        """
        start = buf.find("{", pos)
        if start >= 0 and buf[pos:start].strip():
            line_start = buf.rfind("\n", pos, start) + 1
            if buf[max(pos, line_start) : start].strip():
                nxt = buf.find("\n{", start)  # a brace inside a line of text
                start = -1 if nxt < 0 else nxt + 1
        if start >= 0:
            text_end = start
        elif final:
            text_end = len(buf)
        else:
            text_end = max(pos, buf.rfind("\n", pos) + 1)
            if len(buf) - text_end > _MAX_TEXT_LINE:
                text_end = len(buf)
        skipped = buf[pos:text_end]
        if skipped.strip():
            self.text_blocks += 1
            if self.text_blocks == 1:
                self.problems.warn(
                    self.source,
                    self._line,
                    "text",
                    "text around the JSON documents skipped (fio's notes or normal output, "
                    f"e.g. --output-format=json+,normal): {skipped.strip()[:60]!r}",
                )
        self._line += skipped.count("\n")
        self._text_end = text_end
        return start

    def _drain(self, *, final: bool) -> Iterator[dict[str, Any]]:
        pos = 0
        buf = self._buf
        while True:
            start = self._next_document(buf, pos, final=final)
            if start < 0:
                pos = self._text_end
                break
            try:
                doc, end = self._decoder.raw_decode(buf, start)
            except RecursionError:
                # Nesting deeper than the interpreter's stack: hostile or broken, not fio.
                self.problems.report(
                    self.source, self._line, "json", "invalid JSON document: nested too deeply"
                )
                pos = self._skip_document(buf, start)
                continue
            except json.JSONDecodeError as exc:
                incomplete = exc.pos >= len(buf) - 1 or (
                    exc.msg.startswith("Unterminated string") and '"' not in buf[exc.pos + 1 :]
                )
                if incomplete and not final and _held_bytes(buf, start) <= self.max_document_bytes:
                    pos = start  # wait for the rest of this document
                    break
                if incomplete and final:
                    self.problems.report(
                        self.source,
                        self._line,
                        "truncated",
                        "last JSON document is incomplete (fio still writing?)",
                    )
                    pos = len(buf)
                    break
                # A broken (or oversized) document: skip to the next line that opens one.
                reason = (
                    f"JSON document over {self.max_document_bytes} bytes"
                    if incomplete
                    else f"invalid JSON document: {exc.msg}"
                )
                self.problems.report(self.source, self._line, "json", reason)
                pos = self._skip_document(buf, start)
                continue
            except ValueError as exc:  # e.g. an integer of more than 4300 digits
                self.problems.report(
                    self.source, self._line, "json", f"invalid JSON document: {exc}"[:200]
                )
                pos = self._skip_document(buf, start)
                continue
            self._line += buf.count("\n", start, end)
            pos = end
            if isinstance(doc, dict):
                self.documents += 1
                yield doc
            else:
                self.problems.report(self.source, self._line, "json", "JSON value is not an object")
        self._buf = buf[pos:]

    def _skip_document(self, buf: str, start: int) -> int:
        """Where to go on after a broken document at ``start``: the next line opening one."""
        nxt = buf.find("\n{", start + 1)
        cut = len(buf) if nxt < 0 else nxt + 1
        self._line += buf.count("\n", start, cut)
        return cut


@dataclass(slots=True)
class _JobState:
    stream: StreamInfo
    restarts: int = 0
    last_ts: int | None = None
    cum: dict[int, npt.NDArray[np.int64]] = field(default_factory=dict)
    bytes_: dict[int, int] = field(default_factory=dict)
    active: set[int] = field(default_factory=set)


class JsonStatusParser:
    """Turns json+ status documents into interval records.

    Args:
        source: name used in messages and stream ids (usually the path).
        host: host label of the records.
        layout: fio 3 layout of the json+ bins (GROUP_NR 29 unless fio was rebuilt).
        problems: where bad documents are reported.
        skip_jobs: positions of jobs not to read.
        latency: which latency's bins to read (``clat``, ``lat`` or ``slat``).
    """

    def __init__(
        self,
        source: str,
        *,
        host: str = "",
        layout: BinLayout | None = None,
        problems: ProblemLog | None = None,
        skip_jobs: frozenset[int] = frozenset(),
        latency: LatencyKind = "clat",
    ) -> None:
        if latency not in _LATENCY_KEYS:
            msg = f"latency kind {latency!r}: expected clat, lat or slat"
            raise ValueError(msg)
        self.source = source
        self.latency: LatencyKind = latency
        self._key = _LATENCY_KEYS[latency]
        self.host = host
        self.layout = layout or BinLayout()
        self.problems = problems if problems is not None else ProblemLog()
        self.splitter = JsonSplitter(source, self.problems)
        self.skip_jobs = skip_jobs
        self._jobs: dict[tuple[int, str], _JobState] = {}
        self._index_cache: dict[str, int] = {}
        self.records = 0
        self.hist_names: set[str] = set()  # hist-log name prefixes its jobs write
        self.job_prefixes: dict[int, str] = {}  # job position -> its hist-log name prefix
        self.first_ms: int | None = None  # earliest time its I/Os cover
        self.last_ms: int | None = None  # its last dump
        self._interval_ms = 0  # largest spacing of dumps seen
        self._no_bins: dict[tuple[str, str], int] = {}  # (job, direction) -> total_ios
        self._other_bins: set[LatencyKind] = (
            set()
        )  # other kinds' bins where this kind's are missing
        self._told_no_bins = False
        self._client_unplaced = 0  # fio --client entries with no runtime at all
        self._finished = False
        # The latest document, and a hook called with each before its records are made
        # (the agent's pairing reads each job's cumulative bins and may add skip_jobs).
        self.last_document: dict[str, Any] | None = None
        self.on_document: Callable[[dict[str, Any]], None] | None = None

    kind: Literal["json"] = "json"  # fiomon.fio.parsers.RecordParser
    slack_ms = 0  # dumps come in time order

    @property
    def time_kind(self) -> Literal["epoch"] | None:
        """json+ stamps are always epoch (None until records came)."""
        return "epoch" if self.records else None

    def declaration(self, stream: str) -> Declaration:
        """What this stream says about the hist logs of its jobs (:mod:`fiomon.fio.overlap`)."""
        return Declaration(
            stream,
            frozenset(self.hist_names),
            self.first_ms,
            self.last_ms,
            max(MIN_SLACK_MS, 3 * self._interval_ms),
        )

    def _note_declarations(self, doc: dict[str, Any]) -> None:
        """Remember the hist logs the document's jobs write, and the time it covers.

        fio lists command-line and ``[global]`` options under ``global options`` and a
        job's own under its ``job options``; a bare ``write_hist_log`` names the logs after
        the job. The hist logs of those jobs describe the same I/Os as this stream.
        """
        glob_opts = doc.get("global options")
        default = glob_opts.get("write_hist_log") if isinstance(glob_opts, dict) else None
        jobs = doc.get("jobs")
        ts = doc.get("timestamp_ms")
        client = _client_view(doc)
        if client is not None:  # fio --client: one document, entries per interval
            ts, jobs = client.end_ms, [e for s in client.slots for e, _ in s.entries[-1:]]
        for pos, job in enumerate(jobs if isinstance(jobs, list) else []):
            if not isinstance(job, dict) or len(self.hist_names) >= _MAX_PREFIXES:
                continue
            own = job.get("job options")
            prefix = own.get("write_hist_log") if isinstance(own, dict) else None
            prefix = prefix if isinstance(prefix, str) else default
            name = job.get("jobname")
            if isinstance(prefix, str) and 0 < len(prefix) <= 4096:
                hist_name = prefix_name(prefix)
            elif isinstance(name, str) and 0 < len(name) <= 4096:
                hist_name = name  # fio's default hist log name
            else:
                continue
            self.hist_names.add(hist_name)
            if client is None:  # client logs are numbered per server: no job mapping
                self.job_prefixes[pos] = hist_name
            runtime = _job_span_ms(job)
            if _is_int(ts, _MAX_MS) and runtime is not None:
                start = ts - runtime
                self.first_ms = start if self.first_ms is None else min(self.first_ms, start)
        if _is_int(ts, _MAX_MS):
            if self.last_ms is not None and ts > self.last_ms:
                self._interval_ms = max(self._interval_ms, min(ts - self.last_ms, 600_000))
            self.last_ms = ts if self.last_ms is None else max(self.last_ms, ts)

    @property
    def dump_interval_ms(self) -> int:
        """The largest spacing of its dumps' ``timestamp_ms`` seen, in ms (0: one dump so far)."""
        return self._interval_ms

    def feed(self, data: bytes) -> RecordBatch | None:
        """Records of every document completed by ``data`` (``None`` if there are none)."""
        return self._collect(self.splitter.feed(data))

    def finish(self) -> RecordBatch | None:
        """End of input; reports a truncated last document, and a file held no histograms."""
        out = self._collect(self.splitter.finish())
        self._finished = True
        if self.splitter.documents == 0 and self.splitter.text_blocks:
            self.problems.report(self.source, 0, "refused", _TEXT_ONLY)
        elif self.splitter.documents == 0:
            self.problems.warn(self.source, 0, "empty", "no fio JSON status documents")
        elif self._no_bins and self.records:
            self.problems.report(
                self.source,
                0,
                "no-bins",
                f"{self.ios_without_bins} I/Os in job sections without {self._key} bins "
                f"not counted ({_WRITES_BINS[self.latency]})",
            )
        return out

    @property
    def ios_without_bins(self) -> int:
        """I/Os (fio's ``total_ios``, last seen per job and direction) without bins."""
        return sum(self._no_bins.values())

    @property
    def refusal(self) -> str | None:
        """Why this file gives no records though it is fio output (None: it does, or is empty).

        Plain ``--output-format=json`` holds I/O counts but no histograms; fio's normal
        (text) output holds no JSON at all. Known once the file is finished (the count of
        I/Os is the final one).
        """
        if self.records or not self._finished:
            return None  # (the agent is told at once, by a ``refused`` problem)
        if self._no_bins:
            return self._no_bins_reason()
        if self._client_unplaced:
            return _CLIENT_SKIPS["no-runtime"].format(n=self._client_unplaced)
        if self.splitter.documents == 0 and self.splitter.text_blocks:
            return _TEXT_ONLY
        return None

    def _note_no_bins(self, state: _JobState, ios: dict[int, int], line: int) -> None:
        """Remember a job's I/O counts without bins; tell at once if none had bins so far."""
        for d, n in ios.items():
            if len(self._no_bins) < _MAX_JOBS:
                self._no_bins[(state.stream.stream, DIRECTION_LABELS[d])] = n
        if not self.records and not self._told_no_bins:
            self._told_no_bins = True
            self.problems.report(self.source, line, "refused", self._no_bins_reason())

    def _no_bins_reason(self) -> str:
        n = self.ios_without_bins
        others = sorted(self._other_bins)
        # What it does hold: the flag (the agent's config key ``latency``) that reads it.
        has = "".join(f"; its {_LATENCY_KEYS[k]} bins are read with --latency {k}" for k in others)
        if self.latency == "lat":
            return (
                f"fio JSON without total-latency histograms: it holds {n} I/Os but no "
                "lat_ns bins, which fio writes only with lat_percentiles=1; re-run fio "
                "with --lat_percentiles=1 (and --output-format=json+)" + has
            )
        if self.latency == "slat":
            return (
                f"fio JSON without submission-latency histograms: it holds {n} I/Os but "
                "no slat_ns bins, which fio writes only with slat_percentiles=1 and only "
                "for asynchronous ioengines (libaio, io_uring: psync and other synchronous "
                "engines record no submission latency); re-run fio with "
                "--slat_percentiles=1 (and --output-format=json+)" + has
            )
        return (
            f"fio JSON without latency histograms: it holds {n} I/Os but "
            "no bins (clat_ns.bins), so no percentiles can be computed from it; run fio with "
            "--output-format=json+ (plain json has no bins, nor has json+ with "
            "clat_percentiles=0), or give fiomon the jobs' hist logs (write_hist_log=NAME "
            "with log_hist_msec=MS)" + has
        )

    def _collect(self, docs: Iterator[dict[str, Any]]) -> RecordBatch | None:
        rows: list[_Row] = []
        for doc in docs:
            self._note_declarations(doc)
            self.last_document = doc
            if self.on_document is not None:
                self.on_document(doc)
            try:
                rows.extend(self._document(doc))
            except (TypeError, ValueError, OverflowError, RecursionError) as exc:
                # Values fio never writes (huge numbers, odd types): skip the document.
                self.problems.report(
                    self.source,
                    self.splitter._line,
                    "json-shape",
                    f"document has values fio does not write ({type(exc).__name__})",
                )
        if not rows:
            return None
        streams: dict[StreamInfo, int] = {}
        sidx = [streams.setdefault(r.stream, len(streams)) for r in rows]
        lens = [len(r.bins) for r in rows]
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        self.records += len(rows)
        return RecordBatch(
            layout=self.layout,
            streams=tuple(streams),
            stream_idx=np.asarray(sidx, dtype=np.int32),
            direction=np.asarray([r.direction for r in rows], dtype=np.int8),
            start_ms=np.asarray([r.start for r in rows], dtype=np.int64),
            end_ms=np.asarray([r.end for r in rows], dtype=np.int64),
            nbytes=np.asarray([r.nbytes for r in rows], dtype=np.int64),
            indptr=indptr,
            bins=np.concatenate([r.bins for r in rows]).astype(np.int32),
            counts=np.concatenate([r.counts for r in rows]),
        )

    def _document(self, doc: dict[str, Any]) -> list[_Row]:
        line = self.splitter._line
        client = _client_view(doc)
        if client is not None:
            return self._client_document(client, line)
        ts = doc.get("timestamp_ms")
        jobs = doc.get("jobs")
        if not _is_int(ts, _MAX_MS) or not isinstance(jobs, list):
            self.problems.report(
                self.source,
                line,
                "json-shape",
                "document lacks integer 'timestamp_ms' or list 'jobs' (not fio json+ output?)",
            )
            return []
        rows: list[_Row] = []
        for pos, job in enumerate(jobs):
            if not isinstance(job, dict) or pos in self.skip_jobs:
                continue
            name = str(job.get("jobname", f"job{pos}"))
            key = (pos, name)
            state = self._jobs.get(key)
            if state is None:
                if len(self._jobs) >= _MAX_JOBS:
                    # fio lists the same jobs in every dump; only hostile input grows this.
                    oldest = min(self._jobs, key=lambda k: self._jobs[k].last_ts or 0)
                    del self._jobs[oldest]
                    self.problems.report(
                        self.source, line, "jobs", f"more than {_MAX_JOBS} jobs: forgot one"
                    )
                state = _JobState(StreamInfo(self.host, f"{self.source}:{pos}:{name}"))
                self._jobs[key] = state
            rows.extend(self._job(state, job, ts, line))
            state.last_ts = ts
        return rows

    def _client_document(self, client: _ClientView, line: int) -> list[_Row]:
        """Records of a ``fio --client`` document: every server's jobs, interval by interval.

        The document is written once, when the run ends, and holds cumulative entries per
        job per status interval with ``job_runtime`` (ms since the job started) but no
        wall-clock stamp of their own. All jobs of a client run start together, so each is
        placed at ``start = document time - longest job runtime`` and each entry ends at
        ``start + job_runtime``. The document's time has whole seconds only (fio 3.33
        writes ``timestamp``, not ``timestamp_ms``) and follows the end of the last job, so
        the placement is late by up to about a second plus the time fio took to collect
        the servers' final results; the relative times of the entries are exact.
        """
        if client.end_ms is None:
            self.problems.report(
                self.source, line, "json-shape", "fio --client document without a timestamp"
            )
            return []
        for kind, n in client.skipped.items():
            if kind == "aggregate":  # fio's sum over the servers: counting it counts twice
                self.problems.warn(self.source, line, kind, f"{n} 'All clients' sums not counted")
            else:
                self._client_unplaced += n if kind == "no-runtime" else 0
                self.problems.report(self.source, line, kind, _CLIENT_SKIPS[kind].format(n=n))
        if client.fallback:
            self.problems.warn(
                self.source,
                line,
                "no-job-runtime",
                f"{client.fallback} fio --client entries have no job_runtime (fio before "
                "3.8?): placed in time by their direction runtime (ms) or elapsed (s)",
            )
        start = client.end_ms - max((rt for s in client.slots for _, rt in s.entries), default=0)
        rows: list[_Row] = []
        for slot in client.slots:
            key = (-1, f"{slot.host}\0{slot.name}")
            state = self._jobs.get(key)
            if state is None:
                label = f"{self.source}:{slot.host}:{slot.name}"
                state = self._jobs[key] = _JobState(StreamInfo(slot.host, label))
            for entry, rt in slot.entries:
                if state.last_ts is not None and start + rt < state.last_ts:
                    state.last_ts = None  # runtime went back: the server ran the job again
                rows.extend(self._job(state, entry, start + rt, line))
                state.last_ts = start + rt
        return rows

    def _job(self, state: _JobState, job: dict[str, Any], ts: int, line: int) -> list[_Row]:
        current: dict[int, tuple[npt.NDArray[np.int64], int]] = {}
        no_bins: dict[int, int] = {}
        for d, label in enumerate(DIRECTION_LABELS):
            section = job.get(label)
            if d == Direction.MIXED and (current or no_bins):
                # unified_rw_reporting=both: mixed is the sum of the other sections.
                break
            parsed = self._direction(section, label, line)
            if parsed is not None:
                current[d] = parsed
            elif isinstance(section, dict):
                ios = section.get("total_ios")
                if _is_int(ios, _MAX_COUNT) and ios > 0:
                    no_bins[d] = ios
        if no_bins:
            self._note_no_bins(state, no_bins, line)
        restarted = any(
            d in state.cum and _decreased(state.cum[d], cum) for d, (cum, _) in current.items()
        )
        if restarted:
            state.restarts += 1
            base = state.stream.stream.split("#run", 1)[0]
            state.stream = StreamInfo(state.stream.host, f"{base}#run{state.restarts + 1}")
            state.cum.clear()
            state.bytes_.clear()
            state.active.clear()
            state.last_ts = None
            self.problems.warn(
                self.source,
                line,
                "restart",
                f"job {base.rsplit(':', 1)[-1]!r} restarted (counts decreased): new stream",
            )
        if state.last_ts is None:
            span = _job_span_ms(job)
            start = ts - min(span or 0, ts)
        else:
            start = state.last_ts
        if ts < start:
            self.problems.report(
                self.source, line, "decreasing", f"timestamp_ms {ts} is before the previous {start}"
            )
            return []
        rows = []
        for d, (cum, nbytes) in current.items():
            prev = state.cum.get(d)
            delta = cum if prev is None else cum - prev
            dbytes = nbytes - state.bytes_.get(d, 0)
            state.cum[d] = cum
            state.bytes_[d] = nbytes
            if delta.any():
                state.active.add(d)
            if d not in state.active:
                continue  # a direction the job never used: no records at all
            nz = np.flatnonzero(delta)
            rows.append(_Row(state.stream, d, start, ts, max(dbytes, 0), nz, delta[nz]))
        return rows

    def _indices(self, bins: dict[str, object]) -> npt.NDArray[np.int64]:
        """Fine bin index of each json+ key (a midpoint in ns), cached by key text.

        Raises:
            ValueError: a key is not a non-negative integer.
        """
        cache = self._index_cache
        try:
            return np.fromiter(map(cache.__getitem__, bins), dtype=np.int64, count=len(bins))
        except KeyError:
            pass
        keys = np.fromiter(map(int, bins), dtype=np.int64, count=len(bins))
        if (keys < 0).any():
            msg = "negative bin key"
            raise ValueError(msg)
        idx = plat_val_to_idx(keys, self.layout.group_nr)
        if len(cache) + len(bins) > _INDEX_CACHE_MAX:
            cache.clear()
        cache.update(zip(bins, idx.tolist(), strict=True))
        return idx

    def _direction(
        self, section: object, label: str, line: int
    ) -> tuple[npt.NDArray[np.int64], int] | None:
        """Cumulative dense histogram and io_bytes of one direction, or None if absent."""
        if not isinstance(section, dict):
            return None
        key = self._key
        lat = section.get(key)
        bins = lat.get("bins") if isinstance(lat, dict) else None
        if bins is None:
            for kind, other in _LATENCY_KEYS.items():
                sec = section.get(other)
                if other != key and isinstance(sec, dict) and isinstance(sec.get("bins"), dict):
                    self._other_bins.add(kind)
            return None
        if not isinstance(bins, dict):
            self.problems.report(
                self.source, line, "json-shape", f"{label}.{key}.bins is no object"
            )
            return None
        try:
            # map() iterates in C: this runs for every job and direction every second.
            vals = np.fromiter(map(int, bins.values()), dtype=np.int64, count=len(bins))
            idx = self._indices(bins)
        except (TypeError, ValueError):
            self.problems.report(
                self.source,
                line,
                "json-shape",
                f"{label}.{key}.bins has non-integer or negative keys or counts",
            )
            return None
        if (vals < 0).any():
            self.problems.report(
                self.source, line, "negative", f"{label}.{key}.bins has negative values"
            )
            return None
        if len(vals) and int(vals.max()) > _MAX_COUNT:
            self.problems.report(
                self.source, line, "overflow", f"{label}.{key}.bins has counts above 2**53"
            )
            return None
        dense = np.zeros(self.layout.fine_nbins, dtype=np.int64)
        np.add.at(dense, idx, vals)
        io_bytes = section.get("io_bytes", 0)
        return dense, io_bytes if _is_int(io_bytes, _MAX_COUNT) else 0


@dataclass(frozen=True, slots=True)
class _Row:
    stream: StreamInfo
    direction: int
    start: int
    end: int
    nbytes: int
    bins: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]


_TEXT_ONLY = (
    "text without a fio JSON document or hist-log line (fio's normal output?): run fio "
    "with --output-format=json+ (and --status-interval=N for records over time)"
)
_CLIENT_SKIPS = {
    "json-shape": "{n} fio --client entries without a string jobname and hostname not counted",
    "no-runtime": "{n} fio --client entries not counted: without job_runtime, a direction "
    "runtime or elapsed nothing places them in time; give fiomon the servers' hist logs "
    "(write_hist_log with log_hist_msec) instead",
}
_LATENCY_KEYS: dict[LatencyKind, str] = {"clat": "clat_ns", "lat": "lat_ns", "slat": "slat_ns"}
_WRITES_BINS: dict[LatencyKind, str] = {
    "clat": "fio --output-format=json+ writes them",
    "lat": "fio writes them with lat_percentiles=1, per job",
    "slat": "fio writes them with slat_percentiles=1 on an asynchronous engine, per job",
}
_INDEX_CACHE_MAX = 16384  # distinct bin keys remembered (fio has 1856; junk must not grow it)
_MAX_PREFIXES = 4096  # distinct hist-log names remembered per stream
_MAX_JOBS = 2048  # job states per stream (each holds a cumulative histogram per direction)
_MAX_MS = 10**14  # epoch ms in the year 5138: anything larger is not a fio time
_MAX_COUNT = 2**53  # sums of counts and bytes stay exact in int64 and float64


@dataclass(slots=True)
class _ClientSlot:
    """One job of one server in a ``fio --client`` document."""

    host: str
    name: str
    entries: list[tuple[dict[str, Any], int]]  # (entry, job_runtime ms), in order


@dataclass(slots=True)
class _ClientView:
    """A ``fio --client`` json+ document, sorted into jobs."""

    end_ms: int | None
    slots: list[_ClientSlot]
    skipped: dict[str, int]  # kind -> entries not counted
    fallback: int = 0  # entries placed without job_runtime


_SAME_INTERVAL_MS = 50  # entries of one key this close in runtime are jobs of one interval


def _client_view(doc: dict[str, Any]) -> _ClientView | None:
    """Sort a client document's entries into jobs (None: not a client document).

    ``client_stats`` lists, for every status interval, one cumulative entry per job per
    server (jobs of one server with the same name, ``numjobs``, come one after another
    with the same runtime), and sometimes an ``"All clients"`` sum, which is skipped: it
    would count every I/O twice.
    """
    entries = doc.get("client_stats")
    if not isinstance(entries, list) or isinstance(doc.get("jobs"), list):
        return None
    ms = doc.get("timestamp_ms")
    secs = doc.get("timestamp")
    end_ms = ms if _is_int(ms, _MAX_MS) else secs * 1000 if _is_int(secs, _MAX_MS // 1000) else None
    ports: dict[str, set[object]] = {}
    for e in entries:
        if isinstance(e, dict) and isinstance(e.get("hostname"), str):
            ports.setdefault(e["hostname"], set()).add(e.get("port"))
    slots: dict[tuple[str, str, int], _ClientSlot] = {}
    groups: dict[tuple[str, str], list[int]] = {}  # key -> [interval's first runtime, count, known]
    skipped: dict[str, int] = {}
    fallback = 0
    for e in entries:
        if not isinstance(e, dict):
            continue
        name, host, rt = e.get("jobname"), e.get("hostname"), e.get("job_runtime")
        if name == "All clients":
            skipped["aggregate"] = skipped.get("aggregate", 0) + 1
            continue
        if not isinstance(name, str) or not isinstance(host, str):
            skipped["json-shape"] = skipped.get("json-shape", 0) + 1
            continue
        if not _is_int(rt, _MAX_MS):
            rt = _runtime_without_job_runtime(e)
            if rt is None:
                skipped["no-runtime"] = skipped.get("no-runtime", 0) + 1
                continue
            fallback += 1
        label = f"{host}:{e.get('port')}" if len(ports.get(host, ())) > 1 else host
        g = groups.setdefault((label, name), [rt, 0, 0])
        if g[1] and (abs(rt - g[0]) > _SAME_INTERVAL_MS or (g[2] and g[1] >= g[2])):
            g[2] = max(g[2], g[1])  # a new interval: slot numbering starts again
            g[0], g[1] = rt, 0
        slot = slots.setdefault((label, name, g[1]), _ClientSlot(label, f"{g[1]}:{name}", []))
        slot.entries.append((e, rt))
        g[1] += 1
    return _ClientView(end_ms, list(slots.values()), skipped, fallback)


def _job_span_ms(job: dict[str, Any]) -> int | None:
    """How long (ms) a job entry has run at its document: where its first record starts.

    ``job_runtime``, except where fio summed it over the threads of a ``group_reporting``
    entry (``numjobs=8``: eight times the wall time, so the run would seem to start long
    before its first I/O): a ``job_runtime`` beyond ``elapsed`` (whole seconds since the
    job started) plus a second is such a sum, and the directions' ``runtime`` (not summed)
    places the entry instead.
    """
    runtime = job.get("job_runtime")
    elapsed = job.get("elapsed")
    if _is_int(runtime, _MAX_MS) and not (
        _is_int(elapsed, _MAX_MS // 1000) and runtime > (elapsed + 1) * 1000
    ):
        return runtime
    return _runtime_without_job_runtime(job)


def _runtime_without_job_runtime(entry: dict[str, Any]) -> int | None:
    """A client entry's runtime (ms) when it has no ``job_runtime`` (fio 3.7 and older).

    Each direction's ``runtime`` is the ms the job has run with I/O in it, the job's
    runtime for any direction it used (the largest is taken); a job with no I/O yet falls
    back to ``elapsed`` (whole seconds). None: nothing places the entry in time.
    """
    runtimes = [
        rt
        for label in DIRECTION_LABELS
        if isinstance(sec := entry.get(label), dict) and _is_int(rt := sec.get("runtime"), _MAX_MS)
    ]
    if runtimes and max(runtimes) > 0:
        return max(runtimes)
    elapsed = entry.get("elapsed")
    return elapsed * 1000 if _is_int(elapsed, _MAX_MS // 1000) else None


def _held_bytes(buf: str, start: int) -> int:
    """Memory the text from ``start`` takes (1, 2 or 4 bytes a character in CPython)."""
    width = max(1, (sys.getsizeof(buf) - sys.getsizeof("")) // max(1, len(buf)))
    return (len(buf) - start) * width


def _is_int(value: object, upper: int) -> TypeGuard[int]:
    """A real int (not a bool) in ``[0, upper]``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= upper


def _decreased(old: npt.NDArray[np.int64], new: npt.NDArray[np.int64]) -> bool:
    return bool((new < old).any())
