"""Quanta files as report input: closed-quantum JSON lines read back, revisions resolved.

An aggregator's or root's quanta file (``quanta.jsonl``, rotated to ``quanta.jsonl.1``,
``.2``, ...: the higher the suffix, the older) and the output of ``fiomon report --format
jsonl`` hold one closed-quantum JSON object per line
(:meth:`fiomon.closed.ClosedQuantum.to_json_line`). A quanta file is append-only and may
hold several publications of one row: its key (``end_ms``, ``scope``, ``host``,
``direction``) gets the next ``revision`` each time late records are merged into its
quantum. Readers take the highest ``revision`` per key; on equal revisions the later line
wins, in file order, the files of one rotation read oldest first.

Recognised by content (:func:`is_quanta_file`): the first non-blank line opens with
``{"start_ms":``, which no fio output does (a json+ document opens with ``"fio version"``,
``"jobs"``, ...; a hist log with a digit).

Errors: a line that is not a closed-quantum object is a :class:`QuantaFileError` naming
``file:line``, except a file's last line when it has no newline and does not parse (a
writer killed mid-line): that one is skipped with a warning.

The rows are all there is: without histograms, another quantum, phase, confidence level
or span merging cannot be computed from them (:func:`resolve_rows` refuses those), and a
percentile the rows do not hold cannot be printed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from fiomon.closed import ClosedQuantum
from fiomon.errors import FiomonError, QuantaFileError
from fiomon.histogram import HistStats, pct_key

HEAD_BYTES = 4096
_HEAD = re.compile(rb'\A\s*\{\s*"start_ms"\s*:')
_ROTATED = re.compile(r"\A(?P<base>.+)\.(?P<n>\d+)\Z")
# Epoch ms of 1973: rows ending before it come from relative-time fio logs (``fiomon report
# --format jsonl`` of logs without log_unix_epoch), whose times count from the run's start.
RELATIVE_BEFORE_MS = 10**11
_T = TypeVar("_T")


def is_quanta_file(path: Path) -> bool:
    """Whether ``path`` holds closed-quantum JSON lines (False: unreadable, or other content)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError:
        return False
    return _HEAD.match(head) is not None


def _blank(path: Path) -> bool:
    """Whether ``path`` holds nothing but white space (an unreadable file is not blank)."""
    try:
        with path.open("rb") as fh:
            return not fh.read(HEAD_BYTES).strip()
    except OSError:
        return False


def rotation_order(paths: Sequence[Path]) -> list[Path]:
    """``paths`` with each rotation's files oldest first (``f.2``, ``f.1``, ``f``).

    Files of one rotation (same folder, same name less a ``.N`` suffix) keep the place of
    the first of them given; other files keep their order.
    """
    families: dict[Path, list[tuple[int, Path]]] = {}
    for p in paths:
        m = _ROTATED.match(p.name)
        base, n = (p.with_name(m["base"]), int(m["n"])) if m else (p, 0)
        families.setdefault(base, []).append((n, p))
    return [p for members in families.values() for _, p in sorted(members, key=lambda x: -x[0])]


@dataclass(frozen=True, slots=True)
class FileRow:
    """One resolved row and the line that published it.

    Args:
        row: the row (no histogram: ``hist`` is None).
        line: the line as the file holds it, newline included.
        where: ``file:line`` of that line.
    """

    row: ClosedQuantum
    line: str
    where: str


@dataclass(slots=True)
class QuantaRows:
    """The resolved rows of some quanta files and what reading them met.

    Args:
        rows: one per key, its highest revision, in ``end_ms`` order (stable: rows of one
            quantum keep the order of their keys' first lines).
        percentiles: the percentile keys of the first row (``"99"``, ``"99.9"``).
        quantum_ms: length of the first plain row (not a span), ms; 0 if all are spans.
        lines: rows read (every revision).
        warnings: torn last lines skipped, one message each.
    """

    rows: list[FileRow] = field(default_factory=list)
    percentiles: tuple[str, ...] = ()
    quantum_ms: int = 0
    lines: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def superseded(self) -> int:
        """Lines replaced by a later publication of their key."""
        return self.lines - len(self.rows)

    @property
    def relative(self) -> bool:
        """The rows' times count from a run's start (see :data:`RELATIVE_BEFORE_MS`)."""
        return bool(self.rows) and self.rows[-1].row.end_ms < RELATIVE_BEFORE_MS


def read_quanta_files(paths: Sequence[Path]) -> QuantaRows:
    """The resolved rows of the quanta files ``paths`` (see the module docstring).

    Raises:
        QuantaFileError: a file cannot be read, a line is not a closed-quantum object, or
            no file holds a row.
    """
    latest: dict[tuple[int, str, str | None, str], FileRow] = {}
    out = QuantaRows()
    for path in rotation_order(paths):
        for item in _lines(path, out.warnings):
            out.lines += 1
            key = item.row.key
            old = latest.get(key)
            # Equal revisions: the later line wins (a writer re-publishing after a loss).
            if old is None or item.row.revision >= old.row.revision:
                latest[key] = item  # an existing key keeps its place in the dict
    if not latest:
        names = ", ".join(str(p) for p in paths)
        raise QuantaFileError(names, 0, "holds no closed-quantum rows")
    out.rows = sorted(latest.values(), key=lambda f: f.row.end_ms)
    first = out.rows[0].row
    out.percentiles = tuple(first.stats.percentiles_ns)
    out.quantum_ms = next(
        (f.row.end_ms - f.row.start_ms for f in out.rows if f.row.target_met is None), 0
    )
    return out


def _lines(path: Path, warnings: list[str]) -> Iterator[FileRow]:
    """The rows of one file, in file order; a torn last line is skipped with a warning."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise QuantaFileError(str(path), 0, f"cannot read: {exc.strerror}") from None
    with fh:
        pending: tuple[int, bytes] | None = None
        for n, raw in enumerate(fh, 1):
            if pending is not None:
                yield _row(path, *pending)
            pending = None if not raw.strip() else (n, raw)
        if pending is None:
            return
        n, raw = pending
        if raw.endswith(b"\n"):
            yield _row(path, n, raw)
            return
        try:
            yield _row(path, n, raw)
        except QuantaFileError as exc:
            # A writer killed mid-line leaves its last line without the newline.
            warnings.append(
                f"{path}:{n}: torn last line skipped (no newline, {exc.reason}; a writer "
                "stopped mid-line)"
            )


def _row(path: Path, n: int, raw: bytes) -> FileRow:
    """One line as a row.

    Raises:
        QuantaFileError: not a closed-quantum JSON object.
    """
    try:
        text = raw.decode("utf-8")
        obj = json.loads(text)
    except UnicodeDecodeError:
        raise QuantaFileError(str(path), n, "not UTF-8 text") from None
    except ValueError as exc:
        raise QuantaFileError(str(path), n, f"not a JSON object ({exc})") from None
    if not isinstance(obj, dict):
        raise QuantaFileError(str(path), n, "not a JSON object")
    try:
        row = parse_row(obj)
    except ValueError as exc:
        raise QuantaFileError(str(path), n, f"not a closed-quantum row: {exc}") from None
    line = text if text.endswith("\n") else text + "\n"
    return FileRow(row, line, f"{path}:{n}")


def parse_row(obj: dict[str, Any]) -> ClosedQuantum:
    """A closed-quantum JSON object (:meth:`ClosedQuantum.to_json`) as the row it describes.

    Fields later versions added (``complete``, ``revision``, ``runs``) take their defaults
    when absent, so files written before them still read.

    Raises:
        ValueError: a field is missing or has the wrong type, naming it.
    """
    scope = _get(obj, "scope", str)
    if scope not in ("cluster", "host"):
        msg = f"scope {scope!r} is neither 'cluster' nor 'host'"
        raise ValueError(msg)
    host = obj.get("host")
    if (scope == "host") != isinstance(host, str):
        msg = f"host {host!r} does not fit scope {scope!r}"
        raise ValueError(msg)
    pcts = _get(obj, "percentiles_ns", dict)
    saturated = _get(obj, "saturated", list)
    ci = obj.get("percentiles_ci_ns")
    missing = obj.get("cells_missing")
    stats = HistStats(
        samples=_number(obj, "samples"),
        min_ns=_number(obj, "min_ns"),
        mean_ns=_number(obj, "mean_ns"),
        max_ns=_number(obj, "max_ns"),
        percentiles_ns={str(k): _value(v, f"percentiles_ns.{k}") for k, v in pcts.items()},
        saturated=tuple(_text(s, "saturated") for s in saturated),
    )
    return ClosedQuantum(
        start_ms=_get(obj, "start_ms", int),
        end_ms=_get(obj, "end_ms", int),
        scope="host" if scope == "host" else "cluster",
        host=host if isinstance(host, str) else None,
        direction=_get(obj, "direction", str),
        stats=stats,
        iops=_optional(obj, "iops"),
        bytes_per_second=_optional(obj, "bytes_per_second"),
        streams=_get(obj, "streams", int),
        late_records=_get(obj, "late_records", int),
        ci_ns=None if ci is None else _intervals(ci),
        target_met=_get(obj, "target_met", bool) if "target_met" in obj else None,
        complete=_get(obj, "complete", bool) if "complete" in obj else True,
        cells_missing=(
            None if missing is None else tuple(_text(c, "cells_missing") for c in missing)
        ),
        revision=_get(obj, "revision", int) if "revision" in obj else 0,
        revised_at=None if obj.get("revised_at") is None else _get(obj, "revised_at", int),
        runs=tuple(_text(r, "runs") for r in _get(obj, "runs", list)) if "runs" in obj else (),
    )


def _get(obj: dict[str, Any], name: str, kind: type[_T]) -> _T:
    if name not in obj:
        msg = f"no {name!r}"
        raise ValueError(msg)
    v = obj[name]
    # bool is an int to isinstance; JSON's true is no count.
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        msg = f"{name} is {v!r}, not {kind.__name__}"
        raise ValueError(msg)
    return v


def _value(v: object, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        msg = f"{name} is {v!r}, not a number"
        raise ValueError(msg)
    return float(v)


def _number(obj: dict[str, Any], name: str) -> float:
    if name not in obj:
        msg = f"no {name!r}"
        raise ValueError(msg)
    return _value(obj[name], name)


def _optional(obj: dict[str, Any], name: str) -> float | None:
    v = obj.get(name)
    return None if v is None else _value(v, name)


def _text(v: object, name: str) -> str:
    if not isinstance(v, str):
        msg = f"{name} holds {v!r}, not a string"
        raise ValueError(msg)
    return v


def _intervals(ci: object) -> dict[str, tuple[float | None, float | None]]:
    if not isinstance(ci, dict):
        msg = f"percentiles_ci_ns is {ci!r}, not an object"
        raise ValueError(msg)
    out: dict[str, tuple[float | None, float | None]] = {}
    for k, pair in ci.items():
        if not isinstance(pair, list) or len(pair) != 2:
            msg = f"percentiles_ci_ns.{k} is {pair!r}, not [low, high]"
            raise ValueError(msg)
        lo, hi = (None if x is None else _value(x, f"percentiles_ci_ns.{k}") for x in pair)
        # Bounds are whole ns written as ints: keep them ints, so the row writes back the same.
        out[str(k)] = (_whole(lo), _whole(hi))
    return out


def _whole(x: float | None) -> float | None:
    if x is None or not math.isfinite(x) or not x.is_integer():
        return x
    return int(x)


def project(row: ClosedQuantum, keys: Sequence[str]) -> ClosedQuantum:
    """``row`` with only the percentiles ``keys`` (in that order; each must be in it)."""
    s = row.stats
    if list(s.percentiles_ns) == list(keys):
        return row
    stats = replace(
        s,
        percentiles_ns={k: s.percentiles_ns[k] for k in keys},
        saturated=tuple(k for k in s.saturated if k in keys),
    )
    ci = None if row.ci_ns is None else {k: row.ci_ns[k] for k in keys if k in row.ci_ns}
    return replace(row, stats=stats, ci_ns=ci)


@dataclass(frozen=True, slots=True)
class Selection:
    """What a report prints of a quanta file's rows.

    Args:
        percentiles: the percentiles, in percent (each must be in every row).
        directions: the directions of the rows printed.
        per_host: host rows too (else cluster rows only).
        quantum_ms: the quantum asked for (None: the file's).
        other: options that need histograms and were given, ``flag -> why``; any is an
            error.
    """

    percentiles: tuple[float, ...] | None
    directions: tuple[str, ...]
    per_host: bool
    quantum_ms: int | None = None
    other: dict[str, str] = field(default_factory=dict)


def resolve_rows(paths: Sequence[Path], select: Selection) -> tuple[QuantaRows, list[FileRow]]:
    """Read ``paths`` (:func:`read_quanta_files`) and pick the rows ``select`` asks for.

    Rows keep the file's line (:attr:`FileRow.line`) unless a projection to fewer
    percentiles changed them.

    Raises:
        QuantaFileError: as :func:`read_quanta_files`; or a percentile a row lacks.
        FiomonError: ``select`` asks for what needs histograms.
    """
    names = ", ".join(str(p) for p in paths)
    if select.other:
        why = "; ".join(f"{flag}: {reason}" for flag, reason in select.other.items())
        msg = (
            f"{names}: a quanta file holds closed rows, not histograms, so these options "
            f"cannot apply to it ({why}); run them on the fio logs instead"
        )
        raise FiomonError(msg)
    got = read_quanta_files(paths)
    if select.quantum_ms is not None and got.quantum_ms and select.quantum_ms != got.quantum_ms:
        msg = (
            f"{names}: --quantum {select.quantum_ms} ms, but the file's quanta are "
            f"{got.quantum_ms} ms: other quanta need the histograms, which a quanta file "
            "does not hold; run fiomon report on the fio logs instead"
        )
        raise FiomonError(msg)
    keys = (
        got.percentiles if select.percentiles is None else tuple(map(pct_key, select.percentiles))
    )
    out: list[FileRow] = []
    for f in got.rows:
        r = f.row
        if r.direction not in select.directions or (r.scope == "host" and not select.per_host):
            continue
        have = r.stats.percentiles_ns
        lacking = [k for k in keys if k not in have]
        if lacking:
            path, _, line = f.where.rpartition(":")
            msg = (
                f"no percentile {', '.join(lacking)} in it; its rows hold "
                f"{', '.join(have) or 'none'} (choose among them with --percentiles)"
            )
            raise QuantaFileError(path, int(line), msg)
        p = project(r, keys)
        out.append(f if p is r else FileRow(p, p.to_json_line(), f.where))
    return got, out


def all_quanta_files(paths: Sequence[Path]) -> bool:
    """Whether ``paths`` are quanta files (True) or fio output (False), never both.

    Raises:
        FiomonError: both kinds are given (naming one of each): a quanta file's rows
            are already closed quanta, and fio's records cannot be merged into them.
    """
    # An empty file says nothing either way: the current quanta file right after a
    # rotation (or of an idle aggregator) is empty, and its rotated siblings are the rows.
    given = [p for p in paths if not _blank(p)]
    if given and len(given) < len(paths) and all(is_quanta_file(p) for p in given):
        return True
    kinds = [is_quanta_file(p) for p in paths]
    if all(kinds):
        return bool(kinds)
    if not any(kinds):
        return False
    rows = [str(p) for p, k in zip(paths, kinds, strict=True) if k]
    fio = [str(p) for p, k in zip(paths, kinds, strict=True) if not k]
    msg = (
        f"cannot mix a quanta file ({_few(rows)}: closed-quantum rows, no histograms) with "
        f"fio output ({_few(fio)}) in one run: report them separately"
    )
    raise FiomonError(msg)


def _few(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def first_row(paths: Sequence[Path]) -> ClosedQuantum | None:
    """The oldest row of the quanta files ``paths`` (its percentiles and quantum), or None.

    Raises:
        QuantaFileError: the file cannot be read, or its first line is not a row.
    """
    for path in rotation_order(paths):
        for item in _lines(path, []):
            return item.row
    return None
