"""The quantum engine: records in, closed quanta out (offline report and live aggregator).

Time is cut into quanta ``(phase + q*Q, phase + (q+1)*Q]`` (ms). Records are end-stamped
spans; a record that overlaps several quanta is split over them in proportion to overlap,
and a zero-length record (fio's catch-up record after a stall) goes wholly to the quantum
holding its stamp. Everything is accumulated per (quantum, host, direction) in float64 bins,
so cluster scope is the sum over hosts and ``all`` the sum over directions, at close time.

Closing is driven from outside: :meth:`QuantumEngine.close_through` closes every quantum
that ends at or before a time (the report passes the streams' common progress, the live
aggregator its watermark). A record that reaches a closed quantum is *late*. With a
revision horizon (``revise_within_ms``) the closed quanta's histograms are kept
(:mod:`fiomon.kept`) and a late record whose quantum ended within the horizon is merged
into it: the next close publishes a *revision* of the rows it changed (``revision``
counts up per row key, ``revised_at`` says when), equal to what the quantum would have
been with the record in time. Older late records are not merged and are counted per host.

Memory is bounded by ``max_open_quanta``: when a record would open more, the oldest open
quanta are closed early (counted in ``forced_closes``).

Intake has two halves so that parsing threads do the arithmetic: :meth:`QuantumEngine.prepare`
cuts a batch at quantum boundaries and groups it per (quantum, host, direction) *slot*; it
reads only the engine's fixed settings, so any thread may call it. :meth:`~QuantumEngine.commit`
(the engine owner's thread) finds or opens the slots' rows and merges with one
``np.add.at``. :meth:`~QuantumEngine.add` does both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum, Scope, closed_row, group_stats
from fiomon.confidence import DEFAULT_LEVEL
from fiomon.kept import FOLDED, Delta, Group, KeptQuantum
from fiomon.model import (
    DEFAULT_PERCENTILES,
    DIRECTION_LABELS,
    DIRECTIONS,
    Direction,
    RecordBatch,
    StreamInfo,
    expand_ranges,
)
from fiomon.partials import RawPartial

OVERFLOW_HOST = -1  # host id of hosts over the cap: cluster scope only
FOLDED_HOST = FOLDED  # host id of slots that sum every host (no host scope requested)
KEPT_BYTES = 1 << 30  # closed quanta kept for revisions at most (more forget the oldest)
# A kept group's direction (fio's 0..3, or -1 for the sum of them) as its row's label.
_LABELS = {**dict(enumerate(DIRECTION_LABELS)), -1: "all"}
_FAR = 2**62
CLOSE_ROWS = 2048  # stored rows closed together at most (bounds the memory of a close)


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """A batch cut at quantum boundaries and summed per (quantum, host, direction) slot.

    Made by :meth:`QuantumEngine.prepare`; taken by :meth:`QuantumEngine.commit`. Slots are
    sorted by (quantum, host, direction) and histogram entries are grouped by slot.

    Args:
        records: number of records in the source batch.
        streams: the batch's stream table.
        hosts: host names that ``slot_host`` indexes (empty when hosts are folded).
        slot_q: quantum id of each slot.
        slot_host: index into ``hosts``, or :data:`FOLDED_HOST`.
        slot_dir: fio direction 0/1/2 of each slot.
        slot_entries: number of histogram entries of each slot.
        slot_lo: earliest covered time of each slot, ms.
        slot_hi: latest covered time of each slot, ms.
        slot_nbytes: bytes of each slot (overlap-weighted).
        entry_idx: ``slot * nbins + bin`` of each histogram entry.
        entry_val: overlap-weighted count of each entry.
        pair_slot: with ``pair_stream``, the unique (slot, stream index) pairs.
        pair_stream: stream index (into ``streams``) of each pair.
        piece_slot: slot of each piece (a record's part in one quantum).
        piece_rec: record index of each piece.
        piece_stream: stream index (into ``streams``) of each piece.
        piece_samples: overlap-weighted I/O count of each piece.
        bin_lo: the smallest bin index with a count (``nbins`` when there is none).
        bin_hi: the largest bin index with a count (-1 when there is none).
    """

    records: int
    streams: tuple[StreamInfo, ...]
    hosts: tuple[str, ...]
    slot_q: npt.NDArray[np.int64]
    slot_host: npt.NDArray[np.int64]
    slot_dir: npt.NDArray[np.int64]
    slot_entries: npt.NDArray[np.int64]
    slot_lo: npt.NDArray[np.int64]
    slot_hi: npt.NDArray[np.int64]
    slot_nbytes: npt.NDArray[np.float64]
    entry_idx: npt.NDArray[np.int64]
    entry_val: npt.NDArray[np.float64]
    pair_slot: npt.NDArray[np.int64]
    pair_stream: npt.NDArray[np.int64]
    piece_slot: npt.NDArray[np.int64]
    piece_rec: npt.NDArray[np.int64]
    piece_stream: npt.NDArray[np.int64]
    piece_samples: npt.NDArray[np.float64]
    bin_lo: int = 0
    bin_hi: int = -1


@dataclass(frozen=True, slots=True)
class _Groups:
    """Merged histograms of one kind of output row (e.g. cluster per direction)."""

    scope: Scope
    q: npt.NDArray[np.int64]
    host: npt.NDArray[np.int64]  # host id, or FOLDED_HOST for cluster scope
    label: list[str]
    hists: npt.NDArray[np.float64]
    row_gid: npt.NDArray[np.int64]  # per closing row, its group (-1: not in this kind)


def _once_late(rows: list[ClosedQuantum]) -> list[ClosedQuantum]:
    """``rows`` with each (scope, host, direction)'s late count on its first row only."""
    seen: set[tuple[str, str | None, str]] = set()
    for i, r in enumerate(rows):
        if not r.late_records:
            continue
        key = (r.scope, r.host, r.direction)
        if key in seen:
            rows[i] = replace(r, late_records=0)
        else:
            seen.add(key)
    return rows


def _run_starts(*keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Start index of every run of equal key tuples (keys sorted, non-empty)."""
    change = np.zeros(len(keys[0]), dtype=np.bool_)
    change[0] = True
    for k in keys:
        change[1:] |= k[1:] != k[:-1]
    return np.flatnonzero(change)


def _run_ids(starts: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    """Run number of each of ``n`` items, given the runs' start indices."""
    mark = np.zeros(n, dtype=np.int64)
    mark[starts] = 1
    return np.cumsum(mark) - 1


class QuantumEngine:
    """Accumulates records into quanta and closes them into closed-quantum rows.

    The rows are :class:`~fiomon.closed.ClosedQuantum`; with ``keep_partials`` the groups
    behind them are kept as well (for a cell feeding a root).

    Args:
        layout: bin layout of the merged histograms; finer batches of the same GROUP_NR
            are coarsened to it, others refused (:class:`~fiomon.errors.LayoutError`).
        quantum_ms: quantum length Q in ms (> 0).
        phase_ms: grid offset in ms; quanta end at ``phase_ms + k*Q``.
        percentiles: percentiles to compute, e.g. ``(50, 90, 99, 99.9)``.
        directions: which direction rows to emit (labels of :data:`~fiomon.closed.DIRECTIONS`).
        per_host: also emit host-scope rows.
        max_hosts: hosts tracked for host scope; more are counted in ``hosts_over_cap``
            and only enter cluster scope.
        max_open_quanta: open quanta kept; more force the oldest to close.
        max_open_rows: open (quantum, host, direction) rows kept, each a float64 row of
            the layout's bins (1856 bins: 14.5 KiB); more force the oldest quanta to
            close. None: no bound beyond ``max_open_quanta``.
        keep_hists: attach the merged histogram to cluster rows (``ClosedQuantum.hist``).
        keep_host_hists: attach it to host rows too: True for every direction, or the
            direction labels whose host rows need it (the SLA rules' tail shares).
        confidence_level: compute each percentile's confidence interval at this level
            (``ClosedQuantum.ci_ns``); None: none.
        capacity_rows: rows reserved up front. The store is allocated zeroed, so rows
            cost memory only once used; reserving avoids copying the store as it grows.
        keep_partials: also keep every closed group as a
            :class:`~fiomon.partials.RawPartial` in :attr:`partials` (a cell publishing to
            a root takes them from there).
        revise_within_ms: the revision horizon: closed quanta ending within this of the
            newest close are kept, and late records for them are merged into revisions.
            0: none (every late record is counted and dropped).
        kept_max_bytes: memory of the kept quanta at most; past it the oldest are
            forgotten early (counted in :attr:`kept_dropped`).
    """

    def __init__(
        self,
        *,
        layout: BinLayout,
        quantum_ms: int,
        phase_ms: int = 0,
        percentiles: Sequence[float] = DEFAULT_PERCENTILES,
        directions: Sequence[str] = DIRECTIONS,
        per_host: bool = False,
        max_hosts: int = 1000,
        max_open_quanta: int = 100_000,
        max_open_rows: int | None = None,
        keep_hists: bool = False,
        keep_host_hists: bool | frozenset[str] = False,
        confidence_level: float | None = DEFAULT_LEVEL,
        capacity_rows: int = 64,
        keep_partials: bool = False,
        revise_within_ms: int = 0,
        kept_max_bytes: int = KEPT_BYTES,
    ) -> None:
        if quantum_ms <= 0:
            msg = f"quantum_ms must be positive, got {quantum_ms}"
            raise ValueError(msg)
        bad = [d for d in directions if d not in DIRECTIONS]
        if bad:
            msg = f"unknown directions {bad}; choose from {list(DIRECTIONS)}"
            raise ValueError(msg)
        self.layout = layout
        self.quantum_ms = quantum_ms
        self.phase_ms = phase_ms % quantum_ms
        self.percentiles = tuple(percentiles)
        self.directions = tuple(directions)
        self.per_host = per_host
        self.max_hosts = max_hosts
        self.max_open_quanta = max_open_quanta
        self.max_open_rows = max_open_rows
        self.keep_hists = keep_hists
        self.keep_host_hists = keep_host_hists
        if confidence_level is not None and not 0.0 < confidence_level < 1.0:
            msg = f"confidence_level must be in (0, 1), got {confidence_level}"
            raise ValueError(msg)
        self.confidence_level = confidence_level
        self.keep_partials = keep_partials
        self.partials: list[RawPartial] = []  # with keep_partials; the taker empties it
        self.revise_within_ms = max(0, revise_within_ms)
        self.kept_max_bytes = kept_max_bytes
        self._kept: dict[int, KeptQuantum] = {}  # closed quantum id -> its state
        self._kept_bytes = 0
        self.kept_dropped = 0  # quanta forgotten before the horizon (memory)
        # Quanta ending at or before this are not revisable: before the horizon, forgotten
        # for memory, or (after a restart) closed by a previous run whose records the
        # journal no longer holds in full.
        self.kept_from_ms = -_FAR
        self._mark_ms: int | None = None  # the newest close_through() time
        self._now_ms: int | None = None  # the newest close_through() wall clock
        # Replaying records the previous run published: what they add to closed quanta is
        # folded in at once (:meth:`absorb`), never revised (nor force-closed as revisions).
        self.absorbing = False
        self.revised_records: Counter[str] = Counter()  # late records merged, per host
        self._rev_late: dict[int, Counter[str]] = {}  # revising quantum -> host -> records
        self._added: dict[str, npt.NDArray[np.float64]] = {}  # cluster label -> counts
        self._next_open: int | None = None  # quanta below this id are closed
        self._hosts: dict[str, int] = {}
        self._host_names: list[str] = []
        self._stream_ids: dict[StreamInfo, int] = {}
        self._stream_runs: list[str | None] = []  # per stream id, its run label
        self._any_run = False  # some stream has a run label: rows name their runs
        # (quantum, scope, host, direction) -> runs of a closed row: its revisions repeat them
        self._closed_runs: dict[tuple[int, str, str | None, str], tuple[str, ...]] = {}
        self.late_records: Counter[str] = Counter()
        self.late_samples = 0.0
        self._late_since_close: Counter[str] = Counter()
        self.hosts_over_cap = 0
        self._over_cap_hosts: set[str] = set()
        self.forced_closes = 0
        self.records = 0
        # Bins that ever held a count: closing reads and clears only these columns (fio's
        # 1856 bins span 2**34 ns; one workload's latencies fill a few hundred of them).
        self._bin_lo = layout.nbins
        self._bin_hi = -1
        self._pending_closed: list[ClosedQuantum] = []
        self._groups_cache: dict[
            int, tuple[tuple[StreamInfo, ...], npt.NDArray[np.int64], npt.NDArray[np.int64]]
        ] = {}
        # Every open slot is one row of a float64 store plus per-row metadata; freed rows
        # are zeroed and reused. ``_rows`` finds a slot's row, ``_quanta`` counts open rows
        # per quantum. (row, stream id) pairs say which streams fed a row.
        self._rows: dict[tuple[int, int, int], int] = {}
        self._quanta: Counter[int] = Counter()
        self._pair_row: list[npt.NDArray[np.int64]] = []
        self._pair_sid: list[npt.NDArray[np.int64]] = []
        self._free: list[int] = []
        self._grow(max(64, capacity_rows))

    def _grow(self, capacity: int) -> None:
        """Resize the store and its row metadata to ``capacity`` rows (never shrinks)."""
        old = getattr(self, "_store", np.zeros((0, self.layout.nbins)))
        n = len(old)
        store = np.zeros((capacity, self.layout.nbins), dtype=np.float64)
        store[:n] = old
        self._store = store

        def grown(name: str, fill: float, dtype: type) -> npt.NDArray[Any]:
            arr: npt.NDArray[Any] = np.full(capacity, fill, dtype=dtype)
            if n:
                arr[:n] = getattr(self, name)
            return arr

        self._row_q = grown("_row_q", 0, np.int64)
        self._row_host = grown("_row_host", 0, np.int64)
        self._row_dir = grown("_row_dir", 0, np.int64)
        self._row_used = grown("_row_used", 0, np.bool_)
        self._row_lo = grown("_row_lo", _FAR, np.int64)
        self._row_hi = grown("_row_hi", -_FAR, np.int64)
        self._row_nbytes = grown("_row_nbytes", 0.0, np.float64)
        self._free.extend(range(capacity - 1, n - 1, -1))

    # -- intake -------------------------------------------------------------------------

    def quantum_of(self, t_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Id of the quantum ``(start, end]`` holding each time."""
        return np.floor_divide(t_ms - self.phase_ms - 1, self.quantum_ms)

    def _host_hist(self, direction: str) -> bool:
        """Whether host rows of ``direction`` carry their histogram (``keep_host_hists``)."""
        keep = self.keep_host_hists
        return keep if isinstance(keep, bool) else direction in keep

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

    def _stream_id(self, stream: StreamInfo) -> int:
        sid = self._stream_ids.get(stream)
        if sid is None:
            sid = self._stream_ids[stream] = len(self._stream_ids)
            self._stream_runs.append(stream.run)
            self._any_run = self._any_run or stream.run is not None
        return sid

    def add(
        self, batch: RecordBatch, groups: Sequence[tuple[StreamInfo, ...]] | None = None
    ) -> None:
        """Merge every record of ``batch`` into its quanta (late parts are counted).

        Args:
            batch: the records.
            groups: optional: ``batch.streams`` is these tuples one after the other, each
                of one host (the live aggregator's decoded messages). The engine then
                keeps its stream and host ids per tuple object, and a batch costs no
                Python work per stream.
        """
        if groups is None:
            self.commit(self.prepare(batch))
            return
        sids, hids = self._group_ids(groups)
        self.commit(self.prepare(batch, stream_hosts=hids), stream_ids=sids)

    def _group_ids(
        self, groups: Sequence[tuple[StreamInfo, ...]]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Stream ids and host ids of the streams of ``groups``, per tuple object cached."""
        cache = self._groups_cache
        if len(cache) > 65_536:
            cache.clear()
        sids, hids = [], []
        for t in groups:
            hit = cache.get(id(t))
            if hit is None or hit[0] is not t:
                hid = self._host_index(t[0].host) if t else 0
                sid = np.fromiter((self._stream_id(si) for si in t), np.int64, count=len(t))
                hit = cache[id(t)] = (t, sid, np.full(len(t), hid, dtype=np.int64))
            sids.append(hit[1])
            hids.append(hit[2])
        empty = np.zeros(0, dtype=np.int64)
        return (np.concatenate(sids) if sids else empty), (np.concatenate(hids) if hids else empty)

    def prepare(
        self, batch: RecordBatch, stream_hosts: npt.NDArray[np.int64] | None = None
    ) -> PreparedBatch:
        """Cut ``batch`` into per-slot histogram entries.

        Pure: reads only the engine's fixed settings (layout, quantum, phase, per_host),
        so it may run on any thread while another commits.

        Args:
            batch: the records.
            stream_hosts: the engine's host id of each stream (from :meth:`add`); then the
                slots carry engine host ids and ``hosts`` is empty.

        Raises:
            LayoutError: the batch's layout cannot be coarsened to the engine's.
        """
        batch = batch.coarsened(self.layout)
        n = len(batch)
        s, e = batch.start_ms, batch.end_ms
        q_last = self.quantum_of(e)
        q_first = np.where(e > s, np.floor_divide(s - self.phase_ms, self.quantum_ms), q_last)
        q_first = np.minimum(q_first, q_last)
        npieces = q_last - q_first + 1
        rec = np.repeat(np.arange(n, dtype=np.int64), npieces)
        q = q_first[rec] + (np.arange(len(rec)) - np.repeat(np.cumsum(npieces) - npieces, npieces))
        hosts: tuple[str, ...] = ()
        if self.per_host and stream_hosts is not None:
            host = stream_hosts[batch.stream_idx[rec]]
        elif self.per_host:
            hosts = tuple(sorted({si.host for si in batch.streams}))
            where = {h: i for i, h in enumerate(hosts)}
            stream_host = np.array([where[si.host] for si in batch.streams] or [0], dtype=np.int64)
            host = stream_host[batch.stream_idx[rec]]
        else:
            host = np.full(len(rec), FOLDED_HOST, dtype=np.int64)
        d = batch.direction[rec].astype(np.int64)
        # Pieces in slot order, so a slot's entries are contiguous.
        order = np.lexsort((d, host, q))
        rec, q, host, d = rec[order], q[order], host[order], d[order]
        qstart = self.phase_ms + q * self.quantum_ms
        lo = np.maximum(s[rec], qstart)
        hi = np.minimum(e[rec], qstart + self.quantum_ms)
        dur = (e - s)[rec]
        # A zero-length (catch-up) record has exactly one piece, which takes all of it.
        w: npt.NDArray[np.float64] = np.where(dur > 0, (hi - lo) / np.maximum(dur, 1), 1.0)
        if len(rec):
            starts = _run_starts(q, host, d)
            slot = _run_ids(starts, len(rec))
        else:
            starts = slot = np.zeros(0, dtype=np.int64)
        nslots = len(starts)
        lens = np.diff(batch.indptr)[rec]
        entry = expand_ranges(batch.indptr[rec], lens)
        weight = np.repeat(w, lens)
        nstreams = len(batch.streams) + 1
        pairs = np.unique(slot * nstreams + batch.stream_idx[rec].astype(np.int64))
        return PreparedBatch(
            records=n,
            streams=batch.streams,
            hosts=hosts,
            slot_q=q[starts],
            slot_host=host[starts],
            slot_dir=d[starts],
            slot_entries=np.bincount(slot, weights=lens, minlength=nslots).astype(np.int64),
            slot_lo=np.minimum.reduceat(lo, starts) if nslots else lo,
            slot_hi=np.maximum.reduceat(hi, starts) if nslots else hi,
            slot_nbytes=np.bincount(slot, weights=batch.nbytes[rec] * w, minlength=nslots).astype(
                np.float64
            ),
            entry_idx=np.repeat(slot * self.layout.nbins, lens) + batch.bins[entry],
            entry_val=batch.counts[entry] * weight,
            pair_slot=pairs // nstreams,
            pair_stream=pairs % nstreams,
            piece_slot=slot,
            piece_rec=rec,
            piece_stream=batch.stream_idx[rec].astype(np.int64),
            piece_samples=w * batch.samples()[rec],
            bin_lo=int(batch.bins.min()) if len(batch.bins) else self.layout.nbins,
            bin_hi=int(batch.bins.max()) if len(batch.bins) else -1,
        )

    def commit(self, p: PreparedBatch, stream_ids: npt.NDArray[np.int64] | None = None) -> None:
        """Merge a prepared batch (only from the thread that owns the engine).

        ``stream_ids``: the engine's id of each stream, from :meth:`add` (its batch was
        prepared with engine host ids).
        """
        if p.records == 0:
            return
        self.records += p.records
        self._bin_lo = min(self._bin_lo, p.bin_lo)
        self._bin_hi = max(self._bin_hi, p.bin_hi)
        if stream_ids is None:
            for si in p.streams:
                self._host_index(si.host)  # hosts are tracked (and capped) in every mode
        nslots = len(p.slot_q)
        if stream_ids is not None:
            host = p.slot_host  # already engine host ids (or folded)
        elif self.per_host:
            ids = np.array([self._host_index(h) for h in p.hosts] or [0], dtype=np.int64)
            host = ids[p.slot_host]
        else:
            host = p.slot_host
        keep = np.ones(nslots, dtype=np.bool_)
        if self._next_open is not None:
            late = p.slot_q < self._next_open
            if late.any():
                # Within the horizon, late slots open rows of their closed quantum that
                # hold only what the late records add (the next close revises it).
                revisable = late & (p.slot_q >= self._revisable_q())
                if revisable.any():
                    self._count_revised(p, revisable)
                dropped = late & ~revisable
                if dropped.any():
                    self._count_late(p, dropped)
                keep = ~dropped
        keys = list(zip(p.slot_q.tolist(), host.tolist(), p.slot_dir.tolist(), strict=True))
        # Looked up in one C-level pass; only new slots take the Python path.
        rows = np.fromiter(map(self._rows.get, keys, repeat(-1)), dtype=np.int64, count=nslots)
        for j in np.flatnonzero((rows < 0) & keep).tolist():
            # Over-cap hosts share one slot key, so a key may repeat within a batch.
            r = self._rows.get(keys[j])
            rows[j] = self._open_row(keys[j]) if r is None else r
        rows[~keep] = np.flatnonzero(~keep)  # late slots keep a harmless dummy row
        nbins = self.layout.nbins
        idx = p.entry_idx + np.repeat((rows - np.arange(nslots)) * nbins, p.slot_entries)
        val = p.entry_val
        if not keep.all():
            entry_keep = np.repeat(keep, p.slot_entries)
            idx, val = idx[entry_keep], val[entry_keep]
        np.add.at(self._store.reshape(-1), idx, val)
        # Over-cap hosts share one row, so rows may repeat: unbuffered updates.
        kept = rows[keep]
        np.minimum.at(self._row_lo, kept, p.slot_lo[keep])
        np.maximum.at(self._row_hi, kept, p.slot_hi[keep])
        np.add.at(self._row_nbytes, kept, p.slot_nbytes[keep])
        sids = (
            stream_ids
            if stream_ids is not None and len(stream_ids)
            else np.array([self._stream_id(si) for si in p.streams] or [0], dtype=np.int64)
        )
        pair_keep = keep[p.pair_slot]
        self._pair_row.append(rows[p.pair_slot[pair_keep]])
        self._pair_sid.append(sids[p.pair_stream[pair_keep]])
        if self.absorbing:
            self.absorb()
        self._enforce_cap()

    def _open_row(self, key: tuple[int, int, int]) -> int:
        """Give slot ``key`` (quantum, host id, direction) a zeroed row."""
        if not self._free:
            self._grow(2 * len(self._store))
        r = self._free.pop()
        q, h, d = key
        self._rows[key] = r
        self._quanta[q] += 1
        self._row_q[r], self._row_host[r], self._row_dir[r] = q, h, d
        self._row_used[r] = True
        return r

    def _count_late(self, p: PreparedBatch, late_slot: npt.NDArray[np.bool_]) -> None:
        """Count late records by host name (also for hosts over the cap)."""
        late = late_slot[p.piece_slot]
        self.late_samples += float(p.piece_samples[late].sum())
        _, first = np.unique(p.piece_rec[late], return_index=True)
        # Per stream, then per host: a backlog of late records must cost less than merging
        # them would (no Python per record), or an aggregator that fell behind never
        # catches up.
        per_stream = np.bincount(p.piece_stream[late][first], minlength=len(p.streams))
        for si in np.flatnonzero(per_stream).tolist():
            h = p.streams[si].host
            n = int(per_stream[si])
            self.late_records[h] += n
            self._late_since_close[h] += n

    def _revisable_q(self) -> int:
        """The oldest closed quantum a late record may still revise (a huge id: none)."""
        if not self.revise_within_ms or self._mark_ms is None:
            return _FAR
        horizon = int(self.quantum_of(np.array([self._mark_ms - self.revise_within_ms]))[0]) + 1
        # Quanta starting at or after kept_from_ms (ceiling division).
        kept = -((self.phase_ms - self.kept_from_ms) // self.quantum_ms)
        return max(horizon, kept)

    def _count_revised(self, p: PreparedBatch, revisable: npt.NDArray[np.bool_]) -> None:
        """Count the late records merged into revisions: per host, and per quantum and host."""
        sel = revisable[p.piece_slot]
        rec = p.piece_rec[sel]
        q = p.slot_q[p.piece_slot[sel]]
        st = p.piece_stream[sel]
        _, first = np.unique(rec, return_index=True)
        per_stream = np.bincount(st[first], minlength=len(p.streams))
        for si in np.flatnonzero(per_stream).tolist():
            self.revised_records[p.streams[si].host] += int(per_stream[si])
        # A record reaching two closed quanta counts in each one's rows.
        q0 = int(q.min())
        _, once = np.unique((q - q0) * max(p.records, 1) + rec, return_index=True)
        nst = len(p.streams) + 1
        keys, counts = np.unique((q[once] - q0) * nst + st[once], return_counts=True)
        for k, n in zip(keys.tolist(), counts.tolist(), strict=True):
            qq, si = divmod(k, nst)
            self._rev_late.setdefault(q0 + qq, Counter())[p.streams[si].host] += n

    def _enforce_cap(self) -> None:
        excess = len(self._quanta) - self.max_open_quanta
        if self.max_open_rows is not None and len(self._rows) > self.max_open_rows:
            # Memory: close the oldest quanta until the open rows fit (at least one).
            rows, n = len(self._rows), 0
            for q in sorted(self._quanta):
                if rows <= self.max_open_rows or n == len(self._quanta) - 1:
                    break
                rows -= self._quanta[q]
                n += 1
            excess = max(excess, n)
        if excess > 0:
            oldest = sorted(self._quanta)[excess - 1]
            self.forced_closes += excess
            closed = self.close_through(self.quantum_bounds(oldest)[1], self._now_ms)
            self._pending_closed.extend(closed)

    def reset_late_counts(self) -> None:
        """Forget late counts (after replaying records whose closed quanta were published)."""
        self.late_records.clear()
        self.late_samples = 0.0
        self._late_since_close.clear()

    # -- closing ------------------------------------------------------------------------

    @property
    def open_quanta(self) -> int:
        """Number of quanta holding data and not yet closed."""
        return len(self._quanta)

    def close_through(self, t_ms: int, now_ms: int | None = None) -> list[ClosedQuantum]:
        """Close every quantum that ends at or before ``t_ms``, oldest first.

        Then the revisions: every closed quantum that late records reached since the
        previous close is published again (only the rows they changed), after the
        quanta closed for the first time. ``now_ms``: the wall clock the revisions'
        ``revised_at`` says (default ``t_ms``).
        """
        out, self._pending_closed = self._pending_closed, []
        forced = len(out)  # closed earlier (memory bounds), their late counts given then
        if now_ms is not None:
            self._now_ms = now_ms
        last_q = int(self.quantum_of(np.array([t_ms + 1], dtype=np.int64))[0]) - 1
        first_open = self._next_open
        ready = sorted(q for q in self._quanta if q <= last_q)
        revising = [q for q in ready if first_open is not None and q < first_open]
        if revising:
            ready = ready[len(revising) :]
        # Close in chunks of about CLOSE_ROWS rows: closing many quanta at once (after an
        # outage, or at the end of a report) must not need memory for all of them.
        chunk: list[int] = []
        rows = 0
        for q in ready:
            if chunk and rows + self._quanta[q] > CLOSE_ROWS:
                out.extend(self._close(chunk[0], chunk[-1]))
                chunk, rows = [], 0
            chunk.append(q)
            rows += self._quanta[q]
        if chunk:
            out.extend(self._close(chunk[0], chunk[-1]))
        if ready:
            # Late records counted since the previous close go on the oldest quantum
            # closed now (per row kind), not on each of them: rows add up to the total.
            out[forced:] = _once_late(out[forced:])
            self._late_since_close.clear()
        if self._next_open is None or last_q + 1 > self._next_open:
            self._next_open = last_q + 1
        if revising:
            out.extend(self._revise(revising, t_ms if now_ms is None else now_ms))
        if self.revise_within_ms:
            if self._mark_ms is None or t_ms > self._mark_ms:
                self._mark_ms = t_ms
            self._forget(self._mark_ms - self.revise_within_ms)
            if self._closed_runs:
                oldest = self._revisable_q()
                self._closed_runs = {k: v for k, v in self._closed_runs.items() if k[0] >= oldest}
        return out

    def flush(self) -> list[ClosedQuantum]:
        """Close every open quantum (end of input)."""
        if not self._quanta:
            out, self._pending_closed = self._pending_closed, []
            return out
        return self.close_through(self.quantum_bounds(max(self._quanta))[1])

    def _close(self, first_q: int, last_q: int) -> list[ClosedQuantum]:
        """Close the open quanta ``first_q..last_q``; their statistics in one go."""
        rows = np.flatnonzero(self._row_used & (self._row_q >= first_q) & (self._row_q <= last_q))
        rows = rows[np.lexsort((self._row_host[rows], self._row_dir[rows], self._row_q[rows]))]
        rq, rh, rd = self._row_q[rows], self._row_host[rows], self._row_dir[rows]
        lo, hi = (self._bin_lo, self._bin_hi + 1) if self._bin_hi >= 0 else (0, 1)
        cols = slice(lo, hi)
        hists = self._store[rows, cols]
        u_pos, u_sid = self._take_pairs(rows)
        out = self._emit(rows, self._groups(rq, rh, rd, hists), lo, u_pos, u_sid)
        if self.revise_within_ms:
            self._keep(rows, hists, lo, u_pos, u_sid)
        self._free_rows(rows)
        return out

    def _take_pairs(
        self, rows: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The distinct (position in ``rows``, stream id) pairs of closing rows, by position.

        The pairs of the other rows stay.
        """
        pair_row = np.concatenate(self._pair_row)
        pair_sid = np.concatenate(self._pair_sid)
        pos = np.full(len(self._store), -1, dtype=np.int64)
        pos[rows] = np.arange(len(rows))
        pair_pos = pos[pair_row]
        closing = pair_pos >= 0
        self._pair_row, self._pair_sid = [pair_row[~closing]], [pair_sid[~closing]]
        nsid = len(self._stream_ids) + 1
        u = np.unique(pair_pos[closing] * nsid + pair_sid[closing])
        u_pos = u // nsid
        return u_pos, u - u_pos * nsid

    def _free_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """Zero closed rows and give them back (their slots and quanta are forgotten)."""
        lo, hi = (self._bin_lo, self._bin_hi + 1) if self._bin_hi >= 0 else (0, 1)
        rq, rh, rd = self._row_q[rows], self._row_host[rows], self._row_dir[rows]
        self._store[rows, lo:hi] = 0.0
        self._row_used[rows] = False
        self._row_lo[rows] = _FAR
        self._row_hi[rows] = -_FAR
        self._row_nbytes[rows] = 0.0
        for key in zip(rq.tolist(), rh.tolist(), rd.tolist(), strict=True):
            del self._rows[key]
        for q in set(rq.tolist()):
            del self._quanta[q]
        self._free.extend(rows.tolist())

    # -- revisions ----------------------------------------------------------------------

    def _keep(
        self,
        rows: npt.NDArray[np.int64],
        hists: npt.NDArray[np.float64],
        first_bin: int,
        u_pos: npt.NDArray[np.int64],
        u_sid: npt.NDArray[np.int64],
    ) -> None:
        """Keep the state of the quanta closing (sorted by quantum) for revisions.

        Which rows were published is not stored: a group was published at its first
        close exactly when it held counts then (:meth:`KeptQuantum.has`).
        """
        rq = self._row_q[rows]
        starts = _run_starts(rq)
        bounds = [*starts.tolist(), len(rows)]
        sbounds = np.searchsorted(u_pos, bounds)
        for i in range(len(starts)):
            a, b = bounds[i], bounds[i + 1]
            sa, sb = int(sbounds[i]), int(sbounds[i + 1])
            r = rows[a:b]
            kq = KeptQuantum.of_rows(
                self._row_host[r],
                self._row_dir[r],
                hists[a:b],
                first_bin,
                self._row_lo[r],
                self._row_hi[r],
                self._row_nbytes[r],
                u_pos[sa:sb] - a,
                u_sid[sa:sb],
            )
            self._put_kept(int(rq[a]), kq)

    def _put_kept(self, q: int, kq: KeptQuantum) -> None:
        old = self._kept.get(q)
        if old is not None:
            self._kept_bytes -= old.nbytes
        self._kept[q] = kq
        self._kept_bytes += kq.nbytes
        while self._kept_bytes > self.kept_max_bytes and len(self._kept) > 1:
            oldest = next(iter(self._kept))
            self._kept_bytes -= self._kept.pop(oldest).nbytes
            self.kept_dropped += 1
            self.kept_from_ms = max(self.kept_from_ms, self.quantum_bounds(oldest)[1])

    def _forget(self, before_ms: int) -> None:
        """Forget kept quanta ending at or before ``before_ms`` (past the horizon)."""
        last = int(self.quantum_of(np.array([before_ms]))[0])
        end = self.quantum_bounds(last)[1]
        last = last if end <= before_ms else last - 1
        for q in [q for q in self._kept if q <= last]:
            self._kept_bytes -= self._kept.pop(q).nbytes
        for q in [q for q in self._rev_late if q <= last and q not in self._quanta]:
            del self._rev_late[q]

    def late_hosts(self, end_ms: int) -> frozenset[str]:
        """The hosts whose late records revised the kept quantum ending at ``end_ms``."""
        kept = self._kept.get(int(self.quantum_of(np.array([end_ms]))[0]))
        return frozenset() if kept is None else kept.late_hosts

    @property
    def kept_bytes(self) -> int:
        """Memory the kept quanta hold (arrays), bytes."""
        return self._kept_bytes

    @property
    def kept_quanta(self) -> int:
        """Closed quanta kept for revisions."""
        return len(self._kept)

    def take_added(self) -> dict[str, npt.NDArray[np.float64]]:
        """Per cluster direction label, the counts revisions added since the last call."""
        out, self._added = self._added, {}
        return out

    def _deltas(self, q: int) -> dict[tuple[int, int], Delta]:
        """Take the rows late records opened in closed quantum ``q`` (freed here)."""
        rows = np.flatnonzero(self._row_used & (self._row_q == q))
        u_pos, u_sid = self._take_pairs(rows)
        sb = np.searchsorted(u_pos, np.arange(len(rows) + 1))
        out: dict[tuple[int, int], Delta] = {}
        for i, r in enumerate(rows.tolist()):
            key = (int(self._row_host[r]), int(self._row_dir[r]))
            out[key] = Delta(
                self._store[r].copy(),
                int(self._row_lo[r]),
                int(self._row_hi[r]),
                float(self._row_nbytes[r]),
                u_sid[sb[i] : sb[i + 1]].copy(),
            )
        self._free_rows(rows)
        return out

    def absorb(self) -> None:
        """Fold what late records opened into the kept quanta without publishing it.

        After a restart's replay of the journal: those records were in the rows
        published before the restart (first closes or revisions), so they re-form the
        kept state and are no revision (nor counted late or merged).
        """
        if self._next_open is None:
            return
        for q in sorted(q for q in self._quanta if q < self._next_open):
            deltas = self._deltas(q)
            base = self._kept.get(q) or KeptQuantum.empty()
            revised = base.revised(deltas, self.layout.nbins)
            # Those records were published (at revision 0 at least, as KeptQuantum.has
            # then says): a revision after the restart is never numbered 0 again, even
            # if the quanta file no longer says.
            revised.published, revised.revisions = base.published, base.revisions
            self._put_kept(q, revised)
        self._rev_late.clear()
        self.revised_records.clear()

    def note_published(self, end_ms: int, host: str | None, direction: str, revision: int) -> None:
        """A row of a kept quantum was published at ``revision`` (a restart reads them back)."""
        q = int(self.quantum_of(np.array([end_ms]))[0])
        kept = self._kept.get(q)
        if kept is None:
            return
        key = (host, direction)
        if revision > 0:  # revision 0 is what the kept counts say (KeptQuantum.has)
            kept.published[key] = max(kept.published.get(key, 0), revision)
        # A later revision's partials must carry a number not used before the restart.
        kept.revisions = max(kept.revisions, revision + 1)

    def _revise(self, quanta: list[int], now_ms: int) -> list[ClosedQuantum]:
        """Publish again the closed ``quanta`` that late records reached."""
        out: list[ClosedQuantum] = []
        nbins = self.layout.nbins
        want_all = "all" in self.directions
        for q in quanta:
            deltas = self._deltas(q)
            if not deltas:
                continue
            base = self._kept.get(q) or KeptQuantum.empty()
            kept = base.revised(deltas, nbins)
            kept.revisions += 1
            touched = sorted(deltas)
            groups = kept.groups(touched, nbins, per_host=self.per_host, want_all=want_all)
            late = self._rev_late.pop(q, Counter())
            kept.late_hosts = kept.late_hosts | frozenset(late)
            start, end = self.quantum_bounds(q)
            lo, hi = (self._bin_lo, self._bin_hi + 1) if self._bin_hi >= 0 else (0, 1)
            wanted = [g for g in groups if _LABELS[g[2]] in self.directions]
            stats, cis = group_stats(
                np.stack([g[3][lo:hi] for g in wanted]) if wanted else np.zeros((0, hi - lo)),
                self.layout,
                self.percentiles,
                confidence_level=self.confidence_level,
                first_bin=lo,
            )
            for g, st, ci in zip(wanted, stats, cis, strict=True):
                scope, h, d, hist, glo, ghi, nb, streams = g
                host = None if scope == "cluster" else self._host_names[h]
                label = _LABELS[d]
                if scope == "cluster":
                    self._add_delta(label, deltas, d)
                if st is None:
                    continue
                runs = self._closed_runs.get((q, scope, host, label), ())
                late_runs = self._late_runs(deltas, scope, h, d)
                if not late_runs <= set(runs):  # late records of another run (or a first)
                    runs = tuple(sorted({*runs, *late_runs}))
                    self._closed_runs[q, scope, host, label] = runs
                key = (host, label)
                prev = kept.published.get(key)
                if prev is None:  # its first close published it if it held counts then
                    prev = 0 if base.has(scope, h, d) else -1
                revision = prev + 1
                kept.published[key] = revision
                out.append(
                    replace(
                        closed_row(
                            start_ms=start,
                            end_ms=end,
                            scope=scope,  # type: ignore[arg-type]
                            host=host,
                            direction=label,
                            stats=st,
                            ci_ns=ci,
                            lo_ms=glo,
                            hi_ms=ghi,
                            nbytes=nb,
                            streams=streams,
                            late_records=sum(late.values()) if host is None else late[host],
                            hist=(
                                hist
                                if (self.keep_hists and host is None)
                                or (host is not None and self._host_hist(label))
                                else None
                            ),
                        ),
                        revision=revision,
                        revised_at=now_ms,
                        runs=runs,
                    )
                )
            if self.keep_partials:
                self._keep_delta_partials(q, base, kept.revisions, groups, deltas)
            self._put_kept(q, kept)
        return out

    def _late_runs(
        self, deltas: dict[tuple[int, int], Delta], scope: str, h: int, d: int
    ) -> set[str]:
        """The run labels of the late records in group (``scope``, ``h``, ``d``)."""
        if not self._any_run:
            return set()
        runs = self._stream_runs
        out: set[str] = set()
        for (dh, dd), x in deltas.items():
            if d not in (-1, dd) or (scope != "cluster" and dh != h):
                continue
            for sid in x.sids.tolist():
                run = runs[sid] if 0 <= sid < len(runs) else None
                if run is not None:
                    out.add(run)
        return out

    def _add_delta(self, label: str, deltas: dict[tuple[int, int], Delta], d: int) -> None:
        """Add what the revision added to cluster direction ``label`` to :meth:`take_added`."""
        add = [x.hist for (_, dd), x in deltas.items() if d in (-1, dd)]
        if not add:
            return
        total = np.sum(add, axis=0)
        prev = self._added.get(label)
        self._added[label] = total if prev is None else prev + total

    def _keep_delta_partials(
        self,
        q: int,
        base: KeptQuantum,
        revision: int,
        groups: list[Group],
        deltas: dict[tuple[int, int], Delta],
    ) -> None:
        """A revision's partials: per group, what it added (see RawPartial.revision).

        ``groups``: the revised quantum's groups the revision touched (its rows' groups);
        ``base``: the quantum before it (the streams it had).
        """
        nbins = self.layout.nbins
        want_all = "all" in self.directions
        before = {
            (g[0], g[1], g[2]): g[7]
            for g in base.groups(sorted(deltas), nbins, per_host=self.per_host, want_all=want_all)
        }
        start, end = self.quantum_bounds(q)
        for g in groups:
            scope, h, d, _, _, _, _, streams = g
            if _LABELS[d] not in self.directions:
                continue
            mine = [
                x
                for (dh, dd), x in deltas.items()
                if (scope == "cluster" or dh == h) and d in (-1, dd)
            ]
            if not mine:
                continue
            self.partials.append(
                RawPartial(
                    start_ms=start,
                    end_ms=end,
                    scope=scope,  # type: ignore[arg-type]
                    host=None if scope == "cluster" else self._host_names[h],
                    direction=_LABELS[d],
                    hist=np.sum([x.hist for x in mine], axis=0),
                    lo_ms=min(x.lo_ms for x in mine),
                    hi_ms=max(x.hi_ms for x in mine),
                    nbytes=float(sum(x.nbytes for x in mine)),
                    streams=streams - before.get((scope, h, d), 0),
                    revision=revision,
                )
            )

    def _groups(
        self,
        rq: npt.NDArray[np.int64],
        rh: npt.NDArray[np.int64],
        rd: npt.NDArray[np.int64],
        hists: npt.NDArray[np.float64],
    ) -> list[_Groups]:
        """Merged histograms per output kind, from closing rows sorted by (q, dir, host).

        Cluster rows sum hosts per (quantum, direction); ``all`` sums those directions, so
        each stored row is read once. Host rows are the stored rows themselves.
        """
        n = len(rq)
        want_all = "all" in self.directions
        cd_start = _run_starts(rq, rd)
        cd_q, cd_d = rq[cd_start], rd[cd_start]
        cd_gid = _run_ids(cd_start, n)
        # Without host scope every (quantum, direction) has one row: nothing to add up.
        cd_hist = hists if len(cd_start) == n else np.add.reduceat(hists, cd_start, axis=0)
        folded = np.full(len(cd_start), FOLDED_HOST, dtype=np.int64)
        kinds = [
            _Groups("cluster", cd_q, folded, _labels(cd_d), cd_hist, cd_gid),
        ]
        if want_all:
            ca_start = _run_starts(cd_q)
            ca_of_cd = _run_ids(ca_start, len(cd_q))
            kinds.append(
                _Groups(
                    "cluster",
                    cd_q[ca_start],
                    folded[: len(ca_start)],
                    ["all"] * len(ca_start),
                    np.add.reduceat(cd_hist, ca_start, axis=0),
                    ca_of_cd[cd_gid],
                )
            )
        if not self.per_host:
            return kinds
        hrows = np.flatnonzero(rh >= 0)  # over-cap hosts have no host scope
        if not len(hrows):
            return kinds
        gid = np.full(n, -1, dtype=np.int64)
        gid[hrows] = np.arange(len(hrows))
        host_hists = hists if len(hrows) == n else hists[hrows]  # no copy when all are hosts
        kinds.append(_Groups("host", rq[hrows], rh[hrows], _labels(rd[hrows]), host_hists, gid))
        if want_all:
            # (quantum, host) groups; each direction adds its rows to them with one fancy
            # add (a (quantum, host) has at most one row per direction), not a full copy.
            o = hrows[np.lexsort((rh[hrows], rq[hrows]))]
            st = _run_starts(rq[o], rh[o])
            gid = np.full(n, -1, dtype=np.int64)
            gid[o] = _run_ids(st, len(o))
            total = np.zeros((len(st), hists.shape[1]))
            for d in Direction:
                sel = hrows[rd[hrows] == d]
                if len(sel):
                    total[gid[sel]] += hists[sel]
            kinds.append(_Groups("host", rq[o][st], rh[o][st], ["all"] * len(st), total, gid))
        return kinds

    def _emit(
        self,
        rows: npt.NDArray[np.int64],
        kinds: list[_Groups],
        first_bin: int,
        u_pos: npt.NDArray[np.int64],
        u_sid: npt.NDArray[np.int64],
    ) -> list[ClosedQuantum]:
        """Closed-quantum rows of ``kinds``: per quantum, cluster then hosts, in label order.

        The histograms of ``kinds`` hold the columns from ``first_bin`` on; ``u_pos`` and
        ``u_sid`` are the closing rows' distinct (position, stream id) pairs.
        """
        nsid = len(self._stream_ids) + 1
        # Streams per group, from two sorts for every kind (not one per kind): a stream has
        # one host, so within one direction it lands in one row of a (quantum, direction)
        # and the distinct (row, stream) pairs count each group's streams; across
        # directions (``all``) the distinct (quantum, stream) pairs do.
        _, first = np.unique(self._row_q[rows][u_pos] * nsid + u_sid, return_index=True)
        qs_pos = u_pos[first]
        lo, hi, nbytes = self._row_lo[rows], self._row_hi[rows], self._row_nbytes[rows]
        late_total = sum(self._late_since_close.values())
        keyed: list[tuple[tuple[int, int, int], ClosedQuantum]] = []
        for k in kinds:
            wanted = [i for i, label in enumerate(k.label) if label in self.directions]
            if not wanted:
                continue
            ng = len(k.q)
            m = k.row_gid >= 0
            g = k.row_gid[m]
            g_lo = np.full(ng, _FAR, dtype=np.int64)
            np.minimum.at(g_lo, g, lo[m])
            g_hi = np.full(ng, -_FAR, dtype=np.int64)
            np.maximum.at(g_hi, g, hi[m])
            g_bytes = np.bincount(g, weights=nbytes[m], minlength=ng)
            is_all = bool(k.label) and k.label[0] == "all"
            pg = k.row_gid[qs_pos if is_all else u_pos]
            g_streams = np.bincount(pg[pg >= 0], minlength=ng)
            g_runs = self._group_runs(pg, u_sid[first] if is_all else u_sid)
            if self.keep_partials:
                self._keep_partials(k, wanted, g_lo, g_hi, g_bytes, g_streams, first_bin)
            stats, cis = group_stats(
                k.hists[wanted],
                self.layout,
                self.percentiles,
                confidence_level=self.confidence_level,
                first_bin=first_bin,
            )
            for i, st, ci in zip(wanted, stats, cis, strict=True):
                if st is None:
                    continue  # empty quanta produce no row
                q, h = int(k.q[i]), int(k.host[i])
                host = None if k.scope == "cluster" else self._host_names[h]
                start, end = self.quantum_bounds(q)
                row = closed_row(
                    start_ms=start,
                    end_ms=end,
                    scope=k.scope,
                    host=host,
                    direction=k.label[i],
                    stats=st,
                    ci_ns=ci,
                    lo_ms=int(g_lo[i]),
                    hi_ms=int(g_hi[i]),
                    nbytes=float(g_bytes[i]),
                    streams=int(g_streams[i]),
                    late_records=(
                        late_total if host is None else self._late_since_close.get(host, 0)
                    ),
                    hist=(
                        self._full(k.hists[i], first_bin)
                        if (self.keep_hists and host is None)
                        or (host is not None and self._host_hist(k.label[i]))
                        else None
                    ),
                )
                runs = g_runs.get(i)
                if runs:
                    row = replace(row, runs=runs)
                    if self.revise_within_ms:
                        self._closed_runs[q, k.scope, host, k.label[i]] = runs
                rank = 0 if host is None else 1 + h
                keyed.append(((q, rank, self.directions.index(k.label[i])), row))
        keyed.sort(key=lambda kr: kr[0])
        return [r for _, r in keyed]

    def _group_runs(
        self, pg: npt.NDArray[np.int64], sids: npt.NDArray[np.int64]
    ) -> dict[int, tuple[str, ...]]:
        """Per group id, the sorted run labels of its streams (``pg``, ``sids``: pairs)."""
        if not self._any_run:
            return {}
        per: dict[int, set[str]] = {}
        runs = self._stream_runs
        for g, sid in zip(pg.tolist(), sids.tolist(), strict=True):
            run = runs[sid] if g >= 0 and sid < len(runs) else None
            if run is not None:
                per.setdefault(g, set()).add(run)
        return {g: tuple(sorted(v)) for g, v in per.items()}

    def _keep_partials(  # noqa: PLR0917 -- the group columns _emit computed
        self,
        k: _Groups,
        wanted: list[int],
        g_lo: npt.NDArray[np.int64],
        g_hi: npt.NDArray[np.int64],
        g_bytes: npt.NDArray[Any],
        g_streams: npt.NDArray[Any],
        first_bin: int,
    ) -> None:
        """Keep the ``wanted`` groups of ``k`` as :class:`RawPartial` (empty ones too)."""
        for i in wanted:
            q = int(k.q[i])
            start, end = self.quantum_bounds(q)
            self.partials.append(
                RawPartial(
                    start_ms=start,
                    end_ms=end,
                    scope=k.scope,
                    host=None if k.scope == "cluster" else self._host_names[int(k.host[i])],
                    direction=k.label[i],
                    hist=self._full(k.hists[i], first_bin),
                    lo_ms=int(g_lo[i]),
                    hi_ms=int(g_hi[i]),
                    nbytes=float(g_bytes[i]),
                    streams=int(g_streams[i]),
                )
            )

    def _full(self, part: npt.NDArray[np.float64], first_bin: int) -> npt.NDArray[np.float64]:
        """A histogram of the layout's every bin from the columns from ``first_bin`` on."""
        out = np.zeros(self.layout.nbins)
        out[first_bin : first_bin + len(part)] = part
        return out


def _labels(dirs: npt.NDArray[np.int64]) -> list[str]:
    return [DIRECTION_LABELS[d] for d in dirs.tolist()]
