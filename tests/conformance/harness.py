"""Runs the whole matrix once: broker, aggregator and agents first, then every fio case at once.

The session fixture (``conftest.py``) calls :func:`run_matrix`; the tests only read the
:class:`Results` it returns, so fio runs once for all of them. Everything waits on
deadlines (a socket that listens, a subscription in the broker's log, a counter that stops
moving), never on fixed sleeps.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conformance.matrix import CASES, SERVERS, Case, Ctx, Expect, View
from tests.conftest import DEADLINE_S, Mosquitto, free_port
from tests.metricskit import scrape_or_none, total
from tests.offline.test_fio_client import listening

PREFIX = "fiomonconf"
AGG_ID = "fiomon-aggregator-conformance"
# After the last fio exits and every agent says it holds nothing back (no hist log waiting
# for a json+ stream, nothing spooled), the aggregator's received count must hold still
# this long (agents flush every 200 ms).
QUIET_S = 5.0


class AgentStatuses:
    """Every agent's latest retained status (``counters``), read from the real broker."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt  # noqa: PLC0415 (the harness alone needs it)
        from paho.mqtt.enums import CallbackAPIVersion  # noqa: PLC0415

        self.latest: dict[str, tuple[float, dict[str, Any]]] = {}  # host -> (monotonic, doc)
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="conf-status")
        self._client.on_connect = lambda c, *_: c.subscribe(f"{PREFIX}/v1/+/status", qos=1)
        self._client.on_message = self._on_message
        self._client.connect("127.0.0.1", port)
        self._client.loop_start()

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        try:
            doc = json.loads(msg.payload)
        except ValueError:
            return
        if isinstance(doc, dict) and isinstance(doc.get("agent"), str):
            self.latest[doc["agent"]] = (time.monotonic(), doc)

    def holding(self, hosts: list[str], since: float) -> list[str]:
        """Hosts without a status after ``since`` saying nothing is held back (empty: none)."""
        out = []
        for h in hosts:
            at, doc = self.latest.get(h, (-1.0, {}))
            c = doc.get("counters", {})
            if at < since or c.get("logs_held") != 0 or c.get("spooled_messages") != 0:
                out.append(h)
        return out

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


@dataclass
class Outcome:
    """What one command printed, and how it ended."""

    cmd: list[str]
    returncode: int
    stdout: str
    stderr: str


@dataclass(repr=False)
class Results:
    """Everything the tests check, gathered once."""

    root: Path
    errors: dict[str, str] = field(default_factory=dict)  # case -> why it has no result
    views: dict[tuple[str, str], View] = field(default_factory=dict)
    offline: dict[tuple[str, str], Outcome] = field(default_factory=dict)
    live: dict[str, Expect] = field(default_factory=dict)
    live_rows: list[dict[str, Any]] = field(default_factory=list)
    agent_logs: dict[str, str] = field(default_factory=dict)  # case -> its agents' stderr
    aggregator_log: str = ""
    aggregator_rc: int | None = None  # its exit code after SIGTERM (--final)
    timings: dict[str, float] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)  # case -> what its run had to do

    def __repr__(self) -> str:  # pytest prints fixtures of a failing test: keep it short
        return f"Results({self.root})"

    def live_hosts(self) -> dict[str, float]:
        """Per host label: samples of host-scope rows, direction all, latest revision."""
        best: dict[tuple[Any, ...], dict[str, Any]] = {}
        for r in self.live_rows:
            if r.get("scope") != "host" or r.get("direction") != "all":
                continue
            key = (r["start_ms"], r["end_ms"], r["host"])
            if key not in best or r.get("revision", 0) >= best[key].get("revision", 0):
                best[key] = r
        out: dict[str, float] = {}
        for r in best.values():
            out[str(r["host"])] = out.get(str(r["host"]), 0.0) + float(r["samples"])
        return out


def agent_label(case: Case, sub: str) -> str:
    return case.name if not sub else f"{case.name}-{sub}"


def fiomon_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "fiomon", *args]


def view_cmd(v: View) -> list[str]:
    if v.tool == "report":
        head = ["report", "--format", "jsonl", "--per-host", "--directions", "all"]
    else:
        head = ["summary", "--format", "json"]
    return fiomon_cmd(*head, *v.args, *map(str, v.files))


def run_cmd(cmd: list[str]) -> Outcome:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE_S, check=False)
    except subprocess.TimeoutExpired:
        return Outcome(cmd, -1, "", f"(the test stopped it: no answer within {DEADLINE_S:g} s)")
    return Outcome(cmd, r.returncode, r.stdout, r.stderr)


class Procs:
    """Child processes started here, stopped (each by its own handle) at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, cmd: list[str], log: Path | None = None) -> subprocess.Popen[bytes]:
        with log.open("ab") if log else open(os.devnull, "wb") as err:
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        self.procs.append(p)
        return p

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def wait(predicate: Any, what: str, within: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            msg = f"not within {within:g} s: {what}"
            raise TimeoutError(msg)
        time.sleep(0.05)


def received(port: int) -> float | None:
    s = scrape_or_none(port)
    return None if s is None else total(s, "fiomon_records_total", result="received")


def run_matrix(root: Path, fio: str, mosquitto_bin: str) -> Results:
    res = Results(root)
    t0 = time.monotonic()
    for sub in ("cases", "truth", "data", "state", "logs"):
        (root / sub).mkdir(parents=True)
    procs = Procs()
    statuses: AgentStatuses | None = None
    broker = Mosquitto(mosquitto_bin, root / "mosquitto")
    agg_log = root / "logs" / "aggregator.log"
    try:
        broker.start()
        # fio servers for the client/server cases: one port per case, two loopback IPs each
        servers: dict[str, tuple[tuple[str, ...], int]] = {}
        for case_name, ips in SERVERS.items():
            port = free_port()
            servers[case_name] = (ips, port)
            for ip in ips:
                procs.start([fio, f"--server=ip:{ip},{port}"])
        # the aggregator: nothing closes on the clock during the session (lateness 300 s);
        # --final closes every open quantum when it is stopped after the last record
        metrics = free_port()
        cfg = root / "aggregator.yaml"
        cfg.write_text(
            f"broker: {{host: 127.0.0.1, port: {broker.port}}}\ntopic_prefix: {PREFIX}\n"
            f"client_id: {AGG_ID}\nquantum: 1s\nlateness: 300s\nalign: epoch\n"
            f"listen: 127.0.0.1:{metrics}\nquanta_file: {root / 'quanta.jsonl'}\n"
            f"state_dir: {root / 'state' / 'aggregator'}\n"
        )
        aggregator = procs.start(fiomon_cmd("aggregator", "--config", str(cfg), "--final"), agg_log)
        wait(
            lambda: f"{AGG_ID} 1 {PREFIX}/v1/+/records" in broker.log_text(),
            "the aggregator's subscription in the broker's log",
        )
        # one agent per case folder (three-hosts: per host folder), host = case name
        for case in CASES:
            (root / "cases" / case.name).mkdir()
            (root / "truth" / case.name).mkdir()
            for sub in case.agents:
                label = agent_label(case, sub)
                d = root / "cases" / case.name / sub if sub else root / "cases" / case.name
                if sub:
                    d.mkdir(parents=True, exist_ok=True)
                watch = ", ".join(f"'{d}{'/*' * n}'" for n in (1, 2, 3))
                acfg = root / "state" / f"agent-{label}.yaml"
                acfg.write_text(
                    f"broker: {{host: 127.0.0.1, port: {broker.port}}}\n"
                    f"topic_prefix: {PREFIX}\nhost: {label}\nwatch: [{watch}]\n"
                    f"state_dir: {root / 'state' / label}\nflush_interval: 200ms\n"
                    "poll_interval: 200ms\nheartbeat_interval: 1s\n"
                )
                procs.start(
                    fiomon_cmd("agent", "--config", str(acfg)), root / "logs" / f"agent-{label}.log"
                )
        wait(lambda: received(metrics) is not None, "the aggregator's /metrics")
        labels = [agent_label(c, s) for c in CASES for s in c.agents]
        wait(
            lambda: all(f" as fiomon-agent-{h} (" in broker.log_text() for h in labels),
            "every agent connected to the broker",
        )
        for ips, port in servers.values():
            wait(
                lambda ips=ips, port=port: all(listening(ip, port) for ip in ips),
                f"fio --server on {ips} port {port}",
            )
        statuses = seen = AgentStatuses(broker.port)
        res.timings["setup"] = time.monotonic() - t0
        # every case at once; a case's offline commands start as soon as its fio is done
        ctxs = {c.name: Ctx(c.name, fio, root, servers) for c in CASES}
        with (
            cf.ThreadPoolExecutor(len(CASES)) as fios,
            cf.ThreadPoolExecutor(2) as offline,
        ):
            running = {fios.submit(c.run, ctxs[c.name]): c for c in CASES}
            outs: dict[tuple[str, str], cf.Future[Outcome]] = {}
            for fut in cf.as_completed(running):
                c = running[fut]
                if ctxs[c.name].notes:
                    res.notes[c.name] = ctxs[c.name].notes
                try:
                    fut.result()
                    # truth and expectations, from fio's output now on disk
                    views = c.views(ctxs[c.name])
                    res.live[c.name] = c.live(ctxs[c.name])
                except Exception:
                    res.errors[c.name] = traceback.format_exc()
                    continue
                if sorted(v.id for v in views) != sorted(c.view_ids):
                    res.errors[c.name] = f"views {[v.id for v in views]} != {c.view_ids}"
                    continue
                for v in views:
                    res.views[(c.name, v.id)] = v
                    outs[(c.name, v.id)] = offline.submit(run_cmd, view_cmd(v))
            res.timings["fio"] = time.monotonic() - t0
            res.offline = {k: f.result() for k, f in outs.items()}
        res.timings["offline"] = time.monotonic() - t0
        # live: every agent has published what it holds (a hist log waits for a json+
        # stream at most a minute: fiomon.agent.follow.HOLD_S) ...
        fio_done = t0 + res.timings["fio"]
        try:
            wait(
                lambda: not seen.holding(labels, fio_done),
                "every agent's status saying it holds nothing back",
                within=2 * DEADLINE_S,  # a hist log may wait a minute (follow.HOLD_S)
            )
        except TimeoutError as exc:
            late = {h: seen.latest.get(h) for h in seen.holding(labels, fio_done)}
            msg = f"{exc}; the statuses of those that do: {late}"
            raise TimeoutError(msg) from None
        # ... and the aggregator's received count holds still for QUIET_S
        last, since = received(metrics), time.monotonic()
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() - since < QUIET_S:
            if time.monotonic() > deadline:
                msg = "the aggregator's received count kept changing"
                raise TimeoutError(msg)
            time.sleep(0.25)
            now = received(metrics)
            if now != last:
                last, since = now, time.monotonic()
        aggregator.send_signal(signal.SIGTERM)
        res.aggregator_rc = aggregator.wait(DEADLINE_S)
        res.timings["live"] = time.monotonic() - t0
    finally:
        if statuses is not None:
            statuses.close()
        procs.stop_all()
        broker.stop()
    quanta = root / "quanta.jsonl"
    if quanta.exists():
        res.live_rows = [json.loads(x) for x in quanta.read_text().splitlines() if x.strip()]
    res.aggregator_log = agg_log.read_text(errors="replace") if agg_log.exists() else ""
    for c in CASES:
        res.agent_logs[c.name] = "".join(
            (root / "logs" / f"agent-{agent_label(c, s)}.log").read_text(errors="replace")
            for s in c.agents
            if (root / "logs" / f"agent-{agent_label(c, s)}.log").exists()
        )
    return res
