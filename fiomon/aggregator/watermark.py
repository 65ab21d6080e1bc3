"""When quanta may close: event-time progress of live streams, bounded by the wall clock.

docs/quanta-closing.md: a quantum closes early when every *live* stream has reported past its end,
and at the latest ``lateness`` after its end on the wall clock. A stream is live while
its agent is not marked offline (its status topic) and it has reported within
``idle_ms``; a silent or offline stream therefore never holds quanta open beyond the
lateness. Records of one stream arrive in order (one MQTT client, QoS 1), so a stream
whose records reached time ``t`` has nothing more to say about quanta ending by ``t``.

A stream has *parts*, one per fio job and direction: a hist log's read and write records
carry stamps a few ms apart, and the next record of a part starts where its previous one
ended. So a stream has reported up to the smallest latest end over its parts that
reported within ``idle_ms``, and the cluster up to the smallest over all such parts.
Parts live in flat numpy arrays (latest end, last seen, agent), so a message updates its
parts with one ``np.maximum.at`` and the close decision is one masked minimum: the cost
is per record received, not per host per tick.

Early closing starts ``warmup_ms`` after the first record, on the clock and in the
records' own time: until then the set of streams is not known (agents start, and
reconnect after an aggregator restart, at different times; a lagging intake meets them
later), and closing on the first few would make every other host's records late.
Agents publish every second, so a couple of seconds suffice. The same holds when records
arrive again after an idle input (none for ``2 x lateness``: the next run of a benchmark),
so the warm-up starts over then.

The wall clock only speaks for input we could have received: while the aggregator is
disconnected from the broker, and for ``lateness`` after it (re)connects, the clock bound
holds where it was (:meth:`Watermark.hold`), so a restart or a broker outage does not
close quanta whose records are still queued in the broker.

The same holds while the aggregator's own intake is behind (a CPU-starved process, the
backlog after a restart or an outage): the wall clock counts from the newest record
received, not from now, as long as records keep coming. Otherwise, once intake falls
behind by more than the lateness, every record would reach an already closed quantum
and count as late; held this way, quanta wait for their records (``max_open_quanta``
bounds the memory) and close delays show the lag instead.

Our own pauses say nothing about the input. Two rules keep them from closing quanta
whose records wait in the broker or in our socket:

* A part is live while it reported within ``idle_ms`` on the wall clock *or* its latest
  end is within ``idle_ms`` of the newest record end received (event time). Event time
  only moves with our intake, so a restart that spent seconds re-forming its open quanta
  from the journal, or a lagging intake that has not yet met a host's next record, does
  not leave the first few hosts that arrive as the only live parts (which once closed a
  quantum with a fifth of its hosts right after a slow restart). The wall clock still
  speaks for parts whose event time is ahead of the rest (a host whose clock runs fast).
* :meth:`Watermark.stalled` credits time the process could not read its input (a long
  step, CPU starvation, a VM pause): it does not count as input silence, so the clock
  bound does not jump to ``now - lateness`` over records that are waiting for us.

Two kinds of host are known without a record in hand:

* After a restart, a host whose records all lie in quanta already confirmed is not in the
  journal. Its streams' progress is therefore saved with the grid state
  (:meth:`Watermark.known` / :meth:`Watermark.restore_known`): each stream live at the
  stop (in event time) comes back as one part at its latest end, so the first hosts of
  the backlog do not close a quantum without it; the first new record of that stream
  replaces it, and it turns idle in event time like any part.
* A host that announced itself online (a fresh status) but sent no record yet
  (:meth:`Watermark.announced`): its first records may come seconds after another
  host's (a slow start on a loaded machine), so no quantum closes early until it sends,
  goes offline, or ``lateness`` passes after the first record received after its
  announcement (an agent that is online with no benchmark to follow pauses early
  closing once per start of the input, for one lateness). The clock bound still
  applies, so it never holds a quantum longer than the lateness.

The watermark never moves back. Pure: the caller passes ``now_ms``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fiomon.model import Direction

MAX_OUTAGES = 32  # broker outages remembered for silent() (a flapping link: the newest)

_FAR = 2**62
DIRECTIONS = len(Direction)  # slots per part key: one per direction (mixed included)
_RESTORED = ("restored",)  # the key of a stream's progress saved by the previous run
MAX_KNOWN_STREAMS = 1_000_000  # a saved state never restores more streams than this


@dataclass(frozen=True, slots=True)
class KnownStreams:
    """The streams a watermark knows, for the grid state (survives a restart).

    Args:
        newest_end_ms: the newest record end received (epoch ms).
        streams: ``(agent, stream, latest end ms)`` per stream live in event time: the
            smallest latest end over its live parts, as the watermark judges it.
    """

    newest_end_ms: int
    streams: tuple[tuple[str, str, int], ...]

    def __post_init__(self) -> None:
        if len(self.streams) > MAX_KNOWN_STREAMS:
            msg = f"{len(self.streams)} known streams (at most {MAX_KNOWN_STREAMS})"
            raise ValueError(msg)

    def to_json(self) -> dict[str, object]:
        """``{"newest_end_ms": t, "streams": [[agent, stream, t - end], ...]}``."""
        t = self.newest_end_ms
        return {"newest_end_ms": t, "streams": [[a, s, t - e] for a, s, e in self.streams]}

    @classmethod
    def from_json(cls, doc: object) -> KnownStreams:
        """Parse :meth:`to_json`'s form.

        Raises:
            ValueError: not that form (also for wrong types).
        """
        if not isinstance(doc, dict):
            msg = "known streams: not an object"
            raise ValueError(msg)
        t = doc.get("newest_end_ms")
        rows = doc.get("streams")
        if not isinstance(t, int) or isinstance(t, bool) or not isinstance(rows, list):
            msg = "known streams: newest_end_ms or streams missing"
            raise ValueError(msg)
        out: list[tuple[str, str, int]] = []
        for row in rows:
            if not (isinstance(row, list) and len(row) == 3):
                msg = f"known streams: bad entry {str(row)[:80]}"
                raise ValueError(msg)
            a, s, back = row
            if not (isinstance(a, str) and isinstance(s, str) and isinstance(back, int)):
                msg = f"known streams: bad entry {str(row)[:80]}"
                raise ValueError(msg)
            if back < 0 or isinstance(back, bool):
                msg = f"known streams: end after the newest end in {str(row)[:80]}"
                raise ValueError(msg)
            out.append((a, s, t - back))
        return cls(t, tuple(out))


class Watermark:
    """Tracks the progress of stream parts and says up to which time quanta may close.

    Args:
        lateness_ms: the latest a quantum closes, after its end.
        idle_ms: a part silent this long, on the wall clock and behind the newest record
            end received, stops holding quanta open (it is forgotten after ten times as
            long, which bounds memory); default the lateness.
        warmup_ms: no early closing this long after the first record; default the
            lateness.
        slack_ms: records arrive after their end (agents publish about once a second):
            the clock bound is at most this much ahead of the newest record end
            received, plus the lateness ago.
    """

    def __init__(
        self,
        lateness_ms: int,
        idle_ms: int | None = None,
        warmup_ms: int | None = None,
        slack_ms: int = 2000,
    ) -> None:
        self.lateness_ms = lateness_ms
        self.slack_ms = slack_ms
        self._newest_end: int | None = None  # the newest record end received
        self._first_end: int | None = None  # the first record end received
        self._newest_at = -_FAR  # wall clock when records last arrived
        self.idle_ms = lateness_ms if idle_ms is None else idle_ms
        self.warmup_ms = lateness_ms if warmup_ms is None else warmup_ms
        self._keys: dict[tuple[str, str, Hashable], int] = {}  # -> first of 3 slots
        self._tables: dict[tuple[str, str, int], tuple[object, npt.NDArray[np.int64]]] = {}
        self._agents: dict[str, int] = {}
        self._offline = np.zeros(16, dtype=np.bool_)
        self._end = np.full(0, -_FAR, dtype=np.int64)
        self._seen = np.full(0, -_FAR, dtype=np.int64)
        self._agent = np.zeros(0, dtype=np.int64)
        self._stream = np.zeros(0, dtype=np.int64)  # per slot: index into _streams
        self._streams: list[tuple[str, str]] = []  # (agent, stream) of each stream index
        self._stream_ids: dict[tuple[str, str], int] = {}
        self._restored: dict[int, int] = {}  # stream index -> its restored part's slot
        self._waiting: dict[int, int] = {}  # agent id -> wall ms it is waited for until
        self._unstarted = False  # some wait has not started (_FAR: no record since)
        self._used = 0
        self._mark: int | None = None
        self._first_ms: int | None = None
        self._hold_at: int | None = None
        self._hold_until: int | None = None
        # Recent spans (wall ms) with no broker connection, newest last; the open one ends
        # at _FAR. A host's silence during them is ours, not the host's (silent()).
        self._outages: list[tuple[int, int]] = []
        self._forgot_ms = -_FAR
        self.reason = ""  # which bound set the mark last (for the debug log)

    # -- parts ---------------------------------------------------------------------------

    def _agent_id(self, agent: str) -> int:
        aid = self._agents.get(agent)
        if aid is None:
            aid = self._agents[agent] = len(self._agents)
            if aid >= len(self._offline):
                self._offline = np.concatenate([self._offline, np.zeros_like(self._offline)])
        return aid

    def _slot(self, agent: str, stream: str, key: Hashable) -> int:
        """The first of the slots (read, write, trim, mixed) of a part key."""
        slot = self._keys.get((agent, stream, key))
        if slot is None:
            if self._used + DIRECTIONS > len(self._end):
                grow = max(3 * 1024, len(self._end))
                self._end = np.concatenate([self._end, np.full(grow, -_FAR, dtype=np.int64)])
                self._seen = np.concatenate([self._seen, np.full(grow, -_FAR, dtype=np.int64)])
                self._agent = np.concatenate([self._agent, np.zeros(grow, dtype=np.int64)])
                self._stream = np.concatenate([self._stream, np.zeros(grow, dtype=np.int64)])
            slot = self._used
            self._used += DIRECTIONS
            self._agent[slot : slot + DIRECTIONS] = self._agent_id(agent)
            sid = self._stream_ids.get((agent, stream))
            if sid is None:
                sid = self._stream_ids[(agent, stream)] = len(self._streams)
                self._streams.append((agent, stream))
            self._stream[slot : slot + DIRECTIONS] = sid
            self._keys[(agent, stream, key)] = slot
        return slot

    def slots(self, agent: str, stream: str, labels: Sequence[Hashable]) -> npt.NDArray[np.int64]:
        """The first slot of each job label of a stream; a record's part is ``slot + direction``.

        Cached per label table (the decoder hands out the same table object every time an
        agent sends the same labels), so a known stream costs one dictionary lookup.
        """
        key = (agent, stream, id(labels))
        hit = self._tables.get(key)
        if hit is not None and hit[0] is labels:
            return hit[1]
        arr = np.fromiter(
            (self._slot(agent, stream, lab) for lab in labels), dtype=np.int64, count=len(labels)
        )
        self._tables[key] = (labels, arr)  # keeps ``labels`` alive, so its id stays unique
        return arr

    def observe_parts(
        self, parts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], now_ms: int
    ) -> None:
        """Records of ``parts`` (slots from :meth:`slots` plus direction) ended at ``ends``."""
        if self._first_ms is None:
            self._first_ms = now_ms
        if not len(parts):
            return
        if self._newest_at > -_FAR and now_ms - self._newest_at >= 2 * self.lateness_ms:
            # The first records after an idle input (2 x lateness, as the core's idle): a
            # new run, whose hosts start at different times just as the first run's did,
            # so early closing waits for the warm-up again.
            self._first_ms = now_ms
            self._first_end = None
        top = int(ends.max())
        if self._newest_end is None or top > self._newest_end:
            self._newest_end = top
        if self._first_end is None:
            self._first_end = int(ends.min())
        self._newest_at = now_ms
        np.maximum.at(self._end, parts, ends)
        self._seen[parts] = now_ms
        if self._offline.any():
            self._offline[np.unique(self._agent[parts])] = False
        if self._waiting:
            for aid in np.unique(self._agent[parts]).tolist():
                self._waiting.pop(aid, None)
            if self._unstarted:
                # The input runs: announced agents' first records are due within lateness.
                self._unstarted = False
                for aid, until in self._waiting.items():
                    if until == _FAR:
                        self._waiting[aid] = now_ms + self.lateness_ms
        if self._restored:
            # A stream that sends again speaks for itself: its saved progress goes.
            for sid in np.unique(self._stream[parts]).tolist():
                slot = self._restored.pop(sid, None)
                if slot is not None:
                    self._end[slot] = self._seen[slot] = -_FAR

    def observe(
        self,
        agent: str,
        stream: str,
        end_ms: int,
        now_ms: int,
        parts: dict[object, int] | None = None,
    ) -> None:
        """A stream's records reached ``end_ms`` (received at ``now_ms``).

        Args:
            agent: the agent.
            stream: its stream id.
            end_ms: the latest record end in what arrived.
            now_ms: the wall clock.
            parts: the latest end per part (job, direction) in what arrived; without it
                the stream is one part.
        """
        items = list((parts or {None: end_ms}).items())
        slots = np.array([self._slot(agent, stream, k) for k, _ in items], dtype=np.int64)
        self.observe_parts(slots, np.array([e for _, e in items], dtype=np.int64), now_ms)

    def set_online(self, agent: str, online: bool) -> None:
        """The agent's status topic said online or offline."""
        aid = self._agent_id(agent)
        self._offline[aid] = not online
        if not online:
            self._waiting.pop(aid, None)

    def announced(self, agent: str) -> None:
        """The agent announced itself online and may not have sent its first records yet.

        No quantum closes early until its first record arrives, it goes offline, or
        ``lateness`` passes after the next record received from anyone (the input's
        start); the clock bound is unchanged.
        """
        self._waiting[self._agent_id(agent)] = _FAR
        self._unstarted = True

    def waiting(self, now_ms: int) -> int:
        """Announced agents whose first record is still awaited (see :meth:`announced`)."""
        for aid in [a for a, until in self._waiting.items() if until <= now_ms]:
            del self._waiting[aid]
        return len(self._waiting)

    # -- a restart -------------------------------------------------------------------------

    def known(self) -> KnownStreams | None:
        """The progress of every stream live in event time, to save with the grid state.

        A stream's progress is the smallest latest end over its parts within ``idle_ms``
        of the newest record end (what holds quanta open); parts of agents marked offline
        are left out. None before any record.
        """
        newest = self._newest_end
        if newest is None:
            return None
        n = self._used
        end = self._end[:n]
        ok = end >= newest - self.idle_ms
        if self._offline.any():
            ok &= ~self._offline[self._agent[:n]]
        if not ok.any():
            return KnownStreams(newest, ())
        sids = self._stream[:n][ok]
        ends = end[ok]
        order = np.lexsort((ends, sids))  # by stream, smallest end first
        sids, ends = sids[order], ends[order]
        first = np.flatnonzero(np.r_[True, sids[1:] != sids[:-1]])
        streams = self._streams
        return KnownStreams(
            newest,
            tuple(
                (*streams[sid], e)
                for sid, e in zip(sids[first].tolist(), ends[first].tolist(), strict=True)
            ),
        )

    def restore_known(self, known: KnownStreams) -> None:
        """Take the streams a previous run saved (:meth:`known`), before any record.

        Each comes back as one part at its saved end, live in event time only (never seen
        on this run's clock): it holds quanta open as it did before the stop, until its
        stream sends again (then its own parts take over) or turns idle in event time.
        """
        if self._newest_end is None or known.newest_end_ms > self._newest_end:
            self._newest_end = known.newest_end_ms
        for agent, stream, end in known.streams:
            slot = self._slot(agent, stream, _RESTORED)
            self._end[slot] = max(int(self._end[slot]), end)
            self._restored[int(self._stream[slot])] = slot

    def _live(self, now_ms: int) -> npt.NDArray[np.bool_]:
        n = self._used
        live: npt.NDArray[np.bool_] = self._seen[:n] >= now_ms - self.idle_ms
        if self._newest_end is not None:
            # Event time: close to the newest record end received is live, however long
            # ago our own intake last met the part (a restart, a stall, a lag).
            live |= self._end[:n] >= self._newest_end - self.idle_ms
        if self._offline.any():
            live &= ~self._offline[self._agent[:n]]
        return live

    # -- completeness ----------------------------------------------------------------------

    def silent(self, quanta: Sequence[tuple[int, int]]) -> list[tuple[str, ...]]:
        """Per quantum ``(start_ms, end_ms)`` closing now: the hosts expected in it but silent.

        What the aggregator can know of a host is what it sent. A host (agent) is
        *expected* in a quantum when it reported within ``idle_ms`` before the quantum's
        start (in event time: its latest record end over all its streams and parts) and
        its agent is not marked offline; it is *silent* there when its latest record end
        is at or before the quantum's start (it sent nothing for the quantum) while the
        input went on past the quantum's end (some record ends at or after it). So:

        * a host that never sent a record is not known, hence never expected;
        * a host whose agent said offline (a clean stop, or the broker's Will for it)
          is not expected from then on;
        * a host silent for ``idle_ms`` or longer is taken as gone: the quanta after
          that hold the other hosts and are complete (as the watermark stops waiting
          for it after ``idle_ms``); time the aggregator itself was cut from the broker
          does not count as the host's silence (its records may come after the outage);
        * the quantum in which a host's records stop holds part of it and is not marked
          (a fio job that ends mid-quantum looks the same); the records that come later
          for it are counted late;
        * when every host stops (the end of a run, or the input as a whole) nothing
          went on past the quantum and nothing is marked.

        Pure, like the rest: it reads the progress observed so far.
        """
        out: list[tuple[str, ...]] = [() for _ in quanta]
        newest = self._newest_end
        n = self._used
        if newest is None or not n or not quanta:
            return out
        naid = len(self._agents)
        progress = np.full(naid, -_FAR, dtype=np.int64)
        np.maximum.at(progress, self._agent[:n], self._end[:n])
        ok = progress > -_FAR
        ok &= ~self._offline[:naid]
        if not ok.any():
            return out
        aids = np.flatnonzero(ok)
        prog = progress[aids]
        order = np.argsort(prog, kind="stable")
        aids, prog = aids[order], prog[order]
        names: list[str] | None = None
        for i, (start, end) in enumerate(quanta):
            if newest < end:
                continue
            lo = int(np.searchsorted(prog, start - self.idle_ms, side="right"))
            hi = int(np.searchsorted(prog, start, side="right"))
            if self._outages:
                # Time we were cut from the broker is not the hosts' silence: a host last
                # heard before an outage is expected until idle_ms of connected time.
                older = prog[:lo]
                cut = self._outage_within(older, start)
                lo = int(np.count_nonzero(start - older - cut > self.idle_ms))
                # (older is sorted; those within the widened window are its tail)
            if lo == hi:
                continue
            if names is None:
                names = [""] * naid
                for name, aid in self._agents.items():
                    names[aid] = name
            out[i] = tuple(sorted(names[a] for a in aids[lo:hi].tolist()))
        return out

    # -- the wall clock -------------------------------------------------------------------

    def stalled(self, ms: int) -> None:
        """Our process did not read its input for ``ms`` (it was busy, starved or paused).

        That time is not input silence: the wall-clock bound and the parts' last-seen times
        are moved on by it, as if the pause had not happened, so records that waited for
        us meanwhile find their quanta still open.
        """
        if ms <= 0:
            return
        if self._newest_at > -_FAR:
            self._newest_at += ms
        seen = self._seen[: self._used]
        seen[seen > -_FAR] += ms
        if self._hold_until is not None:
            self._hold_until += ms
        for aid, until in self._waiting.items():
            if until != _FAR:
                self._waiting[aid] = until + ms

    def hold(self, at_ms: int) -> None:
        """Hold the clock bound at ``at_ms`` (at most) until :meth:`connected` + lateness.

        Called when input stops for a reason of our own (the broker connection dropped,
        the process starts): records for quanta ending after ``at_ms`` may be queued in
        the broker, so only the streams' own progress may close those quanta.
        """
        self._hold_at = at_ms if self._hold_at is None else min(self._hold_at, at_ms)
        self._hold_until = None

    def disconnected(self, now_ms: int) -> None:
        """The broker connection dropped: the clock bound stops where it is."""
        self.hold(now_ms - self.lateness_ms)
        if not self._outages or self._outages[-1][1] != _FAR:
            self._outages = [*self._outages[-(MAX_OUTAGES - 1) :], (now_ms, _FAR)]

    def connected(self, now_ms: int) -> None:
        """Connected (again): the clock bound resumes ``lateness`` from now."""
        if self._hold_at is not None:
            self._hold_until = now_ms + self.lateness_ms
        if self._outages and self._outages[-1][1] == _FAR:
            self._outages[-1] = (self._outages[-1][0], now_ms)

    def _outage_within(self, since: npt.NDArray[np.int64], until: int) -> npt.NDArray[np.int64]:
        """Per value of ``since``, ms cut from the broker within ``(since, until]``."""
        out = np.zeros(len(since), dtype=np.int64)
        for lo, hi in self._outages:
            out += np.clip(np.minimum(hi, until) - np.maximum(lo, since), 0, None)
        return out

    def close_through(self, now_ms: int) -> int:
        """Quanta ending at or before the returned time (ms) may close now."""
        target = now_ms - self.lateness_ms
        reason = "clock"
        if self._newest_end is not None and now_ms - self._newest_at < self.lateness_ms:
            # Records keep coming: the clock counts from the newest of them (intake lag).
            lag = self._newest_end + self.slack_ms - self.lateness_ms
            if lag < target:
                target, reason = lag, "intake"
        if self._hold_at is not None:
            if self._hold_until is not None and now_ms >= self._hold_until:
                self._hold_at = self._hold_until = None
            elif self._hold_at < target:
                target, reason = self._hold_at, "hold"
        # Warm once warmup_ms passed on the clock *and* the records received span a
        # publishing round (agents publish every second, in order): an intake that lags
        # has not met every stream yet when the clock says so.
        warm = (
            self._first_ms is not None
            and now_ms - self._first_ms >= self.warmup_ms
            and self._newest_end is not None
            and self._first_end is not None
            and self._newest_end - self._first_end >= min(self.warmup_ms, 1000)
        )
        if warm and self._waiting and self.waiting(now_ms):
            # An agent announced itself and its first records are on the way: closing
            # early on the others would leave it out (bounded: see announced()).
            warm = False
            if reason == "clock":
                reason = f"clock (waiting for {len(self._waiting)} announced agents)"
        if warm and self._used:
            live = self._live(now_ms)
            if live.any():
                early = int(self._end[: self._used][live].min())
                if early > target:
                    target, reason = early, f"early ({int(live.sum())} live parts)"
        if self._mark is None or target > self._mark:
            self._mark = target
            self.reason = reason
        if now_ms - self._forgot_ms >= max(self.idle_ms, 1000):
            self._forget(now_ms)
        return self._mark

    def _forget(self, now_ms: int) -> None:
        """Drop parts silent for ten idle periods, on the wall clock and in event time."""
        self._forgot_ms = now_ms
        n = self._used
        if not n:
            return
        span = 10 * max(self.idle_ms, 1000)
        keep = self._seen[:n] >= now_ms - span
        if self._newest_end is not None:  # not while our own intake is behind
            keep |= self._end[:n] >= self._newest_end - span
        keep3 = keep.reshape(-1, DIRECTIONS).any(axis=1)
        if keep3.all():
            return
        old_first = np.flatnonzero(keep3) * DIRECTIONS
        sel = (old_first[:, None] + np.arange(DIRECTIONS)).ravel()
        self._end = self._end[sel].copy()
        self._seen = self._seen[sel].copy()
        self._agent = self._agent[sel].copy()
        self._stream = self._stream[sel].copy()
        self._used = len(sel)
        new_of_old = {int(o): i * DIRECTIONS for i, o in enumerate(old_first.tolist())}
        self._keys = {k: new_of_old[s] for k, s in self._keys.items() if s in new_of_old}
        # Streams with no part left are forgotten too (a long-running aggregator sees a
        # new stream id per fio run): number the remaining ones afresh.
        kept_sids, self._stream = np.unique(self._stream, return_inverse=True)
        new_sid = {int(o): i for i, o in enumerate(kept_sids.tolist())}
        self._streams = [self._streams[o] for o in kept_sids.tolist()]
        self._stream_ids = {k: i for i, k in enumerate(self._streams)}
        self._restored = {
            new_sid[sid]: new_of_old[s]
            for sid, s in self._restored.items()
            if s in new_of_old and sid in new_sid
        }
        self._tables.clear()
