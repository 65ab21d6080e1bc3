"""fio histogram logs (``*_clat_hist.N.log``) to :class:`RecordBatch` records.

Record semantics (fio's HOWTO, "Log File Formats", as fio 3.x writes them):

* a line ``time_ms, ddir, bs, c0..`` is stamped at the *end* of its interval and counts the
  I/Os completed since the previous line of the same direction in the same file;
* the first line of a direction covers ``log_hist_msec`` before it (given, read from the
  job file, or the median spacing of the file's stamps);
* a line with the same stamp as the previous one of its direction is a catch-up line
  written after a stall: a zero-length record at that stamp whose counts are *added*;
* a stamp that goes backwards by less than an interval is bad input (counted, skipped);
  a relative log whose stamps restart near zero, or an epoch log whose stamps go back by
  an interval or more, holds another run's or job's records appended to the file
  (``per_job_logs=0``) and starts a new stream;
* stamps >= 10**12 are epoch ms (``log_unix_epoch=1``); smaller ones are relative to the
  job start, are shifted by ``time_offset_ms`` and flagged with a warning.

The parser is incremental: :meth:`HistLogParser.feed` takes any chunk of bytes, keeps an
incomplete last line for the next call, and returns the records of the complete lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout, Unit, candidate_layouts, detect_layout
from fiomon.errors import LayoutError
from fiomon.fio.linescan import scan
from fiomon.fio.problems import ProblemLog
from fiomon.model import RecordBatch, StreamInfo, row_sums

EPOCH_MS_MIN = 10**12  # 2001-09-09: anything smaller is a relative stamp
DEFAULT_INTERVAL_MS = 1000
MAX_LINE_BYTES = 1 << 20  # a 1859-column line is at most ~40 kB; 1 MiB leaves room for any GROUP_NR

_MIN_HIST_COLUMNS = 3 + 64  # time, ddir, bs and at least one group of bins
# fio's per-I/O logs: NAME_lat.N.log (write_lat_log also writes _clat and _slat), _bw, _iops.
_PER_IO_LOG = re.compile(r"_(lat|clat|slat|bw|iops)(?:\.\d+)?\.log\b")
_LOG_OPTION = {
    "lat": "write_lat_log",
    "clat": "write_lat_log",
    "slat": "write_lat_log",
    "bw": "write_bw_log",
    "iops": "write_iops_log",
}

TimeKind = Literal["epoch", "relative"]


def time_kind_of(stamp_ms: int) -> TimeKind:
    """Whether a fio stamp (ms) is epoch time (``log_unix_epoch=1``) or since the job started."""
    return "epoch" if stamp_ms >= EPOCH_MS_MIN else "relative"


I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class HistLogOptions:
    """How to read hist logs.

    Args:
        interval_ms: ``log_hist_msec``; ``None`` infers it from the stamps' median spacing.
        group_nr: force fio's GROUP_NR (``--group-nr``); ``None`` detects it.
        unit: force the bin unit (``"us"`` for fio 2 logs); ``None`` detects it.
        time_offset_ms: added to relative stamps to place them on a common clock.
        max_line_bytes: a longer line is skipped to its newline and reported
            (``line-too-long``); memory never holds more of it than this.
    """

    interval_ms: int | None = None
    group_nr: int | None = None
    unit: Unit | None = None
    time_offset_ms: int = 0
    max_line_bytes: int = MAX_LINE_BYTES


class HistLogParser:
    """Incremental parser for one hist-log file.

    Args:
        source: name used in messages (usually the path).
        host: host label of the records.
        options: see :class:`HistLogOptions`.
        problems: where bad lines and warnings are reported.
    """

    def __init__(
        self,
        source: str,
        *,
        host: str = "",
        options: HistLogOptions | None = None,
        problems: ProblemLog | None = None,
    ) -> None:
        self.source = source
        self.host = host
        self.options = options or HistLogOptions()
        self.problems = problems if problems is not None else ProblemLog()
        self.layout: BinLayout | None = None
        self.time_kind: TimeKind | None = None
        self.interval_ms = self.options.interval_ms
        self.lines_seen = 0
        self.records = 0
        self._ncols: int | None = None
        self._tail = b""
        self._skipping = False  # inside a line over max_line_bytes: drop bytes to its newline
        self._last_end: dict[int, int] = {}
        self._segment = 0
        # Why the file is not a hist log (fio's lat/bw/iops logs), once its lines show it.
        self.refusal: str | None = None

    kind: Literal["hist"] = "hist"  # fiomon.fio.parsers.RecordParser

    @property
    def slack_ms(self) -> int:
        """How far a later record may start before the latest end seen, ms.

        Directions of one hist log interleave with stamps up to an interval apart, and a
        record starts one interval before its end.
        """
        return 2 * int(self.interval_ms or DEFAULT_INTERVAL_MS)

    @property
    def stream(self) -> StreamInfo:
        """The current stream (a new one starts when a relative log restarts)."""
        name = self.source if self._segment == 0 else f"{self.source}#run{self._segment + 1}"
        return StreamInfo(self.host, name)

    def feed(self, data: bytes) -> RecordBatch | None:
        """Parse the complete lines of ``self._tail + data`` (nothing once refused).

        An incomplete last line is kept for the next call, up to ``max_line_bytes``;
        beyond that it is reported once and its bytes are dropped up to its newline, so
        a line that never ends costs no memory.

        Returns:
            The records, or ``None`` when no complete line was new or the layout is
            unknown (a :class:`LayoutError` problem has been reported then).
        """
        if self.refusal is not None:
            return None
        if self._skipping:
            end = data.find(b"\n")
            if end < 0:
                return None
            self._skipping = False
            self.lines_seen += 1  # the over-long line, reported when it began
            data = data[end + 1 :]
        buf = self._tail + data if self._tail else data
        cut = buf.rfind(b"\n") + 1
        self._tail = buf[cut:]
        batch = self._parse(buf[:cut]) if cut else None
        if len(self._tail) > self.options.max_line_bytes:
            self._tail = b""
            self._skipping = True
            self._report_long(self.lines_seen + 1)
        return batch

    def _report_long(self, line_no: int) -> None:
        limit = self.options.max_line_bytes
        self.problems.report(
            self.source, line_no, "line-too-long", f"line longer than {limit} bytes: skipped"
        )

    def finish(self) -> RecordBatch | None:
        """End of input: an incomplete last line is reported as truncated."""
        if self._skipping:  # already reported as too long
            self._skipping = False
            self.lines_seen += 1
        if self._tail:
            line_no = self.lines_seen + 1
            self._tail = b""
            self.problems.report(
                self.source, line_no, "truncated", "last line has no newline (truncated?)"
            )
        if self.lines_seen == 0:
            self.problems.warn(self.source, 0, "empty", "empty file: no histogram records")
        return None

    def _refuse(self, ncols: int, line_no: int) -> None:
        """Lines of a few numbers: fio's lat/bw/iops log (or other CSV), not a hist log."""
        m = _PER_IO_LOG.search(Path(self.source).name)
        if 4 <= ncols <= 6:  # time, value, ddir, bs[, offset[, prio]]
            what = (
                f"fio's {m.group(1).upper()} log ({_LOG_OPTION[m.group(1)]})"
                if m
                else "fio's latency, bandwidth or IOPS log (write_lat_log, write_bw_log "
                "or write_iops_log)"
            )
            what = f"it looks like {what}: one line per I/O or average"
        else:
            what = f"its lines have {ncols} numbers (a hist log line: {_MIN_HIST_COLUMNS} or more)"
        self.refusal = (
            f"not a histogram log: {what}; fiomon reads the hist logs of write_hist_log=NAME "
            "with log_hist_msec=MS (NAME_clat_hist.N.log) or the json+ output of "
            "fio --output-format=json+"
        )
        self.problems.report(self.source, line_no, "refused", self.refusal)

    def _fits_layout(self, ncols: int) -> bool:
        return bool(candidate_layouts(ncols - 3, self.options.group_nr))

    def _parse(self, buf: bytes) -> RecordBatch | None:
        first_line = self.lines_seen + 1
        res = scan(buf, self._ncols, prefer=self._fits_layout, max_line=self.options.max_line_bytes)
        self.lines_seen += res.lines
        for bad in res.bad:
            self.problems.report(self.source, first_line + bad.index, bad.kind, bad.reason)
        if not len(res.header):
            return None
        if self.layout is None:
            if res.ncols < _MIN_HIST_COLUMNS:
                self._refuse(res.ncols, first_line)
                return None
            try:
                self.layout = detect_layout(
                    res.ncols - 3, group_nr=self.options.group_nr, unit=self.options.unit
                )
            except LayoutError as exc:
                self.problems.report(self.source, first_line, "layout", str(exc))
                return None
            self._ncols = res.ncols
        times, dirs, bss = res.header[:, 0], res.header[:, 1], res.header[:, 2]
        if self.interval_ms is None:
            self.interval_ms = _median_spacing(times, dirs)
            if self.interval_ms is None:
                self.interval_ms = DEFAULT_INTERVAL_MS
                self.problems.warn(
                    self.source,
                    0,
                    "interval",
                    f"cannot infer log_hist_msec from one record; assuming "
                    f"{DEFAULT_INTERVAL_MS} ms (pass --log-hist-msec)",
                )
        keep, starts, ends, streams, stream_idx = self._assign(
            times, dirs, res.line_index + first_line
        )
        samples = row_sums(res.indptr, res.counts)
        batch = RecordBatch(
            layout=self.layout,
            streams=tuple(streams),
            stream_idx=stream_idx,
            direction=dirs.astype(np.int8),
            start_ms=starts,
            end_ms=ends,
            nbytes=samples * bss,
            indptr=res.indptr,
            bins=res.bins,
            counts=res.counts,
        )
        batch = batch if keep.all() else batch.select(keep)
        self.records += len(batch)
        return batch

    def _assign(
        self, times: I64, dirs: I64, line_nos: I64
    ) -> tuple[npt.NDArray[np.bool_], I64, I64, list[StreamInfo], npt.NDArray[np.int32]]:
        """Per record: keep flag, start and end ms, and stream, following fio's rules.

        Well-ordered input takes a vectorised path; anything odd (unknown directions,
        mixed time kinds, stamps going back) the per-record loop, which names each line.
        """
        fast = self._assign_ordered(times, dirs)
        if fast is not None:
            return fast
        n = len(times)
        keep = np.ones(n, dtype=np.bool_)
        stream_idx = np.zeros(n, dtype=np.int32)
        starts = np.zeros(n, dtype=np.int64)
        ends = np.zeros(n, dtype=np.int64)
        streams: list[StreamInfo] = []
        index: dict[StreamInfo, int] = {}
        interval = int(self.interval_ms or DEFAULT_INTERVAL_MS)
        for i, (stamp, d, line_no) in enumerate(
            zip(times.tolist(), dirs.tolist(), line_nos.tolist(), strict=True)
        ):
            kind = time_kind_of(stamp)
            if d not in (0, 1, 2):
                keep[i] = False
                self.problems.report(
                    self.source,
                    line_no,
                    "direction",
                    f"unknown direction {d} (fio writes 0, 1 or 2)",
                )
            elif self.time_kind is None:
                self._set_time_kind(kind)
            elif kind != self.time_kind:
                keep[i] = False
                self.problems.report(
                    self.source,
                    line_no,
                    "time-kind",
                    f"{kind} timestamp {stamp} in a file of {self.time_kind} ones",
                )
            if not keep[i]:
                continue
            t = stamp + (self.options.time_offset_ms if kind == "relative" else 0)
            prev = self._last_end.get(d)
            if prev is not None and t < prev:
                # A relative log restarting near zero is another run appended to the file; an
                # epoch log going back by an interval or more is another job's block (with
                # per_job_logs=0 every job appends its records to one file at its exit).
                restart = prev - t >= interval and (kind == "epoch" or stamp <= 2 * interval)
                if not restart:
                    keep[i] = False
                    self.problems.report(
                        self.source,
                        line_no,
                        "decreasing",
                        f"timestamp {t} is before the previous {prev}",
                    )
                    continue
                self._segment += 1
                self._last_end = {}
                prev = None
                self.problems.warn(
                    self.source,
                    line_no,
                    "restart",
                    "timestamps go back: another job's or run's records appended to this file "
                    "(per_job_logs=0); read as a stream of their own",
                )
            starts[i] = t - interval if prev is None else prev
            ends[i] = t
            self._last_end[d] = t
            s = self.stream
            if s not in index:
                index[s] = len(streams)
                streams.append(s)
            stream_idx[i] = index[s]
        return keep, starts, ends, streams, stream_idx

    def _assign_ordered(
        self, times: I64, dirs: I64
    ) -> tuple[npt.NDArray[np.bool_], I64, I64, list[StreamInfo], npt.NDArray[np.int32]] | None:
        """:meth:`_assign` for clean input, else ``None``.

        Clean: valid directions, one time kind, every direction's stamps non-decreasing
        from its previous record.
        """
        n = len(times)
        if n == 1:
            return self._assign_one(int(times[0]), int(dirs[0]))
        if not n or int(dirs.min()) < 0 or int(dirs.max()) > 2:
            return None
        epoch = times >= EPOCH_MS_MIN
        kind: TimeKind = "epoch" if bool(epoch[0]) else "relative"
        if bool(epoch.any()) and not bool(epoch.all()):
            return None
        if self.time_kind is not None and kind != self.time_kind:
            return None
        t = times + (self.options.time_offset_ms if kind == "relative" else 0)
        interval = int(self.interval_ms or DEFAULT_INTERVAL_MS)
        starts = np.empty(n, dtype=np.int64)
        last: dict[int, int] = {}
        for d in np.unique(dirs).tolist():
            idx = np.flatnonzero(dirs == d)
            td = t[idx]
            prev = self._last_end.get(d)
            if (prev is not None and int(td[0]) < prev) or bool((np.diff(td) < 0).any()):
                return None
            starts[idx[0]] = int(td[0]) - interval if prev is None else prev
            starts[idx[1:]] = td[:-1]
            last[d] = int(td[-1])
        if self.time_kind is None:
            self._set_time_kind(kind)
        self._last_end.update(last)
        keep = np.ones(n, dtype=np.bool_)
        return keep, starts, t, [self.stream], np.zeros(n, dtype=np.int32)

    def _set_time_kind(self, kind: TimeKind) -> None:
        """Fix the file's time kind at its first record; a relative one is a warning."""
        self.time_kind = kind
        if kind == "relative":
            self.problems.warn(
                self.source,
                0,
                "relative-time",
                "relative timestamps (log_unix_epoch=0): hosts cannot be aligned "
                "exactly; times are ms since each job's start",
            )

    def _assign_one(
        self, stamp: int, d: int
    ) -> tuple[npt.NDArray[np.bool_], I64, I64, list[StreamInfo], npt.NDArray[np.int32]] | None:
        """:meth:`_assign_ordered` for one record (a log growing line by line)."""
        kind: TimeKind = "epoch" if stamp >= EPOCH_MS_MIN else "relative"
        if d not in (0, 1, 2) or self.time_kind is None or kind != self.time_kind:
            return None  # the general path handles (and reports) the first and odd records
        t = stamp + (self.options.time_offset_ms if kind == "relative" else 0)
        prev = self._last_end.get(d)
        if prev is not None and t < prev:
            return None
        start = t - int(self.interval_ms or DEFAULT_INTERVAL_MS) if prev is None else prev
        self._last_end[d] = t
        one = np.ones(1, dtype=np.bool_)
        return one, np.array([start]), np.array([t]), [self.stream], np.zeros(1, np.int32)


def _median_spacing(times: I64, dirs: I64) -> int | None:
    """Median positive spacing of stamps within each direction, or None if unknown."""
    gaps = []
    for d in (0, 1, 2):
        t = times[dirs == d]
        diff = np.diff(t)
        gaps.append(diff[diff > 0])
    allgaps = np.concatenate(gaps)
    if not len(allgaps):
        return None
    return max(1, round(float(np.median(allgaps))))


def interval_from_job_file(path: Path) -> int | None:
    """``log_hist_msec`` from a fio job file (last assignment wins), or None.

    fio job files are INI-like but allow bare flags and ``;``/``#`` comments, so this reads
    ``key=value`` lines itself rather than through configparser.
    """
    found: int | None = None
    for raw in path.read_text(errors="replace").splitlines():
        line = raw.split(";", 1)[0].split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep and key.strip() == "log_hist_msec":
            try:
                found = int(value.strip())
            except ValueError:
                continue
    return found
