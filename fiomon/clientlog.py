"""Hist logs written by ``fio --client``: undo the running sums fio writes into them.

In client/server mode the servers send their histogram samples to the controller, which
writes them with ``client_flush_hist_samples`` (fio's ``client.c``, from 3.x to at least
3.42). Unlike the local writer (``flush_hist_samples`` in ``iolog.c``), it never subtracts
the previous sample's histogram, and what arrives is a running sum *two samples back*: per
direction, entry ``k`` holds the I/Os of interval ``k`` plus entry ``k - 2``. Measured on
fio 3.33 with 100 IOPS, intervals of 1 s and 250 ms, read-only and mixed jobs, numjobs 2:
the entries read 102, 100, 202, 199, 303 where the intervals held 102, 100, 100, 99, 101
(the json+ ``total_ios`` of the same run agree with the latter). Read as they are, such
logs count most I/Os several times.

:class:`ClientLogUndo` restores the intervals: ``interval_k = entry_k - entry_(k-2)`` per
stream and direction, in file order. If an entry is ever smaller than the one two before
in some bin, the file is not in that form (a fio that fixed its writer, or another tool):
the problem is reported once and the rest of the file is read as it is.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import numpy.typing as npt

from fiomon.model import RecordBatch
from fiomon.problems import ProblemLog

I64 = npt.NDArray[np.int64]

# What fio --client appends to a hist log's name: the server's host name (or address),
# perhaps compressed after the run (``h_clat_hist.1.log.127.0.0.2.gz``). Not a host: a
# compression or backup suffix (``.fz``, ``.gz``, ``.bz2``, ``.xz``, ``.bak``, ``.old``,
# ``.orig``) or a rotation number (``.1``), alone or followed by such suffixes.
_CLIENT_SUFFIX = re.compile(
    r"_(?:clat|lat|slat)_hist(?:\.\d+)?\.log(?:\.fz)?\."
    r"(?!(?:fz|gz|bz2|xz|bak|old|orig|\d+)(?:\.(?:gz|bz2|xz|bak|old|orig))*$)"
    r"(?P<host>[^/]+?)(?:\.(?:gz|bz2|xz))?$"
)


def client_log_host(path: Path) -> str | None:
    """The server a hist log written by ``fio --client`` came from, else None.

    In client/server mode fio writes every server's hist logs on the controller and
    appends the server's name to each (``h_clat_hist.1.log.127.0.0.2``).
    """
    m = _CLIENT_SUFFIX.search(path.name)
    return None if m is None else m.group("host")


class ClientLogUndo:
    """Differencing at lag two, per (stream, direction), across the batches of one file.

    Args:
        name: the file, for problem messages.
        problems: where a file not in the running-sum form is reported.
    """

    def __init__(self, name: str, problems: ProblemLog) -> None:
        self.name = name
        self.problems = problems
        self.active = True
        problems.warn(
            name,
            0,
            "client-log",
            "written by fio --client, whose entries are running sums two entries back: "
            "each interval taken as the difference",
        )
        # per (stream name, direction): the last two entries (dense counts, bytes)
        self._history: dict[tuple[str, int], list[tuple[I64, int]]] = {}

    def apply(self, batch: RecordBatch) -> RecordBatch:
        """The batch with each record's counts (and bytes) as its own interval's."""
        if not self.active or not len(batch):
            return batch
        dense = batch.dense()
        nbytes = batch.nbytes.copy()
        # file order within each series: by end time (stable for equal stamps)
        for i in np.argsort(batch.end_ms, kind="stable").tolist():
            key = (batch.streams[int(batch.stream_idx[i])].stream, int(batch.direction[i]))
            seen = self._history.setdefault(key, [])
            entry, entry_bytes = dense[i].copy(), int(nbytes[i])
            if len(seen) == 2:
                before, before_bytes = seen[0]
                diff = entry - before
                if (diff < 0).any():
                    self.active = False
                    self.problems.warn(
                        self.name,
                        0,
                        "client-log",
                        "not the running sums fio --client writes (an entry is smaller "
                        "than the one two before): read as it is from here on",
                    )
                    return batch
                dense[i] = diff
                nbytes[i] = entry_bytes - before_bytes
            seen.append((entry, entry_bytes))
            if len(seen) > 2:
                seen.pop(0)
        return _from_dense(batch, dense, nbytes)


def _from_dense(batch: RecordBatch, dense: I64, nbytes: I64) -> RecordBatch:
    rows, bins = np.nonzero(dense)
    indptr = np.zeros(len(batch) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(batch)), out=indptr[1:])
    return RecordBatch(
        layout=batch.layout,
        streams=batch.streams,
        stream_idx=batch.stream_idx,
        direction=batch.direction,
        start_ms=batch.start_ms,
        end_ms=batch.end_ms,
        nbytes=nbytes,
        indptr=indptr,
        bins=bins.astype(np.int32),
        counts=dense[rows, bins].astype(np.int64),
    )
