"""Revised quanta on the live page: the feed and store put them in place, the page redraws.

Before revisions, a second batch for a quantum already in the feed's tail replaced all of
that quantum's rows with the batch's (the other hosts' and directions' rows vanished), and
one for a quantum the page had already fetched was never fetched again.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from fiomon.closed import ClosedQuantum
from fiomon.histogram import HistStats
from fiomon.server.exporter import Snapshot
from fiomon.server.live import LiveFeed, LiveStore, status_of
from fiomon.server.metrics_server import MetricsProcess, revised_of
from tests.browser import Browser

T0 = 1_795_000_000_000
QUANTUM_MS = 1000
REVISED_AT = T0 + 60_000


def _row(end: int, host: str | None, direction: str, p99: float = 2e6) -> ClosedQuantum:
    stats = HistStats(100.0, 1e5, 5e5, 3e6, {"50": 4e5, "99": p99}, ())
    return ClosedQuantum(
        start_ms=end - QUANTUM_MS,
        end_ms=end,
        scope="cluster" if host is None else "host",
        host=host,
        direction=direction,
        stats=stats,
        iops=100.0,
        bytes_per_second=4e5,
        streams=1 if host else 2,
        late_records=0,
    )


def _quantum(end: int) -> list[ClosedQuantum]:
    return [_row(end, h, d) for h in (None, "h1", "h2") for d in ("read", "write")]


def _revision(r: ClosedQuantum, revision: int, p99: float) -> ClosedQuantum:
    stats = replace(r.stats, percentiles_ns={**r.stats.percentiles_ns, "99": p99})
    return replace(
        r, stats=stats, revision=revision, revised_at=REVISED_AT + revision, late_records=7
    )


def _feed() -> LiveFeed:
    return LiveFeed([50.0, 99.0], [], QUANTUM_MS)


def _status() -> dict[str, Any]:
    return status_of(now_ms=T0, hosts_up=2, received=0, late=0, lost=0, rules=[], alerts=[])


def _rows(body: bytes) -> dict[tuple[int, str, str | None, str], dict[str, Any]]:
    """The answer's rows by key; each key must come once."""
    out: dict[tuple[int, str, str | None, str], dict[str, Any]] = {}
    for r in json.loads(body)["quanta"]:
        key = (r["end_ms"], r["scope"], r["host"], r["direction"])
        assert key not in out, f"{key} twice"
        out[key] = r
    return out


def test_a_revision_replaces_its_keys_rows_and_keeps_the_quantums_others() -> None:
    feed, store = _feed(), LiveStore()
    ends = [T0 + i * QUANTUM_MS for i in range(1, 4)]
    for e in ends:
        feed.add(_quantum(e), None)
    first = feed.view(_status())
    store.merge(first)
    cluster_read, h1_read = _quantum(ends[0])[0], _quantum(ends[0])[2]
    feed.add([_revision(cluster_read, 1, 9e6), _revision(h1_read, 1, 8e6)], None)
    second = feed.view(_status())
    store.merge(second)
    store.merge(first)  # an older view again (the tail repeats): the revision stays
    store.merge(second)
    rows = _rows(store.body(0))
    assert len(rows) == 3 * 6
    got = rows[cluster_read.key]
    assert (got["revision"], got["revised_at"], got["late_records"]) == (1, REVISED_AT + 1, 7)
    assert got["percentiles_ns"]["99"] == 9e6
    got = rows[h1_read.key]
    assert (got["revision"], got["revised_at"], got["percentiles_ns"]["99"]) == (
        1,
        60_001 + T0,
        8e6,
    )
    others = [r for k, r in rows.items() if k not in (cluster_read.key, h1_read.key)]
    assert all(r["revision"] == 0 and "revised_at" not in r for r in others)
    assert json.loads(store.body(0))["revised"] == 1


def test_the_highest_revision_wins_and_a_lower_one_never_replaces_it() -> None:
    feed, store = _feed(), LiveStore()
    end = T0 + QUANTUM_MS
    feed.add(_quantum(end), None)
    base = _quantum(end)[0]
    feed.add([_revision(base, 2, 7e6)], None)
    feed.add([_revision(base, 1, 5e6)], None)  # a stale one, after
    store.merge(feed.view(_status()))
    assert _rows(store.body(0))[base.key]["percentiles_ns"]["99"] == 7e6
    feed.add([_revision(base, 2, 6e6)], None)  # equal revision, later: it wins
    store.merge(feed.view(_status()))
    assert _rows(store.body(0))[base.key]["percentiles_ns"]["99"] == 6e6


def test_revised_answers_old_quanta_revised_since_an_earlier_answer() -> None:
    feed, store = _feed(), LiveStore()
    ends = [T0 + i * QUANTUM_MS for i in range(1, 5)]
    for e in ends:
        feed.add(_quantum(e), None)
    store.merge(feed.view(_status()))
    before = json.loads(store.body(ends[-1], revised=None))
    assert before["quanta"] == []
    n = before["revised"]
    late = _row(ends[1], "h3", "read")  # a key first published by late records
    feed.add([_revision(_quantum(ends[1])[0], 1, 9e6), replace(late, revised_at=REVISED_AT)], None)
    store.merge(feed.view(_status()))
    got = _rows(store.body(ends[-1], revised=n))
    assert {k[0] for k in got} == {ends[1]}  # the whole revised quantum, nothing else
    assert len(got) == 7  # its six rows and the late host's
    assert got[late.key]["revision"] == 0
    assert got[late.key]["revised_at"] == REVISED_AT
    assert _rows(store.body(ends[-1])) == {}  # without revised=: as before
    again = json.loads(store.body(ends[-1], revised=json.loads(store.body(0))["revised"]))
    assert again["quanta"] == []
    with pytest.raises(ValueError, match="revised"):
        revised_of("since=1&revised=x")
    assert revised_of("since=1") is None
    assert revised_of("since=1&revised=3") == 3


# -- the page in a real browser, served by the real /metrics child ------------------------


@pytest.fixture
def served() -> Iterator[tuple[MetricsProcess, list[Snapshot]]]:
    current = [Snapshot()]
    server = MetricsProcess("127.0.0.1", 0, lambda: current[0])
    server.start()
    try:
        yield server, current
    finally:
        server.close()


def _p99_on_page(b: Browser, end: int) -> Any:
    """The p99 of reads the page draws at ``end`` (ms), or null."""
    return b.evaluate(
        "(function () { var s = window.fiomonState; if (!s || !s.charts['lat-read']) return null;"
        " var p = s.charts['lat-read'].filter(function (x) { return x.name === 'p99'; })[0];"
        f" var pt = p && p.data.filter(function (d) {{ return d[0] === {end}; }})[0];"
        " return pt ? pt[1] : null; })()"
    )


def test_the_live_page_redraws_a_revised_quantum(
    served: tuple[MetricsProcess, list[Snapshot]],
) -> None:
    server, current = served
    feed = _feed()
    ends = [T0 + i * QUANTUM_MS for i in range(1, 5)]
    for e in ends:
        feed.add(_quantum(e), None)
    current[0] = Snapshot(live=feed.view(_status()))
    server.poke()
    with Browser(1400, 2600) as b:
        b.goto(f"http://127.0.0.1:{server.port}/live")
        b.wait_for("window.fiomonState && window.fiomonState.quanta >= 4", "four quanta drawn")
        assert _p99_on_page(b, ends[1]) == 2.0  # ms
        draws = b.state()["draws"]
        # The second quantum is revised: late reads raised its p99 to 9 ms.
        feed.add([_revision(_quantum(ends[1])[0], 1, 9e6)], None)
        current[0] = Snapshot(live=feed.view(_status()))
        server.poke()
        b.wait_for(
            "(function () { var s = window.fiomonState;"
            " var p = s.charts['lat-read'].filter(function (x) { return x.name === 'p99'; })[0];"
            " return p.data.some(function (d) {"
            f" return d[0] === {ends[1]} && d[1] === 9; }}); }})()",
            "the revised p99 drawn at its quantum",
        )
        after = b.state()
        assert after["draws"] > draws
        assert after["quanta"] == 4  # redrawn in place, not appended
        assert _p99_on_page(b, ends[0]) == 2.0
        p99 = {s["name"]: s for s in after["charts"]["lat-read"]}["p99"]["data"]
        assert sorted(x for x, _ in p99) == ends
    url = f"http://127.0.0.1:{server.port}/api/v1/quanta?since=0"
    with urllib.request.urlopen(url, timeout=30) as resp:
        rows = _rows(resp.read())
    got = rows[(ends[1], "cluster", None, "read")]
    assert (got["revision"], got["percentiles_ns"]["99"]) == (1, 9e6)


def test_the_feed_sends_no_revised_host_rows_the_store_would_not_serve() -> None:
    feed = LiveFeed([50.0, 99.0], [], QUANTUM_MS, window_s=900, host_window_s=10)
    ends = [T0 + i * QUANTUM_MS for i in range(1, 31)]
    for e in ends:
        feed.add(_quantum(e), None)
    old, recent = _quantum(ends[0]), _quantum(ends[-2])
    feed.add([_revision(r, 1, 9e6) for r in old + recent], None)
    sent = {end: {key for key, _, _ in rows} for end, rows in feed.view(_status()).revised}
    # 29 s old: past the 10 s host window, so its cluster rows only.
    assert sent[ends[0]] == {("cluster", "", "read"), ("cluster", "", "write")}
    assert len(sent[ends[-2]]) == 6
