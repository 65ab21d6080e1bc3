"""The live page: the ring behind ``/api/v1/quanta``, and the page in a real browser fed
by a real aggregator on a real Mosquitto, showing quanta that close while it is open."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import aiomqtt
import pytest

from fiomon.aggregator.merger import AggregatorCore
from fiomon.aggregator.service import run_aggregator
from fiomon.closed import ClosedQuantum
from fiomon.config import AggregatorConfig, BrokerConfig, SlaRule
from fiomon.histogram import HistStats
from fiomon.model import RecordBatch
from fiomon.server.live import (
    LiveFeed,
    LiveStore,
    LiveView,
    encode_rows,
    read_history,
    status_of,
)
from fiomon.server.metrics_server import since_ms
from fiomon.server.quantafile import QuantaFile
from fiomon.wire import encode
from tests.batches import batch
from tests.browser import Browser
from tests.conftest import Mosquitto, free_port, until
from tests.offline.test_plot import _shots

PREFIX = "fiomonlive"
HOSTS = ("h1", "h2", "h3")
SLOW = "h2"
SILENT = (3, 4)  # seconds of the run in which the last host sends nothing


def _view(ends: list[int], window_s: int = 900, host_window_s: int = 900) -> LiveView:
    rows = tuple(
        (e, f'{{"end_ms":{e}}}'.encode(), f'{{"end_ms":{e},"host":"h"}}'.encode()) for e in ends
    )
    return LiveView(rows, b'{"m":1}', b'{"s":1}', window_s, host_window_s)


def _ends(body: bytes, host: bool = False) -> list[int]:
    return [r["end_ms"] for r in json.loads(body)["quanta"] if ("host" in r) == host]


def test_the_ring_answers_since_and_forgets_by_time() -> None:
    store = LiveStore()
    store.merge(_view([1000, 2000, 3000]))
    store.merge(_view([2000, 3000, 4000]))  # overlapping tails are merged, not repeated
    body = json.loads(store.body(2000))
    assert body["meta"] == {"m": 1}
    assert body["status"] == {"s": 1}
    assert _ends(store.body(2000)) == [3000, 4000]
    assert _ends(store.body(2000), host=True) == [3000, 4000]
    assert store.quanta == 4
    store.merge(_view([5000], window_s=2, host_window_s=1))  # ends <= 3000 go; hosts <= 4000
    assert _ends(store.body(0)) == [4000, 5000]
    assert _ends(store.body(0), host=True) == [5000]
    assert store.nbytes == 2 * len(b'{"end_ms":4000}') + len(b'{"end_ms":5000,"host":"h"}')


def test_the_ring_is_bounded_by_bytes() -> None:
    store = LiveStore(max_bytes=300)
    for e in range(1, 50):
        store.merge(_view([e * 1000]))
    assert 0 < store.nbytes <= 300
    assert _ends(store.body(0))[-1] == 49_000


def test_since_is_parsed_strictly() -> None:
    assert since_ms("") == 0
    assert since_ms("a=1&since=1795000000123") == 1_795_000_000_123
    with pytest.raises(ValueError, match="since"):
        since_ms("since=yesterday")


def test_status_lists_every_rule_even_before_it_saw_data() -> None:
    rule = SlaRule("p99-read", "read", 99.0, 5e6)
    st = status_of(now_ms=1, hosts_up=2, received=3, late=4, lost=5, rules=[rule], alerts=[])
    assert st["sla"] == [
        {
            "rule": "p99-read",
            "direction": "read",
            "percentile": "99",
            "threshold_ns": 5e6,
            "host": None,
            "state": "inactive",
            "value_ns": None,
        }
    ]
    assert (st["hosts_up"], st["late_records"], st["lost_records"]) == (2, 4, 5)
    feed = LiveFeed([50.0, 99.0], [rule], 1000)
    assert json.loads(feed.meta)["sla_ns"] == [5e6]


def test_api_rows_carry_complete_and_the_missing_cells() -> None:
    stats = HistStats(100.0, 1e5, 2e5, 9e5, {"50": 2e5, "99": 8e5}, ())
    rows = [
        ClosedQuantum(0, 1000, "cluster", None, "read", stats, 100.0, 4e5, 2, 0,
                      complete=False, cells_missing=("cell-a",)),
        ClosedQuantum(0, 1000, "host", "h1", "read", stats, 100.0, 4e5, 1, 0,
                      cells_missing=()),
        ClosedQuantum(0, 1000, "host", "h2", "read", stats, 100.0, 4e5, 1, 0),
    ]  # fmt: skip
    cluster, host = encode_rows(rows, None)
    (c,) = json.loads(b"[" + cluster + b"]")
    h1, h2 = json.loads(b"[" + host + b"]")
    assert (c["complete"], c["cells_missing"]) == (False, ["cell-a"])
    assert (h1["complete"], h1["cells_missing"]) == (True, [])
    assert h2["complete"] is True
    assert "cells_missing" not in h2  # an aggregator's rows name no cells


def _q(end: int, host: str | None, direction: str = "read", revision: int = 0) -> ClosedQuantum:
    stats = HistStats(100.0, 1e5, 2e5, 9e5, {"50": 2e5, "99": 8e5 + revision}, ())
    scope: Literal["cluster", "host"] = "cluster" if host is None else "host"
    row = ClosedQuantum(end - 1000, end, scope, host, direction, stats, 100.0, 4e5, 1, 0)
    return row if not revision else replace(row, revision=revision, revised_at=end + 5000)


def _keys(history: list[tuple[int, bytes, bytes]]) -> list[tuple[int, str | None, int]]:
    out = []
    for end, cluster, host in history:
        for blob in (cluster, host):
            if blob:
                for r in json.loads(b"[" + blob + b"]"):
                    assert r["end_ms"] == end
                    out.append((end, r["host"], r["revision"]))
    return out


def test_history_is_the_window_of_the_quanta_file_latest_revisions_and_rotations(
    tmp_path: Path,
) -> None:
    qf = QuantaFile(tmp_path / "q.jsonl", max_bytes=2000, keep=3)
    for end in range(1000, 21_000, 1000):
        qf.write([_q(end, None), _q(end, "h1"), _q(end, "h2")])
        if end == 17_000:
            qf.write([_q(15_000, None, revision=1)])  # a revision after later quanta
    qf.write([_q(20_000, None, revision=2), _q(20_000, None, revision=1)])  # out of order
    qf.close()
    paths = [str(p) for p in qf.files()]
    assert (tmp_path / "q.jsonl.1").exists()  # the window spans rotated files
    got = read_history(paths, window_s=8, host_window_s=3)
    keys = _keys(got)
    assert [e for e, _, _ in got] == list(range(13_000, 21_000, 1000))
    cluster = {e: rev for e, h, rev in keys if h is None}
    assert cluster == {**dict.fromkeys(range(13_000, 21_000, 1000), 0), 15_000: 1, 20_000: 2}
    assert {e for e, h, _ in keys if h is not None} == {18_000, 19_000, 20_000}
    # Bounded by bytes too: the newest quanta are kept.
    small = read_history(paths, window_s=8, host_window_s=3, max_bytes=1500)
    assert small
    assert [e for e, _, _ in small] == [e for e, _, _ in got][-len(small) :]
    assert read_history([str(tmp_path / "none.jsonl")], 900, 120) == []


def test_a_new_store_serves_the_quanta_file_before_new_quanta_and_views_win(
    tmp_path: Path,
) -> None:
    qf = QuantaFile(tmp_path / "q.jsonl")
    qf.write([_q(e, None) for e in (1000, 2000, 3000)])
    qf.close()
    store = LiveStore()
    feed = LiveFeed([50.0, 99.0], [], 1000)
    feed.history = tuple(str(p) for p in qf.files())
    feed.add([_q(3000, None, revision=0), _q(4000, None)], None)  # 3000 again, newer: kept
    store.merge(feed.view(status_of(now_ms=0, hosts_up=0, received=0, late=0, lost=0,
                                    rules=[], alerts=[])))  # fmt: skip
    assert store.wait_history(30)
    body = json.loads(store.body(0))
    assert [r["end_ms"] for r in body["quanta"]] == [1000, 2000, 3000, 4000]
    assert store.restored == 2
    # A page polling with the last answer's revised count gets the restored quanta too.
    assert body["revised"] == 1
    assert [r["end_ms"] for r in json.loads(store.body(4000, 0))["quanta"]] == [1000, 2000]


def test_status_names_loud_hosts_worst_first_and_no_host_for_a_quiet_per_host_rule() -> None:
    rule = SlaRule("p99-write", "write", 99.0, 5e6, scope="host")
    quiet: list[dict[str, object]] = [
        {"rule": "p99-write", "host": h, "state": "inactive", "value_ns": 1e6}
        for h in ("h1", "h2", "h3")
    ]
    st = status_of(now_ms=1, hosts_up=3, received=0, late=0, lost=0, rules=[rule], alerts=quiet)
    (line,) = st["sla"]
    assert (line["host"], line["state"]) == (None, "inactive")  # not "h1", the first
    loud: list[dict[str, object]] = [
        {"rule": "p99-write", "host": "h1", "state": "pending", "value_ns": 9e6},
        {"rule": "p99-write", "host": "h2", "state": "firing", "value_ns": 6e6},
        {"rule": "p99-write", "host": "h3", "state": "firing", "value_ns": 8e6},
    ]
    st = status_of(
        now_ms=1, hosts_up=3, received=0, late=0, lost=0, rules=[rule], alerts=loud,
        silent=("h9", "h4"),
    )  # fmt: skip
    assert [(s["host"], s["state"]) for s in st["sla"]] == [
        ("h3", "firing"),
        ("h2", "firing"),
        ("h1", "pending"),
    ]
    assert (st["silent_hosts"], st["silent_count"]) == (["h4", "h9"], 2)
    # A cluster rule's worst hosts and a resolved alert's "ended" come through.
    cluster = SlaRule("p99-read", "read", 99.0, 5e6)
    alerts: list[dict[str, object]] = [
        {"rule": "p99-read", "host": None, "state": "firing", "value_ns": 9e6,
         "worst_hosts": [["h2", 0.75]]},
        {"rule": "p99-write", "host": "h1", "state": "resolved", "value_ns": 1e6, "ended": True},
    ]  # fmt: skip
    st = status_of(
        now_ms=1, hosts_up=3, received=0, late=0, lost=0, rules=[cluster, rule], alerts=alerts
    )
    assert st["sla"][0]["worst_hosts"] == [["h2", 0.75]]
    assert (st["sla"][1]["host"], st["sla"][1]["state"], st["sla"][1]["ended"]) == (
        None,
        "resolved",
        True,
    )


# -- a real aggregator, a real broker, a real browser ------------------------------------


def _record(host: str, end_ms: int) -> RecordBatch:
    """One second of reads and writes; the slow host's reads take ten times longer."""
    read_bin = 900 if host == SLOW else 700
    start = end_ms - 1000
    recs = [(start, end_ms, 0, {read_bin: 200}), (start, end_ms, 1, {710: 100})]
    return batch(recs, host, "job", nbytes=4096 * 300)


async def _publish(port: int, stop: asyncio.Event) -> None:
    """Each second, each host's records of the second that just ended, until ``stop``.

    The last host skips its 4th and 5th seconds: those quanta close without it, incomplete.
    """
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{time.monotonic_ns()}") as c:
        seq = dict.fromkeys(HOSTS, 0)
        i = 0
        while not stop.is_set():
            now = time.time()
            await asyncio.sleep(int(now) + 1.05 - now)  # just past the next whole second
            end = int(time.time()) * 1000
            for h in HOSTS:
                if h == HOSTS[-1] and i in SILENT:
                    continue
                payload = encode(h, "run.json@1", seq[h], _record(h, end))
                await c.publish(f"{PREFIX}/v1/{h}/records", payload, qos=1)
                seq[h] += 2
            i += 1


def _get(url: str, accept: str = "*/*") -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept})  # noqa: S310 -- http
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 -- http
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def _browse(port: int, folder: Path) -> tuple[dict[str, Any], dict[str, Any], str]:
    """Open the page, wait for quanta, then for later ones on the same page."""
    with Browser(1400, 2600) as b:
        b.goto(f"http://127.0.0.1:{port}/")
        b.wait_for(
            "window.fiomonState && window.fiomonState.quanta >= 3", "three quanta on the page"
        )
        first = b.state()
        b.screenshot(folder / "live-1.png")
        b.wait_for(
            f"window.fiomonState.last_end_ms >= {first['last_end_ms'] + 3000}",
            "three more quanta without reloading the page",
        )
        second = b.state()
        b.screenshot(folder / "live-2.png")
        status = str(b.evaluate("document.getElementById('status').textContent"))
    return first, second, status


async def test_the_live_page_shows_quanta_as_they_close(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    port = free_port()
    cfg = AggregatorConfig(
        broker=BrokerConfig(port=mosquitto.port),
        topic_prefix=PREFIX,
        client_id="fiomon-aggregator-live",
        lateness_ms=1500,
        align="epoch",
        listen=f"127.0.0.1:{port}",
        sla=(SlaRule("p99-read", "read", 99.0, 2e6, for_quanta=2, min_samples=1),),
    )
    cores: list[AggregatorCore] = []
    stop, stop_pub = asyncio.Event(), asyncio.Event()
    agg = asyncio.create_task(run_aggregator(cfg, stop=stop, ready=cores.append))
    pub: asyncio.Task[None] | None = None
    try:
        await until(lambda: cores, what="the aggregator started")
        pub = asyncio.create_task(_publish(mosquitto.port, stop_pub))
        first, second, status = await asyncio.to_thread(_browse, port, tmp_path)
        code, ctype, body = await asyncio.to_thread(
            _get, f"http://127.0.0.1:{port}/api/v1/quanta?since=0"
        )
        code_after, _, after = await asyncio.to_thread(
            _get, f"http://127.0.0.1:{port}/api/v1/quanta?since={second['last_end_ms']}"
        )
        bad, _, _ = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/api/v1/quanta?since=x")
        m_code, m_type, metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/")
    finally:
        stop_pub.set()
        if pub is not None:
            await asyncio.wait_for(pub, 30)
        stop.set()
        await asyncio.wait_for(agg, 30)
    assert (code, ctype) == (200, "application/json")
    api = json.loads(body)
    assert api["meta"]["sla_ns"] == [2e6]
    assert api["status"]["hosts_up"] == 3
    assert code_after == 200
    assert all(r["end_ms"] > second["last_end_ms"] for r in json.loads(after)["quanta"])
    assert bad == 400
    # A scraper (no text/html in Accept) still gets the metrics at /.
    assert m_code == 200
    assert "text/plain" in m_type
    assert b"# TYPE fiomon_" in metrics  # the text format, whatever the metric names
    # The same page, later: more quanta, and the newest are drawn.
    assert second["quanta"] > first["quanta"]
    assert second["last_end_ms"] >= first["last_end_ms"] + 3000
    assert second["hosts"] == 3
    assert second["draws"] > first["draws"]
    # What the page drew is what the API serves: the p99 of reads, quantum by quantum.
    rows = {
        r["end_ms"]: r
        for r in api["quanta"]
        if r["scope"] == "cluster" and r["direction"] == "read"
    }
    p99 = {s["name"]: s for s in second["charts"]["lat-read"]}["p99"]["data"]
    assert len(p99) >= 4
    for x, y in p99:
        assert y == pytest.approx(rows[x]["percentiles_ns"]["99"] / 1e6, rel=1e-9)
    # And its confidence band is the API's percentiles_ci_ns (null: a side left open).
    band = {s.get("id"): s for s in second["charts"]["lat-read"]}["band-99"]
    assert band["name"] == "confidence bands"
    assert len(band["data"]) == len(p99)
    bounded = 0
    for x, lo, hi in band["data"]:
        for got, want in zip((lo, hi), rows[x]["percentiles_ci_ns"]["99"], strict=True):
            if want is None:
                assert got is None
            else:
                bounded += 1
                assert got == pytest.approx(want / 1e6, rel=1e-9)
    assert bounded > 0
    # The read rule's SLA line is on the read chart, labelled, and on no other.
    sla = {s["name"]: s for s in second["charts"]["lat-read"]}["SLA"]
    assert (sla["markLines"], sla["labels"]) == ([2.0], ["SLA p99 read 2 ms"])
    assert "SLA" not in {s["name"] for s in second["charts"]["lat-write"]}
    # The quanta closed while h3 was silent are incomplete, drawn as hollow points.
    partial = sorted(x for x, r in rows.items() if r["complete"] is False)
    assert partial, "the quanta of h3's silence are incomplete"
    marks = {s["name"]: s for s in second["charts"]["lat-read"]}["incomplete quantum"]
    assert sorted(p["value"][0] for p in marks["data"]) == partial
    assert "incomplete quanta: " in status
    assert "hosts reporting: 3" in status
    assert "SLA p99-read" in status
    for name in ("live-1.png", "live-2.png"):
        assert (tmp_path / name).stat().st_size > 30_000
    dest = _shots()
    if dest is not None:
        (dest / "live.png").write_bytes((tmp_path / "live-2.png").read_bytes())
