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

**Detected by content.** The server's name fio appends (``h_clat_hist.1.log.10.0.0.7``)
is often gone: pbench-fio files each server's logs as ``clients/<host>/h_clat_hist.1.log``.
So a hist log without that suffix is checked by its records (:func:`looks_like_running_sums`):
per direction, with at least ``DETECT_RECORDS`` entries, every entry is bin by bin at
least the one two before, the totals pile up (27, 25, 52, 50, 77, 75 at 100 IOPS and
250 ms), and the two interleaved chains show: some entry is below the one right before.
A log fio writes itself holds each interval once: its bins go up and down, its totals
stay level under steady load, and a load that ramps up smoothly grows at every step, so
it is not taken for one. A log too short to tell (fewer records) is read as it is.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import numpy.typing as npt

from fiomon.fio.problems import ProblemLog
from fiomon.model import RecordBatch

I64 = npt.NDArray[np.int64]

# What fio --client appends to a hist log's name: the server's host name (or address),
# perhaps compressed after the run (``h_clat_hist.1.log.127.0.0.2.gz``). Not a host: a
# compression or backup suffix (``.fz``, ``.gz``, ``.bz2``, ``.xz``, ``.bak``, ``.old``,
# ``.orig``, ``.log``: ``fio --inflate-log=X.fz > X.fz.log``) or a rotation number (``.1``),
# alone or followed by such suffixes.
_CLIENT_SUFFIX = re.compile(  # hist logs, and per-I/O latency logs (write_lat_log)
    r"_(?:clat|lat|slat)(?:_hist)?(?:\.\d+)?\.log(?:\.fz)?\."
    r"(?!(?:fz|gz|bz2|xz|bak|old|orig|log|\d+)(?:\.(?:gz|bz2|xz|bak|old|orig|log))*$)"
    r"(?P<host>[^/]+?)(?:\.(?:gz|bz2|xz))?$"
)


def client_log_host(path: Path) -> str | None:
    """The server a hist log written by ``fio --client`` came from, else None.

    In client/server mode fio writes every server's hist logs on the controller and
    appends the server's name to each (``h_clat_hist.1.log.127.0.0.2``).
    """
    m = _CLIENT_SUFFIX.search(path.name)
    return None if m is None else m.group("host")


DETECT_RECORDS = 4  # entries per direction needed to recognise running sums by content
_DETECT_HOLD = 64  # records held (per file) while the form is not known yet


def looks_like_running_sums(batch: RecordBatch, *, pbench: bool = False) -> bool | None:
    """Whether a hist log's first records are fio --client's running sums (see above).

    Per direction with I/O and at least ``DETECT_RECORDS`` entries, all of: the first two
    entries hold I/O; every bin of every entry is at least the same bin two entries
    before; the totals grew to at least
    twice the first two entries' (sums pile up; a log fio writes itself stays level under
    steady load); and some bin is smaller than the entry right before (two chains of sums,
    interleaved; a load ramping up smoothly grows at every step). None: too few records
    to tell yet.

    Args:
        batch: the log's first records.
        pbench: the log lies where pbench-fio files fio --client's logs
            (``clients/<server>/``, :func:`filed_by_pbench`): three entries per direction
            suffice (a 2-second job at 500 ms writes no more), and the third must be at
            least 1.5 times the first two (two intervals against one, less the jitter
            of a short run).
    """
    dense = batch.dense()
    order = np.argsort(batch.end_ms, kind="stable")
    found = False
    need, growth = (3, 1.5) if pbench else (DETECT_RECORDS, 2.0)
    for d in np.unique(batch.direction).tolist():
        rows = dense[order[batch.direction[order] == d]]
        totals = rows.sum(axis=1)
        if len(rows) < need or not totals.any():
            continue
        if bool((rows[2:] < rows[:-2]).any()):
            return False  # some bin went down two entries on: intervals, not sums
        if not (totals[0] and totals[1]):
            return False  # sums start from two intervals with I/O; a ramp from idle does not
        if int(totals[-1]) < growth * max(int(totals[0]), int(totals[1])):
            return False
        if not bool((rows[1:] < rows[:-1]).any()):
            return False  # grows at every step: a ramp, not two chains of sums
        found = True
    return found if found or len(batch) >= _DETECT_HOLD else None


def filed_by_pbench(path: Path) -> bool:
    """Whether ``path`` lies in ``clients/<server>/`` (pbench-fio's place for fio --client logs)."""
    return path.parent.parent.name == "clients"


def ambiguous_sums(batch: RecordBatch) -> bool:
    """Whether a log too short to tell could still be running sums.

    Three entries in some direction, the first two with I/O and the third at least the
    first bin by bin: it is read as it is, and the reader says so.
    """
    dense = batch.dense()
    order = np.argsort(batch.end_ms, kind="stable")
    for d in np.unique(batch.direction).tolist():
        rows = dense[order[batch.direction[order] == d]]
        if len(rows) == 3 and rows[0].any() and rows[1].any() and not (rows[2] < rows[0]).any():
            return True
    return False


class ClientLogUndo:
    """Differencing at lag two, per (stream, direction), across the batches of one file.

    Args:
        name: the file, for problem messages.
        problems: where a file not in the running-sum form is reported.
        detect: the file is not named as a client log: hold its first records and undo
            only if they show the running-sum form (:func:`looks_like_running_sums`).
    """

    def __init__(self, name: str, problems: ProblemLog, *, detect: bool = False) -> None:
        self.name = name
        self.problems = problems
        self.active = True
        self._detecting = detect
        self._pbench = detect and filed_by_pbench(Path(name))
        self._held: list[RecordBatch] = []
        if not detect:
            problems.warn(
                name,
                0,
                "client-log",
                "written by fio --client, whose entries are running sums two entries back: "
                "each interval taken as the difference",
            )
        # per (stream name, direction): the last two entries (dense counts, bytes)
        self._history: dict[tuple[str, int], list[tuple[I64, int]]] = {}

    def feed(self, batch: RecordBatch | None, *, final: bool = False) -> RecordBatch | None:
        """The records of ``batch`` made per interval (held while the form is unknown)."""
        if not self._detecting:
            return None if batch is None else self.apply(batch)
        if batch is not None and len(batch):
            self._held.append(batch)
        if not self._held:
            return None
        held = RecordBatch.concat(self._held)
        verdict = looks_like_running_sums(held, pbench=self._pbench)
        if verdict is None and not final:
            return None
        self._held = []
        self._detecting = False
        if not verdict:
            self.active = False
            if verdict is None and ambiguous_sums(held):
                self.problems.warn(
                    self.name,
                    0,
                    "client-log",
                    "too few records to tell whether these are the running sums fio "
                    "--client writes (the third entry holds the first): read as they are; "
                    "if fio --client wrote this log, its counts after the second entry "
                    "are too high",
                )
            return held
        self.problems.warn(
            self.name,
            0,
            "client-log",
            "its entries are running sums two entries back, as fio --client writes them "
            "(recognised by content: the server's name is not in the file name, e.g. filed "
            "by pbench-fio): each interval taken as the difference",
        )
        return self.apply(held)

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
