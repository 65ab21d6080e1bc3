"""fio's per-I/O latency logs (``write_lat_log`` with ``log_avg_msec=0``), streamed.

fio writes ``P_clat.N.log``, ``P_lat.N.log`` and ``P_slat.N.log`` (``P_clat.log`` with
``per_job_logs=0``; a ``fio --client`` run appends ``.<host>``): one line per I/O,

    time_ms, value, ddir, bs[, offset][, prio]

4 to 6 integer columns with ``", "`` between them; ``value`` is the latency in ns (fio >= 3;
µs before: ``log_unit="us"``), ``ddir`` 0 read, 1 write, 2 trim, ``bs`` the bytes of the
I/O. fio 3.33 writes a 5th column (the I/O priority) even without ``log_offset``, and the
priority in hex (``0x0000``) with ``log_prio=1``. A 5-column log holds the offset when its
5th column has a value above 0xffff or more than :data:`_PRIO_MAX_DISTINCT` distinct values
(offsets of a real job), else the priority.

With ``log_avg_msec > 0`` fio writes an *averaged* log with the same columns: one line per
direction per window, value = the window's mean (``log_max_value=1``: its max), and ``bs``,
offset and priority 0 (fio passes 0 for them; an I/O always has bytes). The reader calls a
log averaged when every line of its head has ``bs`` 0; such logs stamp a regular grid of one
step with at most one line per direction per stamp, which a rate-limited per-I/O log can
also do, so the grid alone does not decide.

The KIND (clat, lat, slat) comes from the file name (:func:`iolog_kind`); that the file is a
per-I/O log comes from its content (4-6 columns). Compression (gzip, bzip2, xz) and text
encodings are undone as for every fio file (:mod:`fiomon.fio.decode`).

Speed: a chunk of about 2 MiB of text (~50 000 lines) is parsed with a fixed number of
numpy passes: two byte comparisons locate newlines and commas, which check that every line
has the same number of fields, and numpy's C text parser reads the integers. A chunk that
fails those checks (a bad line in it) is split line by line with a regular expression: the
bad lines are reported (file and line) and skipped, the others parsed as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
import numpy.typing as npt

from fiomon.fio.decode import InputDecoder, fio_log_store
from fiomon.fio.linescan import BadLine
from fiomon.fio.problems import ProblemLog
from fiomon.model import LatencyKind

I64 = npt.NDArray[np.int64]
LogUnit = Literal["ns", "us"]

READ_BYTES = 2 << 20  # raw bytes read at once (decoded pieces: at most 4 MiB)
HEAD_BYTES = 256 << 10  # decoded head looked at to learn the columns and averaging
MIN_COLUMNS, MAX_COLUMNS = 4, 6
_MAX_DIGITS = 18  # every 18-digit decimal fits in int64
_MAX_VALUE = 10**_MAX_DIGITS
_PRIO_MAX_DISTINCT = 16
_NL, _COMMA = 10, 44
# "_clat.1.log", "_lat.log", "_slat.3.log.host1", "_clat.1.log.gz"; never "_clat_hist.1.log".
_KIND_RE = re.compile(r"_(clat|lat|slat)(?:\.\d+)?\.log(?:\.|$)")
_RATE_RE = re.compile(r"_(bw|iops)(?:\.\d+)?\.log(?:\.|$)")
_RATE_OPTION = {"bw": "write_bw_log", "iops": "write_iops_log"}
_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
    _HEX[bytes([_c]).upper()[0]] = _i


def rate_log(path: Path) -> str | None:
    """Why a file is not a latency log when its name says fio's bw or iops log, else None."""
    found = _RATE_RE.findall(path.name)
    if not found or iolog_kind(path) is not None:
        return None
    what = found[-1]
    measure = "bandwidth" if what == "bw" else "IOPS"
    return (
        f"fio's {what.upper()} log ({_RATE_OPTION[what]}): {measure}, not latency; "
        "fiomon reads write_lat_log's P_clat.N.log / P_lat.N.log / P_slat.N.log, hist logs "
        "(write_hist_log) and json+ output"
    )


def iolog_kind(path: Path) -> LatencyKind | None:
    """The latency kind a file name says (``clat``, ``lat``, ``slat``); None: not a lat log.

    ``P_clat_hist.N.log`` (a hist log) and ``P_bw.N.log`` / ``P_iops.N.log`` are not.
    """
    found = _KIND_RE.findall(path.name)
    if not found:
        return None
    kind: LatencyKind = found[-1]
    return kind


@dataclass(frozen=True, slots=True)
class Span:
    """A part of a log: decoded bytes ``[start, stop)`` whose first line is ``first_line``.

    fio appends the jobs of ``per_job_logs=0`` one after the other to one file, each
    starting its time again: each job is one span (:meth:`IoLogReader.time_spans`).
    """

    start: int = 0
    stop: int | None = None
    first_line: int = 1


@dataclass(frozen=True, slots=True)
class IoChunk:
    """Consecutive lines of one per-I/O log as columns (bad lines left out).

    Args:
        time_ms: stamp as written (ms since the job started, or epoch ms).
        value_ns: latency, ns (converted from µs for ``log_unit="us"``).
        ddir: fio's direction, 0 read, 1 write, 2 trim.
        bs: bytes of the I/O (0 in averaged logs).
        offset: the I/O's offset (``log_offset=1``), else None.
        prio: the I/O's priority column, else None.
        first_line: 1-based line number of the chunk's first line.
    """

    time_ms: I64
    value_ns: I64
    ddir: I64
    bs: I64
    offset: I64 | None
    prio: I64 | None
    first_line: int

    def __len__(self) -> int:
        return len(self.time_ms)


@dataclass(frozen=True, slots=True)
class LineScan:
    """Lines of integers parsed from a buffer of complete lines.

    Args:
        values: ``(lines, columns)`` int64 of the accepted lines.
        line_index: 0-based index of each accepted line in the buffer.
        bad: rejected lines, with reasons.
        lines: lines in the buffer.
    """

    values: I64
    line_index: I64
    bad: list[BadLine]
    lines: int


def _line_re(ncols: int, hex_last: bool) -> re.Pattern[bytes]:
    dec = rb"[0-9]{1,18}"
    sep = rb"[ \t]*,[ \t]*"
    last = rb"0x[0-9a-fA-F]{1,4}" if hex_last else dec
    return re.compile(rb"[ \t]*" + dec + (sep + dec) * (ncols - 2) + sep + last + rb"[ \t]*")


def _why(line: bytes, ncols: int, hex_last: bool) -> tuple[str, str]:
    """Kind and reason of a line the canonical pattern refused."""
    if not line.strip():
        return "empty", "empty line"
    if any(b > 126 or (b < 32 and b != 9) for b in line):
        return "binary", "binary data (not a fio log line)"
    fields = [f.strip() for f in line.split(b",")]
    if len(fields) != ncols:
        return "columns", f"has {len(fields)} fields, expected {ncols}"
    for i, f in enumerate(fields, start=1):
        text = f.decode("ascii", "replace")[:20]
        if not f:
            return "empty-field", f"field {i} is empty"
        if re.fullmatch(rb"-[0-9]+", f):
            return "negative", f"negative value {text!r} in field {i}"
        if re.fullmatch(rb"[0-9]+", f) and len(f) > _MAX_DIGITS:
            return "overflow", f"field {i} has {len(f)} digits (more than 18)"
        if i == ncols and hex_last and not f.startswith(b"0x"):
            return "non-numeric", f"field {i} is {text!r}, expected fio's hex priority 0xNNNN"
    return "non-numeric", "not a line of integers"


def _fast(buf: bytes, ncols: int, hex_last: bool) -> I64 | None:
    """All lines of ``buf`` as ``(lines, ncols)``; None when any line is not clean."""
    a = np.frombuffer(buf, dtype=np.uint8)
    nl = np.flatnonzero(a == _NL)
    n = len(nl)
    commas = np.flatnonzero(a == _COMMA)
    c = ncols - 1
    if len(commas) != n * c:
        return None
    prev = np.empty(n, dtype=np.int64)
    prev[0] = -1
    prev[1:] = nl[:-1]
    # Sorted positions, n*c commas in all: if each line's first and last of its c commas
    # lie inside it, every line has exactly c.
    if not (np.all(commas[0::c] > prev) and np.all(commas[c - 1 :: c] < nl)):
        return None
    prio: I64 | None = None
    if hex_last:
        # fio writes the priority as "0x%04x": six bytes before each newline.
        if n and nl[0] < 7:
            return None
        w = np.frombuffer(bytearray(buf), dtype=np.uint8)
        if not (np.all(w[nl - 6] == ord("0")) and np.all(w[nl - 5] == ord("x"))):
            return None
        digits = np.stack([_HEX[w[nl - 4 + j]] for j in range(4)], axis=1)
        if np.any(digits == 255):
            return None
        prio = digits.astype(np.int64) @ np.array([4096, 256, 16, 1], dtype=np.int64)
        for j in range(6):
            w[nl - 6 + j] = ord("0")
        w[nl] = _COMMA
        text = w.tobytes()
    else:
        text = buf.replace(b"\n", b",")
    try:
        flat = np.fromstring(text, dtype=np.int64, sep=",")
    except ValueError:  # a field numpy cannot read (empty, text, "1 2")
        return None
    if len(flat) != n * ncols or (n and (flat.min() < 0 or flat.max() >= _MAX_VALUE)):
        return None  # negatives, or saturated (more than 18 digits)
    values = flat.reshape(n, ncols)
    if prio is not None:
        values[:, -1] = prio
    return values


def scan_lines(buf: bytes, ncols: int, *, hex_last: bool = False) -> LineScan:
    """Parse complete lines (``buf`` ends with a newline) of ``ncols`` integers each.

    Never raises on content: each line is accepted or listed in ``bad`` with a reason.
    ``hex_last``: the last field is fio's hex priority (``0x0000``).
    """
    if b"\r" in buf:
        buf = buf.replace(b"\r\n", b"\n")
    if not buf:
        return LineScan(np.zeros((0, ncols), np.int64), np.zeros(0, np.int64), [], 0)
    values = _fast(buf, ncols, hex_last)
    if values is not None:
        n = len(values)
        return LineScan(values, np.arange(n, dtype=np.int64), [], n)
    lines = buf.split(b"\n")[:-1]
    good = _line_re(ncols, hex_last)
    keep: list[int] = []
    bad: list[BadLine] = []
    for i, line in enumerate(lines):
        if good.fullmatch(line):
            keep.append(i)
        else:
            bad.append(BadLine(i, *_why(line, ncols, hex_last)))
    if not keep:
        return LineScan(np.zeros((0, ncols), np.int64), np.zeros(0, np.int64), bad, len(lines))
    clean = b"\n".join(_canonical(lines[i], hex_last) for i in keep) + b"\n"
    values = _fast(clean, ncols, hex_last)
    if values is None:  # cannot happen (every kept line matched); reject, never loop
        bad = sorted(
            bad + [BadLine(i, "malformed", "not a line of integers") for i in keep],
            key=lambda b: b.index,
        )
        return LineScan(np.zeros((0, ncols), np.int64), np.zeros(0, np.int64), bad, len(lines))
    return LineScan(values, np.asarray(keep, dtype=np.int64), bad, len(lines))


def _canonical(line: bytes, hex_last: bool) -> bytes:
    """A line the pattern accepted, in fio's spacing (and hex priority widened to 4 digits)."""
    fields = [f.strip() for f in line.split(b",")]
    if hex_last:
        fields[-1] = b"0x" + fields[-1][2:].rjust(4, b"0")
    return b", ".join(fields)


@dataclass(slots=True)
class _Head:
    columns: int = 0
    hex_last: bool = False
    has_offset: bool = False
    has_prio: bool = False
    averaged: bool = False
    refusal: str | None = None


def _learn(text: bytes) -> _Head:
    """Columns, priority form and averaging from the decoded head of a log."""
    lines = [ln for ln in text.split(b"\n")[:-1] if ln.strip()][:2000]
    if not lines:
        return _Head()
    counts: dict[int, int] = {}
    for ln in lines:
        k = ln.count(b",") + 1
        counts[k] = counts.get(k, 0) + 1
    ncols = max(counts, key=lambda k: (MIN_COLUMNS <= k <= MAX_COLUMNS, counts[k]))
    if not MIN_COLUMNS <= ncols <= MAX_COLUMNS:
        return _Head(
            columns=ncols,
            refusal=f"not a per-I/O latency log: its lines have {ncols} numbers "
            f"(fio's lat logs have {MIN_COLUMNS} to {MAX_COLUMNS}: time, value, ddir, bs"
            "[, offset][, prio])",
        )
    first = next((ln for ln in lines if ln.count(b",") + 1 == ncols), lines[0])
    hex_last = ncols > MIN_COLUMNS and first.rsplit(b",", 1)[-1].strip().startswith(b"0x")
    head = scan_lines(b"\n".join(lines) + b"\n", ncols, hex_last=hex_last)
    v = head.values
    has_offset = ncols == MAX_COLUMNS
    has_prio = ncols == MAX_COLUMNS or hex_last
    if ncols == MAX_COLUMNS - 1 and not hex_last:
        fifth = v[:, 4]
        has_offset = bool(len(fifth)) and (
            int(fifth.max()) > 0xFFFF or len(np.unique(fifth)) > _PRIO_MAX_DISTINCT
        )
        has_prio = not has_offset
    averaged = bool(len(v)) and not np.any(v[:, 3])
    return _Head(ncols, hex_last, has_offset, has_prio, averaged)


class IoLogReader:
    """Streams one per-I/O (or averaged) latency log as :class:`IoChunk`s.

    Memory is bounded: the file is read ~2 MiB at a time (compressed: decoded pieces of
    at most 4 MiB) and each chunk holds the lines of one piece. The head of the file is
    read at construction to learn :attr:`columns`, :attr:`averaged` and whether offset /
    priority columns are present.

    Args:
        path: the log (plain or compressed).
        log_unit: unit of the values, ``ns`` (fio >= 3) or ``us`` (fio 2.x).
        problems: where bad lines are reported (file and line); a fresh log if None.

    Attributes:
        kind: latency kind from the name, None if the name does not say.
        averaged: the log holds window means (or maxima), not one line per I/O.
        columns: fields per line (4 to 6; another count: :attr:`refusal` says why).
        refusal: why the file is not a per-I/O latency log, or None.
        lines: lines read so far (good and bad).
        bytes_read: bytes of the file read so far (as stored: compressed or not).
        has_offset: the lines carry the I/O's offset (``log_offset=1``).
        has_prio: the lines carry the I/O's priority.
    """

    def __init__(
        self,
        path: Path,
        *,
        log_unit: LogUnit = "ns",
        problems: ProblemLog | None = None,
        span: Span | None = None,
    ) -> None:
        if log_unit not in ("ns", "us"):
            msg = f"log_unit must be 'ns' or 'us', got {log_unit!r}"
            raise ValueError(msg)
        self.path = path
        self.log_unit = log_unit
        self.problems = problems if problems is not None else ProblemLog()
        self.kind = iolog_kind(path)
        self.span = span or Span()
        self.lines = 0
        self.bytes_read = 0
        head = self._read_head()
        self.columns = head.columns
        self.averaged = head.averaged
        self.has_offset = head.has_offset
        self.has_prio = head.has_prio
        self.refusal = head.refusal
        self._hex_last = head.hex_last
        rate = rate_log(path)
        if rate is not None:
            self.refusal = rate

    @property
    def source(self) -> str:
        """The file, as problems name it."""
        return str(self.path)

    # The generators below hand each piece on without keeping a reference while suspended
    # (``yield box.pop()``): a report reads many files in step, and a piece held per
    # suspended file was most of its memory.

    def _ranged(self) -> Iterator[bytes]:
        """The decoded bytes of :attr:`span` (the whole file by default)."""
        start, stop = self.span.start, self.span.stop
        pos = start
        pieces = self._pieces(start)
        box: list[bytes] = []
        while (piece := next(pieces, None)) is not None:
            if stop is not None and pos + len(piece) >= stop:
                if stop > pos:
                    yield piece[: stop - pos]
                return
            pos += len(piece)
            box.append(piece)
            del piece
            yield box.pop()

    def _pieces(self, skip: int = 0) -> Iterator[bytes]:
        """The file's decoded UTF-8 bytes from offset ``skip``, piece by piece (<= 4 MiB).

        A plain file seeks there; a compressed one is decoded from its start.
        """
        with self.path.open("rb") as fh:
            box = [fh.read(READ_BYTES)]
            if not box[0]:
                return
            decoder = InputDecoder(box[0])
            if not decoder.needed:
                if skip:
                    fh.seek(skip)
                    box = [fh.read(READ_BYTES)]
                while box[0]:
                    self.bytes_read += len(box[0])
                    yield box.pop()
                    box.append(fh.read(READ_BYTES))
                return
            pieces = self._decoded(fh, decoder, box.pop())
            while (piece := next(pieces, None)) is not None:
                if skip >= len(piece):
                    skip -= len(piece)
                    continue
                box.append(piece[skip:] if skip else piece)
                del piece
                skip = 0
                yield box.pop()

    def _decoded(self, fh: BinaryIO, decoder: InputDecoder, data: bytes) -> Iterator[bytes]:
        """The decoded pieces of a compressed or re-encoded file starting with ``data``."""
        while data:
            self.bytes_read += len(data)
            yield from decoder.feed(data)
            data = fh.read(READ_BYTES)
        yield from decoder.finish()
        if decoder.error is not None:
            what = decoder.description
            self.problems.report(
                self.source, 0, "corrupt", f"{what}: {decoder.error}; read up to there"
            )

    def _read_head(self) -> _Head:
        with self.path.open("rb") as fh:
            raw = fh.read(4096)
        if fio_log_store(raw):
            return _Head(
                refusal="fio's zlib-compressed log store (log_store_compressed=1), not a "
                "readable log: inflate it with `fio --inflate-log=FILE > FILE.log`"
            )
        text = b""
        quiet = ProblemLog()
        saved, self.problems = self.problems, quiet
        try:
            for piece in self._pieces():
                text += piece
                if len(text) >= HEAD_BYTES:
                    break
        finally:
            self.problems = saved
        if len(text) > HEAD_BYTES:
            # A piece is up to 4 MiB (~100 000 lines): splitting all of it to keep 2000 lines
            # cost 0.1 s per reader, 3 readers per file in a report.
            text = text[:HEAD_BYTES]
        if not text.endswith(b"\n") and len(text) < HEAD_BYTES:
            text += b"\n"  # the whole file, its last line unterminated
        return _learn(text[: text.rfind(b"\n") + 1] if b"\n" in text else b"")

    def time_spans(self, slack_ms: int) -> list[Span]:
        """The parts of the file whose stamps start again, one :class:`Span` each.

        fio appends the jobs of ``per_job_logs=0`` to one file one after the other, each
        from its own time: a line stamped more than ``slack_ms`` before the latest stamp
        so far starts a new part. Reads the whole file once (bad lines are left to
        :meth:`chunks` to report).
        """
        if self.refusal is not None or self.columns == 0:
            return [self.span]
        restarts: list[tuple[int, int]] = []  # (byte offset, line number) of each new part
        saved, self.problems = self.problems, ProblemLog()
        try:
            offset, lines, tail = 0, 0, b""
            latest: int | None = None
            for piece in self._pieces():
                data = tail + piece if tail else piece
                cut = data.rfind(b"\n") + 1
                buf, tail = data[:cut], data[cut:]
                if not cut:
                    continue
                res = scan_lines(buf, self.columns, hex_last=self._hex_last)
                t = res.values[:, 0]
                nl = np.flatnonzero(np.frombuffer(buf, dtype=np.uint8) == _NL)
                k = 0
                while k < len(t):
                    run = np.maximum.accumulate(t[k:])
                    before = np.empty_like(run)
                    before[0] = t[k] if latest is None else latest
                    before[1:] = np.maximum(run[:-1], before[0])
                    drop = np.flatnonzero(t[k:] < before - slack_ms)
                    if not len(drop):
                        latest = int(max(before[0], run[-1]))
                        break
                    k += int(drop[0])
                    i = int(res.line_index[k])
                    restarts.append((offset + (int(nl[i - 1]) + 1 if i else 0), lines + i + 1))
                    latest = int(t[k])
                offset += cut
                lines += res.lines
        finally:
            self.problems = saved
        bounds = [(0, 1), *restarts]
        return [
            Span(start, bounds[n + 1][0] if n + 1 < len(bounds) else None, line)
            for n, (start, line) in enumerate(bounds)
        ]

    def _warn_unit(self) -> None:
        """Say once per file that a 4-column log's values are read as ns (fio 2.x wrote us).

        fio 3.33 writes a 5th column (priority) always; 4 columns come from an older fio,
        and fio 2.x wrote µs where 3.x writes ns: the file cannot say which.
        """
        if self.columns != MIN_COLUMNS or self.log_unit != "ns" or self.averaged:
            return
        if any(p.source == self.source and p.kind == "log-unit" for p in self.problems.kept):
            return
        self.problems.warn(
            self.source,
            0,
            "log-unit",
            "4 columns (an older fio): values read as ns, as fio >= 3 writes them; "
            "fio 2.x wrote us: pass --log-unit us for a fio 2.x log",
        )

    def chunks(self) -> Iterator[IoChunk]:
        """The file's lines in chunks; bad lines are reported (file:line) and skipped.

        A refused file (see :attr:`refusal`) yields nothing and reports one ``refused``
        problem; an empty one yields nothing (a warning).
        """
        self.lines = self.span.first_line - 1
        self.bytes_read = 0
        if self.refusal is not None:
            self.problems.report(self.source, 0, "refused", self.refusal)
            return
        if self.columns == 0:
            self.problems.warn(self.source, 0, "empty", "empty file: no latency lines")
            return
        self._warn_unit()
        tail = b""
        for piece in self._ranged():
            data = tail + piece if tail else piece
            cut = data.rfind(b"\n") + 1
            tail = data[cut:]
            chunk = self._parse(data[:cut] if tail else data) if cut else None
            del data, piece  # nothing held while suspended but the tail
            if chunk is not None:
                box = [chunk]
                del chunk
                yield box.pop()
        if tail.strip():
            chunk = self._parse(tail + b"\n")
            if chunk is not None:
                yield chunk

    def _parse(self, buf: bytes) -> IoChunk | None:
        first = self.lines + 1
        res = scan_lines(buf, self.columns, hex_last=self._hex_last)
        self.lines += res.lines
        for b in res.bad:
            self.problems.report(self.source, first + b.index, b.kind, b.reason)
        v = res.values
        line_index = res.line_index
        if len(v) and int(v[:, 2].max()) > 2:
            wrong = v[:, 2] > 2
            for i in np.flatnonzero(wrong)[: self.problems.keep_per_kind + 1]:
                d = int(v[i, 2])
                self.problems.report(
                    self.source, first + int(line_index[i]), "ddir", f"direction {d} (not 0-2)"
                )
            extra = int(np.count_nonzero(wrong)) - (self.problems.keep_per_kind + 1)
            if extra > 0:
                self.problems.counts["ddir"] += extra
            v = v[~wrong]
            line_index = line_index[~wrong]
        if not len(v):
            return None
        value = np.ascontiguousarray(v[:, 1])
        if self.log_unit == "us":
            value = value * 1000
        return IoChunk(
            time_ms=np.ascontiguousarray(v[:, 0]),
            value_ns=value,
            ddir=np.ascontiguousarray(v[:, 2]),
            bs=np.ascontiguousarray(v[:, 3]),
            offset=np.ascontiguousarray(v[:, 4]) if self.has_offset else None,
            prio=np.ascontiguousarray(v[:, -1]) if self.has_prio else None,
            first_line=first + int(line_index[0]),
        )
