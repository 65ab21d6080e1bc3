"""The quantum engine: records in, closed quanta out (offline report and live aggregator).

Time is cut into quanta ``(phase + q*Q, phase + (q+1)*Q]`` (ms). Records are end-stamped
spans; a record that overlaps several quanta is split over them in proportion to overlap,
and a zero-length record (fio's catch-up record after a stall) goes wholly to the quantum
holding its stamp. Everything is accumulated per (quantum, host, direction) in float64 bins,
so cluster scope is the sum over hosts and ``all`` the sum over directions, at close time.

Closing is driven from outside: :meth:`QuantumEngine.close_through` closes every quantum
that ends at or before a time (the report passes the streams' common progress, the live
aggregator its watermark). A record that reaches a closed quantum is *late*: that part is
not merged (published quanta never change) and it is counted per host.

Memory is bounded by ``max_open_quanta``: when a record would open more, the oldest open
quanta are closed early (counted in ``forced_closes``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.histogram import HistStats, summarize_many
from fiomon.model import DIRECTION_LABELS, RecordBatch, StreamInfo, expand_ranges

Scope = Literal["cluster", "host"]
ALL_DIRECTIONS: tuple[str, ...] = (*DIRECTION_LABELS, "all")
OVERFLOW_HOST = -1


@dataclass(frozen=True, slots=True)
class ClosedQuantum:
    """One closed quantum for one scope and direction (the closed-quantum JSON line).

    Args:
        start_ms: quantum start (exclusive), ms.
        end_ms: quantum end (inclusive), ms.
        scope: ``cluster`` or ``host``.
        host: the host for host scope, else ``None``.
        direction: ``read``, ``write``, ``trim`` or ``all``.
        stats: histogram statistics (never ``None``: empty quanta produce no row).
        iops: samples per covered second (``None`` if the records cover no time).
        bytes_per_second: bytes per covered second (``None`` likewise).
        streams: number of streams that contributed.
        late_records: late records of this scope counted since the previous close.
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

    def to_json(self) -> dict[str, Any]:
        """The closed-quantum JSON object of DESIGN.md."""
        s = self.stats
        return {
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
        }


def _num(x: float) -> float | int:
    """Integers stay integers; other values keep 12 significant digits (stable text)."""
    if float(x).is_integer() and abs(x) < 2**53:
        return int(x)
    return float(f"{x:.12g}")


@dataclass(slots=True)
class _Slot:
    row: int  # row of the engine's store holding this slot's histogram
    nbytes: float = 0.0
    lo: int = 2**62
    hi: int = -(2**62)
    streams: set[StreamInfo] = field(default_factory=set)


class QuantumEngine:
    """Accumulates records into quanta and closes them into :class:`ClosedQuantum` rows.

    Args:
        layout: bin layout of the merged histograms; finer batches of the same GROUP_NR
            are coarsened to it, others refused (:class:`~fiomon.errors.LayoutError`).
        quantum_ms: quantum length Q in ms (> 0).
        phase_ms: grid offset in ms; quanta end at ``phase_ms + k*Q``.
        percentiles: percentiles to compute, e.g. ``(50, 90, 99, 99.9)``.
        directions: which direction rows to emit (labels of :data:`ALL_DIRECTIONS`).
        per_host: also emit host-scope rows.
        max_hosts: hosts tracked for host scope; more are counted in ``hosts_over_cap``
            and only enter cluster scope.
        max_open_quanta: open quanta kept; more force the oldest to close.
    """

    def __init__(
        self,
        *,
        layout: BinLayout,
        quantum_ms: int,
        phase_ms: int = 0,
        percentiles: Sequence[float] = (50, 90, 99, 99.9),
        directions: Sequence[str] = ALL_DIRECTIONS,
        per_host: bool = False,
        max_hosts: int = 1000,
        max_open_quanta: int = 100_000,
    ) -> None:
        if quantum_ms <= 0:
            msg = f"quantum_ms must be positive, got {quantum_ms}"
            raise ValueError(msg)
        bad = [d for d in directions if d not in ALL_DIRECTIONS]
        if bad:
            msg = f"unknown directions {bad}; choose from {list(ALL_DIRECTIONS)}"
            raise ValueError(msg)
        self.layout = layout
        self.quantum_ms = quantum_ms
        self.phase_ms = phase_ms % quantum_ms
        self.percentiles = tuple(percentiles)
        self.directions = tuple(directions)
        self.per_host = per_host
        self.max_hosts = max_hosts
        self.max_open_quanta = max_open_quanta
        self._open: dict[int, dict[tuple[int, int], _Slot]] = {}
        self._next_open: int | None = None  # quanta below this id are closed
        self._hosts: dict[str, int] = {}
        self._host_names: list[str] = []
        self.late_records: Counter[str] = Counter()
        self.late_samples = 0.0
        self._late_since_close: Counter[str] = Counter()
        self.hosts_over_cap = 0
        self._over_cap_hosts: set[str] = set()
        self.forced_closes = 0
        self.records = 0
        self._pending_closed: list[ClosedQuantum] = []
        # Histograms of open slots are rows of one float64 store, so a whole batch merges
        # with a single np.add.at; freed rows are zeroed and reused.
        self._store = np.zeros((64, layout.nbins), dtype=np.float64)
        self._free: list[int] = list(range(63, -1, -1))

    # -- intake -------------------------------------------------------------------------

    def quantum_of(self, t_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Id of the quantum ``(start, end]`` holding each time."""
        return np.floor_divide(t_ms - self.phase_ms - 1, self.quantum_ms)

    def quantum_bounds(self, q: int) -> tuple[int, int]:
        """Start (exclusive) and end (inclusive) of quantum ``q``, ms."""
        start = self.phase_ms + q * self.quantum_ms
        return start, start + self.quantum_ms

    def _host_index(self, host: str) -> int:
        idx = self._hosts.get(host)
        if idx is not None:
            return idx
        if len(self._hosts) >= self.max_hosts:
            if host not in self._over_cap_hosts:
                self._over_cap_hosts.add(host)
                self.hosts_over_cap += 1
            return OVERFLOW_HOST
        self._hosts[host] = len(self._host_names)
        self._host_names.append(host)
        return self._hosts[host]

    def add(self, batch: RecordBatch) -> None:
        """Merge every record of ``batch`` into its quanta (late parts are counted)."""
        n = len(batch)
        if n == 0:
            return
        batch = batch.coarsened(self.layout)
        self.records += n
        s, e = batch.start_ms, batch.end_ms
        q_last = self.quantum_of(e)
        q_first = np.where(e > s, np.floor_divide(s - self.phase_ms, self.quantum_ms), q_last)
        q_first = np.minimum(q_first, q_last)
        npieces = q_last - q_first + 1
        rec = np.repeat(np.arange(n, dtype=np.int64), npieces)
        q = q_first[rec] + (np.arange(len(rec)) - np.repeat(np.cumsum(npieces) - npieces, npieces))
        qstart = self.phase_ms + q * self.quantum_ms
        lo = np.maximum(s[rec], qstart)
        hi = np.minimum(e[rec], qstart + self.quantum_ms)
        dur = (e - s)[rec]
        w = np.where(dur > 0, (hi - lo) / np.maximum(dur, 1), 1.0)

        stream_host = np.array(
            [self._host_index(si.host) for si in batch.streams] or [0], dtype=np.int64
        )
        host = stream_host[batch.stream_idx[rec]]
        if self._next_open is not None:
            late = q < self._next_open
            if late.any():
                self._count_late(batch, rec, late, w)
                keep = ~late
                rec, q, lo, hi, w, host = (
                    rec[keep],
                    q[keep],
                    lo[keep],
                    hi[keep],
                    w[keep],
                    host[keep],
                )
                if not len(rec):
                    return

        d = batch.direction[rec].astype(np.int64)
        qmin = int(q.min())
        nh = len(self._host_names) + 1
        key = ((q - qmin) * nh + (host + 1)) * 3 + d
        uniq, slot = np.unique(key, return_inverse=True)
        slots: list[_Slot] = []
        for k in uniq.tolist():
            d_j = k % 3
            rest = k // 3
            qj = rest // nh + qmin
            hj = rest % nh - 1
            acc = self._open.setdefault(qj, {})
            sl = acc.get((hj, d_j))
            if sl is None:
                sl = acc[(hj, d_j)] = _Slot(self._alloc_row())
            slots.append(sl)
        slot_row = np.array([sl.row for sl in slots], dtype=np.int64)
        lens = np.diff(batch.indptr)[rec]
        entry = expand_ranges(batch.indptr[rec], lens)
        piece = np.repeat(np.arange(len(rec), dtype=np.int64), lens)
        nbins = self.layout.nbins
        np.add.at(
            self._store.reshape(-1),
            slot_row[slot[piece]] * nbins + batch.bins[entry],
            batch.counts[entry] * w[piece],
        )
        nbytes = np.bincount(slot, weights=batch.nbytes[rec] * w, minlength=len(uniq))
        slot_lo = np.full(len(uniq), 2**62, dtype=np.int64)
        slot_hi = np.full(len(uniq), -(2**62), dtype=np.int64)
        np.minimum.at(slot_lo, slot, lo)
        np.maximum.at(slot_hi, slot, hi)
        for j, sl in enumerate(slots):
            sl.nbytes += float(nbytes[j])
            sl.lo = min(sl.lo, int(slot_lo[j]))
            sl.hi = max(sl.hi, int(slot_hi[j]))
        pairs = np.unique(slot * (len(batch.streams) + 1) + batch.stream_idx[rec])
        for p in pairs.tolist():
            slots[p // (len(batch.streams) + 1)].streams.add(
                batch.streams[p % (len(batch.streams) + 1)]
            )
        self._enforce_cap()

    def _count_late(
        self,
        batch: RecordBatch,
        rec: npt.NDArray[np.int64],
        late: npt.NDArray[np.bool_],
        w: npt.NDArray[np.float64],
    ) -> None:
        """Count late records by host name (also for hosts over the cap)."""
        samples = batch.samples()
        late_recs = np.unique(rec[late])
        self.late_samples += float((samples[rec[late]] * w[late]).sum())
        for r in late_recs.tolist():
            h = batch.streams[int(batch.stream_idx[r])].host
            self.late_records[h] += 1
            self._late_since_close[h] += 1

    def _alloc_row(self) -> int:
        if not self._free:
            old = self._store
            self._store = np.zeros((2 * len(old), old.shape[1]), dtype=np.float64)
            self._store[: len(old)] = old
            self._free = list(range(2 * len(old) - 1, len(old) - 1, -1))
        return self._free.pop()

    def _enforce_cap(self) -> None:
        excess = len(self._open) - self.max_open_quanta
        if excess > 0:
            oldest = sorted(self._open)[excess - 1]
            self.forced_closes += excess
            closed = self.close_through(self.quantum_bounds(oldest)[1])
            self._pending_closed.extend(closed)

    # -- closing ------------------------------------------------------------------------

    @property
    def open_quanta(self) -> int:
        """Number of quanta holding data and not yet closed."""
        return len(self._open)

    def close_through(self, t_ms: int) -> list[ClosedQuantum]:
        """Close every quantum that ends at or before ``t_ms``, oldest first."""
        out, self._pending_closed = self._pending_closed, []
        last_q = int(self.quantum_of(np.array([t_ms + 1], dtype=np.int64))[0]) - 1
        ready = sorted(q for q in self._open if q <= last_q)
        if ready:
            out.extend(self._close(ready))
        if self._next_open is None or last_q + 1 > self._next_open:
            self._next_open = last_q + 1
        return out

    def flush(self) -> list[ClosedQuantum]:
        """Close every open quantum (end of input)."""
        if not self._open:
            out, self._pending_closed = self._pending_closed, []
            return out
        return self.close_through(self.quantum_bounds(max(self._open))[1])

    def _close(self, quanta: list[int]) -> list[ClosedQuantum]:
        """Rows of ``quanta`` (oldest first); their statistics are computed in one go."""
        specs: list[tuple[int, Scope, str | None, str, list[_Slot]]] = []
        freed: list[int] = []
        for q in quanta:
            slots = self._open.pop(q)
            freed.extend(sl.row for sl in slots.values())
            hosts = sorted({h for h, _ in slots})
            scopes: list[tuple[Scope, str | None, list[int]]] = [("cluster", None, hosts)]
            if self.per_host:
                scopes += [("host", self._host_names[h], [h]) for h in hosts if h != OVERFLOW_HOST]
            for scope, host_name, members in scopes:
                for label in self.directions:
                    dirs = [0, 1, 2] if label == "all" else [DIRECTION_LABELS.index(label)]
                    parts = [slots[(h, d)] for h in members for d in dirs if (h, d) in slots]
                    if parts:
                        specs.append((q, scope, host_name, label, parts))
        rows_src = [p.row for *_, parts in specs for p in parts]
        group_start = np.cumsum([0] + [len(spec[4]) for spec in specs[:-1]])
        hists = np.add.reduceat(self._store[rows_src], group_start, axis=0) if specs else None
        stats = summarize_many(hists, self.layout, self.percentiles) if hists is not None else []
        rows: list[ClosedQuantum] = []
        for (q, scope, host_name, label, parts), st in zip(specs, stats, strict=True):
            if st is not None:
                start, end = self.quantum_bounds(q)
                rows.append(
                    self._row(
                        start=start,
                        end=end,
                        scope=scope,
                        host=host_name,
                        label=label,
                        parts=parts,
                        stats=st,
                    )
                )
        self._store[freed] = 0.0
        self._free.extend(freed)
        self._late_since_close.clear()
        return rows

    def _row(
        self,
        *,
        start: int,
        end: int,
        scope: Scope,
        host: str | None,
        label: str,
        parts: list[_Slot],
        stats: HistStats,
    ) -> ClosedQuantum:
        covered_s = (max(p.hi for p in parts) - min(p.lo for p in parts)) / 1000.0
        streams = set().union(*(p.streams for p in parts))
        late = (
            sum(self._late_since_close.values())
            if host is None
            else self._late_since_close.get(host, 0)
        )
        return ClosedQuantum(
            start_ms=start,
            end_ms=end,
            scope=scope,
            host=host,
            direction=label,
            stats=stats,
            iops=stats.samples / covered_s if covered_s > 0 else None,
            bytes_per_second=sum(p.nbytes for p in parts) / covered_s if covered_s > 0 else None,
            streams=len(streams),
            late_records=late,
        )
