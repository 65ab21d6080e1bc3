"""The live page's pictures, read from screenshots of a real browser fed by a real
aggregator on a real Mosquitto: idle periods drawn as gaps, each percentile in its palette
colour, SLA lines only on their direction's chart, the window restored from the quanta
file after an aggregator restart, and the status bar naming the host that went silent.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiomqtt

from fiomon.aggregator.merger import AggregatorCore
from fiomon.aggregator.service import run_aggregator
from fiomon.config import AggregatorConfig, BrokerConfig, SlaRule
from fiomon.model import RecordBatch
from fiomon.palette import SLA_COLOUR, percentile_colour
from fiomon.wire import encode
from tests.batches import batch
from tests.browser import Browser
from tests.conftest import Mosquitto, free_port, until
from tests.offline.test_plot import _shots
from tests.pixels import black, chart_box, dashes, inked, load, near, x_of

PREFIX = "fiomonpics"
HOSTS = ("h1", "h2", "h3")
BUSY, IDLE = 4, 6  # run 1: 4 s of I/O, 6 s with none, 4 s of I/O
_T = TypeVar("_T")


def _record(host: str, end_ms: int) -> RecordBatch:
    """One second of reads (spread, so p50..p99.9 are apart) and fast writes."""
    up = 40 if host == "h2" else 0
    reads = {650 + up: 100, 760 + up: 88, 860 + up: 10, 950 + up: 2}
    writes = {700: 100, 740: 98, 780: 2}
    start = end_ms - 1000
    return batch([(start, end_ms, 0, reads), (start, end_ms, 1, writes)], host, "job", nbytes=4096)


async def _publish(
    port: int,
    hosts_at: Callable[[int], tuple[str, ...]],
    seconds: int,
    seqs: dict[str, int],
    prefix: str = PREFIX,
) -> list[int]:
    """Each second for ``seconds``, the records of ``hosts_at(i)``; the ends sent to.

    ``seqs``: each host's next sequence number (kept across runs: a restarted aggregator
    drops numbers it has seen).
    """
    ends: list[int] = []
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{time.monotonic_ns()}") as c:
        for i in range(seconds):
            now = time.time()
            await asyncio.sleep(int(now) + 1.05 - now)  # just past the next whole second
            end = int(time.time()) * 1000
            hosts = hosts_at(i)
            for h in hosts:
                payload = encode(h, "run.json@1", seqs.get(h, 0), _record(h, end))
                await c.publish(f"{prefix}/v1/{h}/records", payload, qos=1)
                seqs[h] = seqs.get(h, 0) + 2
            if hosts:
                ends.append(end)
    return ends


def _file_ends(path: Path) -> set[int]:
    if not path.exists():
        return set()
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["end_ms"] for r in rows if r["scope"] == "cluster" and r["direction"] == "read"}


def _gap_columns(port: int, folder: Path, want: int, before: int, after: int) -> dict[str, Any]:
    with Browser(1400, 2600) as b:
        b.goto(f"http://127.0.0.1:{port}/")
        b.wait_for(
            f"window.fiomonState && window.fiomonState.quanta >= {want}",
            f"the {want} quanta of the quanta file on the restarted aggregator's page",
            within=30,
        )
        state = b.state()
        shot = folder / "live-restored.png"
        b.screenshot(shot)
        charts = ("lat-read", "lat-write", "throughput")
        return {
            "state": state,
            "img": load(shot),
            "boxes": {c: chart_box(b, c) for c in charts},
            "gap": {c: (x_of(b, c, before) + 3, x_of(b, c, after) - 3) for c in charts},
            "busy": {c: (x_of(b, c, after), x_of(b, c, after + 3000)) for c in charts},
        }


async def _with_aggregator(cfg: AggregatorConfig, work: Callable[[], Awaitable[_T]]) -> _T:
    """``work()`` while an aggregator runs with ``cfg``; the aggregator stopped after."""
    cores: list[AggregatorCore] = []
    stop = asyncio.Event()
    agg = asyncio.create_task(run_aggregator(cfg, stop=stop, ready=cores.append))
    try:
        await until(lambda: cores, what="the aggregator started")
        return await work()
    finally:
        stop.set()
        await asyncio.wait_for(agg, 30)


def _status_when_silent(port: int) -> str:
    with Browser(1400, 1200) as b:
        b.goto(f"http://127.0.0.1:{port}/")
        b.wait_for(
            "document.getElementById('incomplete') !== null",
            "the status bar says the newest quantum is incomplete",
            within=40,
        )
        return str(b.evaluate("document.getElementById('status').textContent"))


async def test_restart_restores_the_window_with_gaps_colours_and_sla_lines(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    port = free_port()
    quanta = tmp_path / "quanta.jsonl"
    cfg = AggregatorConfig(
        broker=BrokerConfig(port=mosquitto.port),
        topic_prefix=PREFIX,
        client_id="fiomon-aggregator-pictures",
        lateness_ms=1500,
        align="epoch",
        listen=f"127.0.0.1:{port}",
        state_dir=tmp_path / "state",
        quanta_file=quanta,
        # A write rule only: the read chart must carry no SLA line.
        sla=(SlaRule("p99-write", "write", 99.0, 5e6, scope="host", for_quanta=2, min_samples=1),),
    )

    def run(work: Callable[[], Awaitable[_T]]) -> Awaitable[_T]:
        return _with_aggregator(cfg, work)

    seqs: dict[str, int] = {}

    # Run 1: busy, idle (nobody sends), busy; every quantum sent to is in the file.
    def first_plan(i: int) -> tuple[str, ...]:
        return () if BUSY <= i < BUSY + IDLE else HOSTS

    async def first() -> list[int]:
        ends = await _publish(mosquitto.port, first_plan, 2 * BUSY + IDLE, seqs)
        await until(lambda: _file_ends(quanta) >= set(ends), what="run 1's quanta in the file")
        return ends

    sent: list[int] = await run(first)
    assert len(sent) == 2 * BUSY
    before, after = sent[BUSY - 1], sent[BUSY] - 1000  # the gap: no quantum in between
    assert after - before == IDLE * 1000

    # Run 2: a new aggregator; the page shows run 1 before any new record comes.
    async def second() -> dict[str, Any]:
        got: dict[str, Any] = await asyncio.to_thread(
            _gap_columns, port, tmp_path, len(sent), before, after
        )
        return got

    got = await run(second)
    state, img, boxes = got["state"], got["img"], got["boxes"]
    # The earlier quanta, restored from the quanta file, point for point.
    p99 = {s["name"]: s for s in state["charts"]["lat-read"]}["p99"]["data"]
    drawn = {x for x, y in p99 if y is not None}
    assert set(sent) <= drawn
    # The idle period is a gap: the pixel columns inside it carry no line, band or IOPS,
    # while the busy seconds next to it do.
    for chart in ("lat-read", "throughput"):
        x0, x1 = got["gap"][chart]
        assert x1 - x0 > 40, (chart, x0, x1)
        assert inked(boxes[chart].crop(img, x0, x1)) == 0, f"{chart}: ink inside the idle gap"
        b0, b1 = got["busy"][chart]
        assert inked(boxes[chart].crop(img, b0, b1)) > 20, f"{chart}: no ink where I/O was"
    # Each percentile in its palette colour (p50 and p99 apart by a decade here).
    read = boxes["lat-read"].crop(img)
    for p in (50.0, 99.0):
        assert near(read, percentile_colour(p)) > 100, f"p{p:g} not in {percentile_colour(p)}"
    # The write rule's SLA line: on the write chart only, black, labelled.
    assert black(read) == 0, "an SLA line on the read chart, whose direction has no rule"
    assert black(boxes["lat-write"].crop(img)) > 50
    assert dashes(boxes["lat-write"].crop(img)) >= 20, "the SLA line is dashed"
    assert SLA_COLOUR == "#000000"
    names = {c: [s["name"] for s in state["charts"][c]] for c in ("lat-read", "lat-write")}
    assert "SLA" not in names["lat-read"]
    sla = next(s for s in state["charts"]["lat-write"] if s["name"] == "SLA")
    assert sla["markLines"] == [5.0]
    assert sla["labels"] == ["SLA p99 write 5 ms (each host)"]
    dest = _shots()
    if dest is not None:
        (dest / "live-restored.png").write_bytes((tmp_path / "live-restored.png").read_bytes())


async def test_the_status_bar_names_the_silent_host_and_the_worst_one(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    port = free_port()
    cfg = AggregatorConfig(
        broker=BrokerConfig(port=mosquitto.port),
        topic_prefix=PREFIX + "-status",
        client_id="fiomon-aggregator-status",
        lateness_ms=1500,
        align="epoch",
        listen=f"127.0.0.1:{port}",
        sla=(
            # Breached by the cluster (h2's reads are the slow ones): names h2, the worst.
            SlaRule("p99-read", "read", 99.0, 1e5, for_quanta=1, min_samples=1),
            # Quiet on every host: names none (it named h1, the first by name).
            SlaRule("p99-write", "write", 99.0, 5e6, scope="host", for_quanta=2, min_samples=1),
        ),
    )

    def plan(i: int) -> tuple[str, ...]:
        return HOSTS if i < 3 else HOSTS[:2]  # h3 goes silent

    async def work() -> str:
        pub = asyncio.create_task(_publish(mosquitto.port, plan, 12, {}, cfg.topic_prefix))
        try:
            return await asyncio.to_thread(_status_when_silent, port)
        finally:
            await asyncio.wait_for(pub, 60)

    status = await _with_aggregator(cfg, work)
    assert "silent: h3" in status
    assert "incomplete: h3 sent nothing" in status
    assert "p99-write: p99 write < 5.00 ms (each host): inactive" in status
    assert " on h1" not in status
    # The cluster rule names h2 first: the alerts' share of the tail, or the page's own
    # reading of the newest host rows.
    assert re.search(r"p99-read: p99 read < 100 µs; worst hosts? h2\b", status), status
