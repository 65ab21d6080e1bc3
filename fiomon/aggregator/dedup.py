"""Duplicates and gaps by ``(agent, stream, seq)``: pure, bounded, range arithmetic.

Each stream's sequence numbers are contiguous from its first record (the agent numbers
them per file generation). Per stream the tracker keeps ``next`` (every seq below was seen
or counted lost) and up to ``max_ranges`` ranges of seqs counted lost that may still come
(paho resends after a reconnect, out of order). So a message is judged in O(ranges):

* seqs at or above ``next`` are new; a jump past ``next`` counts the skipped seqs as lost;
* seqs below ``next`` are new only inside a lost range (then counted as recovered), else
  duplicates.

A stream first seen mid-way (an aggregator restart, or a broker that dropped its start)
starts at its first seq without counting a gap: what came before is unknown, not lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt


@dataclass(slots=True)
class _Stream:
    next: int
    lost: list[tuple[int, int]] = field(default_factory=list)  # [lo, hi) ranges


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a message's records are.

    Args:
        new: per record, whether it is new (to be merged).
        duplicates: records already seen.
        lost: seqs skipped by this message (counted lost now).
        recovered: records that arrive after being counted lost.
        refused: the stream is over the cap (every record refused).
    """

    new: npt.NDArray[np.bool_]
    duplicates: int = 0
    lost: int = 0
    recovered: int = 0
    refused: bool = False


class SeqTracker:
    """Judges records by ``(agent, stream, seq)``.

    Args:
        max_streams: streams tracked; a message of a further stream is refused (counted
            by the caller) rather than letting memory grow.
        max_ranges: lost ranges remembered per stream; the oldest are forgotten (their
            seqs then count as duplicates if they still come).
    """

    def __init__(self, max_streams: int = 100_000, max_ranges: int = 64) -> None:
        self.max_streams = max_streams
        self.max_ranges = max_ranges
        self._streams: dict[tuple[str, str], _Stream] = {}

    def __len__(self) -> int:
        return len(self._streams)

    def judge_new(self, agent: str, stream: str, first_seq: int, count: int) -> Verdict | None:
        """Like :meth:`judge`, but None when every record is new and nothing was skipped.

        That is almost every message (the next seqs of a known stream, or a new stream), and
        it needs no array.
        """
        st = self._streams.get((agent, stream))
        if st is None:
            if len(self._streams) < self.max_streams:
                self._streams[(agent, stream)] = _Stream(first_seq + count)
                return None
        elif first_seq == st.next:
            st.next = first_seq + count
            return None
        return self.judge(agent, stream, first_seq, count)

    def judge(self, agent: str, stream: str, first_seq: int, count: int) -> Verdict:
        """Judge seqs ``first_seq .. first_seq + count - 1`` and remember them."""
        key = (agent, stream)
        st = self._streams.get(key)
        if st is None:
            if len(self._streams) >= self.max_streams:
                return Verdict(np.zeros(count, dtype=np.bool_), refused=True)
            st = self._streams[key] = _Stream(first_seq)
        lo, hi = first_seq, first_seq + count
        new = np.zeros(count, dtype=np.bool_)
        lost = recovered = 0
        # Below next: only seqs inside lost ranges are new.
        if lo < st.next:
            kept: list[tuple[int, int]] = []
            for a, b in st.lost:
                x, y = max(a, lo), min(b, hi, st.next)
                if x < y:
                    new[x - lo : y - lo] = True
                    recovered += y - x
                    if a < x:
                        kept.append((a, x))
                    if y < b:
                        kept.append((y, b))
                else:
                    kept.append((a, b))
            st.lost = kept
        # At or above next: new; a jump counts the gap as lost.
        if hi > st.next:
            start = max(lo, st.next)
            if start > st.next:
                lost = start - st.next
                st.lost.append((st.next, start))
                if len(st.lost) > self.max_ranges:
                    del st.lost[: len(st.lost) - self.max_ranges]
            new[start - lo :] = True
            st.next = hi
        duplicates = count - int(new.sum())
        return Verdict(new, duplicates=duplicates, lost=lost, recovered=recovered)
