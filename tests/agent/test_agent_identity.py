"""Stream identity on real fio output: lost positions, copies that diverge, json+ heads.

Real fio writes the files, a real Mosquitto carries the records, the agent runs as its own
process, and the subscriber keeps each record by ``(stream, seq)`` with its I/O count (and
replays every message through the aggregator's own dedup, :class:`SeqTracker`). Ground
truth is fio's: the cumulative counts of a json+ stream's last document, the bins of a
hist log's lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from fiomon.agent.follow import Follower, head_tells_kind
from tests.agent.agentkit import AgentProcess, Subscriber, json_total_ios, start_agent, subscribed
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
        agent = start_agent(mosquitto, tmp_path, agents, watch=watch)
        await sub.wait_for(lambda: sub.samples() >= truth)
        assert await agent.stop() == 0
        records = len(sub.seen)
        for damage in (b'{"version": 2, "streams": {"x', b""):
            positions.write_bytes(damage)
            resent = sub.duplicates
            agent = start_agent(mosquitto, tmp_path, agents, watch=watch)
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
        agent = start_agent(mosquitto, tmp_path, agents, watch=[f"{logs}/*_clat_hist.*.log"])
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


@pytest.fixture(scope="module")
def text_first_outputs(tmp_path_factory: pytest.TempPathFactory, fio_bin: str) -> list[bytes]:
    """Real fio output with text before the first document: json+,normal, and stdout."""
    folder = tmp_path_factory.mktemp("textfirst")
    both = folder / "both.txt"
    fio(
        fio_bin,
        *fio_args(folder / "data", 2),
        "--status-interval=1",
        "--output-format=json+,normal",
        f"--output={both}",
    )
    stdout = subprocess.run(  # psync with iodepth 4: fio prints a note: line to stdout
        [
            fio_bin,
            *fio_args(folder / "data", 1),
            "--iodepth=4",
            "--status-interval=1",
            "--output-format=json+",
        ],
        check=True,
        capture_output=True,
        timeout=DEADLINE_S,
    ).stdout
    outputs = [both.read_bytes(), stdout]
    for out in outputs:
        assert not out.startswith(b"{")
        assert b"\n{" in out
    assert stdout.startswith(b"note:")
    return outputs


def test_text_before_the_first_document_waits_for_it(
    tmp_path: Path, text_first_outputs: list[bytes]
) -> None:
    """A growing file that so far holds fio's text is neither read nor given a kind."""
    for k, out in enumerate(text_first_outputs):
        brace = out.index(b"\n{") + 1
        for n in range(0, brace + 1, 37):
            assert not head_tells_kind(out[:n]), out[:n]
        assert head_tells_kind(out[: brace + 1])
        path = tmp_path / f"run{k}.json"
        path.write_bytes(out[:brace])  # fio has written its text, not yet a document
        f = Follower((str(path),), agent="client-07", max_message_bytes=1 << 20)
        assert list(f.poll()) == []
        assert f.stats.bytes_read == 0
        assert f.stats.problems == {}
        f.close()


async def follow_fio_live(
    mosquitto: Mosquitto,
    tmp_path: Path,
    fio_bin: str,
    agents: list[AgentProcess],
    *args: str,
    stdout_to: Path | None = None,
) -> tuple[Subscriber, int]:
    """Run fio (4 s, a dump a second) while the agent follows its output; (sub, fio's I/Os)."""
    results = tmp_path / "results"
    results.mkdir()
    out = stdout_to or results / "run.json"
    cmd = [fio_bin, *fio_args(tmp_path / "data", 4), "--status-interval=1", *args]
    if stdout_to is None:
        cmd.append(f"--output={out}")
    async with subscribed(mosquitto) as sub:
        agent = start_agent(mosquitto, tmp_path, agents, watch=[f"{results}/*.json"])
        await sub.wait_for(lambda: sub.status)  # following before fio starts
        sink = os.open(out if stdout_to else os.devnull, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdout=sink, stderr=asyncio.subprocess.DEVNULL
            )
            async with asyncio.timeout(DEADLINE_S):
                assert await proc.wait() == 0
        finally:
            os.close(sink)
        truth = json_total_ios(out)
        with contextlib.suppress(TimeoutError):
            await sub.wait_for(lambda: sub.samples() >= truth, within=20)
        assert await agent.stop() == 0
    return sub, truth


@pytest.mark.parametrize("where", ["json+,normal", "stdout with note"])
async def test_text_before_json_documents_is_followed_as_a_json_stream(
    mosquitto: Mosquitto, tmp_path: Path, fio_bin: str, agents: list[AgentProcess], where: str
) -> None:
    """Needs parsers.sniff to recognise json after leading text (the parsers' change)."""
    if where == "json+,normal":
        sub, truth = await follow_fio_live(
            mosquitto, tmp_path, fio_bin, agents, "--output-format=json+,normal"
        )
    else:
        sub, truth = await follow_fio_live(
            mosquitto,
            tmp_path,
            fio_bin,
            agents,
            "--iodepth=4",  # psync: fio's note: line comes first on stdout
            "--output-format=json+",
            stdout_to=tmp_path / "results" / "stdout.json",
        )
    print(f"{where}: fio {truth} I/Os, published {sub.samples()}")
    assert sub.samples() == truth
    assert sub.invalid == 0


async def test_unified_rw_reporting_stream_is_published_live(
    mosquitto: Mosquitto, tmp_path: Path, fio_bin: str, agents: list[AgentProcess]
) -> None:
    """unified_rw_reporting=1: only `mixed` sections (needs the parsers' mixed direction)."""
    sub, truth = await follow_fio_live(
        mosquitto,
        tmp_path,
        fio_bin,
        agents,
        "--unified_rw_reporting=1",
        "--output-format=json+",
    )
    print(f"unified_rw_reporting=1: fio {truth} I/Os, published {sub.samples()}")
    assert truth > 0
    assert sub.samples() == truth
    assert sub.invalid == 0
