"""The aggregator service on real parts, under faults: restarts of every kind under load,
a hanging Alertmanager, hostile retained statuses, SIGHUP, two aggregators on one client id."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import BinaryIO

import aiomqtt

from fiomon.aggregator.merger import AggregatorCore
from fiomon.aggregator.service import run_aggregator
from fiomon.config import AggregatorConfig, BrokerConfig, SlaRule, WebhookConfig
from fiomon.model import RecordBatch
from fiomon.tools.simulate import write_cluster
from fiomon.wire import encode
from tests.aggregator.corekit import close_delays
from tests.aggregator.test_aggregator_live import _agent, offline_report, replay_logs
from tests.batches import batch
from tests.conftest import DEADLINE_S, Mosquitto, free_port, until
from tests.metricskit import scrape, total

PREFIX = "fiomonsvc"


async def _retained(port: int, topic: str) -> bytes:
    """The retained message on ``topic``, once there is one (within the test deadline)."""
    async with asyncio.timeout(DEADLINE_S):
        while True:
            ident = f"r-{time.monotonic_ns()}"
            async with aiomqtt.Client("127.0.0.1", port, identifier=ident) as c:
                await c.subscribe(topic, qos=1)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        async for m in c.messages:
                            assert isinstance(m.payload, bytes)
                            if m.payload:  # an empty retained message clears it
                                return m.payload


async def _serving(port: int, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await asyncio.to_thread(scrape, port)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _start(cfg: Path, port: int, log: BinaryIO, *extra: str) -> asyncio.subprocess.Process:
    """``fiomon aggregator --config cfg *extra`` (stderr to ``log``), once it serves ``port``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fiomon", "aggregator", "--config", str(cfg), *extra, stderr=log
    )
    await _serving(port)
    return proc


def _record(host: str, end_ms: int) -> RecordBatch:
    start = end_ms - 1000
    recs = [(start, end_ms, 0, {700: 200}), (start, end_ms, 1, {710: 100})]
    return batch(recs, host, "job", nbytes=4096 * 10)


async def _publish_seconds(port: int, hosts: list[str], seconds: int) -> int:
    """Each second, each host's records of the second that just ended; returns records."""
    sent = 0
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{time.monotonic_ns()}") as c:
        for s in range(seconds):
            now = time.time()
            await asyncio.sleep(int(now) + 1.05 - now)
            end = int(time.time()) * 1000
            for h in hosts:
                payload = encode(h, "run.json@1", 2 * s, _record(h, end))
                await c.publish(f"{PREFIX}/v1/{h}/records", payload, qos=1)
                sent += 2
    return sent


async def test_restarts_under_load_keep_the_quanta_file_exact(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    # Three agents follow logs written at 4x real time while the aggregator is stopped
    # with SIGTERM twice, killed with SIGKILL twice, and stopped with its state directory
    # deleted once, each time restarted at once. The quanta file must equal the offline
    # report of the same logs, with no row written twice, except the quanta that were
    # open when the state directory was deleted (their records received before that are
    # gone with it: reported as state-lost, never published twice).
    now = time.time_ns() // 1_000_000
    start = now // 1000 * 1000 + 3000
    staged = write_cluster(
        tmp_path / "staged", hosts=3, jobs_per_host=2, seconds=80, iops=300, start_ms=start, seed=9
    )
    state = tmp_path / "aggregator-state"
    quanta = tmp_path / "quanta.jsonl"
    cfg = tmp_path / "aggregator.yaml"
    port = free_port()
    cfg.write_text(
        f"broker: {{port: {mosquitto.port}}}\ntopic_prefix: fiomonlive\n"
        "client_id: fiomon-aggregator-restarts\nquantum: 1s\nlateness: 3s\nalign: epoch\n"
        f"listen: 127.0.0.1:{port}\nquanta_file: {quanta}\nstate_dir: {state}\n"
    )
    logs = (tmp_path / "aggregator.log").open("ab")

    async def aggregator(*extra: str) -> asyncio.subprocess.Process:
        return await _start(cfg, port, logs, *extra)

    agg = await aggregator()
    agents = [await _agent(tmp_path, f"client-{h:02d}", mosquitto.port) for h in (1, 2, 3)]
    writer = asyncio.create_task(
        replay_logs(staged, tmp_path / "data", start_ms=start, speedup=2.5)
    )
    wiped_after: int | None = None
    try:
        for action in ("term", "kill", "term", "kill", "wipe"):
            await asyncio.sleep(4.0)  # it closes quanta (early close starts 2 s after start)
            if action == "kill":
                agg.kill()
                await agg.wait()
            else:
                agg.terminate()
                assert await asyncio.wait_for(agg.wait(), 30) == 0, "SIGTERM exits 0"
            if action == "wipe":
                lines = quanta.read_text().splitlines()
                wiped_after = json.loads(lines[-1])["end_ms"] if lines else start
                shutil.rmtree(state)
            agg = await aggregator(*(["--final"] if action == "wipe" else []))
        await writer
        await asyncio.sleep(3.0)  # the agents publish the last lines
    finally:
        for a in agents:
            a.terminate()
            await a.wait()
    agg.terminate()  # --final: what is open closes now
    assert await asyncio.wait_for(agg.wait(), 30) == 0
    logs.close()
    files = sorted(p.resolve() for p in (tmp_path / "data").glob("*/*.log"))
    offline, _ = offline_report(files)
    online = [json.loads(line) for line in quanta.read_text().splitlines()]

    def key(r: dict[str, object]) -> tuple[int, str, str, str]:
        return (int(str(r["end_ms"])), str(r["scope"]), str(r["host"] or ""), str(r["direction"]))

    keys = [key(r) for r in online]
    assert len(keys) == len(set(keys)), "no row is written twice"
    got = {key(r): r for r in online}
    want = {key(r): r for r in offline}
    assert wiped_after is not None
    # What was open: at most lateness + Q, plus the 2.5 s of event time per second that
    # early closing may lag on a loaded machine.
    window = range(wiped_after + 1, wiped_after + 6501)
    wrong = sorted(
        {k[0] for k in want if got.get(k) != want[k]} | {k[0] for k in got if k not in want}
    )
    print(
        f"{len(want)} rows; quanta not equal to the offline report: {wrong} "
        f"(the state directory was deleted after {wiped_after})"
    )
    assert all(end in window for end in wrong), "only quanta open at the wipe may differ"
    assert len({k[0] for k in want}) > 50
    text = (tmp_path / "aggregator.log").read_text()
    assert "state-lost" in text, "the lost state directory is reported"


async def test_a_hanging_alertmanager_never_delays_a_quantum(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    # A receiver that accepts and never answers: each POST waits its whole timeout in
    # the sender; quanta close every second regardless, and the failures are counted.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []

    async def hold() -> None:
        loop = asyncio.get_running_loop()
        server.setblocking(False)
        while True:
            conn, _ = await loop.sock_accept(server)
            held.append(conn)

    holder = asyncio.create_task(hold())
    cfg = AggregatorConfig(
        broker=BrokerConfig(port=mosquitto.port),
        topic_prefix=PREFIX,
        client_id="fiomon-aggregator-webhook",
        lateness_ms=1500,
        align="epoch",
        listen=f"127.0.0.1:{free_port()}",
        sla=(SlaRule("always", "read", 50.0, 1e3, for_quanta=1, min_samples=1),),
        webhook=WebhookConfig(
            f"http://127.0.0.1:{server.getsockname()[1]}", timeout_ms=4000, resend_ms=5000
        ),
    )
    cores: list[AggregatorCore] = []
    stop = asyncio.Event()
    agg = asyncio.create_task(run_aggregator(cfg, stop=stop, ready=cores.append))
    try:
        await asyncio.sleep(1.0)
        await _publish_seconds(mosquitto.port, ["h1", "h2"], 10)
        await asyncio.sleep(2.0)
    finally:
        stop.set()
        await asyncio.wait_for(agg, 30)
        holder.cancel()
        for s in [*held, server]:
            s.close()
    core = cores[0]
    delays = close_delays(core)
    print(f"close delays: {delays}; webhook: {dict(core.counts.alert_deliveries)}")
    assert core.counts.quanta_closed >= 9
    # The first two closes may wait for the start; no other waited for the webhook.
    assert delays.n - delays.at_most(2.0) <= 2, "no close waited for the webhook"
    assert core.counts.alert_deliveries[("webhook", "failed")] >= 1
    assert held, "the webhook was called"


async def test_hostile_retained_statuses_are_counted_at_every_start(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    # Any client may leave garbage on a status topic, retained: the aggregator counts it
    # and runs; the 100,000 '[' (over the size limit) and 50,000 '[' (json's
    # recursion limit) alike.
    async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="vandal") as c:
        await c.publish(f"{PREFIX}/v1/evil1/status", b"[" * 100_000, qos=1, retain=True)
        await c.publish(f"{PREFIX}/v1/evil2/status", b"[" * 50_000, qos=1, retain=True)
        await c.publish(f"{PREFIX}/v1/ghost/status", b'{"state": "online"}', qos=1, retain=True)
    for run in range(2):
        port = free_port()
        cfg = AggregatorConfig(
            broker=BrokerConfig(port=mosquitto.port),
            topic_prefix=PREFIX,
            client_id="fiomon-aggregator-vandal",
            lateness_ms=1000,
            align="epoch",
            listen=f"127.0.0.1:{port}",
        )
        cores: list[AggregatorCore] = []
        stop = asyncio.Event()
        agg = asyncio.create_task(run_aggregator(cfg, stop=stop, ready=cores.append))
        await _publish_seconds(mosquitto.port, ["h1"], 2)
        await asyncio.sleep(0.5)
        m = await asyncio.to_thread(scrape, port)
        stop.set()
        await asyncio.wait_for(agg, 30)
        invalid = {
            dict(k)["reason"]: v
            for (n, k), v in m.items()
            if n == "fiomon_invalid_messages_total" and v
        }
        assert invalid == {"status": 1, "status-oversized": 1}, run
        assert cores[0].counts.records["received"] == 4, run
        # The retained "online" without a time is no evidence of life; h1 sends records.
        assert m[("fiomon_hosts_up", ())] == 1.0, run


async def test_sighup_reloads_rules_and_log_level_and_says_what_it_did(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    port = free_port()
    cfg = tmp_path / "aggregator.yaml"
    base = (
        f"broker: {{port: {mosquitto.port}}}\ntopic_prefix: {PREFIX}\n"
        f"client_id: fiomon-aggregator-hup\nlisten: 127.0.0.1:{port}\n"
    )
    cfg.write_text(base + "sla: [{name: a, direction: read, percentile: 99, threshold: 5ms}]\n")
    log = tmp_path / "agg.log"
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fiomon", "aggregator", "--config", str(cfg), stderr=err
        )
        try:
            await _serving(port)
            cfg.write_text(
                base + "log_level: debug\n"
                "sla: [{name: b, direction: write, percentile: 99.9, threshold: 20ms}]\n"
            )
            proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + DEADLINE_S
            while "SIGHUP: reloaded" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()
                await asyncio.sleep(0.2)
            # /metrics is served by a child process from the latest snapshot: the new
            # rules show within a snapshot interval (about a second), not at once.
            await until(
                lambda: (
                    ("fiomon_sla_breaches_total", (("latency", "clat"), ("rule", "b")))
                    in scrape(port)
                ),
                what="rule b on /metrics after the reload",
            )
            m = await asyncio.to_thread(scrape, port)
            assert ("fiomon_sla_breaches_total", (("latency", "clat"), ("rule", "a"))) not in m
            cfg.write_text(base + "webhook: {url: 'alertmanager:9093', timeout: 10m}\n")
            proc.send_signal(signal.SIGHUP)
            while "the running configuration stays" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()
                await asyncio.sleep(0.2)
            assert proc.returncode is None, "SIGHUP never stops it"
        finally:
            proc.terminate()
            code = await asyncio.wait_for(proc.wait(), DEADLINE_S)
    text = log.read_text()
    print(text)
    assert code == 0
    assert "sla rules: 0 kept; added b; removed a" in text and "log_level None -> debug" in text
    assert "webhook.url: expected an http:// or https:// URL" in text
    assert "webhook.timeout: must be at most 30000 ms" in text


async def test_two_aggregators_on_one_client_id_do_not_flap(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    # A staging copy started with production's client_id: the broker gives the session to
    # the newer one. The older one notices, stops reading (instead of taking the session
    # back every few seconds, each counting the other's records as lost), says so in its
    # log and on /metrics, and tells the newer one, which says so too.
    ports = [free_port(), free_port()]
    procs = []
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    files = [p.open("wb") for p in logs]
    presence = f"{PREFIX}/v1/_aggregator/fiomon-aggregator-twin/instance"

    def takeovers() -> int:
        return mosquitto.log_text().count("already connected, closing old connection")

    try:
        for i in range(2):
            cfg = tmp_path / f"agg{i}.yaml"
            cfg.write_text(
                f"broker: {{port: {mosquitto.port}}}\ntopic_prefix: {PREFIX}\n"
                f"client_id: fiomon-aggregator-twin\nlisten: 127.0.0.1:{ports[i]}\n"
                f"state_dir: {tmp_path / f'state{i}'}\nlateness: 2s\nalign: epoch\n"
            )
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "fiomon",
                    "aggregator",
                    "--config",
                    str(cfg),
                    stderr=files[i],
                )
            )
            await _serving(ports[i])
            if i == 0:  # the first one has announced itself (retained) before the second
                await _retained(mosquitto.port, presence)
        # The newer one takes the session; the older one finds out, stops reading and
        # tells it: both say so. Until then the broker may hand the session back and forth
        # once or twice (reconnects race with the announcement on a loaded machine).
        await until(
            lambda: (
                "took our MQTT session" in logs[0].read_text()
                and "we took its MQTT session" in logs[1].read_text()
            ),
            what="both aggregators reporting the shared client_id",
        )
        settled = takeovers()
        await _publish_seconds(mosquitto.port, ["h1", "h2"], 8)
        await until(
            lambda: (
                scrape(ports[1]).get(("fiomon_records_total", (("result", "received"),)))
                == 2 * 2 * 8
            ),
            what="every record received by the newer aggregator",
        )
        first = await asyncio.to_thread(scrape, ports[0])
        second = await asyncio.to_thread(scrape, ports[1])
    finally:
        for p in procs:
            p.terminate()
            await asyncio.wait_for(p.wait(), DEADLINE_S)
        for f in files:
            f.close()
    print(f"broker takeovers: {settled} until both knew, {takeovers()} in all")
    assert settled <= 4, "the session went back and forth before the conflict was seen"
    assert takeovers() == settled, "no flapping once both know"
    assert first[("fiomon_mqtt_session_taken_over", ())] == 1.0
    assert second[("fiomon_mqtt_session_taken_over", ())] == 0.0
    assert second[("fiomon_records_total", (("result", "received"),))] == 2 * 2 * 8
    assert second[("fiomon_lost_records_total", (("host", "h1"),))] == 0.0


def test_the_unit_reloads_with_sighup() -> None:
    unit = Path(__file__).resolve().parents[2] / "deploy/systemd/fiomon-aggregator.service"
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit.read_text()


async def test_a_pause_longer_than_the_lateness_closes_no_quantum_early(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    # Three hosts publish every second; the aggregator process is stopped (SIGSTOP: a VM
    # pause, CPU starvation) for 7 s, more than twice its lateness, then continued. The
    # records queued meanwhile must find their quanta open: every quantum whole, none
    # late. (Taken for silence of the input, the pause closed the queued quanta on the
    # first records read after it.)
    hosts = ["h1", "h2", "h3"]
    quanta = tmp_path / "quanta.jsonl"
    cfg = tmp_path / "aggregator.yaml"
    port = free_port()
    cfg.write_text(
        f"broker: {{port: {mosquitto.port}}}\ntopic_prefix: {PREFIX}\n"
        "client_id: fiomon-aggregator-pause\nquantum: 1s\nlateness: 3s\nalign: epoch\n"
        f"listen: 127.0.0.1:{port}\nquanta_file: {quanta}\nstate_dir: {tmp_path / 'state'}\n"
    )
    log = tmp_path / "aggregator.log"
    with log.open("ab") as err:
        agg = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fiomon", "aggregator", "--config", str(cfg), stderr=err
        )
    try:
        await _serving(port)
        publisher = asyncio.create_task(_publish_seconds(mosquitto.port, hosts, 16))
        await asyncio.sleep(5.5)
        agg.send_signal(signal.SIGSTOP)
        await asyncio.sleep(7.0)
        agg.send_signal(signal.SIGCONT)
        await publisher
        last_end = int(time.time()) * 1000
        deadline = time.monotonic() + 30
        while True:  # until the last second's quantum is closed
            m = await asyncio.to_thread(scrape, port)
            if m.get(("fiomon_quantum_end_timestamp_seconds", ()), 0) * 1000 >= last_end:
                break
            assert time.monotonic() < deadline, "the last quantum never closed"
            await asyncio.sleep(0.2)
    finally:
        agg.send_signal(signal.SIGCONT)
        agg.terminate()
        await asyncio.wait_for(agg.wait(), 30)
    late = sum(v for (name, _), v in m.items() if name == "fiomon_late_records_total")
    rows = [json.loads(line) for line in quanta.read_text().splitlines()]
    cluster = {r["end_ms"]: r for r in rows if r["scope"] == "cluster" and r["direction"] == "all"}
    print(f"{len(cluster)} quanta, late {late}; samples {[r['samples'] for r in cluster.values()]}")
    assert "did not run for" in log.read_text(), "the pause was noticed"
    assert late == 0
    assert len(cluster) >= 15
    assert all(r["samples"] == 3 * 300 for r in cluster.values()), "every quantum whole"


async def test_a_backlog_after_a_restart_waits_in_the_broker_not_in_memory(
    mosquitto_bin: str, tmp_path: Path
) -> None:
    # 400 hosts' records are published while the aggregator is stopped; the broker
    # queues them in its persistent session. At the restart they must come at most
    # `max_inflight` at a time (MQTT 5 Receive Maximum, acknowledged after journaling),
    # not all at once into the aggregator's memory, and every record still arrives once.
    # The broker has no in-flight cap of its own here (Mosquitto's max_inflight_messages
    # 0; some brokers have none), and Mosquitto 2.0.11 ignores the Receive Maximum too once
    # the resumed session acknowledged a message (it then sent 295-380 of the 400 at once):
    # what holds is the aggregator not reading its socket beyond the limit.
    mosquitto = Mosquitto(mosquitto_bin, tmp_path / "mqtt")
    with mosquitto.conf.open("a") as fh:
        fh.write("max_inflight_messages 0\n")
    mosquitto.start()
    hosts = [f"h{i:03d}" for i in range(400)]
    cfg = tmp_path / "aggregator.yaml"
    port = free_port()
    cfg.write_text(
        f"broker: {{port: {mosquitto.port}}}\ntopic_prefix: {PREFIX}\n"
        "client_id: fiomon-aggregator-backlog\nquantum: 1s\nlateness: 60s\nalign: epoch\n"
        f"listen: 127.0.0.1:{port}\nstate_dir: {tmp_path / 'state'}\nmax_inflight: 20\n"
    )
    log = (tmp_path / "aggregator.log").open("ab")
    agg: asyncio.subprocess.Process | None = None
    try:
        agg = await _start(cfg, port, log)
        await mosquitto.wait_for_log(f"fiomon-aggregator-backlog 1 {PREFIX}/v1/+/records")
        agg.terminate()
        assert await asyncio.wait_for(agg.wait(), 30) == 0
        end = int(time.time()) * 1000
        async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="pub-backlog") as c:
            for h in hosts:
                payload = encode(h, "run.json@1", 0, _record(h, end))
                await c.publish(f"{PREFIX}/v1/{h}/records", payload, qos=1)
        agg = await _start(cfg, port, log)
        deadline = time.monotonic() + DEADLINE_S
        while True:  # until every queued record arrived
            m = await asyncio.to_thread(scrape, port)
            received = total(m, "fiomon_records_total", result="received")
            if received >= 2 * len(hosts):
                break
            assert time.monotonic() < deadline, f"{received:g} of {2 * len(hosts)} records"
            await asyncio.sleep(0.2)
    finally:  # no process outlives the test, whatever failed
        if agg is not None and agg.returncode is None:
            agg.terminate()
            await asyncio.wait_for(agg.wait(), 30)
        log.close()
        mosquitto.stop()
    backlog = total(m, "fiomon_intake_backlog_messages_max")
    print(f"backlog at most {backlog:g} messages of {len(hosts)} queued")
    assert total(m, "fiomon_records_total", result="received") == 2 * len(hosts)
    assert total(m, "fiomon_records_total", result="duplicate") == 0
    assert sum(v for (name, _), v in m.items() if name == "fiomon_lost_records_total") == 0
    assert 1 <= backlog <= 20, "the broker kept the backlog beyond max_inflight"
