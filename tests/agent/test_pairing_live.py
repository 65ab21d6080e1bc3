"""One truth per I/O live: the agent's covering decision on real fio output.

Published samples are counted against fio's own ``total_ios``: exact where the json+
stream publishes, and the hist log's own sum where the log publishes (fio's log lacks the
last partial interval, never more).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fiomon.agent.follow import HOLD_S, STREAM_QUIET_S, Follower
from fiomon.agent.service import Agent
from fiomon.config import AgentConfig, BrokerConfig
from fiomon.wire import decode
from tests.agent.agentkit import PREFIX, subscribed
from tests.clock import FakeClock
from tests.conftest import DEADLINE_S, Mosquitto
from tests.fiorun import job_file, last_document, start_fio, total_ios, wait_fio

pytestmark = pytest.mark.fio

LAST_INTERVAL = 60  # I/Os a hist log may lack: fio's unwritten last partial interval


def log_sum(path: Path) -> int:
    """Every I/O a hist log holds (the sum of its bins)."""
    return sum(
        sum(int(x) for x in line.split(",")[3:])
        for line in path.read_text().splitlines()
        if line.strip()
    )


def config(broker: Mosquitto, tmp_path: Path, watch: tuple[str, ...]) -> AgentConfig:
    return AgentConfig(
        watch=watch,
        state_dir=tmp_path / "state",
        broker=BrokerConfig(port=broker.port, keepalive_s=5),
        topic_prefix=PREFIX,
        host="client-07",
        flush_interval_ms=100,
        poll_interval_ms=100,
        heartbeat_interval_ms=500,
        log_hist_msec=250,
    )


def _of(path: Path) -> Callable[[str], bool]:
    """Whether a stream id is one of ``path``'s."""
    return lambda st: st.rsplit("@", 1)[0] == str(path)


async def test_plain_json_beside_hist_logs_publishes_the_logs(
    mosquitto: Mosquitto, tmp_path: Path, fio_bin: str
) -> None:
    """--output-format=json has no bins: it declares nothing, the hist log is published."""
    data = tmp_path / "data"
    job = job_file(data, iops=200, runtime=2)
    stop = asyncio.Event()
    cfg = config(mosquitto, tmp_path, (str(data / "*.log"), str(data / "*.json")))
    async with subscribed(mosquitto) as sub:
        task = asyncio.create_task(Agent(cfg).run(stop))
        await asyncio.to_thread(
            wait_fio, [start_fio(fio_bin, job, data / "plain.json", fmt="json")]
        )
        log = data / "run_clat_hist.1.log"
        want = log_sum(log)
        await sub.wait_for(lambda: sub.samples(_of(log)) >= want)
        stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
    truth = total_ios(data / "plain.json")
    print(f"plain json + hist log: {sub.samples()} published against fio's {truth}")
    assert sub.samples(_of(log)) == want
    assert sub.samples() == want
    assert truth - LAST_INTERVAL <= want <= truth


async def test_two_concurrent_runs_with_one_prefix_in_two_folders(
    mosquitto: Mosquitto, tmp_path: Path, fio_bin: str
) -> None:
    """Run a (json+) and run b (plain json) both write 'run' hist logs, at the same time.

    a's log is covered by a's stream (its bins hold it); b's log is b's only histogram
    and no stream holds its counts: published.
    """
    a, b = tmp_path / "data" / "a", tmp_path / "data" / "b"
    ja = job_file(a, iops=100, runtime=3)
    jb = job_file(b, iops=170, runtime=3)
    stop = asyncio.Event()
    watch = (str(tmp_path / "data" / "*" / "*.log"), str(tmp_path / "data" / "*" / "*.json"))
    cfg = config(mosquitto, tmp_path, watch)
    async with subscribed(mosquitto) as sub:
        task = asyncio.create_task(Agent(cfg).run(stop))
        procs = [
            start_fio(fio_bin, ja, a / "a.json"),
            start_fio(fio_bin, jb, b / "b.json", fmt="json"),
        ]
        await asyncio.to_thread(wait_fio, procs)
        ta, want_b = total_ios(a / "a.json"), log_sum(b / "run_clat_hist.1.log")
        await sub.wait_for(
            lambda: (
                sub.samples(_of(a / "a.json")) >= ta
                and sub.samples(_of(b / "run_clat_hist.1.log")) >= want_b
            )
        )
        stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
    tb = total_ios(b / "b.json")
    print(f"two runs, one prefix: {sub.samples()} published against fio's {ta} + {tb}")
    assert sub.samples(_of(a / "a.json")) == ta
    assert sub.samples(_of(a / "run_clat_hist.1.log")) == 0
    assert sub.samples(_of(b / "run_clat_hist.1.log")) == want_b
    assert tb - LAST_INTERVAL <= want_b <= tb
    assert sub.samples() == ta + want_b


async def test_a_log_that_ends_before_the_first_dump_is_held_then_covered(
    mosquitto: Mosquitto, tmp_path: Path, fio_bin: str
) -> None:
    """--status-interval=35: job 'short' ends (its log appears) long before fio's one dump."""
    data = tmp_path / "data"
    job = _two_jobs(data)
    stop = asyncio.Event()
    cfg = config(mosquitto, tmp_path, (str(data / "*.log"), str(data / "*.json")))
    async with subscribed(mosquitto) as sub:
        task = asyncio.create_task(Agent(cfg).run(stop))
        await asyncio.to_thread(wait_fio, [start_fio(fio_bin, job, data / "run.json", interval=35)])
        truth = total_ios(data / "run.json")
        await sub.wait_for(lambda: sub.samples() >= truth)
        stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
    print(f"status-interval 35, held: {sub.samples()} published against fio's {truth}")
    assert sub.samples(_of(data / "run.json")) == truth
    assert sub.samples() == truth


def _two_jobs(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.fio"
    job.write_text(
        "[global]\nioengine=psync\nrw=randread\nbs=4k\nsize=1m\n"
        f"filename={folder}/data\ntime_based\nrate_iops=100\nlog_hist_msec=250\n"
        "log_unix_epoch=1\nwrite_hist_log=run\n"
        "[short]\nruntime=2\n[long]\nruntime=4\n"
    )
    return job


@pytest.fixture
def follower_factory() -> Iterator[list[Follower]]:
    made: list[Follower] = []
    yield made
    for f in made:
        f.close()


def test_a_log_published_first_makes_the_stream_skip_its_job(
    tmp_path: Path, fio_bin: str, follower_factory: list[Follower]
) -> None:
    """The hold ran out (the dump came more than HOLD_S after the log): one truth anyway.

    Real fio output, replayed on a fake clock: fio created its json+ output, the short
    job's log appeared, HOLD_S passed with no dump (the log went out), then fio's one
    dump came. The stream must not publish the short job again.
    """
    run = tmp_path / "run"
    wait_fio([start_fio(fio_bin, _two_jobs(run), run / "run.json", interval=35)])
    truth = total_ios(run / "run.json")
    data = tmp_path / "data"
    data.mkdir()
    clock = FakeClock(1000.0)
    f = Follower(
        (str(data / "*.log"), str(data / "*.json")),
        agent="client-07",
        max_message_bytes=256 * 1024,
        log_hist_msec=250,
        clock=clock,
    )
    follower_factory.append(f)
    published: dict[str, int] = {}
    acked: dict[str, int] = {}

    def poll(g: Follower = f) -> None:
        for m in g.poll():
            msg = decode(m.payload)
            name = Path(msg.stream.rsplit("@", 1)[0]).name
            published[name] = published.get(name, 0) + int(msg.batch.samples().sum())
            acked[m.stream] = max(acked.get(m.stream, 0), m.first_seq + m.records)

    (data / "run.json").write_text("")  # fio opened its output; no dump yet
    (data / "run_clat_hist.1.log").write_bytes((run / "run_clat_hist.1.log").read_bytes())
    poll()
    assert published == {}  # held: the stream may still show the job
    clock.t += HOLD_S + 1
    poll()
    short = log_sum(run / "run_clat_hist.1.log")
    assert published == {"run_clat_hist.1.log": short}
    (data / "run.json").write_bytes((run / "run.json").read_bytes())
    (data / "run_clat_hist.2.log").write_bytes((run / "run_clat_hist.2.log").read_bytes())
    clock.t += 1
    poll()
    clock.t += 1
    poll()
    print(f"status-interval 35, hold ran out: {published} against fio's {truth}")
    ios = {
        j["jobname"]: int(j["read"]["total_ios"]) for j in last_document(run / "run.json")["jobs"]
    }
    assert published["run.json"] == ios["long"]  # the short job went out as its log
    assert ios["short"] - LAST_INTERVAL <= short <= ios["short"]
    assert sum(published.values()) == short + ios["long"]
    assert f.stats.jobs_skipped == 1
    assert f.stats.files_covered == 1  # the long job's log: the stream holds it
    # fio goes on after an agent restart: the stream, grown, is read again from its start.
    # It skips the same job, so nothing is published twice (the logs that went out are
    # read back to decide it).
    saved = f.state(acked)
    f.close()
    doc = last_document(run / "run.json")
    doc["timestamp_ms"] += 1000  # fio's next dump: the same counts, a second later
    with (data / "run.json").open("a") as fh:
        fh.write(json.dumps(doc) + "\n")
    g = Follower(
        (str(data / "*.log"), str(data / "*.json")),
        agent="client-07",
        max_message_bytes=256 * 1024,
        log_hist_msec=250,
        state=saved,
        clock=clock,
    )
    follower_factory.append(g)
    before = dict(published)
    poll(g)
    clock.t += 1
    poll(g)
    assert published == before
    assert g.stats.jobs_skipped == 1


def test_a_log_no_live_stream_will_dump_for_is_not_held_a_minute(
    tmp_path: Path, fio_bin: str, follower_factory: list[Follower]
) -> None:
    """Two runs at once with one log prefix, in two folders: run a (json+, its log) ends
    first, run b (its log only) two seconds later. Run a's stream names b's log and its
    last dump is older than the log's end, but it has ended: b's log goes out once both
    files are quiet for STREAM_QUIET_S, not after HOLD_S (a minute late for the
    aggregator's lateness), and counts exactly what it holds.
    """
    a, b = tmp_path / "a", tmp_path / "b"
    runs = [
        start_fio(fio_bin, job_file(a, runtime=2), a / "run.json"),
        start_fio(fio_bin, job_file(b, runtime=4), b / "unwatched.json"),
    ]
    wait_fio(runs)
    truth_a = total_ios(a / "run.json")
    held_b = log_sum(b / "run_clat_hist.1.log")
    data = tmp_path / "data"
    for sub in ("a", "b"):
        (data / sub).mkdir(parents=True)
    clock = FakeClock(1000.0)
    f = Follower(
        (str(data / "*" / "*.log"), str(data / "*" / "*.json")),
        agent="client-07",
        max_message_bytes=256 * 1024,
        log_hist_msec=250,
        clock=clock,
    )
    follower_factory.append(f)
    published: dict[str, int] = {}

    def poll() -> None:
        for m in f.poll():
            msg = decode(m.payload)
            name = str(Path(msg.stream.rsplit("@", 1)[0]).relative_to(data))
            published[name] = published.get(name, 0) + int(msg.batch.samples().sum())

    # run a as the agent saw it: its stream's dumps, then its log (covered by the stream)
    (data / "a" / "run.json").write_bytes((a / "run.json").read_bytes())
    (data / "a" / "run_clat_hist.1.log").write_bytes((a / "run_clat_hist.1.log").read_bytes())
    poll()
    clock.t += 1
    poll()
    assert published == {"a/run.json": truth_a}
    assert f.stats.files_covered == 1
    # two seconds later, run b's log: its time goes past run a's last dump
    clock.t += 1
    (data / "b" / "run_clat_hist.1.log").write_bytes((b / "run_clat_hist.1.log").read_bytes())
    poll()
    assert "b/run_clat_hist.1.log" not in published  # the stream may still dump: held
    assert f.stats.logs_held == 1
    clock.t += STREAM_QUIET_S
    poll()
    assert f.stats.logs_held == 0
    assert published == {"a/run.json": truth_a, "b/run_clat_hist.1.log": held_b}
    assert clock.t - 1000.0 < HOLD_S / 4
