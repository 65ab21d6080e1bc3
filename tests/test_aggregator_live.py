"""The aggregator on real parts: agents -> Mosquitto -> aggregator equals the offline report."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from pathlib import Path

from fiomon.aggregator import AggregatorCore, run_aggregator
from fiomon.config import AggregatorConfig, BrokerConfig
from fiomon.report import ReportOptions, run_report
from fiomon.simulate import write_cluster
from fiomon.sources import SourceOptions
from tests.conftest import Mosquitto, free_port
from tests.livedata import write_json_stream

PREFIX = "fiomonlive"


def assert_rows_equal(online: list[dict[str, object]], offline: list[dict[str, object]]) -> None:
    """Same rows (same windows, scopes, hosts, directions); numbers equal to 1e-9 relative."""

    def key(r: dict[str, object]) -> tuple[object, ...]:
        return (r["end_ms"], r["scope"], r["host"] or "", r["direction"])

    a = sorted(online, key=key)
    b = sorted(offline, key=key)
    assert [key(r) for r in a] == [key(r) for r in b]
    worst = 0.0

    def close(x: object, y: object, where: str) -> None:
        nonlocal worst
        if isinstance(x, dict) and isinstance(y, dict):
            assert x.keys() == y.keys(), where
            for k in x:
                close(x[k], y[k], f"{where}.{k}")
        elif isinstance(x, (int, float)) and isinstance(y, (int, float)):
            rel = abs(x - y) / max(abs(x), abs(y), 1e-300)
            worst = max(worst, rel)
            assert rel <= 1e-9, (where, x, y)
        else:
            assert x == y, (where, x, y)

    for ra, rb in zip(a, b, strict=True):
        close(ra, rb, str(key(ra)))
    print(f"online == offline: {len(a)} rows, worst relative difference {worst:.2e}")


async def _agent(tmp: Path, host: str, port: int) -> asyncio.subprocess.Process:
    cfg = tmp / f"agent-{host}.yaml"
    cfg.write_text(
        f"broker: {{port: {port}}}\ntopic_prefix: {PREFIX}\nhost: {host}\n"
        f"watch: ['{tmp}/data/{host}/*.log', '{tmp}/data/{host}/*.json']\n"
        f"state_dir: {tmp}/state-{host}\nflush_interval: 200ms\npoll_interval: 200ms\n"
        "log_hist_msec: 1000\n"
    )
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fiomon",
        "agent",
        "--config",
        str(cfg),
        stderr=asyncio.subprocess.DEVNULL,
    )


async def test_online_equals_offline(mosquitto: Mosquitto, tmp_path: Path) -> None:
    now = time.time_ns() // 1_000_000
    start = now // 1000 * 1000 - 20_000
    paths = write_cluster(
        tmp_path / "data", hosts=3, jobs_per_host=2, seconds=15, iops=300, start_ms=start, seed=11
    )
    stream = tmp_path / "data" / "client-01" / "run.json"
    write_json_stream(stream, jobs=2, start_ms=start, seconds=12, phase_ms=137)
    files = [p.resolve() for p in [*paths, stream]]
    offline = io.StringIO()
    summary = run_report(
        files,
        ReportOptions(
            fmt="jsonl",
            align="epoch",
            per_host=True,
            source=SourceOptions(interval_ms=1000),
            progress=False,
        ),
        offline,
        io.StringIO(),
    )
    cfg = AggregatorConfig(
        broker=BrokerConfig(port=mosquitto.port),
        topic_prefix=PREFIX,
        client_id="fiomon-aggregator-test",
        quantum_ms=1000,
        lateness_ms=120_000,  # the data is up to 20 s old: nothing may close on the clock
        align="epoch",
        listen=f"127.0.0.1:{free_port()}",
        quanta_file=tmp_path / "quanta.jsonl",
    )
    cores: list[AggregatorCore] = []
    stop = asyncio.Event()
    aggregator = asyncio.create_task(run_aggregator(cfg, stop=stop, ready=cores.append))
    await asyncio.sleep(0.5)
    agents = [await _agent(tmp_path, f"client-{h:02d}", mosquitto.port) for h in (1, 2, 3)]
    try:
        async with asyncio.timeout(30):
            while not cores or cores[0].records["received"] < summary.records:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert cores[0].records["received"] == summary.records
    finally:
        for a in agents:
            a.terminate()
            await a.wait()
    stop.set()
    await asyncio.wait_for(aggregator, 15)
    online = [json.loads(line) for line in (tmp_path / "quanta.jsonl").read_text().splitlines()]
    assert_rows_equal(online, [json.loads(line) for line in offline.getvalue().splitlines()])
    core = cores[0]
    assert core.records["duplicate"] == 0
    assert sum(core.lost.values()) == 0
    assert not core.invalid
