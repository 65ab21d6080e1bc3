"""The exact root: cells' partials in, the cluster's closed quanta out (no I/O).

Each cell closes its hosts' quanta and sends, per quantum, every group its engine formed
(:mod:`fiomon.partials`). A host belongs to one cell, so summing the cells'
groups of one ``(quantum, scope, host, direction)`` gives exactly the group one engine fed
every record would have formed: counts per bin add, the covered span is the union (min
of starts, max of ends), bytes, streams and late records add. :class:`RootMerger` makes
the same :class:`~fiomon.closed.ClosedQuantum` rows from them, with the engine's
statistics functions, so the root's quanta file equals one aggregator's (and the
offline report's) to rounding of the float sums.

Exactly once: a row is merged once per ``(cell, quantum, scope, host, direction,
revision)`` (a cell's revision ``n >= 1`` of a group is a delta: what its late records
added); repeats (a cell resending its outbox after a restart) are counted and dropped.

Revisions (issue 25): the groups of a closed quantum are kept, packed sparse, while its
end is within ``revise_within_ms`` of the root's closed-through point. A cell's row of
such a quantum (its first-close row that came late, or a revision of its own) is merged
into them, and the next :meth:`RootMerger.close` publishes a *revision*: the rows of the
keys it touched, plus every row of that quantum whose ``complete``/``cells_missing``
the newly arrived cell changes, each with the key's next ``revision`` (0 for a key that
formed no row before), ``revised_at`` = the root's clock, the full statistics of the
merged state, and ``late_records`` = the cells' late counts on the rows merged into that
publication. Rows of quanta closed longer ago, or closed before the root's start (a
restart loses the kept state, :class:`RootMerger`), are counted late and left out.

Membership and grid come from the root's configuration: only the configured ``cells``
are taken (named by the topic; anything else is refused, counted and logged once per
name), and only rows on the root's own grid (``quantum_ms``, ``phase_ms``); a cell off it
is refused and named while the others proceed, and its closed marks are ignored until it
sends rows on the grid.

Closing: a quantum closes when every live cell has closed it (their
``closed_through_ms``), or when the root's clock is ``lateness_ms`` past its end. A cell
is live while it sent anything within ``cell_timeout_ms`` (expected cells count as
heard from at the root's start); a gone cell is reported and not waited for. A closed
mark more than ``max_skew_ms`` ahead of the root's clock is not believed.

Completeness: every row of a closed quantum carries ``complete`` and ``cells_missing``:
the configured cells that neither sent rows of that quantum nor closed it (a closed mark
at or past its end; a cell that closed it empty sent such a mark). After a start that lost
its state (``state_lost``), a cell's first mark does not vouch for the quanta it covers
(their rows may have gone to the previous run): only rows or a later mark do.
"""

from __future__ import annotations

import logging
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout, coarsen_hist, merged_layout
from fiomon.closed import ClosedQuantum, Scope, closed_row, group_stats
from fiomon.errors import LayoutError, WireFormatError
from fiomon.model import DIRECTIONS, LatencyKind
from fiomon.partials import MAX_PARTIALS_BYTES, PartialRow, PartialsMessage, decode

log = logging.getLogger("fiomon.root")

_FAR = 2**62
MAX_FUTURE_MS = 10 * 60_000  # rows of quanta ending further ahead of the root's clock: refused
MAX_SKEW_MS = 5000  # default bound of a closed mark ahead of the root's clock (root.max_skew)
LOG_EVERY_MS = 60_000  # per-cell warnings (grid, skew, lag) at most this often
UNLISTED_NAMED = 100  # unlisted names logged one by one; past them, every 1000th refusal
REWINDS = 3  # message-number rewinds within REWIND_WINDOW_MS that suggest two cells
REWIND_WINDOW_MS = 60_000
DIGESTS = 4096  # per cell, the latest messages' CRC-32 by number (two cells, one name)
SEEN_QUANTA = 600  # closed quanta whose row identities are kept (to tell resends apart)
GroupKey = tuple[Scope, str | None, str]  # scope, host, direction
# cell, group, the cell's revision of the group, and for revisions (deltas) the CRC-32 of
# what it adds: a cell that restarted without its quanta file numbers its revisions from 1
# again, and its new deltas must not be taken for resends of the old ones (a resend is the
# same bytes). First publications are told apart by identity alone: a cell that lost its
# state and closes a quantum again must not add it twice.
RowId = tuple[str, GroupKey, int, int]


@dataclass(slots=True)
class _Group:
    """One (quantum, scope, host, direction) summed over cells.

    ``late``: the cells' late counts on the rows merged since the group's last
    publication (its row's ``late_records``). ``flags``: per cell that ever said so, the
    revision of its latest row of the group and whether that row was incomplete (a cell's
    newer row replaces its older row's word; None: no cell ever said incomplete).
    """

    hist: npt.NDArray[np.float64]
    lo_ms: int = _FAR
    hi_ms: int = -_FAR
    nbytes: float = 0.0
    streams: int = 0
    late: int = 0
    flags: dict[str, tuple[int, bool]] | None = None

    @property
    def incomplete(self) -> bool:
        """A cell's latest row of the group said ``complete: false``."""
        return self.flags is not None and any(bad for _, bad in self.flags.values())

    def flag(self, cell: str, revision: int, *, complete: bool) -> None:
        """Note cell ``cell``'s word on the group from its row of ``revision``."""
        if self.flags is None:
            if complete:
                return  # the common case: no cell ever said incomplete, nothing kept
            self.flags = {}
        seen = self.flags.get(cell)
        if seen is None or revision >= seen[0]:
            self.flags[cell] = (revision, not complete)


@dataclass(slots=True)
class _Kept:
    """A closed quantum's groups kept for the revision horizon, packed.

    Per group (``keys`` in publication order, interned): its non-zero bins and counts in
    one CSR block (``indptr`` into ``bins`` uint16 and ``vals`` float64), span, bytes,
    streams, and the revision its row was last published at (-1: it formed no row). About
    50 bytes plus 10 per non-zero bin per group, where a dense group is 8 per bin of the
    layout (1856 for fio 3). A group a revision touches is unpacked into ``live`` until
    the revision is published, then the whole quantum is packed again.

    Args:
        cells: the cells with rows in the quantum.
        missing: the ``cells_missing`` of its latest publication.
    """

    keys: list[GroupKey]
    indptr: npt.NDArray[np.int64]
    bins: npt.NDArray[np.uint16]
    vals: npt.NDArray[np.float64]
    lo: npt.NDArray[np.int64]
    hi: npt.NDArray[np.int64]
    nbytes: npt.NDArray[np.float64]
    streams: npt.NDArray[np.int64]
    revision: npt.NDArray[np.int32]
    flags: dict[GroupKey, dict[str, tuple[int, bool]]]
    cells: set[str]
    missing: tuple[str, ...]
    index: dict[GroupKey, int] | None = None  # made when a revision first touches it
    live: dict[GroupKey, tuple[_Group, int]] = field(default_factory=dict)  # (group, rev)
    touched: set[GroupKey] = field(default_factory=set)

    @classmethod
    def pack(
        cls,
        groups: dict[GroupKey, tuple[_Group, int]],
        *,
        cells: set[str],
        missing: tuple[str, ...],
        intern: dict[GroupKey, GroupKey],
    ) -> _Kept:
        """Pack ``groups`` (each with its published revision, -1 for none)."""
        keys = [intern.setdefault(k, k) for k in groups]
        n = len(keys)
        nz = [np.flatnonzero(g.hist) for g, _ in groups.values()]
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum([len(x) for x in nz], out=indptr[1:])
        bins = np.concatenate(nz).astype(np.uint16) if n else np.zeros(0, np.uint16)
        vals = (
            np.concatenate([g.hist[x] for (g, _), x in zip(groups.values(), nz, strict=True)])
            if n
            else np.zeros(0)
        )
        gs = [g for g, _ in groups.values()]
        return cls(
            keys=keys,
            indptr=indptr,
            bins=bins,
            vals=vals,
            lo=np.array([g.lo_ms for g in gs], np.int64),
            hi=np.array([g.hi_ms for g in gs], np.int64),
            nbytes=np.array([g.nbytes for g in gs], np.float64),
            streams=np.array([g.streams for g in gs], np.int64),
            revision=np.array([r for _, r in groups.values()], np.int32),
            flags={k: g.flags for k, g in zip(keys, gs, strict=True) if g.flags},
            cells=cells,
            missing=missing,
        )

    def group(self, key: GroupKey, nbins: int) -> tuple[_Group, int]:
        """The group of ``key`` unpacked (a new empty one, revision -1, if none), kept live."""
        got = self.live.get(key)
        if got is not None:
            return got
        if self.index is None:
            self.index = {k: i for i, k in enumerate(self.keys)}
        i = self.index.get(key)
        if i is None:
            got = (_Group(np.zeros(nbins)), -1)
        else:
            hist = np.zeros(nbins)
            a, b = int(self.indptr[i]), int(self.indptr[i + 1])
            hist[self.bins[a:b]] = self.vals[a:b]
            g = _Group(
                hist,
                lo_ms=int(self.lo[i]),
                hi_ms=int(self.hi[i]),
                nbytes=float(self.nbytes[i]),
                streams=int(self.streams[i]),
                flags=self.flags.get(key),
            )
            got = (g, int(self.revision[i]))
        self.live[key] = got
        return got

    def repacked(
        self,
        revised: dict[GroupKey, int],
        missing: tuple[str, ...],
        intern: dict[GroupKey, GroupKey],
    ) -> _Kept:
        """The quantum packed again after a publication.

        The live groups go back into the arrays (with their new revisions from
        ``revised``; their late counts start again at 0), the others are copied as they
        are (never unpacked: a revision touching a few groups costs little more than them).
        """
        keys = list(self.keys)
        keys.extend(k for k in self.live if self.index is None or k not in self.index)
        idx = self.index or {}
        n = len(keys)
        sizes = np.zeros(n, np.int64)
        bins: list[npt.NDArray[np.uint16]] = []
        vals: list[npt.NDArray[np.float64]] = []
        lo = np.zeros(n, np.int64)
        hi = np.zeros(n, np.int64)
        nbytes = np.zeros(n)
        streams = np.zeros(n, np.int64)
        revision = np.zeros(n, np.int32)
        flags: dict[GroupKey, dict[str, tuple[int, bool]]] = {}
        for j, k in enumerate(keys):
            got = self.live.get(k)
            if got is None:
                i = idx.get(k, j)  # an old key; without an index, keys kept their places
                a, b = int(self.indptr[i]), int(self.indptr[i + 1])
                bins.append(self.bins[a:b])
                vals.append(self.vals[a:b])
                sizes[j] = b - a
                lo[j], hi[j] = self.lo[i], self.hi[i]
                nbytes[j], streams[j] = self.nbytes[i], self.streams[i]
                revision[j] = self.revision[i]
                if k in self.flags:
                    flags[k] = self.flags[k]
                continue
            g, rev = got
            nz = np.flatnonzero(g.hist)
            bins.append(nz.astype(np.uint16))
            vals.append(g.hist[nz])
            sizes[j] = len(nz)
            lo[j], hi[j], nbytes[j], streams[j] = g.lo_ms, g.hi_ms, g.nbytes, g.streams
            revision[j] = revised.get(k, rev)
            if g.flags:
                flags[k] = g.flags
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(sizes, out=indptr[1:])
        return _Kept(
            keys=[intern.setdefault(k, k) for k in keys],
            indptr=indptr,
            bins=np.concatenate(bins) if bins else np.zeros(0, np.uint16),
            vals=np.concatenate(vals) if vals else np.zeros(0),
            lo=lo,
            hi=hi,
            nbytes=nbytes,
            streams=streams,
            revision=revision,
            flags=flags,
            cells=self.cells,
            missing=missing,
        )

    def all_groups(self, nbins: int) -> dict[GroupKey, tuple[_Group, int]]:
        """Every group, unpacked (a revision of the whole quantum)."""
        for k in self.keys:
            self.group(k, nbins)
        return self.live


@dataclass(slots=True)
class CellState:
    """What the root knows of one cell.

    Args:
        last_seen_ms: root clock of its last message (or the root's start, if expected).
        through_ms: it closed every quantum ending at or before this (None: not yet said).
        seq: its last message number.
        up: live at the last check (for the log lines on changes).
        rewinds: root clock of its recent message-number rewinds (two cells, one name?).
        rewind_logged_ms: root clock of the last warning about them.
        late_rows: its rows that came after their quantum closed (for the warnings).
        late_logged_ms: root clock of the last warning about them.
        off_grid: its last rows were off the root's grid (its marks are ignored).
        first_through_ms: after a start without state, its first mark (quanta ending at
            or before it count as closed by it only with its rows); else None.
        mark_lag_ms: root clock minus its latest mark, at receipt (None: no mark yet).
        grid_logged_ms, skew_logged_ms, lag_logged_ms: root clock of the last warning
            about its grid, a mark ahead of the root's clock, its mark's lag.
        doubled: ``(since_ms, until_ms)``, root clock: one of its message numbers came
            twice with different contents (two cells under one name; a cell's outbox
            resends the same bytes): quanta ending in ``[since_ms - lateness, until_ms]``
            hold only part of its rows and name it in ``cells_missing``; None: never.
        digests: CRC-32 of its latest :data:`DIGESTS` messages by number.
    """

    last_seen_ms: int
    through_ms: int | None = None
    seq: int = -1
    up: bool = True
    rewinds: list[int] = field(default_factory=list)  # root clock of recent seq rewinds
    rewind_logged_ms: int = -_FAR
    late_rows: int = 0
    late_logged_ms: int = -_FAR
    off_grid: bool = False
    first_through_ms: int | None = None
    mark_lag_ms: int | None = None
    grid_logged_ms: int = -_FAR
    skew_logged_ms: int = -_FAR
    lag_logged_ms: int = -_FAR
    doubled: tuple[int, int] | None = None
    digests: dict[int, int] = field(default_factory=dict)
    doubled_logged_ms: int = -_FAR


@dataclass(slots=True)
class RootCounts:
    """The root's counters (exported as ``fiomon_root_*``)."""

    # merged, duplicate, late, future; revised: merged into a closed quantum's revision
    rows: Counter[str] = field(default_factory=Counter)
    invalid: Counter[str] = field(default_factory=Counter)  # by wire reason, grid, layout
    messages: Counter[str] = field(default_factory=Counter)  # by cell
    quanta_closed: int = 0
    closed_by_lateness: int = 0
    quanta_revised: int = 0  # publications of revisions (a quantum revised twice: 2)
    kept_forgotten: int = 0  # closed quanta forgotten before the horizon (memory bound)
    missing: Counter[str] = field(default_factory=Counter)  # incomplete quanta, by cell


class RootMerger:
    """Merges partials and closes quanta like one aggregator fed every record.

    Args:
        quantum_ms: the quantum (every cell must use it, on one grid).
        lateness_ms: a quantum closes at the latest this long after its end (root clock).
        percentiles: percentiles to compute.
        confidence_level: level of the percentile intervals, or None.
        per_host: emit host rows.
        cells: the membership (``root.cells``): waited for from the start; any other
            cell is refused.
        cell_timeout_ms: a cell silent this long is gone.
        now_ms: the root's clock at start.
        closed_ms: quanta ending at or before this are published already (a restart).
        phase_ms: the root's grid: quanta end at ``phase_ms`` modulo ``quantum_ms``
            (``align: epoch`` is 0, a fixed offset its value).
        max_skew_ms: a closed mark further ahead of the root's clock is ignored.
        state_lost: what the previous run had received may be lost (the service found
            its state missing at the start): a cell's first mark then vouches for no
            quantum it covers, only its rows or a later mark do.
        revise_within_ms: the revision horizon, ms: a cell's row of a quantum the root
            closed, ending after ``closed_ms - revise_within_ms`` (the root's
            closed-through point then), is merged into a revision of that quantum's rows;
            older ones are counted late. 0: no revisions (every such row is late). The
            groups of closed quanta are kept (sparse) for this long. Quanta closed before
            this merger was made (``closed_ms`` at a restart) are never revised: their
            groups were not kept, and a revision from part of them would be wrong.
        latency: the latency kind merged (the root's ``latency``): a cell's partials of
            another kind (its own ``latency``) are refused, counted as ``latency``.
    """

    def __init__(
        self,
        *,
        quantum_ms: int,
        lateness_ms: int,
        percentiles: Sequence[float],
        confidence_level: float | None,
        per_host: bool,
        cells: Sequence[str],
        cell_timeout_ms: int,
        now_ms: int,
        closed_ms: int | None = None,
        phase_ms: int = 0,
        max_skew_ms: int = MAX_SKEW_MS,
        state_lost: bool = False,
        revise_within_ms: int = 0,
        revise_memory_bytes: int = 1 << 30,
        latency: LatencyKind = "clat",
    ) -> None:
        self.latency: LatencyKind = latency
        self.quantum_ms = quantum_ms
        self.revise_within_ms = max(0, revise_within_ms)
        self.revise_memory_bytes = revise_memory_bytes
        self._floor = closed_ms  # quanta ending at or before it closed in an earlier run
        self.lateness_ms = lateness_ms
        self.percentiles = tuple(percentiles)
        self.confidence_level = confidence_level
        self.per_host = per_host
        self.cell_timeout_ms = cell_timeout_ms
        self.cells: dict[str, CellState] = {c: CellState(now_ms) for c in cells}
        self.expected = frozenset(cells)
        self.order = tuple(cells)  # cells_missing lists them in the configured order
        self.closed_ms = closed_ms
        self.layout: BinLayout | None = None
        self.phase_ms = phase_ms % quantum_ms
        self.max_skew_ms = max_skew_ms
        self.counts = RootCounts()
        self.counts.missing.update({c: 0 for c in cells})
        self._open: dict[int, dict[GroupKey, _Group]] = {}  # quantum end -> groups
        self._seen: dict[int, set[RowId]] = {}  # quantum end -> cell rows (with revision)
        self._kept: dict[int, _Kept] = {}  # closed quantum end -> its groups (the horizon)
        self._intern: dict[GroupKey, GroupKey] = {}  # one tuple per key across kept quanta
        self._added: dict[str, npt.NDArray[np.float64]] = {}  # see take_added
        self._from: dict[int, set[str]] = {}  # open quantum end -> cells with rows in it
        self._closed_any = False  # rows were closed: the layout is fixed from then on
        self._fresh = state_lost
        self._unlisted: set[str] = set()  # unlisted names logged (at most UNLISTED_NAMED)

    # -- intake -----------------------------------------------------------------------------

    def receive(
        self,
        payload: bytes,
        now_ms: int,
        *,
        cell: str | None,
        max_bytes: int = MAX_PARTIALS_BYTES,
        replay: bool = False,
        mark: bool = True,
    ) -> int | None:
        """One partials message on the topic of ``cell`` (refused ones: counted, logged).

        ``cell`` is the name in the topic (``.../_partials/<cell>``): the message is taken
        only if it is in the membership and the payload names the same cell. None: the
        payload's own name (only for journal segments of a format that kept no topic).
        Returns the latest quantum end among its rows (None: refused or no rows), which
        tells a journal when the message is no longer needed. ``replay``: from the
        journal at a start (its rows of closed quanta are expected, not worth a warning).
        ``mark``: take its closed-through mark (False: an earlier message of the cell is
        missing, so the mark waits for :meth:`take_mark`; issue 24).
        """
        if cell is not None and not self._listed(cell):
            return None
        try:
            msg = decode(payload, max_bytes=max_bytes)
        except WireFormatError as exc:
            self._invalid(exc.reason, str(exc))
            return None
        name = msg.cell if cell is None else cell
        if msg.latency != self.latency:
            self._invalid(
                "latency",
                f"cell {name}: its partials hold {msg.latency} latency, this root merges "
                f"{self.latency} (give the cell and the root the same latency setting)",
            )
            return None
        digest = zlib.crc32(payload)
        if not self.take(msg, now_ms, cell=name, replay=replay, mark=mark, digest=digest):
            return None
        return max((r.part.end_ms for r in msg.rows), default=None)

    def _listed(self, cell: str) -> bool:
        """Whether ``cell`` is in the membership; else counted, logged once per name."""
        if cell in self.expected:
            return True
        self.counts.invalid["unlisted"] += 1
        n = self.counts.invalid["unlisted"]
        if cell not in self._unlisted and len(self._unlisted) < UNLISTED_NAMED:
            self._unlisted.add(cell)
            log.warning(
                "partials refused (unlisted): cell %r is not in root.cells (%s): its rows are "
                "not merged, its marks ignored, it is not waited for (add it to root.cells "
                "and restart the root if it belongs to the cluster; further messages from "
                "it are only counted)",
                cell,
                ", ".join(self.order) or "none",
            )
        elif n % 1000 == 0:
            log.warning("partials refused (unlisted): %d messages of cells not in root.cells", n)
        return False

    def _fit_layout(self, msg: PartialsMessage) -> bool:
        """Whether ``msg``'s rows merge into the root's bins (settling them); else refused.

        One rule with the aggregator (:func:`fiomon.bins.merged_layout`): a finer cell's
        rows are summed into the root's coarser bins exactly (:func:`coarsen_hist`, row
        by row in :meth:`take`). A coarser cell cannot be split into finer bins, so before
        the root's first close it re-bins the open groups to the coarser layout instead
        (exact too; nothing was published yet): the root's bins are the coarsest of the
        cells heard from by then, whichever came first. After that they are fixed (its
        published rows and bucket histogram use them), and a coarser cell is refused.
        """
        new = msg.layout
        if not msg.rows:
            return True  # a marker carries no bins (an idle cell sends fio 3's layout)
        if self.layout is None or new == self.layout:
            self.layout = new
            return True
        try:
            merged = merged_layout(self.layout, new)
        except LayoutError as exc:
            self._invalid(
                "layout",
                f"cell {msg.cell}: {exc}: every cell's hosts need fio with the same bins "
                "(fio 3, or fio 2 everywhere)",
            )
            return False
        if merged == self.layout:
            return True
        if not self._closed_any:
            for groups in self._open.values():
                for g in groups.values():
                    g.hist = coarsen_hist(g.hist, self.layout, merged)
            log.info(
                "cell %s: bins %s are coarser than the others' so far: the root merges into "
                "them (exact: finer cells' bins are summed)",
                msg.cell,
                merged.describe(),
            )
            self.layout = merged
            return True
        self._invalid(
            "layout",
            f"cell {msg.cell}: bins {new.describe()} are coarser than the root's "
            f"{self.layout.describe()}, fixed at its first close (finer bins cannot be "
            f"made from coarser ones): give every cell's hosts the same fio "
            f"log_hist_coarseness (at least {new.coarseness}); the root's bins are the "
            "coarsest it heard of before its first close after a start",
        )
        return False

    def _invalid(self, reason: str, text: str) -> None:
        self.counts.invalid[reason] += 1
        n = self.counts.invalid[reason]
        if n <= 5 or n % 1000 == 0:
            log.warning("partials refused (%s, %d so far): %s", reason, n, text)

    def take(
        self,
        msg: PartialsMessage,
        now_ms: int,
        *,
        cell: str,
        replay: bool = False,
        mark: bool = True,
        digest: int | None = None,
    ) -> bool:
        """Merge a decoded message's rows and note the cell's progress; False: refused.

        ``cell`` is the name in the message's topic: a cell not in the membership, or a
        payload naming another cell, is refused (counted, logged). ``mark``: take its
        closed-through mark now (False: an earlier message of the cell is missing, so the
        mark waits for :meth:`take_mark`). ``digest``: the payload's CRC-32, to tell a
        resend (the same bytes) from another cell's message under the same number.
        """
        if not self._listed(cell):
            return False
        if msg.cell != cell:
            self._invalid(
                "cell-name",
                f"the payload on the topic of cell {cell} names cell {msg.cell}: two cells "
                "with one partials topic, or a forged message",
            )
            return False
        state = self.cells[cell]
        # A refused message changes nothing: its grid is checked, then its bins are fitted
        # (which may re-bin the open groups).
        if not self._on_grid(msg, state, now_ms):
            return False
        if not self._fit_layout(msg):
            return False
        if msg.rows:
            state.off_grid = False
        state.last_seen_ms = now_ms
        if state.seq < 0 and not replay:
            log.info("cell %s: first message (closed through %d)", cell, msg.closed_through_ms)
        if msg.seq < state.seq and not replay:
            self._rewound(cell, state, msg.seq, now_ms)
        if digest is not None:
            self._check_digest(cell, state, msg.seq, digest, now_ms)
        state.seq = msg.seq
        self.counts.messages[cell] += 1
        if mark and not state.off_grid:  # an off-grid cell's marker says nothing of ours
            self._mark(cell, state, msg.closed_through_ms, now_ms, replay=replay)
        if not msg.rows:
            return True  # a marker (and heartbeat): nothing to merge
        rows = self.counts.rows
        late_before = rows["late"]
        lay = self.layout
        assert lay is not None  # noqa: S101 -- _fit_layout settled it
        for r in msg.rows:
            p = r.part
            if p.scope == "host" and not self.per_host:
                continue
            key: GroupKey = (p.scope, p.host, p.direction)
            if p.end_ms > now_ms + MAX_FUTURE_MS:
                rows["future"] += 1  # bounds what a wrong clock (or hostile cell) holds open
                continue
            seen = self._seen.setdefault(p.end_ms, set())
            rid: RowId = (msg.cell, key, p.revision, _delta_digest(r) if p.revision else 0)
            if rid in seen:
                rows["duplicate"] += 1  # a resend (closed quanta are remembered a while)
                continue
            hist = p.hist if msg.layout == self.layout else coarsen_hist(p.hist, msg.layout, lay)
            if self.closed_ms is not None and p.end_ms <= self.closed_ms:
                kept = self._revisable(p.end_ms)
                if kept is None:
                    rows["late"] += 1  # never merged: its quantum closed without it
                    continue
                seen.add(rid)
                late_group, _ = kept.group(key, lay.nbins)
                kept.touched.add(key)
                kept.cells.add(cell)  # (no longer missing once its rows are in)
                _merge(late_group, hist, r, cell)
                if p.scope == "cluster":  # what the bucket histogram lacks (take_added)
                    have = self._added.get(p.direction)
                    self._added[p.direction] = hist.copy() if have is None else have + hist
                rows["revised"] += 1
                continue
            seen.add(rid)
            self._from.setdefault(p.end_ms, set()).add(cell)
            groups = self._open.setdefault(p.end_ms, {})
            g = groups.get(key)
            if g is None:
                g = groups[key] = _Group(np.zeros_like(hist))
            _merge(g, hist, r, cell)
            rows["merged"] += 1
        if rows["late"] > late_before and not replay:
            self._log_late(cell, state, rows["late"] - late_before, now_ms)
        return True

    def _revisable(self, end: int) -> _Kept | None:
        """The kept groups of closed quantum ``end`` if a row of it can still revise it.

        Within the horizon of the closed-through point and closed by this merger (not
        before its start); a quantum the root closed with no rows at all gets empty
        groups here. None: a row of it is late.
        """
        closed = self.closed_ms
        if not self.revise_within_ms or closed is None or end <= closed - self.revise_within_ms:
            return None
        if self._floor is not None and end <= self._floor:
            return None
        kept = self._kept.get(end)
        if kept is None:
            kept = self._kept[end] = _Kept.pack({}, cells=set(), missing=(), intern=self._intern)
        return kept

    def _on_grid(self, msg: PartialsMessage, state: CellState, now_ms: int) -> bool:
        """Whether every row is a quantum of the root's grid; else refused and named.

        A cell off the grid has its marks ignored from then on (they say nothing of the
        root's quanta) until it sends rows on the grid: its quanta show it missing.
        """
        q, phase = self.quantum_ms, self.phase_ms
        bad = next(
            (
                r.part
                for r in msg.rows
                if r.part.end_ms - r.part.start_ms != q or r.part.end_ms % q != phase
            ),
            None,
        )
        if bad is None:
            return True
        self.counts.invalid["grid"] += 1
        state.off_grid = True
        state.through_ms = None
        state.first_through_ms = None
        if now_ms - state.grid_logged_ms >= LOG_EVERY_MS:
            state.grid_logged_ms = now_ms
            log.warning(
                "partials refused (grid, %d so far): cell %s sent quantum (%d, %d] (%d ms, "
                "phase %d ms), not on the root's grid (%d ms, phase %d ms: its quantum and "
                "align): give the cell the root's quantum and align; its rows are left out "
                "and its quanta show it in cells_missing",
                self.counts.invalid["grid"],
                msg.cell,
                bad.start_ms,
                bad.end_ms,
                bad.end_ms - bad.start_ms,
                bad.end_ms % q,
                q,
                phase,
            )
        return False

    def _mark(self, name: str, cell: CellState, through: int, now_ms: int, *, replay: bool) -> None:
        """Take a message's closed mark: not ahead of the root's clock beyond the skew bound."""
        if through > now_ms + self.max_skew_ms:
            # Believed, it would stop the root waiting for this cell (the mark only grows):
            # a clock ahead of the root's, or a forged message. Its rows still count.
            self.counts.invalid["future-mark"] += 1
            if not replay:  # the gauge shows it (negative: ahead of the root's clock)
                cell.mark_lag_ms = now_ms - through
            if now_ms - cell.skew_logged_ms >= LOG_EVERY_MS:
                cell.skew_logged_ms = now_ms
                log.warning(
                    "cell %s: closed mark %d is %d ms ahead of the root's clock (%d), more "
                    "than root.max_skew (%d ms): mark ignored, its rows merged (%d such "
                    "marks so far): check the cell's clock (NTP)",
                    name,
                    through,
                    through - now_ms,
                    now_ms,
                    self.max_skew_ms,
                    self.counts.invalid["future-mark"],
                )
            return
        if cell.through_ms is not None and through <= cell.through_ms:
            return  # an older mark (a resend, or a split close's first messages)
        if cell.through_ms is None and self._fresh and cell.first_through_ms is None:
            cell.first_through_ms = through
        cell.through_ms = through
        if replay:
            return
        cell.mark_lag_ms = now_ms - through
        if cell.mark_lag_ms > self.lateness_ms and now_ms - cell.lag_logged_ms >= LOG_EVERY_MS:
            cell.lag_logged_ms = now_ms
            log.warning(
                "cell %s: its closed mark trails the root's clock by %d ms at receipt, more "
                "than the root's lateness (%d ms): its quanta close without it (cells_missing "
                "names it) and its rows come late; the cell's lateness, its clock's skew and "
                "the trip to the root must stay below the root's lateness",
                name,
                cell.mark_lag_ms,
                self.lateness_ms,
            )

    def take_mark(self, name: str, through_ms: int, now_ms: int, *, replay: bool = False) -> None:
        """Cell ``name`` closed every quantum ending at or before ``through_ms``.

        Taken from each message (:meth:`take`), or later, once the messages before it
        are in (issue 24: a mark must not close quanta whose rows are still missing).
        The skew bound and an off-grid cell's silence apply as in :meth:`take`.
        """
        cell = self.cells.get(name)
        if cell is None or cell.off_grid:
            return
        self._mark(name, cell, through_ms, now_ms, replay=replay)

    def _rewound(self, name: str, cell: CellState, seq: int, now_ms: int) -> None:
        """A cell's message number went back: once per restart (a resend), or two cells.

        One cell's messages come in order (one MQTT publisher, QoS 1) and go back only when
        it restarts and resends from its last acknowledged message. Two cells sending under
        one name interleave their numbers, which go back at nearly every message: their
        rows are then taken for resends of each other's and dropped as duplicates.
        """
        cell.rewinds = [t for t in cell.rewinds if now_ms - t < REWIND_WINDOW_MS] + [now_ms]
        if len(cell.rewinds) < REWINDS:
            return
        if now_ms - cell.rewind_logged_ms < REWIND_WINDOW_MS:
            return
        cell.rewind_logged_ms = now_ms
        log.warning(
            "cell %s: its message numbers went back %d times within %d s (now %d after %d): "
            "two cells may be sending under this name (check each cell's `cell:`), or its "
            "link to the root flaps (each reconnection resends what the root has not "
            "acknowledged)",
            name,
            len(cell.rewinds),
            REWIND_WINDOW_MS // 1000,
            seq,
            cell.seq,
        )

    def _check_digest(self, name: str, cell: CellState, seq: int, digest: int, now_ms: int) -> None:
        """Remember message ``seq``'s digest; the same number with other bytes: two cells.

        A cell's outbox resends the very bytes it sent (after a reconnection, a restart,
        a hole), so a number seen again with another digest comes from another process
        using this cell's name (a copied configuration; or the cell's state was lost and
        it numbers from 0 again). Until a minute after the last such message, the
        quanta name the cell in ``cells_missing``: the root takes one's rows for resends
        of the other's, and its cluster rows hold part of them only.
        """
        seen = cell.digests.get(seq)
        if seen is None:
            cell.digests[seq] = digest
            if len(cell.digests) > DIGESTS:
                del cell.digests[next(iter(cell.digests))]
            return
        if seen == digest:
            return
        since = now_ms
        if cell.doubled is not None and cell.doubled[1] >= now_ms - self.lateness_ms:
            since = cell.doubled[0]  # the same episode goes on
        cell.doubled = (since, now_ms + REWIND_WINDOW_MS)
        cell.digests[seq] = digest
        if now_ms - cell.doubled_logged_ms < REWIND_WINDOW_MS:
            return
        cell.doubled_logged_ms = now_ms
        log.warning(
            "cell %s: message %d came twice with different contents: two cells send under "
            "this name (check each cell's `partials.cell`), or the cell lost its state and "
            "numbers from 0 again; the root takes one's rows for resends of the other's, so "
            "its quanta name the cell in cells_missing until a minute after the last such "
            "message",
            name,
            seq,
        )

    def _log_late(self, name: str, cell: CellState, n: int, now_ms: int) -> None:
        """Say (at most every 10 s per cell) that a cell's rows came after their close."""
        cell.late_rows += n
        if now_ms - cell.late_logged_ms < 10_000:
            return
        cell.late_logged_ms = now_ms
        log.warning(
            "cell %s: %d partial rows (%d so far) came after the root closed their quanta "
            "(closed through %s) and are left out: the cell was down or cut off longer than "
            "the root's lateness (%d ms) plus its revise_within (%d ms), or their quanta "
            "closed before the root's start (a restart revises none of them), or the root's "
            "lateness is not above the cells' plus the clock skew between cell and root",
            name,
            n,
            cell.late_rows,
            self.closed_ms,
            self.lateness_ms,
            self.revise_within_ms,
        )

    # -- cells ------------------------------------------------------------------------------

    def live_cells(self, now_ms: int) -> list[str]:
        """Cells heard from within the cell timeout (logs each change of state)."""
        out = []
        for name, c in sorted(self.cells.items()):
            up = now_ms - c.last_seen_ms < self.cell_timeout_ms
            if up != c.up:
                c.up = up
                if up:
                    log.info("cell %s is back", name)
                else:
                    log.warning(
                        "cell %s is gone: nothing from it for %d ms; its quanta close on the "
                        "root's lateness (%d ms) without it",
                        name,
                        now_ms - c.last_seen_ms,
                        self.lateness_ms,
                    )
            if up:
                out.append(name)
        return out

    # -- closing ----------------------------------------------------------------------------

    def close(self, now_ms: int) -> list[ClosedQuantum]:
        """Close every quantum all live cells closed, or ``lateness_ms`` old; oldest first.

        Then the revisions of closed quanta that rows reached since the previous close
        (``revised_at`` = ``now_ms``), oldest quantum first, after the first publications.
        """
        live = self.live_cells(now_ms)
        by_clock = now_ms - self.lateness_ms
        bound = by_clock
        throughs = [self.cells[c].through_ms for c in live]
        if live and all(t is not None for t in throughs):
            bound = max(bound, min(t for t in throughs if t is not None))
        out: list[ClosedQuantum] = []
        if self.closed_ms is None or bound > self.closed_ms:
            ready = sorted(e for e in self._open if e <= bound)
            for end in ready:
                if any(not self._closed_by(c, end) for c in self.order):
                    # Closed while a configured cell had not closed it: on the root's clock,
                    # or without a gone cell (counted whether the cell was live or not).
                    self.counts.closed_by_lateness += 1
                out.extend(self._close_one(end))
            # Row identities of closed quanta are remembered for SEEN_QUANTA quanta, and at
            # least over the revision horizon, so a cell's resends after a restart count as
            # duplicates, not late, and a resent row never revises a quantum twice.
            keep = max(SEEN_QUANTA * self.quantum_ms, self.revise_within_ms + self.quantum_ms)
            for end in [e for e in self._seen if e <= bound - keep]:
                del self._seen[end]
            self.counts.quanta_closed += len(ready)
            self.closed_ms = bound
        out.extend(self._revise(now_ms))
        # Past the horizon a quantum's groups go (after its last revision was published):
        # its rows are late from now on.
        if self.closed_ms is not None:
            horizon = self.closed_ms - self.revise_within_ms
            for end in [e for e in self._kept if e <= horizon]:
                del self._kept[end]
            self._bound_kept()
            if not self._kept:
                self._intern.clear()  # (hosts that went away leave no key behind)
        return out

    def flush(self, now_ms: int | None = None) -> list[ClosedQuantum]:
        """Close everything open (a final stop), then publish the pending revisions.

        ``now_ms``: the root's clock, their ``revised_at`` (None: the closed-through point).
        """
        out: list[ClosedQuantum] = []
        for end in sorted(self._open):
            out.extend(self._close_one(end))
        self.counts.quanta_closed += len({r.end_ms for r in out if r.revised_at is None})
        if self._open or self._seen:
            last = max([*self._open, *self._seen])
            self.closed_ms = max(self.closed_ms or last, last)
        out.extend(self._revise(now_ms if now_ms is not None else self.closed_ms or 0))
        self._open.clear()
        self._seen.clear()
        self._from.clear()
        self._kept.clear()
        return out

    def take_added(self) -> dict[str, npt.NDArray[np.float64]]:
        """Per cluster direction, the bin counts merged into revisions since the last call.

        In the root's layout; what the bucket histogram (``Publisher.revise``) lacks: the
        first publications carried the rest.
        """
        out, self._added = self._added, {}
        return out

    def _closed_by(self, name: str, end: int) -> bool:
        """Whether cell ``name``'s mark says it closed the quantum ending at ``end``.

        After a start that lost its state, its first mark does not vouch for the quanta it
        covers: their rows may have gone to the previous run.
        """
        c = self.cells[name]
        if c.through_ms is None or c.through_ms < end:
            return False
        return c.first_through_ms is None or end > c.first_through_ms

    def missing(self, end: int) -> tuple[str, ...]:
        """The configured cells neither in quantum ``end`` nor known to have closed it.

        Also a cell whose message numbers say two cells send under its name
        (:attr:`CellState.doubled`): the quantum holds only part of its rows.
        """
        kept = self._kept.get(end)
        sent = kept.cells if kept is not None else self._from.get(end, set())
        return tuple(
            c
            for c in self.order
            if (c not in sent and not self._closed_by(c, end)) or self._doubled(c, end)
        )

    def _doubled(self, name: str, end: int) -> bool:
        d = self.cells[name].doubled
        return d is not None and d[0] - self.lateness_ms <= end <= d[1]

    @property
    def open_quanta(self) -> int:
        """Quanta holding rows and not yet closed."""
        return len(self._open)

    def _bound_kept(self) -> None:
        """Forget the oldest kept quanta while they hold more than ``revise_memory_bytes``.

        Their rows are late from then on (as past the horizon); logged once per episode.
        """
        if len(self._kept) < 2:
            return
        total = self.kept_bytes()
        if total <= self.revise_memory_bytes:
            return
        dropped = 0
        while total > self.revise_memory_bytes and len(self._kept) > 1:
            oldest = min(self._kept)
            total -= _kept_nbytes(self._kept.pop(oldest))
            self._floor = oldest if self._floor is None else max(self._floor, oldest)
            dropped += 1
        self.counts.kept_forgotten += dropped
        log.warning(
            "forgot %d closed quanta before revise_within (%d ms, %d so far): the kept "
            "groups reached revise_memory (%d MiB); rows for them are late: raise "
            "revise_memory or shorten revise_within",
            dropped,
            self.revise_within_ms,
            self.counts.kept_forgotten,
            self.revise_memory_bytes >> 20,
        )

    @property
    def kept_quanta(self) -> int:
        """Closed quanta whose groups are kept for revisions (the horizon)."""
        return len(self._kept)

    def kept_bytes(self) -> int:
        """The kept groups' array bytes (an estimate of their memory, for tests and logs)."""
        return sum(_kept_nbytes(k) for k in self._kept.values())

    def _close_one(self, end: int) -> list[ClosedQuantum]:
        """The rows of quantum ``end``: cluster, then hosts by name; directions in order.

        Its groups are then kept (packed) for revisions when there is a horizon.
        """
        cells_missing = self.missing(end)
        cells = self._from.pop(end, set())
        self.counts.missing.update(cells_missing)
        groups = self._open.pop(end)
        self._closed_any = True
        keys = self._ordered(groups)
        out = self._rows(end, {k: (groups[k], -1) for k in keys}, keys, cells_missing, None)
        if self.revise_within_ms:
            published = {(r.scope, r.host, r.direction) for r in out}
            self._kept[end] = _Kept.pack(
                {k: (groups[k], 0 if k in published else -1) for k in keys},
                cells=cells,
                missing=cells_missing,
                intern=self._intern,
            )
        return out

    def _revise(self, now_ms: int) -> list[ClosedQuantum]:
        """The revisions of the kept quanta that changed since their last publication.

        A quantum rows reached: the rows of the keys they touched. A quantum a cell named
        in its ``cells_missing`` is no longer missing from (its rows came, or its mark
        now says it closed the quantum: what an in-time root would have known): every
        row of it, the untouched ones with their statistics unchanged, so the latest
        revision of each key says ``complete`` as the in-time root's row would.
        """
        out: list[ClosedQuantum] = []
        for end in sorted(self._kept):
            kept = self._kept[end]
            if not kept.touched and not kept.missing:
                continue  # (the common case: nothing to recompute)
            cells_missing = self.missing(end)
            back = any(c not in cells_missing for c in kept.missing)
            if not kept.touched and not back:
                continue
            assert self.layout is not None  # noqa: S101 -- kept groups come after a layout
            groups = kept.all_groups(self.layout.nbins) if back else kept.live
            keys = self._ordered({k: g for k, (g, _) in groups.items()})
            rows = self._rows(end, groups, keys, cells_missing, now_ms)
            if rows:
                self.counts.quanta_revised += 1
            out.extend(rows)
            revised = {(r.scope, r.host, r.direction): r.revision for r in rows}
            # A key not republished keeps its row's earlier word on completeness; only a
            # cell leaving the missing ones republishes them all, so this is that word.
            self._kept[end] = kept.repacked(
                revised, cells_missing if back or not kept.missing else kept.missing, self._intern
            )
        return out

    def _ordered(self, groups: dict[GroupKey, _Group]) -> list[GroupKey]:
        """Keys in row order: cluster, then hosts by name; directions in order."""
        order = {d: i for i, d in enumerate(DIRECTIONS)}
        return sorted(groups, key=lambda k: (k[0] != "cluster", k[1] or "", order[k[2]]))

    def _rows(
        self,
        end: int,
        groups: dict[GroupKey, tuple[_Group, int]],
        keys: list[GroupKey],
        cells_missing: tuple[str, ...],
        revised_at: int | None,
    ) -> list[ClosedQuantum]:
        """Rows of ``keys`` of quantum ``end`` (each group with its published revision).

        ``revised_at`` None: the first publication (revision 0); else each key's row is
        its revision + 1 (0 for a key published for the first time).
        """
        assert self.layout is not None  # noqa: S101 -- groups exist only after a layout
        if not keys:
            return []
        hists = np.stack([groups[k][0].hist for k in keys])
        # Only the columns between the first and last bin with a count (as the engine
        # does): one workload fills a few hundred of fio's 1856 bins.
        used = np.flatnonzero(hists.any(axis=0))
        lo, hi = (int(used[0]), int(used[-1]) + 1) if len(used) else (0, 1)
        stats, cis = group_stats(
            hists[:, lo:hi],
            self.layout,
            self.percentiles,
            confidence_level=self.confidence_level,
            first_bin=lo,
        )
        out = []
        for k, st, ci in zip(keys, stats, cis, strict=True):
            if st is None:
                continue  # empty groups form no row (they only widened no span here)
            g, rev = groups[k]
            scope, host, direction = k
            row = closed_row(
                start_ms=end - self.quantum_ms,
                end_ms=end,
                scope=scope,
                host=host,
                direction=direction,
                stats=st,
                ci_ns=ci,
                lo_ms=g.lo_ms,
                hi_ms=g.hi_ms,
                nbytes=g.nbytes,
                streams=g.streams,
                late_records=g.late,
                hist=g.hist if scope == "cluster" else None,
                # Missing a cell, or a cell's own row lacked a host it expected.
                complete=not cells_missing and not g.incomplete,
                cells_missing=cells_missing,
            )
            if revised_at is not None:
                row = replace(row, revision=rev + 1, revised_at=revised_at)
            out.append(row)
        return out


def _merge(g: _Group, hist: npt.NDArray[np.float64], r: PartialRow, cell: str) -> None:
    """Add one cell's row (its revision 0, or a revision's delta) to a group."""
    p = r.part
    g.hist += hist
    g.lo_ms = min(g.lo_ms, p.lo_ms)
    g.hi_ms = max(g.hi_ms, p.hi_ms)
    g.nbytes += p.nbytes
    g.streams += p.streams
    g.late += r.late_records
    g.flag(cell, p.revision, complete=r.complete)


def _delta_digest(r: PartialRow) -> int:
    """CRC-32 of what a revision row adds (its counts, span, bytes and streams)."""
    p = r.part
    head = f"{p.lo_ms},{p.hi_ms},{p.nbytes!r},{p.streams},{r.late_records}".encode()
    return zlib.crc32(np.ascontiguousarray(p.hist).tobytes(), zlib.crc32(head))


def _kept_nbytes(k: _Kept) -> int:
    """A kept quantum's array bytes (and 8 per key reference)."""
    arrays = (k.indptr, k.bins, k.vals, k.lo, k.hi, k.nbytes, k.streams, k.revision)
    return sum(a.nbytes for a in arrays) + 8 * len(k.keys)
