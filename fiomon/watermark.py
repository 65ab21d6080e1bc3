"""When quanta may close: event-time progress of live streams, bounded by the wall clock.

DESIGN.md: a quantum closes early when every *live* stream has reported past its end,
and at the latest ``lateness`` after its end on the wall clock. A stream is live while
its agent is not marked offline (its status topic) and it has reported within
``idle_ms``; a silent or offline stream therefore never holds quanta open beyond the
lateness. Records of one stream arrive in order (one MQTT client, QoS 1), so a stream
whose records reached time ``t`` has nothing more to say about quanta ending by ``t``.

Early closing starts ``warmup_ms`` after the first record: until then the set of
streams is not known (agents start, and reconnect after an aggregator restart, at
different times), and closing on the first few would make every other host's records
late. Agents publish every second, so a couple of seconds suffice.

The watermark never moves back. Pure: the caller passes ``now_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Progress:
    agent: str
    end_ms: int  # how far every part of the stream has reported (min over its parts)
    seen_ms: int  # wall clock when it last reported
    parts: dict[object, tuple[int, int]]  # part -> (latest end, seen)


class Watermark:
    """Tracks stream progress and says up to which time quanta may close.

    A stream (one followed file) has *parts*, one per fio job and direction: a hist log's
    read and write records carry stamps a few ms apart, and the next record of a part
    starts where its previous one ended. So a stream has reported up to the smallest
    latest end over its parts that reported within ``idle_ms``.

    Args:
        lateness_ms: the latest a quantum closes, after its end.
        idle_ms: a stream or part silent this long stops holding quanta open (a stream is
            forgotten after ten times as long, which bounds memory); default the lateness.
        warmup_ms: no early closing this long after the first record; default the
            lateness.
    """

    def __init__(
        self, lateness_ms: int, idle_ms: int | None = None, warmup_ms: int | None = None
    ) -> None:
        self.lateness_ms = lateness_ms
        self.idle_ms = lateness_ms if idle_ms is None else idle_ms
        self.warmup_ms = lateness_ms if warmup_ms is None else warmup_ms
        self._streams: dict[tuple[str, str], _Progress] = {}
        self._offline: set[str] = set()
        self._mark: int | None = None
        self._first_ms: int | None = None

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
        if self._first_ms is None:
            self._first_ms = now_ms
        p = self._streams.get((agent, stream))
        if p is None:
            p = self._streams[(agent, stream)] = _Progress(agent, end_ms, now_ms, {})
        for part, end in (parts or {None: end_ms}).items():
            prev = p.parts.get(part)
            p.parts[part] = (end if prev is None else max(prev[0], end), now_ms)
        fresh = [e for e, seen in p.parts.values() if now_ms - seen <= self.idle_ms]
        stale = [k for k, (_, seen) in p.parts.items() if now_ms - seen > 10 * self.idle_ms]
        for k in stale:
            del p.parts[k]
        p.end_ms = min(fresh) if fresh else end_ms
        p.seen_ms = now_ms
        self._offline.discard(agent)

    def set_online(self, agent: str, online: bool) -> None:
        """The agent's status topic said online or offline."""
        if online:
            self._offline.discard(agent)
        else:
            self._offline.add(agent)

    def live_streams(self, now_ms: int) -> int:
        """Streams currently holding quanta open."""
        return sum(1 for p in self._streams.values() if self._live(p, now_ms))

    def _live(self, p: _Progress, now_ms: int) -> bool:
        return p.agent not in self._offline and now_ms - p.seen_ms <= self.idle_ms

    def close_through(self, now_ms: int) -> int:
        """Quanta ending at or before the returned time (ms) may close now."""
        ends = [p.end_ms for p in self._streams.values() if self._live(p, now_ms)]
        target = now_ms - self.lateness_ms
        warm = self._first_ms is not None and now_ms - self._first_ms >= self.warmup_ms
        if ends and warm:
            target = max(target, min(ends))
        if self._mark is None or target > self._mark:
            self._mark = target
        self._forget(now_ms)
        return self._mark

    def _forget(self, now_ms: int) -> None:
        horizon = 10 * max(self.idle_ms, 1000)
        stale = [k for k, p in self._streams.items() if now_ms - p.seen_ms > horizon]
        for k in stale:
            del self._streams[k]
