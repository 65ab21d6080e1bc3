"""``watch: [results/**/...]``: a real agent finds real fio runs in run folders made later.

Harnesses file each run in a folder of its own, created while the agent already runs
(``results/<date>/run1/``, CBT's ``results/<n>/id-<x>/``). The agent subscribes nothing in
advance; every I/O of both runs must reach the broker once, counted against fio's
``total_ios`` (json+ stream) and the hist log's own sum (a run with plain json output).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agent.agentkit import AgentProcess, agent_yaml, subscribed
from tests.conftest import Mosquitto
from tests.fiorun import job_file, start_fio, total_ios, wait_fio

pytestmark = pytest.mark.fio


def _of(path: Path) -> Callable[[str], bool]:
    return lambda st: st.rsplit("@", 1)[0] == str(path)


def log_sum(path: Path) -> int:
    return sum(
        sum(int(x) for x in line.split(",")[3:])
        for line in path.read_text().splitlines()
        if line.strip()
    )


async def test_runs_in_new_nested_folders_are_followed(
    mosquitto: Mosquitto, tmp_path: Path, fio_bin: str
) -> None:
    results = tmp_path / "results"  # does not exist when the agent starts
    watch = [str(results / "**" / "*.json"), str(results / "**" / "*_clat_hist.*.log")]
    config = tmp_path / "agent.yaml"
    config.write_text(agent_yaml(mosquitto, watch, tmp_path / "state"))
    agent = AgentProcess(config, tmp_path / "agent.log")
    async with subscribed(mosquitto) as sub:
        agent.start()
        try:
            await sub.wait_for(lambda: sub.status)  # online, before any run folder exists
            run1 = results / "2026-11-27" / "run1"
            run2 = results / "00000000" / "id-1" / "client-07"
            procs = [
                start_fio(fio_bin, job_file(run1, iops=100, runtime=3), run1 / "out.json"),
                start_fio(
                    fio_bin, job_file(run2, iops=150, runtime=3), run2 / "out.json", fmt="json"
                ),
            ]
            await asyncio.to_thread(wait_fio, procs)
            want1 = total_ios(run1 / "out.json")
            want2 = log_sum(run2 / "run_clat_hist.1.log")
            await sub.wait_for(
                lambda: (
                    sub.samples(_of(run1 / "out.json")) >= want1
                    and sub.samples(_of(run2 / "run_clat_hist.1.log")) >= want2
                )
            )
        finally:
            rc = await agent.stop()
    log = (tmp_path / "agent.log").read_text()
    print(f"nested runs: {sub.samples()} I/Os published against {want1} + {want2}")
    assert rc == 0, log
    assert sub.samples(_of(run1 / "out.json")) == want1 > 0
    assert sub.samples(_of(run2 / "run_clat_hist.1.log")) == want2 > 0
    assert sub.samples() == want1 + want2  # run1's own hist log is covered by its stream
    assert sub.duplicates == 0
    assert sub.gapless()
    assert "has matched no file" not in log
