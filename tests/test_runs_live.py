"""Run identity live, on real parts: ``fiomon fio --name`` -> agent ``run: "{dir}"`` ->
Mosquitto -> aggregator -> quanta file rows with ``runs`` and ``fiomon_run_info{run}``.

Two runs one after the other, each started by ``fiomon fio --name`` into its own folder
(created after the agent started, found through a ``**`` pattern). Every I/O fio counted
(``total_ios``) is in the rows of its run, and no row mixes the runs.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.agentkit import PREFIX, AgentProcess, agent_yaml
from tests.conftest import DEADLINE_S, Mosquitto, free_port, until
from tests.fiorun import fiomon, total_ios
from tests.metricskit import scrape_or_none, wait_http

pytestmark = pytest.mark.fio


def fiomon_fio(results: Path, name: str, data: Path, runtime: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "fiomon", "fio", "--name", name, "--output-dir", str(results),
            "--", "--name=j", "--ioengine=psync", "--rw=randread", "--bs=4k", "--size=1m",
            f"--filename={data}", "--time_based", f"--runtime={runtime}", "--rate_iops=200",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def start_aggregator(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "fiomon", "aggregator", "--config", str(config), "--final"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def run_samples(quanta: Path, run: str) -> tuple[float, int]:
    """Cluster ``all`` samples of ``fiomon report --run RUN`` on the quanta file, and rows."""
    r = fiomon("report", "--format", "jsonl", "--run", run, quanta)
    if r.returncode != 0:
        return 0.0, 0
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    cluster = [x for x in rows if x["scope"] == "cluster" and x["direction"] == "all"]
    assert all(x["runs"] == [run] for x in cluster), "a row mixes runs"
    return sum(x["samples"] for x in cluster), len(cluster)


async def test_two_named_runs_are_told_apart_in_rows_and_metrics(
    mosquitto: Mosquitto, tmp_path: Path, fio_bin: str
) -> None:
    del fio_bin  # `fiomon fio` finds it on PATH
    results, quanta, port = tmp_path / "results", tmp_path / "quanta.jsonl", free_port()
    agg = tmp_path / "aggregator.yaml"
    agg.write_text(
        f"broker: {{port: {mosquitto.port}}}\ntopic_prefix: {PREFIX}\nquantum: 1s\n"
        f"lateness: 2s\nlisten: 127.0.0.1:{port}\nquanta_file: {quanta}\n"
        f"state_dir: {tmp_path / 'agg-state'}\n"
    )
    watch = [str(results / "**" / "*.json"), str(results / "**" / "*_clat_hist.*.log")]
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(agent_yaml(mosquitto, watch, tmp_path / "state", run='"{dir}"'))
    agent = AgentProcess(cfg, tmp_path / "agent.log")
    aggregator = start_aggregator(agg, tmp_path / "aggregator.log")
    data = tmp_path / "data"
    data.write_bytes(b"\0" * (1 << 20))
    seen_runs: set[str] = set()
    try:
        agent.start()
        await wait_http(f"http://127.0.0.1:{port}/metrics")
        await mosquitto.wait_for_log(" as fiomon-agent-client-07 (")
        for name, runtime in (("run-a", 3), ("run-b", 4)):
            fio = fiomon_fio(results, name, data, runtime)
            while fio.poll() is None:  # the gauge names the run while it is on
                s = await asyncio.to_thread(scrape_or_none, port)
                for (metric, labels), v in (s or {}).items():
                    if metric == "fiomon_run_info" and v == 1:
                        seen_runs.add(dict(labels)["run"])
                await asyncio.sleep(0.3)
            _, err = fio.communicate()
            assert fio.returncode == 0, err
        host = socket.gethostname().split(".", 1)[0]
        out_a, out_b = results / "run-a" / f"{host}.json", results / "run-b" / f"{host}.json"
        assert (results / "run-a" / f"{host}_clat_hist.1.log").exists()
        want = {"run-a": total_ios(out_a), "run-b": total_ios(out_b)}
        await until(
            lambda: all(abs(run_samples(quanta, r)[0] - n) < 1e-6 * n for r, n in want.items()),
            what=f"the quanta file holds every I/O of each run: {want}",
            within=DEADLINE_S,
            every=1.0,
        )
    finally:
        await agent.stop()
        aggregator.send_signal(signal.SIGTERM)
        aggregator.wait(30)
    got = {r: run_samples(quanta, r) for r in want}
    print(f"runs: {got} against fio's total_ios {want}; gauge saw {sorted(seen_runs)}")
    assert seen_runs == {"run-a", "run-b"}
    assert all(rows >= 3 for _, rows in got.values())
    assert got["run-a"][0] == pytest.approx(want["run-a"], rel=1e-9)
    assert got["run-b"][0] == pytest.approx(want["run-b"], rel=1e-9)
    every = [json.loads(x) for x in quanta.read_text().splitlines()]
    assert {tuple(x.get("runs", ())) for x in every} == {("run-a",), ("run-b",)}
