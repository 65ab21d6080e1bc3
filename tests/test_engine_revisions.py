"""Revisions in the quantum engine: late records within the horizon revise closed quanta.

The reference is the same engine fed every record in time: the latest revision of every
row must equal its row, and a cell's partials (first close plus revision deltas) must add
up to its groups.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from fiomon.closed import ClosedQuantum
from fiomon.engine import QuantumEngine
from fiomon.model import RecordBatch
from fiomon.partials import RawPartial
from tests.batches import LAY, batch

Q = 1000


def _records(rng: random.Random, hosts: int, streams: int, seconds: int) -> list[RecordBatch]:
    out = []
    for h in range(hosts):
        for s in range(streams):
            recs = []
            t = rng.randrange(0, 700)
            while t < seconds * Q:
                dur = rng.choice([0, 300, 1000, 1700])
                bins = {rng.randrange(300, 700): rng.randrange(1, 50) for _ in range(5)}
                recs.append((t, t + dur, rng.choice([0, 0, 1, 2]), bins))
                t += max(dur, 1) + rng.randrange(0, 400)
            out.append(batch(recs, host=f"h{h}", stream=f"s{s}"))
    return out


def _engine(revise_within_ms: int = 0) -> QuantumEngine:
    return QuantumEngine(
        layout=LAY,
        quantum_ms=Q,
        per_host=True,
        keep_hists=True,
        keep_partials=True,
        revise_within_ms=revise_within_ms,
    )


Key = tuple[int, str, str | None, str]


def _latest(rows: list[ClosedQuantum]) -> dict[Key, ClosedQuantum]:
    out: dict[Key, ClosedQuantum] = {}
    for r in rows:
        if r.key not in out or r.revision >= out[r.key].revision:
            out[r.key] = r
    return out


def _same(a: ClosedQuantum, b: ClosedQuantum) -> None:
    assert a.stats.samples == pytest.approx(b.stats.samples, rel=1e-12)
    assert a.stats.percentiles_ns == pytest.approx(b.stats.percentiles_ns, rel=1e-9)
    assert (a.iops is None) == (b.iops is None)
    if a.iops is not None:
        assert a.iops == pytest.approx(b.iops, rel=1e-9)
        assert a.bytes_per_second == pytest.approx(b.bytes_per_second, rel=1e-9)
    assert a.streams == b.streams, (a.key, a.streams, b.streams)
    assert a.ci_ns == b.ci_ns


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_latest_revisions_equal_an_engine_fed_everything_in_time(seed: int) -> None:
    rng = random.Random(seed)
    batches = _records(rng, hosts=4, streams=3, seconds=12)
    ref = _engine()
    for b in batches:
        ref.add(b)
    want = {r.key: r for r in ref.flush()}

    eng = _engine(revise_within_ms=60_000)
    late_hosts = {"h1", "h3"}
    rows: list[ClosedQuantum] = []
    on_time = [b for b in batches if b.streams[0].host not in late_hosts]
    late = [b for b in batches if b.streams[0].host in late_hosts]
    for b in on_time:
        eng.add(b)
    rows += eng.close_through(8 * Q, now_ms=99)
    # The late hosts' records come after quanta 1..8 closed; some reach open quanta too.
    for b in late:
        eng.add(b)
    rows += eng.close_through(9 * Q, now_ms=100)
    rows += eng.flush()
    got = _latest(rows)
    assert set(got) == set(want)
    for k, r in want.items():
        _same(got[k], r)
    revised = [r for r in rows if r.revised_at is not None]
    assert revised, "the late hosts' records must revise the closed quanta"
    assert all(r.revised_at == 100 for r in revised)
    assert eng.late_records == {}  # merged, not lost
    assert sum(eng.revised_records.values()) > 0
    # No key published twice at one revision; revisions count up from 0.
    seen = [(r.key, r.revision) for r in rows]
    assert len(seen) == len(set(seen))
    # Late counts on revised rows: the cluster's is the hosts' sum.
    for r in revised:
        if r.scope == "cluster" and r.direction == "all":
            hosts = [
                x
                for x in revised
                if x.end_ms == r.end_ms and x.scope == "host" and x.direction == "all"
            ]
            assert r.late_records == sum(x.late_records for x in hosts)

    # The partials (first close + revision deltas) add up to the reference's groups.
    def summed(parts: list[RawPartial]) -> dict[Key, list[Any]]:
        acc: dict[Key, list[Any]] = {}
        for p in parts:
            k = (p.end_ms, p.scope, p.host, p.direction)
            if k not in acc:
                acc[k] = [np.zeros_like(p.hist), 2**62, -(2**62), 0.0, 0]
            a = acc[k]
            a[0] = a[0] + p.hist
            a[1], a[2] = min(a[1], p.lo_ms), max(a[2], p.hi_ms)
            a[3] += p.nbytes
            a[4] += p.streams
        return acc

    ref_parts, got_parts = summed(ref.partials), summed(eng.partials)
    for k, (h, lo, hi, nb, st) in ref_parts.items():
        g = got_parts[k]
        np.testing.assert_allclose(g[0], h, rtol=1e-12)
        assert (g[1], g[2], g[4]) == (lo, hi, st), k
        assert g[3] == pytest.approx(nb, rel=1e-12)
    assert {p.revision for p in eng.partials} - {0}, "revision partials carry their number"


def test_records_past_the_horizon_are_late_and_not_merged() -> None:
    eng = _engine(revise_within_ms=3 * Q)
    eng.add(batch([(0, 1000, 0, {400: 5})], host="a"))
    eng.add(batch([(9000, 10000, 0, {400: 5})], host="a"))
    first = eng.close_through(10 * Q)
    assert {r.end_ms for r in first} == {1000, 10000}
    eng.add(batch([(100, 900, 0, {400: 7})], host="b"))  # quantum 1: beyond 3 s
    eng.add(batch([(9100, 9900, 0, {400: 7})], host="b"))  # quantum 10: within
    rows = eng.close_through(10 * Q, now_ms=5)
    assert eng.late_records == {"b": 1}
    assert eng.revised_records == {"b": 1}
    assert {r.end_ms for r in rows} == {10000}
    cl = next(r for r in rows if r.scope == "cluster" and r.direction == "read")
    assert (cl.stats.samples, cl.revision, cl.late_records) == (12, 1, 1)
    hb = next(r for r in rows if r.host == "b" and r.direction == "read")
    assert (hb.revision, hb.revised_at) == (0, 5)  # first published by the late records
    assert eng.kept_quanta >= 1


def test_without_a_horizon_late_records_are_dropped_as_before() -> None:
    eng = _engine()
    eng.add(batch([(0, 1000, 0, {400: 5})], host="a"))
    eng.close_through(Q)
    eng.add(batch([(100, 900, 0, {400: 7})], host="b"))
    assert eng.close_through(2 * Q) == []
    assert eng.late_records == {"b": 1}
    assert eng.kept_quanta == 0


def test_absorb_reforms_the_kept_state_without_publishing() -> None:
    """A restart: replayed records of closed quanta are no revision; later ones are."""
    eng = _engine(revise_within_ms=60_000)
    eng.close_through(5 * Q)  # the previous run published through 5 s
    eng.add(batch([(1000, 2000, 0, {400: 5})], host="a"))  # replayed from the journal
    eng.absorb()
    eng.note_published(2000, None, "read", 0)
    eng.note_published(2000, None, "all", 1)
    assert eng.close_through(5 * Q) == []
    eng.add(batch([(1100, 1900, 0, {400: 7})], host="b"))
    rows = eng.close_through(6 * Q)
    cl = {r.direction: r for r in rows if r.scope == "cluster"}
    assert cl["read"].stats.samples == 12
    assert (cl["read"].revision, cl["all"].revision) == (1, 2)
