"""Revisions on real parts: late data revises what was published, so live converges to offline.

One real fio run (three hosts, 40 s, plus a fourth host whose clock is 30 s behind) is
watched by three independent set-ups, each its own Mosquitto, real ``fiomon agent``
processes and a real ``fiomon aggregator`` (quantum 1 s, lateness 5 s, revise_within 2m,
per-host rows), and each suffers one fault while fio runs:

a. ``kill``: the agent of h2 is ``kill -9``-ed for 8 s (after the aggregator closed
   quanta past the kill without it), then restarted: it resumes where it was, and its
   backlog reaches quanta closed without it.
b. ``clock``: host lag-01's agent and fio run under libfaketime 30 s behind, so every
   record of it is ~30 s late; its first 30 s of records lie before the other hosts'
   run (keys first published by late records), the rest in quanta the others closed.
c. ``broker``: the broker is stopped for 10 s mid-run and started again (persistence on);
   the agents spool and resend; h3's agent returns only after the aggregator closed the
   outage's quanta without it (see :func:`restart_broker`).

In each, once fio ended and the aggregator has counted every I/O (waited on the quanta
file, no fixed sleeps), the quanta file's latest revision per key (``end_ms``, ``scope``,
``host``, ``direction``) equals ``fiomon report --per-host --format jsonl --align epoch``
over the same fio json+ streams: the same keys, samples (and rates) to 1e-6 relative,
percentiles, their confidence bounds and every other field exactly (``complete`` too),
all but the publication's own ``revision``, ``revised_at`` and ``late_records``; the
cluster ``all`` samples sum to fio's
own total_ios; revisions did happen (else the case proves nothing), and no key appears
twice with the same revision.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fiomon.offline.sources import FileSource, SourceOptions
from tests.conftest import DEADLINE_S, Mosquitto, free_port
from tests.fiorun import fiomon, total_ios
from tests.metricskit import Samples, scrape_or_none, total

pytestmark = pytest.mark.fio

PREFIX = "fiomonrev"
RUNTIME_S = 40  # fio's run; the lagging host's events cover (-30 s, +10 s] of it
LAG_S = 30
KILL_S = 8
OUTAGE_S = 10
LATENESS = "5s"
NORMAL = ("h1", "h2", "h3")
LAGGING = "lag-01"
# What a publication says about itself (how late records came to it), not the quantum's
# statistics; ``complete`` is compared: a revision that brings the missing host is complete.
PUBLICATION = ("revision", "revised_at", "late_records")

Row = dict[str, Any]
Key = tuple[int, str, str, str]


def key(r: Row) -> Key:
    return (int(r["end_ms"]), str(r["scope"]), str(r["host"] or ""), str(r["direction"]))


def read_rows(path: Path) -> list[Row]:
    """The quanta file's complete lines (a line being written is left for the next read)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def latest(rows: list[Row]) -> dict[Key, Row]:
    """Highest revision per key; on equal revision the later line (the contract)."""
    out: dict[Key, Row] = {}
    for r in rows:
        k = key(r)
        if k not in out or r["revision"] >= out[k]["revision"]:
            out[k] = r
    return out


def cluster_all(rows: dict[Key, Row]) -> float:
    return sum(float(r["samples"]) for k, r in rows.items() if k[1:] == ("cluster", "", "all"))


@dataclass
class Case:
    """One broker + agents + aggregator watching some of the run's hosts."""

    name: str
    hosts: tuple[str, ...]
    root: Path
    broker: Mosquitto
    metrics_port: int = field(default_factory=free_port)
    agents: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    aggregator: asyncio.subprocess.Process | None = None
    events: list[str] = field(default_factory=list)
    converged: bool = False
    metrics: Samples = field(default_factory=dict)
    aggregator_rc: int | None = None

    @property
    def quanta(self) -> Path:
        return self.root / "quanta.jsonl"

    @property
    def client_id(self) -> str:
        return f"fiomon-aggregator-{self.name}"

    def rows(self) -> list[Row]:
        return read_rows(self.quanta)

    def closed_through(self) -> int:
        """The newest quantum end first published (0 before any)."""
        return max((int(r["end_ms"]) for r in self.rows() if r["revision"] == 0), default=0)

    def note(self, what: str) -> None:
        self.events.append(f"{time.time() * 1000:.0f} {what}")

    def logs(self) -> str:
        out = [f"events: {self.events}"]
        for p in sorted(self.root.glob("*.log")):
            out.append(f"--- {p.name}\n{p.read_text()[-3000:]}")
        return "\n".join(out)


@dataclass
class Run:
    """The shared fio run and the three cases that watched it."""

    data: Path
    cases: dict[str, Case]
    fio_rc: dict[str, int]

    def stream(self, host: str) -> Path:
        return self.data / host / "run.json"


def fio_args(fio: str, data: Path, host: str) -> list[str]:
    out = data / host / "run.json"
    return [
        fio,
        "--name=j",
        "--numjobs=2",
        "--ioengine=psync",
        f"--filename={data / f'{host}.dat'}",
        "--size=16M",
        "--time_based",
        f"--runtime={RUNTIME_S}",
        "--rw=randrw",
        "--rwmixread=70",
        "--bs=4k",
        "--rate_iops=150",
        # The file is written by the test, so it is in the page cache; fio's default
        # invalidate=1 would drop it at the job's start.
        "--invalidate=0",
        "--status-interval=1",
        "--output-format=json+",
        f"--output={out}",
        "--eta=never",
    ]


def faketime(behind_s: int) -> list[str]:
    """The command prefix that runs a program with its clock ``behind_s`` behind."""
    path = shutil.which("faketime")
    if path is None:
        pytest.fail("faketime is missing: apt-get install faketime (libfaketime)")
    return [path, "-f", f"-{behind_s}s"]


async def spawn(cmd: list[str], log: Path) -> asyncio.subprocess.Process:
    with log.open("ab") as fh:  # the child keeps its own descriptor
        return await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=fh
        )


async def start_agent(case: Case, host: str, data: Path) -> None:
    cfg = case.root / f"agent-{host}.yaml"
    cfg.write_text(
        f"broker: {{port: {case.broker.port}}}\ntopic_prefix: {PREFIX}\nhost: {host}\n"
        f"watch: ['{data}/{host}/*.json']\nstate_dir: {case.root}/state-{host}\n"
        "flush_interval: 200ms\npoll_interval: 200ms\nheartbeat_interval: 1s\n"
    )
    prefix = faketime(LAG_S) if host == LAGGING else []
    cmd = [*prefix, sys.executable, "-m", "fiomon", "agent", "--config", str(cfg)]
    case.agents[host] = await spawn(cmd, case.root / f"agent-{host}.log")


async def start_aggregator(case: Case) -> None:
    cfg = case.root / "aggregator.yaml"
    cfg.write_text(
        f"broker: {{port: {case.broker.port}}}\ntopic_prefix: {PREFIX}\n"
        f"client_id: {case.client_id}\nquantum: 1s\nlateness: {LATENESS}\n"
        "revise_within: 2m\nalign: epoch\nper_host: true\n"
        f"listen: 127.0.0.1:{case.metrics_port}\nquanta_file: {case.quanta}\n"
        f"state_dir: {case.root / 'aggregator-state'}\n"
    )
    cmd = [sys.executable, "-m", "fiomon", "aggregator", "--config", str(cfg), "--final"]
    case.aggregator = await spawn(cmd, case.root / "aggregator.log")


async def wait(pred: Any, what: str, case: Case, within: float = DEADLINE_S) -> None:
    """Until ``pred()`` (run in a thread: it reads files); fail with the case's logs."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await asyncio.to_thread(pred):
        if loop.time() > deadline:
            pytest.fail(f"[{case.name}] not within {within:g} s: {what}\n{case.logs()}")
        await asyncio.sleep(0.2)


def stream_records(paths: list[Path], hosts: tuple[str, ...]) -> int:
    """How many records fiomon's parser makes of these json+ streams."""
    n = 0
    for path, host in zip(paths, hosts, strict=True):
        src = FileSource(path, host, SourceOptions())
        try:
            n += sum(len(b) for b in src.batches())
        finally:
            src.close()
    return n


async def kill_agent(case: Case, host: str, t0: float) -> None:
    """kill -9 ``host``'s agent once quanta closed, for KILL_S; restart it after the
    aggregator closed quanta past the kill without it (so its backlog is late)."""
    await wait(lambda: time.time() >= t0 + 6 and case.closed_through() > 0, "quanta closed", case)
    agent = case.agents[host]
    agent.kill()
    await agent.wait()
    killed_ms = time.time() * 1000
    case.note(f"kill -9 agent {host}")
    await wait(
        lambda: case.closed_through() >= killed_ms + 2000,
        "quanta closed past the kill without the dead agent",
        case,
    )
    # The fault itself: the agent stays dead KILL_S (systemd restarts it after that).
    await asyncio.sleep(max(0.0, (killed_ms + KILL_S * 1000) / 1000 - time.time()))
    case.note(f"restart agent {host}")
    await start_agent(case, host, case.root.parent / "data")


async def restart_broker(case: Case, t0: float) -> None:
    """Stop the broker OUTAGE_S once quanta closed, then start it again on its port; h3's
    agent comes back only after the aggregator closed quanta of the outage without it.

    A restart alone is no late data: the aggregator holds its clock bound while it is
    disconnected and for the lateness after (fiomon/aggregator/watermark.py), and the
    agents came back within a second or two of it. After a longer outage the agents'
    reconnect backoff (jittered, up to 30 s) spreads their returns by more than the
    lateness; h3's agent frozen (SIGSTOP) until those quanta closed makes that spread
    certain here.
    """
    await wait(lambda: time.time() >= t0 + 10 and case.closed_through() > 0, "quanta closed", case)
    await asyncio.to_thread(case.broker.stop)
    stopped_ms = time.time() * 1000
    case.note("broker stopped")
    case.agents["h3"].send_signal(signal.SIGSTOP)
    case.note("agent h3 frozen")
    await asyncio.sleep(max(0.0, stopped_ms / 1000 + OUTAGE_S - time.time()))  # the outage
    since = len(case.broker.log_text())
    await asyncio.to_thread(case.broker.start)
    case.note("broker started")
    await case.broker.wait_for_log(f"{case.client_id} 1 {PREFIX}/v1/+/records", since=since)
    await wait(
        lambda: case.closed_through() >= stopped_ms + 2000,
        "quanta of the outage closed without h3",
        case,
    )
    case.agents["h3"].send_signal(signal.SIGCONT)
    case.note("agent h3 resumed")


async def settle(case: Case, run: Run) -> None:
    """Until every record reached the aggregator and the quanta file counts every I/O."""
    paths = [run.stream(h) for h in case.hosts]
    records = await asyncio.to_thread(stream_records, paths, case.hosts)
    ios = sum(total_ios(p) for p in paths)

    def received() -> bool:
        m = scrape_or_none(case.metrics_port)
        return m is not None and total(m, "fiomon_records_total", result="received") >= records

    await wait(received, f"all {records} records received", case)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while loop.time() < deadline:
        got = await asyncio.to_thread(lambda: cluster_all(latest(case.rows())))
        if abs(got - ios) <= 1e-6 * ios:
            case.converged = True
            break
        await asyncio.sleep(0.3)
    case.note(f"converged={case.converged}")
    last = await asyncio.to_thread(scrape_or_none, case.metrics_port)
    case.metrics = last or {}


async def scenario(tmp: Path, fio_bin: str, mosquitto_bin: str) -> Run:
    data = tmp / "data"
    hosts_of = {"kill": NORMAL, "clock": ("h1", "h2", LAGGING), "broker": NORMAL}
    cases = {
        name: Case(name, hosts, tmp / name, Mosquitto(mosquitto_bin, tmp / name / "mosquitto"))
        for name, hosts in hosts_of.items()
    }
    fios: dict[str, asyncio.subprocess.Process] = {}
    try:
        for c in cases.values():
            c.broker.start()
            await start_aggregator(c)
        for c in cases.values():
            await c.broker.wait_for_log(f"{c.client_id} 1 {PREFIX}/v1/+/records")
            for h in c.hosts:
                await start_agent(c, h, data)
        for c in cases.values():
            for h in c.hosts:  # every agent up before fio starts
                await c.broker.wait_for_log(f" as fiomon-agent-{h} (")
        for h in (*NORMAL, LAGGING):
            (data / h).mkdir(parents=True, exist_ok=True)
            (data / f"{h}.dat").write_bytes(os.urandom(16 << 20))
        t0 = time.time()
        for h in (*NORMAL, LAGGING):
            prefix = faketime(LAG_S) if h == LAGGING else []
            fios[h] = await spawn([*prefix, *fio_args(fio_bin, data, h)], tmp / f"fio-{h}.log")
        faults = [
            asyncio.create_task(kill_agent(cases["kill"], "h2", t0)),
            asyncio.create_task(restart_broker(cases["broker"], t0)),
        ]
        fio_rc = {h: await p.wait() for h, p in fios.items()}
        await asyncio.gather(*faults)
        run = Run(data, cases, fio_rc)
        if all(rc == 0 for rc in fio_rc.values()):
            await asyncio.gather(*(settle(c, run) for c in cases.values()))
    finally:
        for p in fios.values():
            if p.returncode is None:
                p.kill()
                await p.wait()
        for c in cases.values():
            for a in c.agents.values():
                if a.returncode is None:
                    a.send_signal(signal.SIGCONT)  # a frozen one would never stop
                    a.terminate()
                    await a.wait()
            if c.aggregator is not None and c.aggregator.returncode is None:
                c.aggregator.send_signal(signal.SIGTERM)
                try:
                    c.aggregator_rc = await asyncio.wait_for(c.aggregator.wait(), DEADLINE_S)
                except TimeoutError:
                    c.aggregator.kill()
                    await c.aggregator.wait()
            c.broker.stop()
    return run


@pytest.fixture(scope="module")
def run(
    tmp_path_factory: pytest.TempPathFactory, fio_bin: str, mosquitto_bin: str
) -> Iterator[Run]:
    yield asyncio.run(scenario(tmp_path_factory.mktemp("revisions"), fio_bin, mosquitto_bin))


def offline(run: Run, case: Case) -> dict[Key, Row]:
    """``fiomon report --per-host --format jsonl --align epoch`` over the case's streams."""
    r = fiomon(
        "report",
        "--format",
        "jsonl",
        "--align",
        "epoch",
        "--per-host",
        "--host-from",
        "dir",
        *(run.stream(h) for h in case.hosts),
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    out = {key(x): x for x in rows}
    assert len(out) == len(rows)
    return out


def compare(online: dict[Key, Row], report: dict[Key, Row]) -> tuple[float, int]:
    """Every latest row equals the report's: samples and rates to 1e-6 relative, the rest
    (percentiles, their bounds, min, max, mean, streams, saturation, complete) exactly;
    the fields of the publication itself (:data:`PUBLICATION`) aside.

    Returns the worst relative difference of samples and rates, and the rows compared.
    """
    missing = sorted(set(report) - set(online))
    extra = sorted(set(online) - set(report))
    assert not missing and not extra, f"keys only offline {missing[:10]}, only live {extra[:10]}"
    worst = 0.0
    bad: list[str] = []
    for k, want in report.items():
        got = online[k]
        for f in sorted(set(want) | set(got)):
            if f in PUBLICATION:
                continue
            a, b = got.get(f, "<absent>"), want.get(f, "<absent>")
            if f in ("samples", "iops", "bytes_per_second") and a is not None and b is not None:
                rel = abs(float(a) - float(b)) / max(abs(float(a)), abs(float(b)), 1e-300)
                worst = max(worst, rel)
                if rel > 1e-6:
                    bad.append(f"{k} {f}: live {a} report {b}")
            elif a != b:
                bad.append(f"{k} {f}: live {a} report {b}")
    assert not bad, f"{len(bad)} differences, e.g.\n" + "\n".join(bad[:15])
    return worst, len(report)


def check(run: Run, name: str) -> tuple[list[Row], dict[Key, Row]]:
    """The checks every case shares; returns the file's rows and the latest per key."""
    assert run.fio_rc == dict.fromkeys(run.fio_rc, 0), f"fio failed: {run.fio_rc}"
    case = run.cases[name]
    rows = case.rows()
    assert rows, f"[{name}] no rows\n{case.logs()}"
    twice = [k for k, n in Counter((key(r), r["revision"]) for r in rows).items() if n > 1]
    assert not twice, f"[{name}] a key written twice at one revision: {twice[:5]}"
    now = latest(rows)
    ios = sum(total_ios(run.stream(h)) for h in case.hosts)
    counted = cluster_all(now)
    assert case.converged, (
        f"[{name}] cluster 'all' samples {counted} != fio's total_ios {ios}\n{case.logs()}"
    )
    assert counted == pytest.approx(ios, rel=1e-6)
    revised = [r for r in rows if r["revision"] >= 1]
    assert all("revised_at" in r for r in revised), "a revision without revised_at"
    assert case.aggregator_rc == 0, f"[{name}] the aggregator's stop\n{case.logs()}"
    late = total(case.metrics, "fiomon_late_records_total")
    assert late == 0, f"[{name}] {late} records late beyond the horizon"
    try:
        worst, n = compare(now, offline(run, case))
    except AssertionError as exc:
        msg = f"[{name}] latest revisions != fiomon report: {exc}\n{case.logs()}"
        raise AssertionError(msg) from None
    merged = sum(
        int(r["late_records"])
        for r in rows
        if "revised_at" in r and r["scope"] == "cluster" and r["direction"] == "all"
    )
    first_incomplete = sum(1 for r in rows if not r["complete"])
    print(
        f"[{name}] {n} keys == fiomon report (samples/rates worst {worst:.1e}, percentiles "
        f"exact); {len(rows)} lines: {len(revised)} rows of revision >= 1 (highest "
        f"{max((r['revision'] for r in rows), default=0)}) over "
        f"{len({key(r)[0] for r in revised})} quanta, "
        f"{sum(1 for r in rows if 'revised_at' in r and r['revision'] == 0)} keys first "
        f"published by late records; {merged} late records merged; {counted:.0f} I/Os == "
        f"fio's total_ios; lines with complete false: {first_incomplete}; aggregator exit "
        f"{case.aggregator_rc}"
    )
    return rows, now


def test_an_agent_killed_for_8s_is_merged_by_revisions_and_live_equals_report(run: Run) -> None:
    rows, _ = check(run, "kill")
    revised_h2 = {key(r) for r in rows if r["revision"] >= 1 and r["host"] == "h2"}
    revised_cluster = {key(r) for r in rows if r["revision"] >= 1 and r["host"] is None}
    assert revised_h2, "h2's backlog revised its host rows"
    assert revised_cluster, "and the cluster rows"


def test_a_host_30s_behind_is_merged_by_revisions_and_live_equals_report(run: Run) -> None:
    rows, now = check(run, "clock")
    # Its events from the others' start on land in quanta the others closed: revisions of
    # cluster rows first published without it.
    first = min(k[0] for k, r in now.items() if r["host"] == "h1")
    revised = {key(r) for r in rows if r["revision"] >= 1 and r["host"] is None}
    assert any(k[0] > first for k in revised), "cluster rows of the shared time revised"
    assert any(r["revision"] >= 1 for r in rows if r["host"] == LAGGING)
    assert {r["host"] for r in now.values()} >= {"h1", "h2", LAGGING}


def test_a_broker_down_10s_is_merged_by_revisions_and_live_equals_report(run: Run) -> None:
    rows, _ = check(run, "broker")
    revised = {r["host"] for r in rows if r["revision"] >= 1}
    assert "h3" in revised, "h3's spool revised its rows\n" + run.cases["broker"].logs()
    assert None in revised, "and the cluster rows"
