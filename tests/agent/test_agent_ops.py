"""The agent as an operator runs it: clean stops, SIGHUP, a taken client id, /metrics.

Real Mosquitto, real ``fiomon agent`` processes (their stderr kept), a subscriber on
the status topics.
"""

from __future__ import annotations

import asyncio
import functools
import re
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from fiomon.build import revision
from tests.agent.agentkit import AgentProcess, Subscriber, agent_yaml, start_agent, subscribed
from tests.aggregator.test_metrics_live import git_head
from tests.conftest import DEADLINE_S, FIXTURES, Mosquitto, free_port, until
from tests.metricskit import http_get, parse_samples


def online_since(sub: Subscriber, m: int) -> bool:
    """An ``online`` status came after the first ``m``."""
    return any(s.get("state") == "online" for s in sub.status[m:])


def more_records(sub: Subscriber, n: int) -> bool:
    """More than ``n`` records came."""
    return len(sub.seen) > n


async def test_seven_clean_stops_log_no_traceback(
    mosquitto: Mosquitto, tmp_path: Path, agents: list[AgentProcess], fio_bin: str
) -> None:
    """SIGTERM while fio runs and records flow: exit 0 and no traceback, 7 of 7."""
    results = tmp_path / "results"
    results.mkdir()
    fio = subprocess.Popen(  # noqa: ASYNC220 -- runs beside the test, killed at its end
        [
            fio_bin,
            "--name=ops",
            f"--filename={tmp_path / 'data'}",
            "--size=4M",
            "--rw=randrw",
            "--bs=4k",
            "--ioengine=psync",
            "--rate_iops=300",
            "--time_based",
            "--runtime=120",
            f"--write_hist_log={results}/ops",
            "--log_hist_msec=100",
            "--log_unix_epoch=1",
            "--output-format=json+",
            "--status-interval=1",
            f"--output={results}/ops.json",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with subscribed(mosquitto) as sub:
            for i in range(7):
                n, m = len(sub.seen), len(sub.status)
                agent = start_agent(mosquitto, tmp_path, agents, f"a{i}")
                await sub.wait_for(functools.partial(online_since, sub, m))
                await sub.wait_for(functools.partial(more_records, sub, n + 5))
                rc = await agent.stop(signal.SIGTERM)
                text = agent.log.read_text()
                assert rc == 0, f"stop {i + 1} of 7: rc {rc}:\n{text}"
                assert "Traceback" not in text, f"stop {i + 1} of 7 logged:\n{text}"
                assert "Errno 9" not in text, f"stop {i + 1} of 7 logged:\n{text}"
    finally:
        fio.kill()
        fio.wait()


async def test_sighup_reloads_watch_and_names_what_needs_a_restart(
    mosquitto: Mosquitto, tmp_path: Path, agents: list[AgentProcess]
) -> None:
    """SIGHUP: the agent lives on, follows the new glob, and names the keys it cannot take."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    hist = (FIXTURES / "fio333_randrw_clat_hist.1.log").read_text()
    (first / "a_clat_hist.1.log").write_text(hist)
    later = [
        f"{int(ln.split(',', 1)[0]) + 60_000},{ln.split(',', 1)[1]}" for ln in hist.splitlines()
    ]
    (second / "b_clat_hist.1.log").write_text("\n".join(later) + "\n")  # other records
    cfg = tmp_path / "agent.yaml"
    state = tmp_path / "state"
    cfg.write_text(agent_yaml(mosquitto, [f"{first}/*_clat_hist.*.log"], state))
    agent = AgentProcess(cfg, tmp_path / "agent.log")
    agents.append(agent)
    async with subscribed(mosquitto) as sub:
        agent.start()
        await sub.wait_for(lambda: sub.streams_of(first / "a_clat_hist.1.log"))
        await sub.wait_for(lambda: online_since(sub, 0))
        cfg.write_text(
            agent_yaml(
                mosquitto,
                [f"{first}/*_clat_hist.*.log", f"{second}/*_clat_hist.*.log"],
                state,
                log_level="debug",
                run="after-hup",
                spool_size="8MiB",
            )
        )
        assert agent.proc is not None
        agent.proc.send_signal(signal.SIGHUP)
        await sub.wait_for(lambda: sub.streams_of(second / "b_clat_hist.1.log"))
        await until(lambda: "take effect at the next start" in agent.log.read_text(), what="log")
        assert agent.alive(), f"SIGHUP ended the agent:\n{agent.log.read_text()}"
        # a file that does not load: logged, the running configuration stays
        cfg.write_text("watch: 3\n")
        agent.proc.send_signal(signal.SIGHUP)
        await until(lambda: "not reloaded" in agent.log.read_text(), what="refusal")
        assert agent.alive()
        assert await agent.stop() == 0
    text = agent.log.read_text()
    assert "SIGHUP: reloaded" in text and "watch" in text
    assert "log_level None -> 'debug'" in text
    assert "run None -> 'after-hup'" in text
    assert "spool_bytes changed but take effect at the next start" in text
    assert "Traceback" not in text, text


def instance_of(agent: AgentProcess) -> str:
    """The instance id the agent logged at its start."""
    found = re.findall(r"\(instance (\w+), client id", agent.log.read_text())
    assert found, agent.log.read_text()
    return str(found[-1])


@pytest.mark.parametrize("own_ids", [False, True], ids=["one-client-id", "own-client-ids"])
async def test_two_agents_with_one_host_name_each_name_the_other(
    mosquitto: Mosquitto, tmp_path: Path, agents: list[AgentProcess], own_ids: bool
) -> None:
    """One host name: each agent names the other; with one client id, also the taken id.

    With the default client id (``fiomon-agent-<host>``) the broker drops one connection
    whenever the other connects, so they take turns (paho said only ``[code:4] The client
    is not currently connected``); with their own client ids both stay connected and
    publish under one name.
    """
    async with subscribed(mosquitto):
        ids = ("agent-a", "agent-b") if own_ids else (None, None)
        a = start_agent(mosquitto, tmp_path, agents, "a", state="state-a", client_id=ids[0])
        b = start_agent(mosquitto, tmp_path, agents, "b", state="state-b", client_id=ids[1])

        def both_named() -> bool:
            ta, tb = a.log.read_text(), b.log.read_text()
            return "another agent with host name 'client-07'" in ta and (
                "another agent with host name 'client-07'" in tb
            )

        await until(both_named, what="both agents name the conflict", within=90)
        for me, other in ((a, b), (b, a)):
            text = me.log.read_text()
            assert f"(instance {instance_of(other)}, pid {other.pid} on " in text, text
            taken = "our MQTT client id 'fiomon-agent-client-07' is in use by another connection"
            assert (taken in text) == (not own_ids), text
            assert me.alive()
        for me in (a, b):
            assert await me.stop() == 0
            assert "Traceback" not in me.log.read_text()


async def test_agent_metrics_on_request_with_process_build_and_probes(
    mosquitto: Mosquitto, tmp_path: Path, agents: list[AgentProcess]
) -> None:
    """``metrics_listen``: process_*, build_info with the checkout's commit, /-/ready."""
    port = free_port()
    async with subscribed(mosquitto) as sub:
        agent = start_agent(mosquitto, tmp_path, agents, "a", metrics_listen=f"127.0.0.1:{port}")
        await sub.wait_for(functools.partial(online_since, sub, 0))

        async def probe(path: str) -> tuple[int, str]:
            return await asyncio.to_thread(http_get, port, path)

        await until_async(lambda: probe("/-/ready"), (200, "fiomon is ready.\n"))
        assert await probe("/-/healthy") == (200, "fiomon is healthy.\n")
        status, text = await probe("/metrics")
        assert status == 200
        samples = parse_samples(text)
        head = git_head()
        build = [k for k in samples if k[0] == "fiomon_build_info"]
        assert len(build) == 1 and dict(build[0][1])["revision"] == head == revision()
        assert samples[("fiomon_agent_broker_connected", ())] == 1
        assert ("fiomon_agent_records_sent_total", ()) in samples
        assert samples[("process_resident_memory_bytes", ())] > 20e6
        assert 0 < samples[("process_cpu_seconds_total", ())] < 60
        assert samples[("process_start_time_seconds", ())] > time.time() - 120
        assert samples[("process_open_fds", ())] >= 5  # the broker, the listener, ...
        mosquitto.stop()  # no broker: alive (healthy), not ready, and says why
        await until_async(
            lambda: probe("/-/ready"),
            (503, "fiomon is not ready: not connected to the MQTT broker\n"),
        )
        assert (await probe("/-/healthy"))[0] == 200
        assert await agent.stop() == 0


async def until_async(get: Callable[[], Awaitable[tuple[int, str]]], want: tuple[int, str]) -> None:
    """Until ``get()`` returns ``want`` (the last answer in the failure)."""
    got: list[tuple[int, str]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not got or got[-1] != want:
        assert loop.time() < deadline, f"wanted {want}, last got {got[-1:]}"
        if got:
            await asyncio.sleep(0.2)
        got.append(await get())


def take_client_id(port: int, client_id: str) -> None:
    """Connect with ``client_id`` (MQTT 3.1.1, clean session) and hang up at once."""
    ident = client_id.encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x3c" + len(ident).to_bytes(2, "big") + ident
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S) as s:
        s.sendall(bytes([0x10, len(body)]) + body)
        assert s.recv(4)[:1] == b"\x20"  # CONNACK: the agent's connection is dropped


async def test_takeovers_while_publishing_leave_no_traceback(
    mosquitto: Mosquitto, tmp_path: Path, agents: list[AgentProcess]
) -> None:
    """Another client takes the agent's client id 25 times while it publishes a stream.

    Each takeover closes the agent's socket in the middle of its publishing: aiomqtt 2.5
    then registered a reader or writer for a closed (or since reused) descriptor, and
    asyncio logged ``OSError: [Errno 9] Bad file descriptor`` or ``FileNotFoundError``
    tracebacks; a new connection could be left with no reader at all (stalled until its
    keep-alive expired).
    """
    logs = tmp_path / "results"
    logs.mkdir()
    hist = (FIXTURES / "fio333_randrw_clat_hist.1.log").read_text().splitlines()
    t0 = int(hist[0].split(",", 1)[0])
    written = 0

    def append(n: int) -> None:
        nonlocal written
        with (logs / "x_clat_hist.1.log").open("a") as fh:
            for i in range(written, written + n):
                rest = hist[i % len(hist)].split(",", 1)[1]
                fh.write(f"{t0 + 100 * i},{rest}\n")
        written += n

    async with subscribed(mosquitto) as sub:
        agent = start_agent(mosquitto, tmp_path, agents, "a", max_message_size="16KiB")
        await sub.wait_for(functools.partial(online_since, sub, 0))
        for k in range(25):
            append(40)  # a burst of messages to publish, PUBACK by PUBACK
            await asyncio.sleep(0.05 + 0.01 * (k % 5))
            await asyncio.to_thread(take_client_id, mosquitto.port, "fiomon-agent-client-07")
            await asyncio.sleep(0.2)
        await sub.wait_for(lambda: len(sub.seen) == written, within=60)
        assert await agent.stop() == 0
    text = agent.log.read_text()
    for bad in ("Traceback", "Bad file descriptor", "No such file or directory"):
        assert bad not in text, text[-4000:]
