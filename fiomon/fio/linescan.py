"""Vectorised scanning of fio's comma-separated integer lines (hist logs).

fio writes ``time, ddir, bs, c0, c1, ...`` with ``", "`` between fields. Parsing that with
``int()`` per field costs about 2 ms per 1859-column line; this module parses a whole
buffer with a fixed number of numpy passes over its bytes and decodes only the non-zero
counts (a fio histogram line is mostly ``0``).

The fast path accepts exactly the canonical form, checked with boolean masks:

* only digits, ``,``, space and newline;
* a space only right after a comma;
* a comma or newline only right after a digit.

Under those rules every field is ``[ ]?[0-9]+``. A line that breaks them goes to a per-line
slow path that either re-writes it canonically (odd but valid spacing) or rejects it with a
reason. Lines are only scanned complete (the buffer must end with a newline).
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

_NL, _COMMA, _SPACE, _ZERO = 10, 44, 32, 48
_MAX_DIGITS = 18  # every 18-digit decimal fits in int64
_INT_RE = re.compile(rb"[0-9]+")
_NEG_RE = re.compile(rb"-[0-9]+")

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class BadLine:
    """A rejected line: its 0-based index in the scanned buffer, a kind and a reason."""

    index: int
    kind: str
    reason: str


@dataclass(frozen=True, slots=True)
class Scan:
    """Result of scanning a buffer of complete lines.

    Args:
        ncols: number of fields per accepted line.
        line_index: 0-based index (in the scanned buffer) of every accepted line.
        header: ``(accepted lines, 3)`` int64: time, ddir, bs.
        indptr: CSR row pointers over accepted lines for the histogram fields.
        bins: column of each non-zero histogram count (0 = the 4th field).
        counts: the non-zero counts.
        bad: rejected lines with reasons.
        lines: number of lines scanned (accepted or not).
    """

    ncols: int
    line_index: I64
    header: I64
    indptr: I64
    bins: npt.NDArray[np.int32]
    counts: I64
    bad: list[BadLine]
    lines: int = 0


def _parse_at(a: npt.NDArray[np.uint8], isd: npt.NDArray[np.bool_], ends: I64) -> tuple[I64, I64]:
    """Decode the digit runs that end just before ``ends``; returns values and digit counts.

    Every run has at least one digit (canonical form), so the last digit is decoded densely;
    earlier digits only for the shrinking set of longer runs (most counts are 1-2 digits).
    """
    val = a[ends - 1].astype(np.int64) - _ZERO
    ndig = np.ones(len(ends), dtype=np.int64)
    # pos may reach -1 at the buffer start: index -1 is the buffer's final newline, which is
    # not a digit, so the run stops there.
    act = np.flatnonzero(isd[ends - 2])
    pos = ends[act] - 2
    for k in range(1, _MAX_DIGITS + 1):
        if not len(act):
            break
        val[act] += (a[pos].astype(np.int64) - _ZERO) * 10**k
        ndig[act] += 1
        more = isd[pos - 1]
        act, pos = act[more], pos[more] - 1
    return val, ndig


def _slow_line(line: bytes, ncols: int | None) -> tuple[bytes | None, str, str]:
    """Check one line field by field: a canonical re-write, or a kind and reason."""
    if any(b > 126 or (b < 32 and b not in (9, 13)) for b in line):
        return None, "binary", "binary data (not a fio log line)"
    fields = [f.strip() for f in line.split(b",")]
    for i, f in enumerate(fields, start=1):
        if not f:
            return None, "empty-field", f"field {i} is empty"
        if _INT_RE.fullmatch(f):
            if len(f) > _MAX_DIGITS:
                # fio's counts and stamps are int64; more digits cannot be a fio value.
                return None, "overflow", f"field {i} has {len(f)} digits (more than 18)"
            continue
        text = f.decode("ascii", "replace")[:20]
        if _NEG_RE.fullmatch(f):
            return None, "negative", f"negative value {text!r} in field {i}"
        return None, "non-numeric", f"non-numeric field {i}: {text!r}"
    if ncols is not None and len(fields) != ncols:
        return None, "columns", f"has {len(fields)} fields, expected {ncols}"
    return b", ".join(fields) + b"\n", "", ""


class _Workspace(threading.local):
    """Per-thread scratch arrays reused across scans.

    Fresh multi-megabyte temporaries cost a page fault per 4 KiB on first touch, which made
    the mask passes several times slower than the arithmetic; reusing buffers avoids that.
    """

    def __init__(self) -> None:
        self.size = 0
        self.u8 = np.zeros(0, dtype=np.uint8)
        self.masks = np.zeros((0, 0), dtype=np.bool_)

    def get(self, n: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
        """A uint8 buffer and 7 boolean rows of at least ``n`` entries (views of length n)."""
        if n > self.size:
            self.size = max(n, self.size * 5 // 4)
            self.u8 = np.empty(self.size, dtype=np.uint8)
            self.masks = np.empty((7, self.size), dtype=np.bool_)
        return self.u8[:n], self.masks[:, :n]


_WS = _Workspace()


def _masks(
    a: npt.NDArray[np.uint8],
) -> tuple[
    npt.NDArray[np.bool_],
    npt.NDArray[np.bool_],
    npt.NDArray[np.bool_],
    npt.NDArray[np.bool_],
    bool,
    int,
]:
    """Masks of a buffer and what they imply.

    Returns the digit, comma, separator (comma or newline) and newline masks; whether the
    whole buffer is canonical; and the separator width (2 for ``", "``, 1 for ``","``, 0
    when mixed). The masks are views of this thread's workspace: valid until its next scan.

    The canonical rules are checked by counting, not with a violation mask: the four
    allowed kinds of byte must add up to the buffer, and the spaces that follow a comma
    and the separators that follow a digit must be all of them.
    """
    u8, m = _WS.get(len(a))
    isd, comma, isnl, sp, sep, tmp = m[:6]
    np.less(np.subtract(a, _ZERO, out=u8), 10, out=isd)  # uint8 wraps: non-digits >= 10
    np.equal(a, _COMMA, out=comma)
    np.equal(a, _NL, out=isnl)
    np.equal(a, _SPACE, out=sp)
    np.logical_or(comma, isnl, out=sep)
    n_d, n_c, n_nl, n_sp = (int(np.count_nonzero(x)) for x in (isd, comma, isnl, sp))
    t = tmp[1:]
    ok = n_d + n_c + n_nl + n_sp == len(a) and not (sp[0] or sep[0])
    if ok:
        ok = int(np.count_nonzero(np.logical_and(comma[:-1], sp[1:], out=t))) == n_sp
    if ok:
        ok = int(np.count_nonzero(np.logical_and(isd[:-1], sep[1:], out=t))) == n_c + n_nl
    # A space only ever follows a comma in canonical text, so equal counts mean every
    # comma is followed by exactly one space.
    width = 2 if n_sp == n_c else 1 if n_sp == 0 else 0
    return isd, comma, sep, isnl, ok, width


def _violations(
    a: npt.NDArray[np.uint8],
    isd: npt.NDArray[np.bool_],
    comma: npt.NDArray[np.bool_],
    sep: npt.NDArray[np.bool_],
) -> npt.NDArray[np.bool_]:
    """The bytes that break the canonical form (slow path only)."""
    sp: npt.NDArray[np.bool_] = a == _SPACE
    viol: npt.NDArray[np.bool_] = ~(isd | sep | sp)
    viol[1:] |= sp[1:] & ~comma[:-1]
    viol[1:] |= sep[1:] & ~isd[:-1]
    viol[0] |= sp[0] | sep[0]
    return viol


def _choose(counts: I64, prefer: Callable[[int], bool] | None) -> int:
    """Most common field count, preferring counts ``prefer`` accepts (0 if none)."""
    if not len(counts):
        return 0
    vals, freq = np.unique(counts, return_counts=True)
    order = np.argsort(-freq, kind="stable")
    ranked = [int(v) for v in vals[order]]
    if prefer is not None:
        fitting = [v for v in ranked if prefer(v)]
        if fitting:
            return fitting[0]
    return ranked[0]


def scan(
    buf: bytes,
    ncols: int | None = None,
    prefer: Callable[[int], bool] | None = None,
    max_line: int | None = None,
) -> Scan:
    """Scan complete lines (``buf`` ends with a newline, or is empty).

    Never raises on content: every line is either accepted or listed in ``bad`` with a
    reason (fields of more than 18 digits included).

    Args:
        buf: the bytes of whole lines.
        ncols: expected fields per line; ``None`` takes the most common count among
            well-formed lines, preferring counts that ``prefer`` accepts.
        prefer: predicate on a field count (e.g. "fits a fio bin layout").
        max_line: lines longer than this many bytes are rejected (``line-too-long``)
            without being parsed.

    Raises:
        ValueError: ``buf`` does not end with a newline (a caller's mistake).
    """
    if not buf:
        return _empty_scan(ncols or 0)
    if not buf.endswith(b"\n"):
        msg = "scan() takes complete lines only"
        raise ValueError(msg)
    if b"\r" in buf:
        buf = buf.replace(b"\r\n", b"\n")
    if len(buf) <= _SMALL_BYTES and (max_line is None or len(buf) <= max_line):
        small = _scan_small(buf, ncols, prefer)
        if small is not None:
            return small
    return scan_vectorised(buf, ncols, prefer, max_line=max_line)


def scan_vectorised(
    buf: bytes,
    ncols: int | None = None,
    prefer: Callable[[int], bool] | None = None,
    *,
    max_line: int | None = None,
    _checked: bool = False,
) -> Scan:
    """:func:`scan` without the small-input shortcut (for tests and large inputs).

    ``_checked`` marks a buffer that :func:`_rescan` already re-wrote line by line: any
    line that still fails the fast path is rejected here rather than re-scanned again, so
    no input can make the two call each other without end.
    """
    if not buf:
        return _empty_scan(ncols or 0)
    a = np.frombuffer(buf, dtype=np.uint8)
    isd, comma, sep, isnl, canonical, width = _masks(a)
    nl = np.flatnonzero(isnl)
    if len(nl) == 0:
        return _empty_scan(ncols or 0)
    if max_line is not None and len(buf) > max_line:
        too_long = np.diff(nl, prepend=-1) - 1 > max_line
        if too_long.any():
            line_ok = ~too_long & _line_ok_slow(a, comma, nl, _violations(a, isd, comma, sep))
            if ncols is None:
                ncols = _mode_fields(a, comma, nl, line_ok, prefer)
            res = _rescan(buf, nl, line_ok, ncols, too_long=too_long, max_line=max_line)
            return replace(res, lines=len(nl))
    if _checked and (width == 0 or not canonical):
        # Cannot happen for a buffer _rescan re-wrote; reject rather than loop.
        bad = [BadLine(i, "malformed", "not a line of integers") for i in range(len(nl))]
        return replace(_with_bad(_empty_scan(ncols or 0), bad), lines=len(nl))
    if width == 0 or not canonical:
        # Per-line checks find the offending lines; the rest is re-written canonically.
        line_ok = _line_ok_slow(a, comma, nl, _violations(a, isd, comma, sep))
        if ncols is None:
            ncols = _mode_fields(a, comma, nl, line_ok, prefer)
        return replace(_rescan(buf, nl, line_ok, ncols), lines=len(nl))
    toks = _Tokens(a, isd, sep, nl, width)
    if ncols is None:
        ncols = _choose(toks.fields[~toks.has_long], prefer)
    line_ok = (toks.fields == ncols) & ~toks.has_long
    if _checked and not line_ok.all():
        # A re-written buffer still holds canonical lines with another field count or a
        # digit run too long for int64: name them, and fast-scan the others alone (each
        # is well-formed on its own, so the second pass accepts all of them).
        return replace(_split_checked(buf, nl, toks, ncols), lines=len(nl))
    if not line_ok.all():
        return replace(_rescan(buf, nl, line_ok, ncols), lines=len(nl))
    return replace(toks.result(a, isd, ncols, np.arange(len(nl), dtype=np.int64)), lines=len(nl))


_SMALL_BYTES = 64 * 1024
_ALLOWED = b"0123456789, "


def _scan_small(buf: bytes, ncols: int | None, prefer: Callable[[int], bool] | None) -> Scan | None:
    """A few clean lines (a log growing line by line), parsed per line in C.

    The vectorised scan costs a fixed ~0.5 ms per call; numpy's own text parser takes
    ~30 us per 1859-field line. Returns None for anything but clean, uniform lines, which
    then take the vectorised path with its exact checks and messages.
    """
    lines = buf.split(b"\n")[:-1]
    rows: list[I64] = []
    for ln in lines:
        edge = ln.strip()
        if (
            ln.translate(None, _ALLOWED)
            or not edge
            # numpy reads an empty field as a number: leave any such line to the exact path
            or b",," in ln
            or b", ," in ln
            or b",  " in ln
            or edge.startswith(b",")
            or edge.endswith(b",")
        ):
            return None
        try:
            v = np.fromstring(ln, dtype=np.int64, sep=",")
        except ValueError:
            return None
        rows.append(v)
    widths = {len(v) for v in rows}
    if len(widths) != 1:
        return None
    (width,) = widths
    if ncols is None:
        if width < 4 or (prefer is not None and not prefer(width)):
            return None
        ncols = width
    if width != ncols or ncols < 4:
        return None
    dense = rows[0][None, :] if len(rows) == 1 else np.stack(rows)
    if int(dense.max()) >= 10**_MAX_DIGITS:  # saturated or too long: exact path decides
        return None
    body = dense[:, 3:]
    flat = np.flatnonzero(body)
    row, col = np.divmod(flat, ncols - 3)
    indptr = np.searchsorted(row, np.arange(len(rows) + 1)).astype(np.int64)
    return Scan(
        ncols,
        np.arange(len(rows), dtype=np.int64),
        np.ascontiguousarray(dense[:, :3]),
        indptr,
        col.astype(np.int32),
        body.reshape(-1)[flat],
        [],
        len(lines),
    )


def _line_ok_slow(
    a: npt.NDArray[np.uint8],
    comma: npt.NDArray[np.bool_],
    nl: I64,
    viol: npt.NDArray[np.bool_],
) -> npt.NDArray[np.bool_]:
    """Lines free of canonical-form violations and of mixed separators.

    ``viol`` is the violation mask of the buffer (:func:`_violations`).
    """
    # Mixed "," and ", " is valid but not fast: send such lines through the slow path,
    # which re-writes them with ", ".
    bad = viol
    bad[:-1] |= comma[:-1] & (a[1:] != _SPACE)
    ok = np.ones(len(nl), dtype=np.bool_)
    ok[np.unique(np.searchsorted(nl, np.flatnonzero(bad)))] = False
    return ok


def _mode_fields(
    a: npt.NDArray[np.uint8],
    comma: npt.NDArray[np.bool_],
    nl: I64,
    line_ok: npt.NDArray[np.bool_],
    prefer: Callable[[int], bool] | None,
) -> int:
    """Most common number of fields among good lines."""
    if not line_ok.any():
        # Nothing is canonical: count fields of the first few lines the slow way.
        starts = np.concatenate(([0], nl[:-1] + 1))
        counts = [
            a[int(s) : int(e)].tobytes().count(b",") + 1
            for s, e in zip(starts[:100], nl[:100], strict=True)
        ]
        return _choose(np.asarray(counts, dtype=np.int64), prefer)
    per_line = np.diff(np.cumsum(comma, dtype=np.int64)[nl], prepend=0) + 1
    return _choose(per_line[line_ok], prefer)


class _Tokens:
    """Non-zero fields of canonical, uniformly separated lines.

    They are located without a per-byte prefix count.

    With separator width ``s`` and ``X_i`` the extra digits (beyond one) of fields
    ``0..i`` of a line, the separator after field ``i`` sits at
    ``line_start + (i + 1) + X_i + s * i``. Every field with more than one digit ends in
    a non-zero digit or has a digit before its last byte, so it is among the located
    fields, and ``X_i`` is a cumulative sum over those alone.
    """

    def __init__(
        self,
        a: npt.NDArray[np.uint8],
        isd: npt.NDArray[np.bool_],
        sep: npt.NDArray[np.bool_],
        nl: I64,
        width: int,
    ) -> None:
        self.nl = nl
        self.starts = np.concatenate(([0], nl[:-1] + 1))
        # In canonical lines a separator always follows a digit, so a field ends at every
        # separator; it is non-zero unless it is a lone "0". ``ends`` are separator
        # positions (one past the field's last digit).
        nz = _WS.get(len(a))[1][6]  # the workspace's spare row (free once masks exist)
        nz[0] = False
        np.not_equal(a[:-1], _ZERO, out=nz[1:])
        nz[2:] |= isd[:-2]
        nz &= sep
        self.ends = np.flatnonzero(nz)
        # Lines and ends are both sorted, so each line's ends are one contiguous run; a
        # line's last field ends at its newline.
        first = np.zeros(len(nl) + 1, dtype=np.int64)
        first[1:] = np.searchsorted(self.ends, nl, side="right")
        per_line = np.diff(first)
        self.row = np.repeat(np.arange(len(nl), dtype=np.int64), per_line)
        self.vals, self.ndig = _parse_at(a, isd, self.ends)
        xc = np.zeros(len(self.ends) + 1, dtype=np.int64)
        np.cumsum(self.ndig - 1, out=xc[1:])
        # col = (end - start - 1 - extra digits of the line's fields so far) // (1 + width)
        base = self.starts + 1 - xc[first[:-1]]
        self.col = (self.ends - xc[1:] - np.repeat(base, per_line)) // (1 + width)
        x_total = xc[first[1:]] - xc[first[:-1]]
        line_len = nl - self.starts
        self.fields = (line_len - x_total + width) // (1 + width)
        # A digit run longer than int64 can hold is decoded only in part, so its line's
        # field arithmetic is off: such lines never take the fast path.
        self.has_long = np.zeros(len(nl), dtype=np.bool_)
        self.has_long[self.row[self.ndig > _MAX_DIGITS]] = True

    def result(
        self,
        a: npt.NDArray[np.uint8],
        isd: npt.NDArray[np.bool_],
        ncols: int,
        line_index: I64,
    ) -> Scan:
        """The scan of these lines (all of which have ``ncols`` fields)."""
        nlines = len(self.nl)
        if ncols < 4:
            short = [
                BadLine(int(i), "columns", f"has {ncols} fields, expected at least 4")
                for i in line_index
            ]
            return _with_bad(_empty_scan(ncols), short)
        header = np.zeros((nlines, 3), dtype=np.int64)
        hdig = np.zeros((nlines, 3), dtype=np.int64)
        pos = self.starts
        for k in range(3):
            header[:, k], hdig[:, k], end = _parse_fwd(a, isd, pos)
            pos = end + 1 + (a[end + 1] == _SPACE)  # skip ", " (or ",")
        body = (self.col >= 3) & (self.vals > 0)  # "00" is located but holds no count
        row, col, vals = self.row[body], self.col[body] - 3, self.vals[body]
        bad: list[BadLine] = []
        too_long = self.ndig > _MAX_DIGITS
        long_rows = np.flatnonzero((hdig > _MAX_DIGITS).any(1))
        if too_long.any() or len(long_rows):
            long_rows = np.union1d(long_rows, self.row[too_long])
            keep = np.ones(nlines, dtype=np.bool_)
            keep[long_rows] = False
            bad = [
                BadLine(int(line_index[r]), "overflow", "a value has more than 18 digits")
                for r in long_rows
            ]
            sel = keep[row]
            row, col, vals = row[sel], col[sel], vals[sel]
            row = (np.cumsum(keep) - 1)[row]
            header, line_index = header[keep], line_index[keep]
        indptr = np.searchsorted(row, np.arange(len(header) + 1), side="left").astype(np.int64)
        return Scan(ncols, line_index, header, indptr, col.astype(np.int32), vals, bad)


def _split_checked(buf: bytes, nl: I64, toks: _Tokens, ncols: int) -> Scan:
    """:func:`scan_vectorised` of a re-written buffer whose lines are not all ``ncols`` wide."""
    starts = np.concatenate(([0], nl[:-1] + 1))
    bad: list[BadLine] = []
    keep: list[int] = []
    for i in range(len(nl)):
        if toks.has_long[i]:
            bad.append(BadLine(i, "overflow", "a value has more than 18 digits"))
        elif toks.fields[i] != ncols:
            bad.append(BadLine(i, "columns", f"has {int(toks.fields[i])} fields, expected {ncols}"))
        else:
            keep.append(i)
    if not keep:
        return _with_bad(_empty_scan(ncols), bad)
    clean = b"".join(buf[int(starts[i]) : int(nl[i]) + 1] for i in keep)
    a = np.frombuffer(clean, dtype=np.uint8)
    isd, _, sep, isnl, canonical, width = _masks(a)
    inner_nl = np.flatnonzero(isnl)
    inner = _Tokens(a, isd, sep, inner_nl, width)
    if not canonical or width == 0 or not ((inner.fields == ncols) & ~inner.has_long).all():
        # Cannot happen (each kept line passed alone); reject rather than loop.
        bad.extend(BadLine(i, "malformed", "not a line of integers") for i in keep)
        return _with_bad(_empty_scan(ncols), sorted(bad, key=lambda b: b.index))
    idx = np.asarray(keep, dtype=np.int64)
    res = inner.result(a, isd, ncols, idx)
    return _with_bad(res, sorted(bad + res.bad, key=lambda b: b.index))


def _with_bad(s: Scan, bad: list[BadLine]) -> Scan:
    return Scan(s.ncols, s.line_index, s.header, s.indptr, s.bins, s.counts, bad)


def _rescan(
    buf: bytes,
    nl: I64,
    line_ok: npt.NDArray[np.bool_],
    ncols: int,
    *,
    too_long: npt.NDArray[np.bool_] | None = None,
    max_line: int | None = None,
) -> Scan:
    """Slow-path the offending lines, then fast-scan the rest in one canonical buffer.

    Lines marked ``too_long`` are rejected unread.
    """
    starts = np.concatenate(([0], nl[:-1] + 1))
    pieces: list[bytes] = []
    index: list[int] = []
    bad: list[BadLine] = []
    # Walk runs of good lines as single slices; only bad lines are looked at one by one.
    flips = np.flatnonzero(np.diff(line_ok.astype(np.int8))) + 1
    bounds = [0, *flips.tolist(), len(line_ok)]
    for lo, hi in itertools.pairwise(bounds):
        if line_ok[lo]:
            pieces.append(buf[int(starts[lo]) : int(nl[hi - 1]) + 1])
            index.extend(range(lo, hi))
            continue
        for i in range(lo, hi):
            if too_long is not None and too_long[i]:
                bad.append(BadLine(i, "line-too-long", f"line longer than {max_line} bytes"))
                continue
            fixed, kind, reason = _slow_line(buf[int(starts[i]) : int(nl[i])], ncols)
            if fixed is None:
                bad.append(BadLine(i, kind, reason))
            else:
                pieces.append(fixed)
                index.append(i)
    clean = b"".join(pieces)
    res = _empty_scan(ncols)
    if clean:
        inner = scan_vectorised(clean, ncols, _checked=True)
        # Every line of ``clean`` is canonical with ``ncols`` fields, so inner.bad holds
        # only overflow lines; map its indices back to ours.
        idx = np.asarray(index, dtype=np.int64)
        bad.extend(BadLine(int(idx[b.index]), b.kind, b.reason) for b in inner.bad)
        res = Scan(
            ncols, idx[inner.line_index], inner.header, inner.indptr, inner.bins, inner.counts, []
        )
    bad.sort(key=lambda b: b.index)
    return _with_bad(res, bad)


def _parse_fwd(
    a: npt.NDArray[np.uint8], isd: npt.NDArray[np.bool_], starts: I64
) -> tuple[I64, I64, I64]:
    """Decode digit runs starting at ``starts``: values, digit counts, end positions."""
    val = np.zeros(len(starts), dtype=np.int64)
    ndig = np.zeros(len(starts), dtype=np.int64)
    alive = np.ones(len(starts), dtype=np.bool_)
    pos = starts.copy()
    for _ in range(_MAX_DIGITS + 1):
        # A canonical line always ends in a newline, so pos never runs past the buffer.
        ok = alive & isd[pos]
        if not ok.any():
            break
        val = val * np.where(ok, 10, 1) + (a[pos].astype(np.int64) - _ZERO) * ok
        ndig += ok
        pos = pos + ok
        alive = ok
    return val, ndig, pos


def _empty_scan(ncols: int) -> Scan:
    z = np.zeros(0, dtype=np.int64)
    return Scan(
        ncols, z, np.zeros((0, 3), np.int64), np.zeros(1, np.int64), np.zeros(0, np.int32), z, []
    )
