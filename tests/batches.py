"""Record batches for tests, written as plain tuples instead of the columnar arrays."""

from __future__ import annotations

import numpy as np

from fiomon.bins import BinLayout
from fiomon.model import RecordBatch, StreamInfo

LAY = BinLayout()
Rec = tuple[int, int, int, dict[int, int]]  # (start_ms, end_ms, direction, {bin: count})


def batch(
    recs: list[Rec],
    host: str = "",
    stream: str = "s",
    layout: BinLayout = LAY,
    *,
    nbytes: int | None = None,
) -> RecordBatch:
    """One stream's records, each ``(start_ms, end_ms, direction, {bin: count})``.

    ``direction`` is 0 read, 1 write, 2 trim, 3 mixed. Each record moved ``nbytes`` bytes, or 4 KiB
    per sample when None.
    """
    lens = [len(r[3]) for r in recs]
    indptr = np.zeros(len(recs) + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    bins = [b for r in recs for b in sorted(r[3])]
    counts = [r[3][b] for r in recs for b in sorted(r[3])]
    moved = [sum(r[3].values()) * 4096 if nbytes is None else nbytes for r in recs]
    return RecordBatch(
        layout=layout,
        streams=(StreamInfo(host, stream),),
        stream_idx=np.zeros(len(recs), np.int32),
        direction=np.array([r[2] for r in recs], np.int8),
        start_ms=np.array([r[0] for r in recs], np.int64),
        end_ms=np.array([r[1] for r in recs], np.int64),
        nbytes=np.array(moved, np.int64),
        indptr=indptr,
        bins=np.array(bins, np.int32),
        counts=np.array(counts, np.int64),
    )
