"""Which hosts hold a cluster's tail: each host's share of the I/Os above a cluster percentile.

At every closed quantum, for each direction and percentile an SLA rule watches, the
cluster row's percentile value ``v`` lies in one of fio's bins, ``b`` (the first bin whose
upper edge is at or above ``v``). A host's *tail count* is its I/Os in bin ``b`` and above,
from its host row's histogram; its *share* is that count over the sum of every host's
(the cluster's I/Os in those bins). The bin holding ``v`` counts whole: fio's bins are
1.6 % wide (3.1 % at coarseness 1, and so on), so a host's share is of the I/Os within
that much below the percentile and above, which is where a slow host's I/Os are.

Cost per close: for each watched direction, one stack of the host rows' bins from the
lowest watched percentile's bin up, one row sum and one ``argpartition`` per
percentile: vectorised, and only for the (direction, percentile) pairs of the configured
SLA rules (about 3.5 ms a quantum for 1000 hosts and one p99 rule on this project's 2-core
test machine); the aggregator attaches histograms only to host rows of the rules'
directions.

Only the ``k`` largest shares are kept (:data:`TOP_K`): the exported gauge
``fiomon_tail_share{direction,percentile,host}`` then has at most ``k`` series per SLA'd
direction and percentile whatever the number of hosts, instead of one per host, and an
alert names the few hosts worth a look.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.histogram import bin_of

TOP_K = 5


@dataclass(frozen=True, slots=True)
class TailShare:
    """The hosts holding one quantum's tail above one cluster percentile.

    Args:
        end_ms: the quantum's end (epoch ms).
        direction: the rows' direction label.
        percentile: the percentile key (``"99"``, ``"99.9"``).
        value_ns: the cluster percentile.
        above: every host's I/Os at or above the percentile's bin.
        top: ``(host, I/Os at or above)`` of the hosts with the most, largest first, at
            most ``k`` of them, none with 0.
    """

    end_ms: int
    direction: str
    percentile: str
    value_ns: float
    above: float
    top: tuple[tuple[str, float], ...]

    def shares(self) -> tuple[tuple[str, float], ...]:
        """``(host, share)`` of the top hosts, shares in 0..1."""
        return tuple((h, n / self.above) for h, n in self.top)


def tail_shares(
    rows: Sequence[ClosedQuantum],
    layout: BinLayout,
    wanted: Iterable[tuple[str, str]],
    k: int = TOP_K,
) -> list[TailShare]:
    """The tail shares of every quantum in ``rows`` for the ``(direction, percentile)`` wanted.

    Only first publications are read (revisions leave the shares of their quanta as
    published), and only host rows that carry their histogram (``hist``). A quantum with
    no such host rows, or no I/O at or above the percentile's bin, gives nothing.
    """
    want: dict[str, set[str]] = defaultdict(set)
    for d, p in wanted:
        want[d].add(p)
    if not want:
        return []
    upper = layout.edges_ns()[1]
    cluster: dict[tuple[int, str], ClosedQuantum] = {}
    hosts: dict[tuple[int, str], list[ClosedQuantum]] = defaultdict(list)
    for r in rows:
        if r.revised_at is not None or r.direction not in want:
            continue
        if r.scope == "cluster":
            cluster[(r.end_ms, r.direction)] = r
        elif r.host is not None and r.hist is not None:
            hosts[(r.end_ms, r.direction)].append(r)
    out: list[TailShare] = []
    for (end, d), c in sorted(cluster.items()):
        hs = hosts.get((end, d))
        if not hs:
            continue
        found = [
            (p, v) for p in sorted(want[d]) if (v := c.stats.percentiles_ns.get(p)) is not None
        ]
        if not found:
            continue
        bins = bin_of(upper, [v for _, v in found])
        lo = int(bins.min())
        tail = np.stack([h.hist[lo:] for h in hs if h.hist is not None])
        for (p, v), b in zip(found, bins.tolist(), strict=True):
            col = tail[:, b - lo :].sum(axis=1)  # each host's I/Os at or above bin b
            total = float(col.sum())
            if total <= 0:
                continue
            n = min(k, len(hs))
            idx = np.argpartition(-col, n - 1)[:n]
            idx = idx[np.argsort(-col[idx], kind="stable")]
            top = tuple((str(hs[i].host), float(col[i])) for i in idx.tolist() if col[i] > 0)
            out.append(TailShare(end, d, p, v, total, top))
    return out


def shares_text(shares: Sequence[tuple[str, float]]) -> str:
    """``host 92%, host 5%`` (the alerts' ``worst_hosts``); ``none`` when empty."""
    if not shares:
        return "none"
    return ", ".join(f"{h} {s * 100:.0f}%" for h, s in shares)
