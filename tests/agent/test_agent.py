"""The agent on real Mosquitto and real files: live delivery, restarts, outages, bad input.

A subscriber counts ``(stream, seq)`` after dedup; every test checks that each record the
files hold arrived (no gap) and that duplicates, if any, are only redeliveries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from fiomon.agent.service import Agent
from fiomon.config import AgentConfig, BrokerConfig
from fiomon.tools.simulate import format_line
from tests.agent.agentkit import PREFIX, subscribed
from tests.clock import T0
from tests.conftest import DEADLINE_S, Mosquitto


def hist_line(i: int, direction: int = 0) -> str:
    counts = np.zeros(1856, dtype=np.int64)
    counts[600 + i % 100] = 3 + i % 7
    return format_line(T0 + 1000 * (i + 1), direction, 4096, counts)


def agent_config(broker: Mosquitto, tmp_path: Path, **kw: object) -> AgentConfig:
    return AgentConfig(
        watch=(str(tmp_path / "data" / "*.log"), str(tmp_path / "data" / "*.json")),
        state_dir=tmp_path / "state",
        broker=BrokerConfig(port=broker.port, keepalive_s=5),
        topic_prefix=PREFIX,
        host="client-07",
        flush_interval_ms=100,
        poll_interval_ms=100,
        heartbeat_interval_ms=500,
        log_hist_msec=1000,
        **kw,  # type: ignore[arg-type]
    )


async def test_records_and_status_reach_a_subscriber(mosquitto: Mosquitto, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    log = data / "job_clat_hist.1.log"
    log.write_bytes(
        (hist_line(0) + hist_line(1)).encode()
        + b"\x00\xffjunk\n"
        + b"1,2\n"
        + hist_line(2).encode()
    )
    stop = asyncio.Event()
    async with subscribed(mosquitto) as sub:
        agent = Agent(agent_config(mosquitto, tmp_path))
        task = asyncio.create_task(agent.run(stop))
        await sub.wait_for(lambda: len(sub.seen) == 3)
        log.write_text(hist_line(9))  # fio re-run: truncated and rewritten
        await sub.wait_for(lambda: len(sub.streams_of(log)) == 2)
        stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
        await sub.wait_for(lambda: sub.status and sub.status[-1]["state"] == "offline")
    first, second = sub.streams_of(log)
    assert sub.seqs(first) == [0, 1, 2]
    assert sub.seqs(second) == [0]
    online = [s for s in sub.status if s["state"] == "online"]
    assert online, "a retained online status (heartbeat) was published"
    counters = sub.status[-1]["counters"]
    assert isinstance(counters, dict)
    assert counters["records_sent"] == 4
    assert sum(counters["bad_input"].values()) == 2  # the junk lines, counted
    saved = json.loads((tmp_path / "state" / "positions.json").read_text())
    assert saved["streams"][second]["path"] == str(log)
    assert saved["streams"][second]["acked_seq"] == 1


async def _writer(path: Path, start: int, count: int, pause: float) -> None:
    for i in range(start, start + count):
        with path.open("a") as fh:
            text = hist_line(i)
            # A line written in two parts: the agent must wait for the newline.
            fh.write(text[:40])
            fh.flush()
            await asyncio.sleep(pause / 2)
            fh.write(text[40:])
        await asyncio.sleep(pause / 2)


async def _start_agent(cfg_path: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fiomon",
        "agent",
        "--config",
        str(cfg_path),
        "--log-level",
        "debug",
        stderr=asyncio.subprocess.DEVNULL,
    )


def _write_config(broker: Mosquitto, tmp_path: Path) -> Path:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"broker: {{host: 127.0.0.1, port: {broker.port}, keepalive: 5s}}\n"
        f"topic_prefix: {PREFIX}\nhost: client-07\n"
        f"watch: ['{tmp_path}/data/*.log']\nstate_dir: {tmp_path}/state\n"
        "flush_interval: 100ms\npoll_interval: 100ms\nheartbeat_interval: 1s\n"
        "log_hist_msec: 1000\n"
    )
    return cfg


async def test_kill_9_and_restart_lose_nothing(mosquitto: Mosquitto, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    log = tmp_path / "data" / "job_clat_hist.1.log"
    cfg = _write_config(mosquitto, tmp_path)
    total = 150
    async with subscribed(mosquitto) as sub:
        agent = await _start_agent(cfg)
        writer = asyncio.create_task(_writer(log, 0, total, 0.02))
        await sub.wait_for(lambda: len(sub.seen) >= 20)
        agent.send_signal(signal.SIGKILL)  # no goodbye, no final checkpoint
        await agent.wait()
        # The broker publishes the Will: the host is marked offline at once.
        await sub.wait_for(lambda: sub.status and sub.status[-1]["state"] == "offline")
        await asyncio.sleep(0.5)  # the scenario: fio writes on while no agent runs
        agent = await _start_agent(cfg)
        await writer
        await sub.wait_for(lambda: len(sub.seen) >= total)
        agent.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(agent.wait(), DEADLINE_S) == 0
    streams = sub.streams_of(log)
    assert len(streams) == 1, f"one file, one stream: {streams}"
    missing = sorted(set(range(total)) - set(sub.seqs(streams[0])))
    assert sub.seqs(streams[0]) == list(range(total)), f"missing seqs {missing[:20]}"
    # Redeliveries are possible after kill -9 (acknowledged but not yet checkpointed);
    # never more than one checkpoint interval's worth.
    print(f"kill -9: {total} records, {sub.duplicates} redelivered and dropped by dedup")
    assert sub.duplicates <= total // 2


async def test_broker_outage_of_10_s_loses_nothing(mosquitto: Mosquitto, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    log = tmp_path / "data" / "job_clat_hist.1.log"
    cfg = _write_config(mosquitto, tmp_path)
    async with subscribed(mosquitto) as sub:
        agent = await _start_agent(cfg)
        writer = asyncio.create_task(_writer(log, 0, 40, 0.05))
        await sub.wait_for(lambda: len(sub.seen) >= 5)
        mosquitto.stop()
        await asyncio.sleep(10)  # the scenario: a 10 s outage, the agent spools meanwhile
        mosquitto.start()
        await writer
        await sub.wait_for(lambda: len(sub.seen) >= 40)
        agent.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(agent.wait(), DEADLINE_S) == 0
    (stream,) = sub.streams_of(log)
    assert sub.seqs(stream) == list(range(40))
    log_text = (mosquitto.folder / "mosquitto.log").read_text()
    assert "fiomon-agent-client-07" in log_text


@pytest.mark.fio
async def test_live_fio_records_arrive_within_2_s_while_fio_runs(
    mosquitto: Mosquitto, tmp_path: Path, fio_bin: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    out = data / "live.json"
    stop = asyncio.Event()
    async with subscribed(mosquitto) as sub:
        agent = asyncio.create_task(Agent(agent_config(mosquitto, tmp_path)).run(stop))
        fio = await asyncio.create_subprocess_exec(
            fio_bin,
            "--name=live",
            f"--filename={tmp_path / 'fio.dat'}",
            "--size=16M",
            "--rw=randrw",
            "--bs=4k",
            "--ioengine=psync",
            "--rate_iops=300",
            "--time_based",
            "--runtime=20",
            "--status-interval=1",
            "--output-format=json+",
            f"--output={out}",
            "--eta=never",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await sub.wait_for(lambda: len(sub.seen) >= 20)
        assert fio.returncode is None, "records must arrive while fio still runs"
        live = list(sub.arrivals)
        assert await asyncio.wait_for(fio.wait(), DEADLINE_S) == 0
        stop.set()
        await asyncio.wait_for(agent, DEADLINE_S)
    delays = sorted(arrived - end for arrived, end in live)
    print(
        f"live fio: {len(live)} records while running, delay median {delays[len(delays) // 2]} "
        f"ms, max {delays[-1]} ms"
    )
    assert delays[-1] <= 2000
    streams = {st for st, _ in sub.seen}
    assert len(streams) == 1
    (stream,) = streams
    assert sub.seqs(stream) == list(range(len(sub.seqs(stream))))


async def test_partial_line_completed_after_a_restart_arrives_once(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    log = data / "job_clat_hist.1.log"
    second = hist_line(1)
    log.write_text(hist_line(0) + second[:100])
    async with subscribed(mosquitto) as sub:
        for text in (second[100:] + hist_line(2), ""):
            stop = asyncio.Event()
            task = asyncio.create_task(Agent(agent_config(mosquitto, tmp_path)).run(stop))
            want = 1 if text else 3
            await sub.wait_for(lambda: len(sub.seen) >= want)  # noqa: B023 -- awaited here
            stop.set()
            await asyncio.wait_for(task, DEADLINE_S)
            if text:
                with log.open("a") as fh:
                    fh.write(text)  # the line is completed while no agent runs
    (stream,) = sub.streams_of(log)
    assert sub.seqs(stream) == [0, 1, 2]
    assert sub.duplicates == 0


async def test_hist_logs_of_fio_client_are_not_published(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    # fio --client writes every server's logs on the controller, as running sums, at the
    # end of the run: a watch pattern that matches them must not publish them as this
    # host's records (README "fio's client/server mode").
    data = tmp_path / "data"
    data.mkdir()
    client_log = data / "h_clat_hist.1.log.10.0.0.2"
    client_log.write_text(hist_line(0) + hist_line(1))
    log = data / "job_clat_hist.1.log"
    log.write_text(hist_line(0) + hist_line(1))
    cfg = agent_config(mosquitto, tmp_path)
    cfg = dataclasses.replace(cfg, watch=(str(data / "*_clat_hist*.log*"),))
    stop = asyncio.Event()
    async with subscribed(mosquitto) as sub:
        task = asyncio.create_task(Agent(cfg).run(stop))
        await sub.wait_for(lambda: len(sub.seen) == 2 and sub.counter("files_refused") == 1)
        stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
    assert [st.rsplit("@", 1)[0] for st, _ in sub.seen] == [str(log), str(log)]
