"""The agent through fio's real file lifecycle: every I/O fio completed is counted once.

Real fio writes the files, a real Mosquitto carries the records, the agent runs as its own
process, and a subscriber keeps each record by ``(stream, seq)`` with its I/O count. The
ground truth is ``fiomon report`` on the same files (copied before fio overwrites them) or
the cumulative counts of fio's last json+ document. Each scenario also checks that the
agent never exits on its own and stays under 150 MB of resident memory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.agent.agentkit import (
    PREFIX,
    AgentProcess,
    Subscriber,
    agent_yaml,
    json_total_ios,
    python_child,
    report_samples,
    subscribed,
)
from tests.conftest import Mosquitto

pytestmark = pytest.mark.fio

ROOT = Path(__file__).resolve().parents[2]
RSS_LIMIT_MB = 150


def fio_job(data: Path, seconds: int, *, jobs: int = 2, iops: int = 150) -> list[str]:
    return [
        "--name=lifecycle",
        f"--filename={data}",
        "--size=8M",
        "--rw=randrw",
        "--bs=4k",
        "--ioengine=psync",
        f"--rate_iops={iops}",
        "--time_based",
        f"--runtime={seconds}",
        f"--numjobs={jobs}",
    ]


async def run(cmd: list[str], within: float = 90.0) -> None:
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(within):
        _, err = await proc.communicate()
    assert proc.returncode == 0, f"{cmd[:4]}... failed: {err.decode()[-2000:]}"


def hist_streams(sub: Subscriber) -> set[str]:
    return {st for st, _ in sub.seen if "_clat_hist" in st}


@pytest.fixture
def agent_proc(tmp_path: Path) -> Iterator[list[AgentProcess]]:
    procs: list[AgentProcess] = []
    yield procs
    for p in procs:
        p.kill()


def healthy(agent: AgentProcess) -> None:
    assert agent.alive(), "the agent must never exit on its own"
    rss = agent.peak_rss_mb()
    print(f"agent peak RSS {rss:.0f} MB")
    assert rss < RSS_LIMIT_MB


async def test_documented_setup_counts_each_io_once_across_reruns(
    mosquitto: Mosquitto, tmp_path: Path, agent_proc: list[AgentProcess]
) -> None:
    """config/agent.example.yaml + `fiomon fio` twice into the same names."""
    results = tmp_path / "results"
    results.mkdir()
    cfg = yaml.safe_load((ROOT / "config" / "agent.example.yaml").read_text())
    cfg["watch"] = [w.replace("/var/lib/fio/results", str(results)) for w in cfg["watch"]]
    cfg["state_dir"] = str(tmp_path / "state")
    cfg["broker"]["port"] = mosquitto.port
    cfg["topic_prefix"] = PREFIX
    cfg["host"] = "client-07"
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(cfg))
    host = socket.gethostname().split(".", 1)[0] or "localhost"
    stream_file = results / f"{host}.json"
    truth = 0
    async with subscribed(mosquitto) as sub:
        agent = AgentProcess(tmp_path / "agent.yaml", tmp_path / "agent.log")
        agent_proc.append(agent)
        agent.start()
        for run_no, seconds in enumerate((3, 4), start=1):
            job = fio_job(tmp_path / "data", seconds)
            await run(
                [sys.executable, "-m", "fiomon", "fio", "--output-dir", str(results), "--", *job]
            )
            copy = tmp_path / f"run{run_no}.json"
            shutil.copy(stream_file, copy)
            truth += json_total_ios(copy)
            hist = sorted(results.glob("*_clat_hist.*.log"))
            assert len(hist) == 2, "fiomon fio writes one hist log per job"
            # The offline report refuses to count both views, then counts one.
            both = await asyncio.create_subprocess_exec(
                *[sys.executable, "-m", "fiomon", "report", str(copy), *map(str, hist)],
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            _, err = await both.communicate()
            assert both.returncode == 2
            assert b"--source" in err
            assert report_samples([copy, *hist], "--source", "json") == pytest.approx(
                json_total_ios(copy)
            )
            await sub.wait_for(lambda: sub.samples() >= truth, within=60)  # noqa: B023
        # Quiet for a while: nothing more arrives (hist logs stay unpublished).
        await sub.wait_for(lambda: sub.counter("files_covered") >= 4)
        healthy(agent)
        assert await agent.stop() == 0
    assert sub.samples() == truth
    assert hist_streams(sub) == set()
    assert sub.gapless()
    assert sub.invalid == 0
    assert len(sub.streams_of(stream_file)) == 2  # one stream per fio run
    print(f"documented setup: {truth} I/Os in 2 runs, received {sub.samples()} once each")


async def test_three_reruns_into_the_same_hist_logs_count_each_io_once(
    mosquitto: Mosquitto, tmp_path: Path, agent_proc: list[AgentProcess]
) -> None:
    """Hist logs with no json+ stream (published), fio re-run three times, longer each time."""
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(agent_yaml(mosquitto, [f"{logs}/*_clat_hist.*.log"], tmp_path / "state"))
    truth = 0.0
    async with subscribed(mosquitto) as sub:
        agent = AgentProcess(cfg, tmp_path / "agent.log")
        agent_proc.append(agent)
        agent.start()
        for run_no, seconds in enumerate((2, 3, 4), start=1):
            await run(
                [
                    "fio",
                    *fio_job(tmp_path / "data", seconds),
                    f"--write_hist_log={logs}/h",
                    "--log_hist_msec=250",
                    "--log_unix_epoch=1",
                    "--output=/dev/null",
                ]
            )
            copies = []
            for h in sorted(logs.glob("*.log")):
                copies.append(tmp_path / f"run{run_no}-{h.name}")
                shutil.copy(h, copies[-1])
            truth += report_samples(copies)
            await sub.wait_for(lambda: sub.samples() >= round(truth), within=60)  # noqa: B023
        healthy(agent)
        assert await agent.stop() == 0
    assert sub.samples() == round(truth)
    assert sub.gapless()
    assert sub.invalid == 0
    for h in sorted(logs.glob("*.log")):
        assert len(sub.streams_of(h)) == 3  # one stream per run, nothing carried over
    print(f"three re-runs: {round(truth)} I/Os, received {sub.samples()}")


@pytest.fixture(scope="module")
def real_lines(tmp_path_factory: pytest.TempPathFactory, fio_bin: str) -> list[str]:
    """Lines of a real fio hist log (epoch stamps, 100 ms records, both directions)."""
    folder = tmp_path_factory.mktemp("fiolines")
    subprocess.run(
        [
            fio_bin,
            *fio_job(folder / "data", 3, jobs=1, iops=400),
            f"--write_hist_log={folder}/h",
            "--log_hist_msec=100",
            "--log_unix_epoch=1",
            "--output=/dev/null",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    lines = (folder / "h_clat_hist.1.log").read_text().splitlines(keepends=True)
    assert len(lines) >= 30
    return lines


def line_ios(line: str) -> int:
    """I/Os in one hist-log line (the sum of its bins)."""
    return sum(int(x) for x in line.split(",")[3:])


def bump(line: str) -> str:
    """The same record with one more I/O in its first non-empty bin (other content)."""
    head, *bins = line.rstrip("\n").split(", ")
    fields = [head, *bins]
    for i in range(3, len(fields)):
        if fields[i] != "0":
            fields[i] = str(int(fields[i]) + 1)
            break
    return ", ".join(fields) + "\n"


async def test_rewrite_with_identical_head_and_renames_count_each_io_once(
    mosquitto: Mosquitto,
    tmp_path: Path,
    agent_proc: list[AgentProcess],
    real_lines: list[str],
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        agent_yaml(mosquitto, [f"{logs}/*_clat_hist.*.log"], tmp_path / "state", rename_grace="5s")
    )
    written: list[str] = []  # every line that reached a followed file, once

    def write(path: Path, text: list[str], mode: str = "a") -> None:
        with path.open(mode) as fh:
            fh.write("".join(text))
        written.extend(text)

    lines = real_lines
    async with subscribed(mosquitto) as sub:
        agent = AgentProcess(cfg, tmp_path / "agent.log")
        agent_proc.append(agent)
        agent.start()

        async def settled() -> None:
            # Each line is one record: its I/Os are the sum of its bins.
            want = sum(line_ios(x) for x in written)
            await sub.wait_for(lambda: sub.samples() == want, within=30)

        # In-place rewrite whose first lines are identical, longer than before.
        a = logs / "a_clat_hist.1.log"
        write(a, lines[:10], "w")
        await settled()
        with a.open("r+") as fh:  # same inode, same first 6 lines, then other records
            new = lines[:6] + [bump(x) for x in lines[6:10]] + lines[10:14]
            fh.write("".join(new))
        written.extend(new)
        await settled()
        assert len(sub.streams_of(a)) == 2

        # Rename to a name the patterns match, append to it; a new file under the old name.
        b = logs / "b_clat_hist.1.log"
        write(b, lines[14:18], "w")
        await settled()
        b2 = logs / "b_clat_hist.2.log"
        b.rename(b2)
        write(b2, lines[18:20])
        write(b, lines[20:22], "w")
        await settled()
        assert len(sub.streams_of(b)) == 2  # the renamed file kept its stream
        assert sub.streams_of(b2) == []

        # Rename to a name they do not match, append within the grace period.
        c = logs / "c_clat_hist.1.log"
        write(c, lines[22:25], "w")
        await settled()
        c.rename(logs / "c.keep")
        write(logs / "c.keep", lines[25:28])
        await settled()
        healthy(agent)
        assert await agent.stop() == 0
    assert sub.gapless()
    assert sub.invalid == 0
    print(f"rewrite and renames: {sub.samples()} I/Os, each once")


async def test_hostile_lines_neither_crash_nor_grow_the_agent(
    mosquitto: Mosquitto,
    tmp_path: Path,
    agent_proc: list[AgentProcess],
    real_lines: list[str],
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(agent_yaml(mosquitto, [f"{logs}/*_clat_hist.*.log"], tmp_path / "state"))
    bad = logs / "bad_clat_hist.1.log"
    head, *bins = real_lines[0].rstrip("\n").split(", ")
    digits30 = ", ".join([head, *bins[:-1], "9" * 30]) + "\n"
    digits22 = ", ".join([head, *bins[:5], "7" * 22, *bins[6:]]) + "\n"
    bad.write_text(real_lines[0] + digits22 + digits30 + real_lines[1])
    async with subscribed(mosquitto) as sub:
        agent = AgentProcess(cfg, tmp_path / "agent.log")
        agent_proc.append(agent)
        agent.start()
        await sub.wait_for(lambda: len(sub.seen) == 2)
        # 20 MB of digits with no newline, written while the agent follows the file.
        with bad.open("a") as fh:
            for _ in range(20):
                fh.write("7" * (1 << 20))
                fh.flush()
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # let the agent chew on it
        healthy(agent)
        with bad.open("a") as fh:
            fh.write("\n" + real_lines[2])
        await sub.wait_for(lambda: len(sub.seen) == 3)

        def bad_input() -> dict[str, int]:
            counts = sub.counters().get("bad_input", {})
            assert isinstance(counts, dict)
            return counts

        await sub.wait_for(lambda: "line-too-long" in bad_input())
        assert bad_input().get("overflow", 0) == 2
        # A restart must not crash on the same file either (it re-reads from byte 0).
        agent.kill()
        agent.start()
        await asyncio.sleep(2.0)
        healthy(agent)
        assert await agent.stop(signal.SIGTERM, within=10) == 0
    assert sub.gapless()
    assert sub.invalid == 0


UNSHARE_FILL = r"""
set -u
mount -t tmpfs -o size=2m tmpfs "$STATE" || { echo "cannot mount a tmpfs on $STATE" >&2; exit 97; }
fill() { head -c 2097152 /dev/zero > "$STATE/filler" 2>/dev/null; }
wait_for() { while [ ! -e "$1" ]; do sleep 0.1; done; }
fill
( wait_for "$FLAG.free1"; rm -f "$STATE/filler"; wait_for "$FLAG.fill2"; fill;
  touch "$FLAG.filled2"; wait_for "$FLAG.free2"; rm -f "$STATE/filler" ) &
while [ ! -e "$FLAG.done" ]; do "$@"; done
"""


async def test_full_state_directory_is_a_state_not_an_exit(
    mosquitto: Mosquitto,
    tmp_path: Path,
    agent_proc: list[AgentProcess],
    real_lines: list[str],
) -> None:
    """positions.json and the spool on a full 2 MB tmpfs; freed; full again with kill -9.

    A new stream goes out only once the positions on disk list it: while they cannot be
    written, new files wait (flagged), so a crash in that state never sends them again
    under another stream id.
    """
    logs = tmp_path / "logs"
    logs.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(agent_yaml(mosquitto, [f"{logs}/*_clat_hist.*.log"], state))
    unshare = shutil.which("unshare")
    assert unshare is not None, "util-linux's unshare is needed for the tmpfs scenario"
    ns = ["-m"] if os.geteuid() == 0 else ["-r", "-m"]
    flag = tmp_path / "flag"
    env = dict(os.environ, STATE=str(state), FLAG=str(flag))
    wrapper = [unshare, *ns, "sh", "-c", UNSHARE_FILL, "sh"]
    a = logs / "a_clat_hist.1.log"
    b = logs / "b_clat_hist.1.log"
    a.write_text("".join(real_lines[:10]))
    try:
        async with subscribed(mosquitto) as sub:
            agent = AgentProcess(cfg, tmp_path / "agent.log", wrapper=wrapper, env=env)
            agent_proc.append(agent)
            agent.start()
            await sub.wait_for(lambda: sub.fault("state_dir") is not None)
            assert sub.seen == {}, "a stream the positions do not list went out"
            await touch(f"{flag}.free1")  # space again: positions saved, the flag clears
            await sub.wait_for(lambda: len(sub.seen) == 10 and sub.fault("state_dir") is None)
            assert sub.counter("state_write_errors") > 0
            await touch(f"{flag}.fill2")
            await appears(Path(f"{flag}.filled2"))
            b.write_text("".join(bump(x) for x in real_lines[10:15]))
            await sub.wait_for(lambda: sub.fault("state_dir") is not None)
            healthy(agent)
            os.kill(python_child(agent.pid), signal.SIGKILL)  # the wrapper restarts it
            await asyncio.sleep(1.0)  # the new agent finds b again; still no room
            assert not sub.streams_of(b)
            await touch(f"{flag}.free2")
            await sub.wait_for(lambda: len(sub.seen) == 15)
            await touch(f"{flag}.done")
            os.kill(python_child(agent.pid), signal.SIGTERM)
            assert await agent.wait() == 0
    finally:
        await touch(f"{flag}.done")
    assert sub.gapless()
    assert sub.invalid == 0, "a torn message was published"
    assert len(sub.streams_of(a)) == len(sub.streams_of(b)) == 1
    truth = sum(line_ios(x) for x in real_lines[:10]) + sum(
        line_ios(bump(x)) for x in real_lines[10:15]
    )
    assert sub.samples() == truth


async def touch(path: str) -> None:
    await asyncio.to_thread(Path(path).touch)


async def appears(path: Path, within: float = 30.0) -> None:
    """Wait until a file exists (a flag another process writes; nothing to subscribe to)."""
    async with asyncio.timeout(within):
        while not await asyncio.to_thread(path.exists):  # noqa: ASYNC110 -- a file, not ours
            await asyncio.sleep(0.05)


def variant(line: str, k: int) -> str:
    """The same record with ``k`` more I/Os in its first non-empty bin (distinct files)."""
    for _ in range(k):
        line = bump(line)
    return line


async def test_many_files_under_a_low_descriptor_limit(
    mosquitto: Mosquitto,
    tmp_path: Path,
    agent_proc: list[AgentProcess],
    real_lines: list[str],
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        agent_yaml(mosquitto, [f"{logs}/*_clat_hist.*.log"], tmp_path / "state", max_open_files="8")
    )
    files = [logs / f"j{k:03d}_clat_hist.1.log" for k in range(60)]
    for k, f in enumerate(files):  # distinct contents: identical files would be copies
        f.write_text("".join(variant(x, k) for x in real_lines[k % 20 : k % 20 + 3]))
    prlimit = shutil.which("prlimit")
    assert prlimit is not None, "util-linux's prlimit is needed"
    async with subscribed(mosquitto) as sub:
        agent = AgentProcess(cfg, tmp_path / "agent.log", wrapper=[prlimit, "--nofile=64:64", "--"])
        agent_proc.append(agent)
        agent.start()
        await sub.wait_for(lambda: len(sub.seen) == 180, within=120)
        with files[0].open("a") as fh:  # a file closed to free a descriptor grows again
            fh.write(real_lines[25])
        # a copy into the watched folder is followed, not published
        shutil.copy(files[1], logs / "copy_clat_hist.1.log")
        await sub.wait_for(lambda: len(sub.seen) == 181, within=60)
        await sub.wait_for(lambda: sub.counter("files_copies") == 1)
        healthy(agent)
        assert await agent.stop() == 0
    assert sub.gapless()
    assert {len(sub.streams_of(f)) for f in files} == {1}
