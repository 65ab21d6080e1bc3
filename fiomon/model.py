"""Value objects shared by the parsers, the quantum engine and the wire format.

A :class:`RecordBatch` holds many interval records as columns (structure of arrays) with
the histogram counts in compressed sparse rows, because fio histograms are sparse (a few
hundred of 1856 bins are non-zero) and because the engine merges a whole batch with one
``numpy.bincount`` instead of a Python loop per record.

Record semantics (fio's): record ``i`` counts the I/Os of one direction of one stream
that *completed* in ``(start_ms[i], end_ms[i]]``; ``start_ms == end_ms`` is a catch-up
record that fio wrote after a stall, whose I/Os completed at ``end_ms``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout, coarsen_counts


class Direction(enum.IntEnum):
    """fio's data directions, numbered as in its logs (``ddir`` column), and ``mixed``.

    ``MIXED`` is the ``mixed`` section of fio's json+ output with
    ``unified_rw_reporting=1`` (or ``mixed``): reads, writes and trims in one histogram,
    which cannot be split again. Hist logs never write it (fio logs directions 0 and 1
    separately even then). The ``all`` rows of reports include it.
    """

    READ = 0
    WRITE = 1
    TRIM = 2
    MIXED = 3

    @property
    def label(self) -> str:
        """Lower-case name in reports and metrics (``read``, ``write``, ``trim``, ``mixed``)."""
        return self.name.lower()


DIRECTION_LABELS: tuple[str, ...] = tuple(d.label for d in Direction)
# The directions of quantum rows, in the order they are written: fio's three, ``all``
# (every I/O, mixed included), then ``mixed``. The partials format numbers them so.
DIRECTIONS: tuple[str, ...] = (*DIRECTION_LABELS[: Direction.MIXED], "all", "mixed")
# The percentiles computed unless asked for others: report, plot, the aggregator, the library.
DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)
# fio's latencies of an I/O: completion (``clat``, what hist logs hold), submission
# (``slat``) and total (``lat`` = slat + clat). A run of fiomon is of one kind.
LatencyKind = Literal["clat", "lat", "slat"]
LATENCY_KINDS: tuple[LatencyKind, ...] = ("clat", "lat", "slat")


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """Where records come from.

    Args:
        host: host (agent) label; ``""`` when the report runs without per-host scope.
        stream: identifier unique within the host (file path, plus job and restart number
            for json+ streams).
        run: the run label its records belong to (the agent's ``run``, a message's run
            label on the wire), or None: closed rows name the runs of what they merged.
    """

    host: str
    stream: str
    run: str | None = None


def _empty_i64() -> npt.NDArray[np.int64]:
    return np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """Interval records as columns; histogram counts as CSR rows.

    Args:
        layout: bin layout of every record in the batch.
        streams: stream table; ``stream_idx`` indexes into it.
        stream_idx: per record, the index of its stream (int32).
        direction: per record, a :class:`Direction` 0..3 (int8).
        start_ms: per record, start of the interval (exclusive), ms (int64).
        end_ms: per record, end of the interval (inclusive), ms (int64).
        nbytes: per record, bytes transferred by its I/Os (int64).
        indptr: CSR row pointers, ``len(records) + 1`` entries (int64).
        bins: bin index of each non-zero count (int32), ascending within a record.
        counts: the non-zero counts (int64, > 0).
    """

    layout: BinLayout
    streams: tuple[StreamInfo, ...]
    stream_idx: npt.NDArray[np.int32]
    direction: npt.NDArray[np.int8]
    start_ms: npt.NDArray[np.int64]
    end_ms: npt.NDArray[np.int64]
    nbytes: npt.NDArray[np.int64]
    indptr: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(1, np.int64))
    bins: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    counts: npt.NDArray[np.int64] = field(default_factory=_empty_i64)

    def __post_init__(self) -> None:
        n = len(self.start_ms)
        for name in ("stream_idx", "direction", "end_ms", "nbytes"):
            if len(getattr(self, name)) != n:
                msg = f"RecordBatch.{name} has {len(getattr(self, name))} entries, expected {n}"
                raise ValueError(msg)
        if len(self.indptr) != n + 1:
            msg = f"RecordBatch.indptr has {len(self.indptr)} entries, expected {n + 1}"
            raise ValueError(msg)
        if len(self.bins) != len(self.counts) or int(self.indptr[-1]) != len(self.bins):
            msg = "RecordBatch CSR arrays disagree (indptr[-1], bins, counts)"
            raise ValueError(msg)

    def __len__(self) -> int:
        return len(self.start_ms)

    @classmethod
    def empty(cls, layout: BinLayout) -> RecordBatch:
        """A batch with no records."""
        return cls(
            layout=layout,
            streams=(),
            stream_idx=np.zeros(0, np.int32),
            direction=np.zeros(0, np.int8),
            start_ms=_empty_i64(),
            end_ms=_empty_i64(),
            nbytes=_empty_i64(),
        )

    @property
    def nnz(self) -> int:
        """Number of stored (non-zero) counts."""
        return len(self.counts)

    def samples(self) -> npt.NDArray[np.int64]:
        """Per record, the number of I/Os it counts."""
        return row_sums(self.indptr, self.counts)

    def dense(self) -> npt.NDArray[np.int64]:
        """Counts as a dense ``(records, nbins)`` array (for tests and small batches)."""
        out = np.zeros((len(self), self.layout.nbins), dtype=np.int64)
        rows = np.repeat(np.arange(len(self)), np.diff(self.indptr))
        out[rows, self.bins] = self.counts
        return out

    def select(self, mask: npt.NDArray[np.bool_]) -> RecordBatch:
        """The records where ``mask`` is true (same stream table)."""
        keep = np.flatnonzero(mask)
        lens = np.diff(self.indptr)[keep]
        indptr = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        entries = expand_ranges(self.indptr[keep], lens)
        return RecordBatch(
            layout=self.layout,
            streams=self.streams,
            stream_idx=self.stream_idx[keep],
            direction=self.direction[keep],
            start_ms=self.start_ms[keep],
            end_ms=self.end_ms[keep],
            nbytes=self.nbytes[keep],
            indptr=indptr,
            bins=self.bins[entries],
            counts=self.counts[entries],
        )

    def coarsened(self, target: BinLayout) -> RecordBatch:
        """This batch in the coarser layout ``target`` (exact aggregation of bins).

        Raises:
            LayoutError: ``target`` is not a coarsening of this batch's layout.
        """
        if target == self.layout:
            return self
        new_bins = coarsen_counts(self.bins.astype(np.int64), self.layout, target)
        # Fine bins of one record that fall into the same coarse bin must be summed so
        # that bins stay unique within a row.
        rows = np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.indptr))
        key = rows * target.nbins + new_bins
        uniq, inv = np.unique(key, return_inverse=True)
        counts = np.bincount(inv, weights=self.counts.astype(np.float64)).astype(np.int64)
        urows = uniq // target.nbins
        indptr = np.searchsorted(urows, np.arange(len(self) + 1), side="left").astype(np.int64)
        return RecordBatch(
            layout=target,
            streams=self.streams,
            stream_idx=self.stream_idx,
            direction=self.direction,
            start_ms=self.start_ms,
            end_ms=self.end_ms,
            nbytes=self.nbytes,
            indptr=indptr,
            bins=(uniq % target.nbins).astype(np.int32),
            counts=counts,
        )

    @classmethod
    def concat(cls, batches: Sequence[RecordBatch]) -> RecordBatch:
        """One batch holding every record of ``batches`` (which share one layout).

        Stream tables are merged; equal :class:`StreamInfo` entries become one stream.

        Raises:
            ValueError: ``batches`` is empty or the layouts differ.
        """
        if not batches:
            msg = "concat needs at least one batch"
            raise ValueError(msg)
        layout = batches[0].layout
        streams: dict[StreamInfo, int] = {}
        idx_parts = []
        indptr_parts = [np.zeros(1, np.int64)]
        offset = 0
        for b in batches:
            if b.layout != layout:
                msg = f"cannot concat {b.layout.describe()} with {layout.describe()}"
                raise ValueError(msg)
            remap = np.array(
                [streams.setdefault(s, len(streams)) for s in b.streams] or [0], dtype=np.int32
            )
            idx_parts.append(remap[b.stream_idx] if len(b) else b.stream_idx)
            indptr_parts.append(b.indptr[1:] + offset)
            offset += b.nnz
        return cls(
            layout=layout,
            streams=tuple(streams),
            stream_idx=np.concatenate(idx_parts).astype(np.int32),
            direction=np.concatenate([b.direction for b in batches]),
            start_ms=np.concatenate([b.start_ms for b in batches]),
            end_ms=np.concatenate([b.end_ms for b in batches]),
            nbytes=np.concatenate([b.nbytes for b in batches]),
            indptr=np.concatenate(indptr_parts),
            bins=np.concatenate([b.bins for b in batches]),
            counts=np.concatenate([b.counts for b in batches]),
        )


def row_sums(indptr: npt.NDArray[np.int64], values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Sum of each CSR row of ``values`` (rows delimited by ``indptr``)."""
    cs = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=cs[1:])
    out: npt.NDArray[np.int64] = cs[indptr[1:]] - cs[indptr[:-1]]
    return out


def expand_ranges(
    starts: npt.NDArray[np.int64], lens: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Concatenation of ``range(s, s + n)`` for each pair, vectorised."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends: npt.NDArray[np.int64] = np.cumsum(lens)
    shift: npt.NDArray[np.int64] = np.repeat(starts - (ends - lens), lens)
    out: npt.NDArray[np.int64] = np.arange(total, dtype=np.int64) + shift
    return out
