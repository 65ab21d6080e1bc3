"""Latency kinds end to end (issue 27): real fio -> agents -> Mosquitto -> aggregator.

One fio run (libaio, buffered: submission takes tens of us, completion about one, so
fio's ``lat`` and ``clat`` lie far apart) writes a json+ stream with
``lat_percentiles=1``. Two agents follow it: ``lat-host`` with ``latency: lat`` and
``clat-host`` with the default ``clat``. The aggregator merges ``lat``: the lat agent's
records give fio's own lat_ns percentiles, the clat agent's are refused, counted, logged
once and merged nowhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fiomon.aggregator.merger import AggregatorCore
from fiomon.aggregator.service import run_aggregator
from fiomon.bins import plat_val_to_idx
from fiomon.config import AggregatorConfig, BrokerConfig
from fiomon.fio.fiojson import JsonSplitter
from fiomon.fio.problems import ProblemLog
from tests.conftest import DEADLINE_S, Mosquitto, free_port, until
from tests.metricskit import scrape_or_none

PREFIX = "fiomonkind"
QUANTUM_MS = 600_000  # the whole run in one quantum: its row is fio's whole run


def _documents(path: Path) -> list[dict[str, Any]]:
    split = JsonSplitter(str(path), ProblemLog())
    return [*split.feed(path.read_bytes()), *split.finish()]


async def _agent(tmp: Path, host: str, port: int, watch: Path, latency: str | None) -> Any:
    cfg = tmp / f"agent-{host}.yaml"
    cfg.write_text(
        f"broker: {{port: {port}}}\ntopic_prefix: {PREFIX}\nhost: {host}\n"
        f"watch: ['{watch}']\nstate_dir: {tmp}/state-{host}\n"
        "flush_interval: 200ms\npoll_interval: 200ms\n"
        + (f"latency: {latency}\n" if latency is not None else "")
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


def _bin(value_ns: float) -> int:
    return int(plat_val_to_idx(np.array([int(value_ns)], dtype=np.int64))[0])


@pytest.mark.fio
async def test_a_lat_agent_gives_fios_lat_percentiles_and_a_clat_agent_is_refused(
    mosquitto: Mosquitto, tmp_path: Path, fio_bin: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="fiomon.aggregator")
    now = time.time_ns() // 1_000_000
    port = free_port()
    cfg = AggregatorConfig(
        broker=BrokerConfig(port=mosquitto.port),
        topic_prefix=PREFIX,
        client_id="fiomon-aggregator-kinds",
        quantum_ms=QUANTUM_MS,
        align=(now - QUANTUM_MS // 2) % QUANTUM_MS,  # now is the middle of a quantum
        lateness_ms=5000,
        listen=f"127.0.0.1:{port}",
        quanta_file=tmp_path / "quanta.jsonl",
        latency="lat",
    )
    cores: list[AggregatorCore] = []
    stop = asyncio.Event()
    aggregator = asyncio.create_task(run_aggregator(cfg, stop=stop, ready=cores.append, final=True))
    await mosquitto.wait_for_log(f"{cfg.client_id} 1 {PREFIX}/v1/+/records")
    out = tmp_path / "data" / "run.json"
    out.parent.mkdir()
    agents = [
        await _agent(tmp_path, "lat-host", mosquitto.port, out, "lat"),
        await _agent(tmp_path, "clat-host", mosquitto.port, out, None),
    ]
    try:
        fio = await asyncio.create_subprocess_exec(
            fio_bin,
            "--name=kinds",
            f"--filename={tmp_path / 'data.bin'}",
            "--size=4M",
            "--rw=randread",
            "--bs=4k",
            "--ioengine=libaio",
            "--iodepth=8",
            "--runtime=3",
            "--time_based",
            "--rate_iops=300",
            "--lat_percentiles=1",
            "--status-interval=1",
            "--output-format=json+",
            f"--output={out}",
            "--eta=never",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert await asyncio.wait_for(fio.wait(), DEADLINE_S) == 0
        docs = _documents(out)
        # One record per dump from the first with reads on (each agent sends them all).
        sent = len(docs) - min(
            i for i, d in enumerate(docs) if d["jobs"][0]["read"]["total_ios"] > 0
        )
        assert sent >= 3, "several messages: the refusal is logged once, not per message"
        core = await asyncio.to_thread(lambda: cores[0])
        counts = core.counts.records
        await until(
            lambda: counts["received"] >= sent and counts["wrong_latency"] >= sent,
            what=f"{sent} records of each agent reached the aggregator",
        )
        assert (counts["received"], counts["wrong_latency"]) == (sent, sent)
        # /metrics counts the refusal (its child process may serve a snapshot 2 s old).
        results = {
            ("fiomon_records_total", (("result", r),)): float(sent)
            for r in ("received", "wrong_latency")
        }

        def served() -> bool:
            m = scrape_or_none(port) or {}
            return all(m.get(k) == v for k, v in results.items())

        await until(served, what=f"/metrics: {sent} records received, {sent} wrong_latency")
    finally:
        for a in agents:
            a.terminate()
            await a.wait()
        stop.set()
        await asyncio.wait_for(aggregator, DEADLINE_S)

    rows = [json.loads(line) for line in (tmp_path / "quanta.jsonl").read_text().splitlines()]
    # Nothing of the clat agent was merged anywhere: no host rows, and the cluster holds
    # the run's I/Os once.
    assert {r["host"] for r in rows if r["scope"] == "host"} == {"lat-host"}
    (read,) = [r for r in rows if r["scope"] == "cluster" and r["direction"] == "read"]
    final = docs[-1]["jobs"][0]["read"]
    assert read["samples"] == pytest.approx(final["lat_ns"]["N"], rel=1e-12)
    # fio's own whole-run lat_ns percentiles, within one bin; far from its clat_ns ones.
    said = {}
    for key in ("50", "90", "99", "99.9"):
        fio_key = f"{float(key):.6f}"
        got = _bin(read["percentiles_ns"][key])
        lat, clat = (_bin(final[k]["percentile"][fio_key]) for k in ("lat_ns", "clat_ns"))
        said[key] = (read["percentiles_ns"][key], final["lat_ns"]["percentile"][fio_key])
        assert abs(got - lat) <= 1, (key, said[key])
        assert abs(got - clat) > 1, (key, "the clat bins were merged")
    print(f"aggregator p (ns) vs fio's lat_ns: {said}; {sent} records refused from clat-host")
    # Logged once, naming the agent and both kinds, however many messages it sent.
    told = [r.getMessage() for r in caplog.records if "refused records of" in r.getMessage()]
    assert len(told) == 1, told
    assert "clat-host" in told[0] and "clat latency" in told[0] and "merges lat" in told[0]
