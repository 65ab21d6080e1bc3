"""``/metrics`` from a child process, over real HTTP: the same answers as the thread
server, a storm served, a dead child replaced and counted, no child outliving its parent."""

from __future__ import annotations

import asyncio
import gzip
import http.client
import os
import resource
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fiomon.server.exporter import CONTENT_TYPE, Snapshot, render
from fiomon.server.metrics_server import MetricsProcess
from tests.server.test_exporter import rich_snapshot


def get(
    port: int,
    path: str = "/metrics",
    *,
    gz: bool = False,
    method: str = "GET",
    conn: http.client.HTTPConnection | None = None,
) -> tuple[int, dict[str, str], bytes]:
    own = conn is None
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request(method, path, headers={"Accept-Encoding": "gzip"} if gz else {})
        resp = c.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        if own:
            c.close()


Served = tuple[MetricsProcess, list[Snapshot], list[int]]
PROCESS_FAMILIES = {
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
    "process_max_fds",
}


def fiomon_part(body: bytes) -> bytes:
    """A scrape's body without the ``process_*`` families read at the scrape (the end)."""
    head, sep, _ = body.partition(b"# HELP process_")
    assert sep, "every scrape ends with the process metrics"
    return head


def wait_for(what: str, ok: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def served() -> Iterator[Served]:
    current = [rich_snapshot()]
    restarts: list[int] = []
    server = MetricsProcess(
        "127.0.0.1", 0, lambda: current[0], on_restart=lambda: restarts.append(1)
    )
    server.start()
    try:
        yield server, current, restarts
    finally:
        server.close()


def test_answers_scrapes_and_serves_a_storm(served: Served) -> None:
    server, current, _ = served
    want = render(current[0])
    status, headers, body = get(server.port)
    assert status == 200
    assert headers["content-type"] == CONTENT_TYPE
    assert fiomon_part(body) == want
    status, headers, body = get(server.port, "/", gz=True)
    assert (status, headers["content-encoding"]) == (200, "gzip")
    assert fiomon_part(gzip.decompress(body)) == want
    assert int(headers["content-length"]) == len(body)
    assert get(server.port, "/other")[0] == 404
    assert get(server.port, method="POST")[0] == 501

    # Keep-alive: several requests on one connection, as Prometheus scrapes.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        for gz in (False, True, False):
            status, headers, body = get(server.port, gz=gz, conn=conn)
            assert status == 200
            assert fiomon_part(gzip.decompress(body) if gz else body) == want
    finally:
        conn.close()

    bodies: list[bytes] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def scrape(gz: bool) -> None:
        try:
            status, _, body = get(server.port, gz=gz)
            assert status == 200
            body = fiomon_part(gzip.decompress(body) if gz else body)
        except BaseException as exc:  # collected and asserted below
            with lock:
                errors.append(exc)
            return
        with lock:
            bodies.append(body)

    threads = [threading.Thread(target=scrape, args=(i % 2 == 0,)) for i in range(300)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert len(bodies) == 300
    assert set(bodies) == {want}

    current[0] = Snapshot()  # a close: the next scrapes see the new snapshot
    server.poke()
    wait_for(
        "the new snapshot is served", lambda: fiomon_part(get(server.port)[2]) == render(Snapshot())
    )


def test_a_dead_child_is_replaced_and_counted(served: Served) -> None:
    server, current, restarts = served
    assert get(server.port)[0] == 200
    first = server.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_for("a new child", lambda: server.pid != first and restarts == [1])
    # Scrapes made while it was down waited in the listen backlog; now they are answered.
    status, _, body = get(server.port)
    assert (status, fiomon_part(body)) == (200, render(current[0]))
    assert server.restarts == 1


def test_the_child_ignores_the_groups_sigterm_and_ends_with_its_parent(tmp_path: Path) -> None:
    # A parent process serving /metrics is killed with SIGKILL: its child must not keep
    # the port (the restarted aggregator binds it again at once).
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from fiomon.server.exporter import Snapshot\n"
        "from fiomon.server.metrics_server import MetricsProcess\n"
        "m = MetricsProcess('127.0.0.1', 0, Snapshot)\n"
        "m.start()\n"
        "print(m.port, m.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    try:
        assert parent.stdout is not None
        port, child = (int(x) for x in parent.stdout.readline().split())
        assert get(port)[0] == 200
        os.kill(child, signal.SIGTERM)  # what `systemctl stop` sends the whole group
        assert get(port)[0] == 200, "SIGTERM is the parent's to act on"
        parent.kill()
        parent.wait(10)

        def gone() -> bool:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for("the child ended with its parent", gone)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))  # the port is free again
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()


def test_a_port_in_use_fails_at_start() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        with pytest.raises(OSError):
            MetricsProcess("127.0.0.1", s.getsockname()[1], Snapshot)


def test_https_when_a_certificate_is_configured(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    snap = rich_snapshot()
    server = MetricsProcess("127.0.0.1", 0, lambda: snap, certfile=cert, keyfile=key)
    server.start()
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        ctx.check_hostname = False
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=30, context=ctx)
        try:
            status, _, body = get(server.port, conn=conn)
        finally:
            conn.close()
        assert (status, fiomon_part(body)) == (200, render(snap))
        # A client that speaks plain HTTP to it fails its handshake; the server goes on.
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            s.recv(100)
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=30, context=ctx)
        try:
            assert get(server.port, conn=conn)[0] == 200
        finally:
            conn.close()
    finally:
        server.close()
    with pytest.raises(ssl.SSLError):
        MetricsProcess("127.0.0.1", 0, Snapshot, certfile=key, keyfile=key)


async def test_a_scrape_during_a_render_gets_the_previous_rendering_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Rendering 1000 hosts takes 150 ms, seconds on a busy CPU at the child's low
    # priority; a scrape that waited for it measured 1.5-2.6 s at p99 under load.
    import dataclasses  # noqa: PLC0415

    from fiomon.server import metrics_server  # noqa: PLC0415

    gate = threading.Event()
    gate3 = threading.Event()

    def held(snap: Snapshot, prefixes: dict[str, dict[tuple[str, ...], str]]) -> bytes:
        if snap.quantum_end_s == 2.0:
            assert gate.wait(30), "the test releases the render"
        if snap.quantum_end_s == 3.0:
            assert gate3.wait(30), "the test releases the render"
        return render(snap, prefixes)

    async def until_served(want: bytes) -> None:
        deadline = time.monotonic() + 60
        while fiomon_part(body.get(gzipped=False)) != want:
            assert time.monotonic() < deadline, "the new rendering never came"
            await asyncio.sleep(0.01)

    monkeypatch.setattr(metrics_server, "render", held)
    body = metrics_server._Body()
    first = dataclasses.replace(rich_snapshot(), quantum_end_s=1.0)
    second = dataclasses.replace(first, quantum_end_s=2.0)
    third = dataclasses.replace(first, quantum_end_s=3.0)
    try:
        body.set(first)
        old = fiomon_part(body.get(gzipped=False))  # nothing rendered yet: rendered now
        assert old == render(first)
        body.set(second)  # scraped before: rendered at once, on the worker thread
        t0 = time.perf_counter()
        assert fiomon_part(body.get(gzipped=False)) == old  # served at once while it renders
        assert fiomon_part(gzip.decompress(body.get(gzipped=True))) == old
        assert time.perf_counter() - t0 < 5
        body.set(third)  # while the second renders: not rendered when that one is done
        gate.set()
        await until_served(render(second))
        # The third came a moment ago and nobody rendered it: the second is served at
        # once (one snapshot old) while the third renders.
        t0 = time.perf_counter()
        assert fiomon_part(body.get(gzipped=False)) == render(second)
        assert time.perf_counter() - t0 < 5
        gate3.set()
        await until_served(render(third))
    finally:
        gate.set()
        gate3.set()
        body.close()


def test_process_metrics_of_the_service_and_the_probes() -> None:
    """``process_*`` of the service (not of the child), ``/-/healthy``, ``/-/ready`` + reason."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    reason: list[str | None] = ["starting: not yet subscribed on the broker"]
    snap = rich_snapshot()
    server = MetricsProcess("127.0.0.1", 0, lambda: snap, not_ready=lambda: reason[0])
    server.start()
    try:
        assert get(server.port, "/-/healthy")[0] == 200
        want = (503, b"fiomon is not ready: starting: not yet subscribed on the broker\n")
        wait_for("the reason", lambda: get(server.port, "/-/ready")[:3:2] == want)
        reason[0] = None
        server.poke()
        wait_for(
            "ready", lambda: get(server.port, "/-/ready")[:3:2] == (200, b"fiomon is ready.\n")
        )
        reason[0] = "not connected to the MQTT broker (reconnecting)"
        server.poke()
        wait_for("not ready again", lambda: b"not connected" in get(server.port, "/-/ready")[2])
        assert get(server.port, "/-/ready")[0] == 503

        for gz in (False, True):
            status, _, body = get(server.port, gz=gz)
            text = (gzip.decompress(body) if gz else body).decode()
            assert status == 200
            values = {
                s.name: s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name.startswith("process_")
            }
            assert set(values) == PROCESS_FAMILIES
            # This test's process is the service here: the child reads its /proc entry.
            me = os.times()
            assert values["process_cpu_seconds_total"] >= me.user + me.system - 0.05
            assert values["process_resident_memory_bytes"] > 20e6  # numpy alone is more
            assert values["process_virtual_memory_bytes"] > values["process_resident_memory_bytes"]
            started = values["process_start_time_seconds"]
            assert time.time() - 24 * 3600 < started <= time.time()
            assert abs(started - own_start_time_s()) < 2
            assert values["process_open_fds"] >= 3
            assert values["process_max_fds"] == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        server.close()
    docs = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    for name in PROCESS_FAMILIES:
        assert f"`{name}`" in docs, name
    for path in ("/-/healthy", "/-/ready"):
        assert f"`{path}`" in docs


def own_start_time_s() -> float:
    """This process's start (Unix time), from /proc as ``ps`` reads it."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    btime = next(
        float(ln.split()[1])
        for ln in Path("/proc/stat").read_text().splitlines()
        if ln.startswith("btime ")
    )
    return btime + float(fields[19]) / ticks


def test_process_metrics_survive_a_proc_with_only_process_directories(tmp_path: Path) -> None:
    """systemd's ``ProcSubset=pid`` hides ``/proc/stat`` (the boot time): still exported."""
    from prometheus_client import CollectorRegistry, ProcessCollector  # noqa: PLC0415

    from fiomon.procstats import ServiceProcessCollector  # noqa: PLC0415

    pid = str(os.getpid())
    (tmp_path / pid).symlink_to(f"/proc/{pid}")  # a /proc with this process only
    plain, ours = CollectorRegistry(), CollectorRegistry()
    ProcessCollector(pid=lambda: pid, proc=str(tmp_path), registry=plain)
    ServiceProcessCollector(pid=lambda: pid, proc=str(tmp_path), registry=ours)
    assert plain.get_sample_value("process_start_time_seconds") is None  # what it did
    started = ours.get_sample_value("process_start_time_seconds")
    assert started is not None and abs(started - own_start_time_s()) < 2
    for name in PROCESS_FAMILIES:
        assert ours.get_sample_value(name) is not None, name
