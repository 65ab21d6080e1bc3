"""Stream identity on real fio output: lost positions, copies that diverge, json+ heads.

Real fio writes the files, a real Mosquitto carries the records, the agent runs as its own
process, and the subscriber keeps each record by ``(stream, seq)`` with its I/O count (and
replays every message through the aggregator's own dedup, :class:`SeqTracker`). Ground
truth is fio's: the cumulative counts of a json+ stream's last document, the bins of a
hist log's lines.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.agentkit import AgentProcess, Subscriber, agent_yaml, json_total_ios, subscribed
from tests.conftest import DEADLINE_S, Mosquitto, until

pytestmark = pytest.mark.fio


def fio_args(data: Path, seconds: int, *, iops: int = 100, rw: str = "randrw") -> list[str]:
    return [
        "--name=ident",
        f"--filename={data}",
        "--size=4M",
        f"--rw={rw}",
        "--bs=4k",
        "--ioengine=psync",
        f"--rate_iops={iops}",
        "--time_based",
        f"--runtime={seconds}",
    ]


def fio(fio_bin: str, *args: str) -> None:
    subprocess.run([fio_bin, *args], check=True, capture_output=True, timeout=DEADLINE_S)


def line_samples(lines: list[str]) -> int:
    """I/Os of hist-log lines: the sum of their bins (fields after time, dir, bs)."""
    return sum(sum(int(v) for v in ln.split(",")[3:]) for ln in lines if ln.strip())


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    procs: list[AgentProcess] = []
    yield procs
    for p in procs:
        p.kill()


def start_agent(
    broker: Mosquitto, tmp_path: Path, watch: list[str], agents: list[AgentProcess]
) -> AgentProcess:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(agent_yaml(broker, watch, tmp_path / "state"))
    agent = AgentProcess(cfg, tmp_path / "agent.log")
    agents.append(agent)
    agent.start()
    return agent


async def test_lost_positions_resend_under_the_same_ids_and_the_aggregator_drops_them(
    mosquitto: Mosquitto, tmp_path: Path, fio_bin: str, agents: list[AgentProcess]
) -> None:
    """A corrupt, then an emptied positions.json: each restart re-reads everything, as dups."""
    results = tmp_path / "results"
    results.mkdir()
    stream_file = results / "run.json"
    fio(
        fio_bin,
        *fio_args(tmp_path / "data", 3),
        "--status-interval=1",
        "--output-format=json+",
        f"--output={stream_file}",
    )
    fio(
        fio_bin,
        *fio_args(tmp_path / "data", 2),
        f"--write_hist_log={results}/h",
        "--log_hist_msec=500",
        "--log_unix_epoch=1",
        "--output=/dev/null",
    )
    hist = results / "h_clat_hist.1.log"
    truth = json_total_ios(stream_file) + line_samples(hist.read_text().splitlines())
    watch = [f"{results}/*.json", f"{results}/*_clat_hist.*.log"]
    positions = tmp_path / "state" / "positions.json"
    async with subscribed(mosquitto) as sub:
        agent = start_agent(mosquitto, tmp_path, watch, agents)
        await sub.wait_for(lambda: sub.samples() >= truth)
        assert await agent.stop() == 0
        records = len(sub.seen)
        for damage in (b'{"version": 2, "streams": {"x', b""):
            positions.write_bytes(damage)
            resent = sub.duplicates
            agent = start_agent(mosquitto, tmp_path, watch, agents)
            # Everything is read again from byte 0 and re-sent: as the same (stream, seq).
            await sub.wait_for(lambda: sub.duplicates >= resent + records)  # noqa: B023
            await until(positions.exists, what="positions saved again")
            assert await agent.stop() == 0
            assert len(sub.seen) == records, "a resend under a new stream id"
            assert (tmp_path / "state" / "positions.json.damaged").read_bytes() == damage
    log = (tmp_path / "agent.log").read_text()
    assert log.count("positions file damaged") == 2
    assert sub.samples() == truth
    assert sub.deduplicated_samples() == truth
    assert sub.gapless()
    assert sub.invalid == 0
    print(
        f"lost positions twice: fio {truth} I/Os; received {sub.samples()} once each, "
        f"{sub.duplicates} records re-sent as duplicates; the aggregator's dedup keeps "
        f"{sub.deduplicated_samples()}"
    )


async def wait_quiet(sub: Subscriber, agent: AgentProcess) -> None:
    """Until the agent has read everything: a heartbeat after its files went quiet."""
    await sub.wait_for(lambda: sub.counter("records_sent") == len(sub.seen))
    beats = len(sub.status)
    await sub.wait_for(lambda: len(sub.status) >= beats + 2)
    assert agent.alive()


async def test_a_copy_that_diverges_from_its_original_publishes_its_own_records(
    mosquitto: Mosquitto, tmp_path: Path, fio_bin: str, agents: list[AgentProcess]
) -> None:
    """cp of a prefix of a real hist log (a copy: not published), then other real lines."""
    runs = []
    for k in range(2):
        fio(
            fio_bin,
            *fio_args(tmp_path / "data", 3, iops=200),
            f"--write_hist_log={tmp_path}/r{k}",
            "--log_hist_msec=250",
            "--log_unix_epoch=1",
            "--output=/dev/null",
        )
        runs.append((tmp_path / f"r{k}_clat_hist.1.log").read_text().splitlines(keepends=True))
    a, b = runs
    keep = 5
    assert len(a) > keep + 2
    assert len(b) > keep + 2
    logs = tmp_path / "logs"
    logs.mkdir()
    original = logs / "a_clat_hist.1.log"
    original.write_text("".join(a))
    async with subscribed(mosquitto) as sub:
        agent = start_agent(mosquitto, tmp_path, [f"{logs}/*_clat_hist.*.log"], agents)
        await sub.wait_for(lambda: sub.samples() >= line_samples(a))
        copy = logs / "copy_clat_hist.1.log"
        copy.write_text("".join(a[:keep]))  # a prefix of the original: a copy
        await sub.wait_for(lambda: sub.counter("files_copies") == 1)
        await wait_quiet(sub, agent)
        assert sub.samples() == line_samples(a)
        with copy.open("a") as fh:  # now it diverges: the lines of another run
            fh.write("".join(b[keep:]))
        truth = line_samples(a) + line_samples(b[keep:])
        await sub.wait_for(lambda: sub.samples() >= truth)
        await wait_quiet(sub, agent)
        assert await agent.stop() == 0
    assert sub.samples() == truth
    (own,) = sub.streams_of(copy)
    # The copy's first `keep` records are the original's bytes: never published again.
    assert sub.seqs(own) == list(range(keep, len(a[:keep]) + len(b[keep:])))
    assert sub.invalid == 0
    assert sub.duplicates == 0
    print(
        f"diverging copy: expected {truth} I/Os ({line_samples(a)} original + "
        f"{line_samples(b[keep:])} of the copy's own), received {sub.samples()}"
    )
