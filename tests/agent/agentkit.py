"""Helpers for agent tests on real parts: a counting subscriber, agent processes, truth.

The subscriber keeps every record it receives by ``(stream, seq)`` with its sample count,
so a test can say "every I/O once": the samples per file equal the ground truth, no
``(stream, seq)`` arrived under two stream ids, and a redelivery is only counted as a
duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiomqtt

from fiomon.aggregator.dedup import SeqTracker
from fiomon.errors import WireFormatError
from fiomon.wire import decode
from tests.conftest import DEADLINE_S, Mosquitto

PREFIX = "fiomontest"


@dataclass
class Subscriber:
    """Collects records and retained status from the broker (run as a task)."""

    port: int
    ident: str
    seen: dict[tuple[str, int], int] = field(default_factory=dict)  # -> samples
    duplicates: int = 0
    invalid: int = 0
    arrivals: list[tuple[int, int]] = field(default_factory=list)  # (received ms, end_ms)
    # every message as received: (agent, stream, first seq, samples per record)
    messages: list[tuple[str, str, int, list[int]]] = field(default_factory=list)
    status: list[dict[str, object]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        client = aiomqtt.Client("127.0.0.1", self.port, identifier=self.ident, clean_session=False)
        while True:
            try:
                async with client:
                    await client.subscribe(f"{PREFIX}/v1/+/records", qos=1)
                    await client.subscribe(f"{PREFIX}/v1/+/status", qos=1)
                    self.ready.set()
                    async for m in client.messages:
                        self._on_message(m)
            except aiomqtt.MqttError:
                await asyncio.sleep(0.2)

    def _on_message(self, m: aiomqtt.Message) -> None:
        assert isinstance(m.payload, bytes)
        if m.topic.value.endswith("/status"):
            self.status.append(json.loads(m.payload))
        else:
            try:
                msg = decode(m.payload)
            except WireFormatError:
                self.invalid += 1  # a torn or garbled message: must never happen
                self.changed.set()
                return
            now = time.time_ns() // 1_000_000
            samples = msg.batch.samples().tolist()
            self.messages.append((msg.agent, msg.stream, int(msg.seqs[0]), samples))
            for seq, end, n in zip(
                msg.seqs.tolist(), msg.batch.end_ms.tolist(), samples, strict=True
            ):
                key = (msg.stream, seq)
                if key in self.seen:
                    self.duplicates += 1
                else:
                    self.seen[key] = int(n)
                    self.arrivals.append((now, end))
        self.changed.set()

    def seqs(self, stream: str) -> list[int]:
        return sorted(s for st, s in self.seen if st == stream)

    def streams_of(self, path: Path) -> list[str]:
        """Stream ids of ``path`` (``<path>@<content id>``), in the order first received."""
        found = {st: None for st, _ in self.seen if st.rsplit("@", 1)[0] == str(path)}
        return list(found)

    def samples(self, where: Callable[[str], bool] = lambda _: True) -> int:
        """I/Os received in streams whose id satisfies ``where``."""
        return sum(n for (st, _), n in self.seen.items() if where(st))

    def gapless(self) -> bool:
        """Every stream's sequence numbers are 0..n-1 (nothing missing in between)."""
        per: dict[str, list[int]] = {}
        for st, s in self.seen:
            per.setdefault(st, []).append(s)
        return all(sorted(v) == list(range(len(v))) for v in per.values())

    def deduplicated_samples(self) -> int:
        """The I/Os the aggregator's own dedup (:class:`SeqTracker`) keeps, in arrival order."""
        tracker = SeqTracker()
        kept = 0
        for agent, stream, first, samples in self.messages:
            verdict = tracker.judge(agent, stream, first, len(samples))
            kept += sum(n for n, new in zip(samples, verdict.new.tolist(), strict=True) if new)
        return kept

    def last_status(self) -> dict[str, object]:
        return self.status[-1] if self.status else {}

    def counters(self) -> dict[str, object]:
        c = self.last_status().get("counters", {})
        assert isinstance(c, dict)
        return c

    def counter(self, name: str) -> int:
        v = self.counters().get(name, 0)
        assert isinstance(v, int)
        return v

    def fault(self, name: str) -> object:
        f = self.last_status().get("faults", {})
        assert isinstance(f, dict)
        return f.get(name)

    async def wait_for(self, predicate: Callable[[], object], within: float = DEADLINE_S) -> None:
        async with asyncio.timeout(within):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def subscribed(broker: Mosquitto, ident: str = "test-sub") -> AsyncIterator[Subscriber]:
    sub = Subscriber(broker.port, ident)
    task = asyncio.create_task(sub.run())
    async with asyncio.timeout(DEADLINE_S):  # subscribed before anything is published
        await sub.ready.wait()
    try:
        yield sub
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def agent_yaml(broker: Mosquitto, watch: list[str], state: Path, **extra: str) -> str:
    lines = [
        f"broker: {{host: 127.0.0.1, port: {broker.port}, keepalive: 5s}}",
        f"topic_prefix: {PREFIX}",
        "host: client-07",
        "watch: [" + ", ".join(f"'{w}'" for w in watch) + "]",
        f"state_dir: {state}",
        "flush_interval: 100ms",
        "poll_interval: 100ms",
        "heartbeat_interval: 500ms",
    ]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


class AgentProcess:
    """``fiomon agent --config FILE`` as a child process, its stderr kept in a file."""

    def __init__(
        self,
        config: Path,
        log: Path,
        wrapper: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self.log = log
        self.wrapper = wrapper or []
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                [
                    *self.wrapper,
                    sys.executable,
                    "-m",
                    "fiomon",
                    "agent",
                    "--config",
                    str(self.config),
                ],
                stderr=err,
                stdout=subprocess.DEVNULL,
                env=self.env,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def peak_rss_mb(self) -> float:
        """Peak resident memory (VmHWM) of the agent process, in MB."""
        pid = python_child(self.pid) if self.wrapper else self.pid
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith("VmHWM:"):
                return int(ln.split()[1]) / 1024
        msg = "no VmHWM"
        raise AssertionError(msg)

    async def stop(self, sig: int = signal.SIGTERM, within: float = 20.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return await self.wait(within)

    async def wait(self, within: float = 20.0) -> int:
        """The exit code, once the process (the wrapper, if any) has ended."""
        assert self.proc is not None
        return await asyncio.to_thread(self.proc.wait, within)

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)


def python_child(pid: int) -> int:
    """The pid of the fiomon process under a wrapper: itself, or a descendant."""
    todo = [pid]
    while todo:
        p = todo.pop(0)
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        if b"fiomon" in cmd and b"python" in cmd[0]:
            return p
        todo += [int(c) for c in children]
    msg = f"no fiomon process under {pid}"
    raise AssertionError(msg)


def report_samples(paths: list[Path], *extra: str) -> float:
    """Ground truth: the I/Os ``fiomon report --format jsonl`` counts in ``paths``."""
    out = subprocess.run(
        [sys.executable, "-m", "fiomon", "report", "--format", "jsonl", *extra, *map(str, paths)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = [json.loads(ln) for ln in out.splitlines() if ln.strip()]
    return float(
        sum(r["samples"] for r in rows if r["scope"] == "cluster" and r["direction"] == "all")
    )


def json_total_ios(path: Path) -> int:
    """Ground truth for a json+ stream: the cumulative I/Os of its last document."""
    text = path.read_text()
    dec = json.JSONDecoder()
    pos, last = 0, None
    while (start := text.find("{", pos)) >= 0:
        last, pos = dec.raw_decode(text, start)
    assert isinstance(last, dict)
    total = 0
    for job in last["jobs"]:
        for d in ("read", "write", "trim", "mixed"):  # mixed: unified_rw_reporting=1
            if d in job:
                total += sum(job[d]["clat_ns"].get("bins", {}).values())
    return total


def start_agent(
    broker: Mosquitto,
    tmp_path: Path,
    procs: list[AgentProcess],
    name: str = "agent",
    *,
    watch: list[str] | None = None,
    state: str = "state",
    client_id: str | None = None,
    **extra: str,
) -> AgentProcess:
    """``fiomon agent`` with its config ``tmp_path/<name>.yaml`` and log ``<name>.log``.

    ``watch`` defaults to the hist logs and json files under ``tmp_path/results`` (made);
    ``extra`` are more config keys. The agent joins ``procs`` (the ``agents`` fixture,
    which kills them at the end).
    """
    if watch is None:
        results = tmp_path / "results"
        results.mkdir(exist_ok=True)
        watch = [f"{results}/*_clat_hist.*.log", f"{results}/*.json"]
    text = agent_yaml(broker, watch, tmp_path / state, **extra)
    if client_id is not None:
        text = text.replace("keepalive: 5s}", f"keepalive: 5s, client_id: {client_id}}}")
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(text)
    agent = AgentProcess(cfg, tmp_path / f"{name}.log")
    procs.append(agent)
    agent.start()
    return agent
