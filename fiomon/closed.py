"""The closed-quantum row: one quantum's statistics for one scope and direction, as JSON.

:class:`ClosedQuantum` is what every producer of quanta emits -- the quantum engine
(:mod:`fiomon.engine`, behind the offline report and the live aggregator) and the root
merging cells' partials -- and :meth:`ClosedQuantum.to_json_line` is the one serializer of
the quanta file and ``fiomon report --format jsonl``. :func:`group_stats` and
:func:`closed_row` are the one computation from merged histograms to rows, shared by the
engine and the root so that their rows are equal.

Times are epoch ms, latencies ns, rates per second of the span the records cover.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.confidence import summarize_with_bounds
from fiomon.histogram import HistStats, pct_key, summarize_many

Scope = Literal["cluster", "host"]
# Compact separators, as json.dumps(obj, separators=(",", ":")); one encoder, not one per row.
_LINE_ENCODER = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class ClosedQuantum:
    """One closed quantum for one scope and direction (the closed-quantum JSON line).

    Args:
        start_ms: quantum start (exclusive), ms.
        end_ms: quantum end (inclusive), ms.
        scope: ``cluster`` or ``host``.
        host: the host for host scope, else ``None``.
        direction: ``read``, ``write``, ``trim``, ``mixed`` or ``all``.
        stats: histogram statistics (never ``None``: empty quanta produce no row).
        iops: samples per covered second (``None`` if the records cover no time).
        bytes_per_second: bytes per covered second (``None`` likewise).
        streams: number of streams that contributed.
        late_records: late records of this scope counted since the previous close, on
            the oldest quantum closed then (0 on the others closed at the same time).
        hist: the merged histogram (counts per bin of the engine's layout), kept for
            cluster rows when the engine is asked to (the exporter's bucket histogram),
            and for host rows too with ``keep_host_hists`` (merging quanta into spans).
        ci_ns: per percentile key, the distribution-free confidence interval ``(low,
            high)`` in ns at the engine's level (:mod:`fiomon.confidence`); ``None`` for a
            side the data cannot bound. ``None`` when bounds are not computed.
        target_met: for rows that merge several quanta to reach a target accuracy
            (:mod:`fiomon.offline.spans`): whether the target was met (False: the span reached its
            maximum first). ``None`` for plain quanta.
        complete: whether the row holds everything its producer expected: always true
            offline (the input is what there is); at the root, false when a configured cell
            is missing from the quantum (:attr:`cells_missing` names them) or a cell's own
            row of the group was incomplete (``cells_missing`` may then be empty); at an
            aggregator, false when a host it was waiting for had not reported past the
            quantum's end when it closed on the lateness.
        cells_missing: root rows only: the configured cells neither in the quantum nor
            known to have closed it (``()`` when complete); ``None`` on other rows (not
            written).
        revision: 0 on a row's first publication; each later publication of the same key
            (``end_ms``, ``scope``, ``host``, ``direction``) with late records merged in
            carries the next number. Readers take the highest revision per key.
        revised_at: wall clock (epoch ms) of a publication after the quantum's first
            close (a revision, or a key first published by late records); ``None`` on a
            row published when its quantum closed (not written).
        runs: the run labels of the records merged into the row, sorted (agents' ``run``,
            ``fiomon report --run``); ``()`` when none carried one (not written). The
            root's rows from cells' partials carry none.
    """

    start_ms: int
    end_ms: int
    scope: Scope
    host: str | None
    direction: str
    stats: HistStats
    iops: float | None
    bytes_per_second: float | None
    streams: int
    late_records: int
    hist: npt.NDArray[np.float64] | None = None
    ci_ns: dict[str, tuple[float | None, float | None]] | None = None
    target_met: bool | None = None
    complete: bool = True
    cells_missing: tuple[str, ...] | None = None
    revision: int = 0
    revised_at: int | None = None
    runs: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[int, str, str | None, str]:
        """The row's identity across revisions: ``(end_ms, scope, host, direction)``."""
        return (self.end_ms, self.scope, self.host, self.direction)

    def to_json(self) -> dict[str, Any]:
        """The closed-quantum JSON object (README.md, ``fiomon report``'s ``jsonl``)."""
        s = self.stats
        out: dict[str, Any] = {
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "scope": self.scope,
            "host": self.host,
            "direction": self.direction,
            "samples": _num(s.samples),
            "min_ns": _num(s.min_ns),
            "mean_ns": _num(s.mean_ns),
            "max_ns": _num(s.max_ns),
            "percentiles_ns": {k: _num(v) for k, v in s.percentiles_ns.items()},
            "saturated": list(s.saturated),
            "iops": None if self.iops is None else _num(self.iops),
            "bytes_per_second": (
                None if self.bytes_per_second is None else _num(self.bytes_per_second)
            ),
            "streams": self.streams,
            "late_records": self.late_records,
            "revision": self.revision,
        }
        if self.revised_at is not None:
            out["revised_at"] = self.revised_at
        out["complete"] = self.complete
        if self.cells_missing is not None:
            out["cells_missing"] = list(self.cells_missing)
        if self.ci_ns is not None:
            # Bounds are whole ns (bin edges; ci_dicts makes them ints), written as
            # they are; lists, as a JSON line reads back.
            ci = self.ci_ns
            out["percentiles_ci_ns"] = dict(zip(ci, map(list, ci.values()), strict=True))
        if self.target_met is not None:
            out["target_met"] = self.target_met
        if self.runs:
            out["runs"] = list(self.runs)
        return out

    def to_json_line(self) -> str:
        """The closed-quantum JSON line, newline included.

        The one serializer of the report == aggregator contract: ``fiomon report --format
        jsonl`` and the aggregator's quanta file both write exactly this. The text is
        ``json`` of :meth:`to_json` with compact separators, character for character
        (``tests/test_closed.py`` checks it), formatted here field by field without the
        intermediate dict: an aggregator writes thousands of rows a second, and building
        and encoding the dict took a third more time.
        """
        s = self.stats
        pct = ",".join([f"{_STR(k)}:{_numtext(v)}" for k, v in s.percentiles_ns.items()])
        line = (
            f'{{"start_ms":{_val(self.start_ms)},"end_ms":{_val(self.end_ms)},'
            f'"scope":{_STR(self.scope)},'
            f'"host":{"null" if self.host is None else _STR(self.host)},'
            f'"direction":{_STR(self.direction)},'
            f'"samples":{_numtext(s.samples)},"min_ns":{_numtext(s.min_ns)},'
            f'"mean_ns":{_numtext(s.mean_ns)},"max_ns":{_numtext(s.max_ns)},'
            f'"percentiles_ns":{{{pct}}},"saturated":[{",".join(map(_STR, s.saturated))}],'
            f'"iops":{"null" if self.iops is None else _numtext(self.iops)},'
            f'"bytes_per_second":'
            f"{'null' if self.bytes_per_second is None else _numtext(self.bytes_per_second)},"
            f'"streams":{_val(self.streams)},"late_records":{_val(self.late_records)},'
            f'"revision":{_val(self.revision)},'
            + ("" if self.revised_at is None else f'"revised_at":{_val(self.revised_at)},')
            + f'"complete":{"true" if self.complete else "false"}'
        )
        if self.cells_missing is not None:
            line += f',"cells_missing":[{",".join(map(_STR, self.cells_missing))}]'
        if self.ci_ns is not None:
            ci = ",".join(
                [f"{_STR(k)}:[{_val(lo)},{_val(hi)}]" for k, (lo, hi) in self.ci_ns.items()]
            )
            line += f',"percentiles_ci_ns":{{{ci}}}'
        if self.target_met is not None:
            line += f',"target_met":{_val(self.target_met)}'
        if self.runs:
            line += f',"runs":[{",".join(map(_STR, self.runs))}]'
        return line + "}\n"


def mark_incomplete(
    rows: list[ClosedQuantum], silent: Mapping[int, Collection[str]]
) -> list[ClosedQuantum]:
    """``rows`` with ``complete`` false where a host expected in the quantum was silent.

    ``silent`` maps a quantum's end (ms) to the hosts the aggregator expected in it that
    sent nothing for it (:meth:`fiomon.aggregator.watermark.Watermark.silent`). Cluster
    rows of such a quantum are incomplete; a host row is incomplete only if its own host
    is among them. The other hosts' rows are complete: each holds everything its host
    sent for the quantum, which is what a host row claims. Rows of other quanta are
    returned as they are (the same objects).
    """
    if not any(silent.values()):
        return rows
    out: list[ClosedQuantum] = []
    for r in rows:
        hosts = silent.get(r.end_ms)
        if hosts and r.complete and (r.host is None or r.host in hosts):
            r = replace(r, complete=False)  # noqa: PLW2901 -- the marked copy
        out.append(r)
    return out


def _num(x: float) -> float | int:
    """Integers stay integers; other values keep 12 significant digits (stable text)."""
    if float(x).is_integer() and abs(x) < 2**53:
        return int(x)
    return float(f"{x:.12g}")


_STR = json.encoder.encode_basestring_ascii  # a JSON string as the encoder writes it
_FLOAT_REPR = float.__repr__
_INF = float("inf")


def _numtext(x: float) -> str:
    """``_val(_num(x))``: ``_num(x)`` as JSON text, exactly as :data:`_LINE_ENCODER` writes it.

    Written out rather than composed: 20 % less time per number, and a closed row has
    about twenty (``tests/test_closed.py`` checks it against the encoder).
    """
    f = float(x)
    if f.is_integer() and abs(f) < 2**53:  # _num's test, inlined (a hot path)
        return int.__repr__(int(x))
    v = float(f"{x:.12g}")
    return _FLOAT_REPR(v) if v - v == 0 else _floattext(v)  # finite: repr


def _floattext(v: float) -> str:
    """A float as the JSON encoder writes it (``allow_nan``: NaN, Infinity, -Infinity)."""
    if v != v:  # noqa: PLR0124 -- NaN is the one value unequal to itself
        return "NaN"
    if v in (_INF, -_INF):
        return "Infinity" if v > 0 else "-Infinity"
    return _FLOAT_REPR(v)


def _val(v: object) -> str:
    """A JSON scalar as :data:`_LINE_ENCODER` writes it (anything else goes to it)."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if type(v) is int:
        return int.__repr__(v)
    if type(v) is float:
        return _floattext(v)
    return _LINE_ENCODER.encode(v)


Interval = dict[str, tuple[float | None, float | None]]  # percentile key -> (low, high) ns


def group_stats(
    hists: npt.NDArray[np.float64],
    layout: BinLayout,
    percentiles: Sequence[float],
    *,
    confidence_level: float | None,
    first_bin: int = 0,
) -> tuple[list[HistStats | None], list[Interval | None]]:
    """Statistics of every row of ``hists`` with their percentile intervals (for closed_row).

    The one computation behind every closed-quantum row: the engine's (and so the
    aggregator's and the offline report's) and the root's, whose equality depends on it.
    ``hists`` may hold only the columns from ``first_bin`` on (as
    :func:`fiomon.histogram.summarize_many`). Intervals are None without a
    ``confidence_level``; an empty row's statistics are None.
    """
    if confidence_level is None:
        stats = summarize_many(hists, layout, percentiles, first_bin=first_bin)
        return stats, [None] * len(stats)
    stats, low, high = summarize_with_bounds(
        hists, layout, percentiles, level=confidence_level, first_bin=first_bin
    )
    return stats, ci_dicts([pct_key(q) for q in percentiles], low, high)


def closed_row(
    *,
    start_ms: int,
    end_ms: int,
    scope: Scope,
    host: str | None,
    direction: str,
    stats: HistStats,
    ci_ns: Interval | None,
    lo_ms: int,
    hi_ms: int,
    nbytes: float,
    streams: int,
    late_records: int,
    hist: npt.NDArray[np.float64] | None,
    complete: bool = True,
    cells_missing: tuple[str, ...] | None = None,
) -> ClosedQuantum:
    """The :class:`ClosedQuantum` row of one group (engine and root alike).

    Rates are per second of the span the group's records cover (``hi_ms - lo_ms``, ms),
    not of the quantum: a stream that ran a tenth of it is not diluted. A group whose
    records cover no time has no rates (None). ``complete`` and ``cells_missing`` are
    the row's :class:`ClosedQuantum` fields (the root sets both; the defaults are an
    engine's row).
    """
    covered_s = (hi_ms - lo_ms) / 1000.0
    return ClosedQuantum(
        start_ms=start_ms,
        end_ms=end_ms,
        scope=scope,
        host=host,
        direction=direction,
        stats=stats,
        iops=stats.samples / covered_s if covered_s > 0 else None,
        bytes_per_second=nbytes / covered_s if covered_s > 0 else None,
        streams=streams,
        late_records=late_records,
        hist=hist,
        ci_ns=ci_ns,
        complete=complete,
        cells_missing=cells_missing,
    )


def ci_dicts(
    keys: Sequence[str], low: npt.NDArray[np.float64], high: npt.NDArray[np.float64]
) -> list[dict[str, tuple[float | None, float | None]] | None]:
    """Per row of ``(rows, keys)`` bounds, ``{key: (low, high)}`` with NaN (no bound) as None."""

    def cells(x: npt.NDArray[np.float64]) -> list[list[float | None]]:
        # Bounds are bin edges: whole ns (as _num would write them), so ints, which
        # JSON writes without formatting a float.
        nan = np.isnan(x)
        whole = np.all((x == np.round(x)) | nan) and not np.any(np.abs(x[~nan]) >= 2**53)
        obj = np.where(nan, 0, x).astype(np.int64).astype(object) if whole else x.astype(object)
        obj[nan] = None
        out: list[list[float | None]] = obj.tolist()
        return out

    # One C-level zip per row: an aggregator builds thousands of these a second.
    return [
        dict(zip(keys, zip(lo, hi, strict=True), strict=True))
        for lo, hi in zip(cells(low), cells(high), strict=True)
    ]
