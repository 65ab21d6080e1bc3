"""Closed quanta kept for revisions: each stored row's histogram, sparse, for a horizon.

When a quantum closes, the engine (:mod:`fiomon.engine`) keeps what it merged -- per
stored row (host, direction) the bin counts, covered span, bytes and streams -- as a
:class:`KeptQuantum`, so that late records within the revision horizon can be added and
the quantum's rows published again exactly as if those records had come in time.

Sparse (compressed rows): one host's quantum fills a few dozen to a few hundred of fio's
1856 bins, so a stored row costs 6 bytes per non-empty bin (int16 index, float32 count
when every count of the quantum is exactly a float32 -- whole counts below 2**24, as
records on the quantum grid give -- else float64: never rounded) instead of 14.8 KiB
dense, and a close keeps every row with a handful of array operations.
A revision densifies only the rows it touches; cluster sums are one ``bincount`` over the
kept entries of a direction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fiomon.model import expand_ranges

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
FOLDED = -2  # the engine's host id of rows summing every host (no host scope)

# One output group of a revision: scope, host id (FOLDED for cluster), direction (fio
# 0/1/2, or -1 for ``all``), dense counts, lo_ms, hi_ms, bytes, streams.
Group = tuple[str, int, int, F64, int, int, float, int]


@dataclass(frozen=True, slots=True)
class Delta:
    """What late records add to one stored row (host, direction) of a closed quantum.

    Args:
        hist: dense counts over every bin.
        lo_ms: earliest covered time of the late records, ms.
        hi_ms: latest covered time, ms.
        nbytes: bytes (overlap-weighted).
        sids: the engine's ids of the streams that fed them.
    """

    hist: F64
    lo_ms: int
    hi_ms: int
    nbytes: float
    sids: I64


@dataclass(slots=True)
class KeptQuantum:
    """A closed quantum's stored rows, as its rows were last published.

    Rows ``i`` of host id ``h[i]`` and fio direction ``d[i]`` hold bins
    ``idx[ptr[i]:ptr[i+1]]`` with counts ``val[...]`` and streams ``sid[sptr[i]:sptr[i+1]]``.

    Args:
        published: per row key ``(host name or None, direction label)``, the revision last
            published (0: the first); absent: never published (it was empty).
        revisions: how many times the quantum was revised (the number its last revision's
            partials carried; 0: only its first close).
        late_hosts: the hosts whose late records were merged into it (its revisions).
    """

    h: I64
    d: I64
    ptr: I64
    idx: npt.NDArray[np.int16]
    val: npt.NDArray[np.float32] | F64
    lo: I64
    hi: I64
    nb: F64
    sptr: I64
    sid: I64
    published: dict[tuple[str | None, str], int] = field(default_factory=dict)
    revisions: int = 0
    late_hosts: frozenset[str] = frozenset()

    @classmethod
    def empty(cls) -> KeptQuantum:
        """A quantum that closed with nothing in it."""
        z = np.zeros(0, dtype=np.int64)
        return cls(
            z, z, np.zeros(1, np.int64), np.zeros(0, np.int16), np.zeros(0), z, z,
            np.zeros(0), np.zeros(1, np.int64), z,
        )  # fmt: skip

    @classmethod
    def of_rows(  # noqa: PLR0917 -- the closing rows' columns, as the engine has them
        cls,
        h: I64,
        d: I64,
        hists: F64,
        first_bin: int,
        lo: I64,
        hi: I64,
        nb: F64,
        spos: I64,
        sid: I64,
    ) -> KeptQuantum:
        """The kept state of closing rows (one quantum's, ``hists`` from ``first_bin`` on).

        ``spos``/``sid``: the distinct (row position, stream id) pairs, sorted by position.
        """
        n = len(h)
        ri, ci = np.nonzero(hists)
        ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(ri, minlength=n), out=ptr[1:])
        sptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(spos, minlength=n), out=sptr[1:])
        return cls(
            h.astype(np.int64),
            d.astype(np.int64),
            ptr,
            (ci + first_bin).astype(np.int16),
            _compact(hists[ri, ci]),
            lo.astype(np.int64),
            hi.astype(np.int64),
            nb.astype(np.float64),
            sptr,
            sid.astype(np.int64),
        )

    @property
    def nbytes(self) -> int:
        """Memory the arrays hold, bytes."""
        arrays = (self.h, self.d, self.ptr, self.idx, self.val, self.lo, self.hi, self.nb)
        return sum(a.nbytes for a in arrays) + self.sptr.nbytes + self.sid.nbytes + 256

    def has(self, scope: str, h: int, d: int) -> bool:
        """Whether the group (scope, host id, direction; -1: ``all``) holds any count.

        Only non-zero counts are kept, so a row holds counts exactly when it has entries.
        """
        sel = np.diff(self.ptr) > 0
        if d >= 0:
            sel &= self.d == d
        if scope != "cluster":
            sel &= self.h == h
        return bool(sel.any())

    def _where(self) -> dict[tuple[int, int], int]:
        keys = zip(self.h.tolist(), self.d.tolist(), strict=True)
        return {k: i for i, k in enumerate(keys)}

    def _dense(self, i: int, nbins: int) -> F64:
        out = np.zeros(nbins)
        a, b = self.ptr[i], self.ptr[i + 1]
        out[self.idx[a:b]] = self.val[a:b]
        return out

    def revised(self, deltas: dict[tuple[int, int], Delta], nbins: int) -> KeptQuantum:
        """This state with ``deltas`` added to their rows (new rows for new keys)."""
        where = self._where()
        new_h, new_d, hists, lo, hi, nb, sids = [], [], [], [], [], [], []
        for (h, d), x in sorted(deltas.items()):
            i = where.get((h, d))
            if i is None:
                hist, rlo, rhi, rnb, rs = x.hist, x.lo_ms, x.hi_ms, x.nbytes, np.unique(x.sids)
            else:
                hist = self._dense(i, nbins) + x.hist
                rlo, rhi = min(int(self.lo[i]), x.lo_ms), max(int(self.hi[i]), x.hi_ms)
                rnb = float(self.nb[i]) + x.nbytes
                rs = np.union1d(self.sid[self.sptr[i] : self.sptr[i + 1]], x.sids)
            new_h.append(h)
            new_d.append(d)
            hists.append(hist)
            lo.append(rlo)
            hi.append(rhi)
            nb.append(rnb)
            sids.append(rs)
        keep = np.ones(len(self.h), dtype=np.bool_)
        for key in deltas:
            i = where.get(key)
            if i is not None:
                keep[i] = False
        lens = np.diff(self.ptr)
        slens = np.diff(self.sptr)
        e_keep = np.repeat(keep, lens)
        s_keep = np.repeat(keep, slens)
        dense = np.stack(hists)
        ri, ci = np.nonzero(dense)
        n_new = len(new_h)
        new_lens = np.bincount(ri, minlength=n_new)
        new_slens = np.array([len(s) for s in sids], dtype=np.int64)
        all_lens = np.concatenate([lens[keep], new_lens])
        all_slens = np.concatenate([slens[keep], new_slens])
        ptr = np.zeros(len(all_lens) + 1, dtype=np.int64)
        np.cumsum(all_lens, out=ptr[1:])
        sptr = np.zeros(len(all_slens) + 1, dtype=np.int64)
        np.cumsum(all_slens, out=sptr[1:])
        return KeptQuantum(
            np.concatenate([self.h[keep], np.array(new_h, dtype=np.int64)]),
            np.concatenate([self.d[keep], np.array(new_d, dtype=np.int64)]),
            ptr,
            np.concatenate([self.idx[e_keep], ci.astype(np.int16)]),
            _compact(np.concatenate([self.val[e_keep].astype(np.float64), dense[ri, ci]])),
            np.concatenate([self.lo[keep], np.array(lo, dtype=np.int64)]),
            np.concatenate([self.hi[keep], np.array(hi, dtype=np.int64)]),
            np.concatenate([self.nb[keep], np.array(nb, dtype=np.float64)]),
            sptr,
            np.concatenate([self.sid[s_keep], *sids]) if sids else self.sid[s_keep],
            dict(self.published),
            self.revisions,
            self.late_hosts,
        )

    def groups(
        self,
        touched: Sequence[tuple[int, int]],
        nbins: int,
        *,
        per_host: bool,
        want_all: bool,
    ) -> list[Group]:
        """The output groups the ``touched`` rows (host id, direction) feed, from this state.

        Cluster: each touched direction and ``all``; hosts (ids >= 0, with ``per_host``):
        each touched (host, direction) and the host's ``all``. Streams count as the
        engine's rows do: per direction the streams of its rows; ``all`` the distinct
        streams over every direction.
        """
        out: list[Group] = []
        dirs = sorted({d for _, d in touched})
        lens = np.diff(self.ptr)
        slens = np.diff(self.sptr)

        # By row numbers: a host's groups read its own few rows, not every entry.
        def summed(sel: npt.NDArray[np.bool_]) -> tuple[F64, int, int, float]:
            rows = np.flatnonzero(sel)
            e = expand_ranges(self.ptr[rows], lens[rows])
            hist: F64 = np.bincount(
                self.idx[e].astype(np.int64), weights=self.val[e], minlength=nbins
            ).astype(np.float64)
            if not len(rows):
                return hist, 0, 0, 0.0
            return (
                hist,
                int(self.lo[rows].min()),
                int(self.hi[rows].max()),
                float(self.nb[rows].sum()),
            )

        def distinct(sel: npt.NDArray[np.bool_]) -> int:
            rows = np.flatnonzero(sel)
            return len(np.unique(self.sid[expand_ranges(self.sptr[rows], slens[rows])]))

        for d in dirs:
            sel = self.d == d
            hist, lo, hi, nb = summed(sel)
            out.append(("cluster", FOLDED, d, hist, lo, hi, nb, int(slens[sel].sum())))
        if want_all and dirs:
            sel = np.ones(len(self.h), dtype=np.bool_)
            hist, lo, hi, nb = summed(sel)
            out.append(("cluster", FOLDED, -1, hist, lo, hi, nb, distinct(sel)))
        if not per_host:
            return out
        dirs_of: dict[int, set[int]] = {}
        for h, d in touched:
            if h >= 0:
                dirs_of.setdefault(h, set()).add(d)
        rows_of: dict[int, list[int]] = {}
        for i, h in enumerate(self.h.tolist()):
            if h in dirs_of:
                rows_of.setdefault(h, []).append(i)
        for h in sorted(dirs_of):
            # Each of the host's few rows made dense once, for its own group and ``all``.
            mine = rows_of.get(h, [])
            dense = {int(self.d[i]): (i, self._dense(i, nbins)) for i in mine}
            for d in sorted(dirs_of[h]):
                got = dense.get(d)
                if got is None:
                    continue
                i, hist = got
                out.append(
                    (
                        "host", h, d, hist, int(self.lo[i]), int(self.hi[i]),
                        float(self.nb[i]), int(slens[i]),
                    )
                )  # fmt: skip
            if want_all and mine:
                total = np.sum([x for _, x in dense.values()], axis=0)
                sids = np.concatenate([self.sid[self.sptr[i] : self.sptr[i + 1]] for i in mine])
                out.append(
                    (
                        "host", h, -1, total, int(self.lo[mine].min()), int(self.hi[mine].max()),
                        float(self.nb[mine].sum()), len(np.unique(sids)),
                    )
                )  # fmt: skip
        return out


def _compact(val: F64) -> npt.NDArray[np.float32] | F64:
    """``val`` as float32 if that holds every value exactly, else as float64."""
    small = val.astype(np.float32)
    return small if np.array_equal(small, val) else val.astype(np.float64)
