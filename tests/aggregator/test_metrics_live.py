"""``/metrics`` of a live aggregator, on real parts: promtool finds nothing, idle withdraws.

A real Mosquitto, the aggregator service with its ``/metrics`` child process, records
published as agents publish them, and a real Prometheus with the shipped rules scraping it:
while records arrive the per-quantum series and the SLA alert are there; once the input
stays silent for ``2 x lateness`` the aggregator is idle, the series go (Prometheus marks
them stale: an instant query finds nothing), the alert resolves, and no alert fires or
waits.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path

import aiomqtt
import pytest

import fiomon
from fiomon import __version__
from fiomon.aggregator.merger import AggregatorCore
from fiomon.aggregator.service import run_aggregator
from fiomon.config import AggregatorConfig, BrokerConfig, SlaRule
from tests.aggregator.test_aggregator_service import PREFIX, _publish_seconds
from tests.conftest import DEADLINE_S, Mosquitto, free_port, until
from tests.metricskit import parse_samples, query, scrape_text, wait_http

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PER_QUANTUM = (
    "fiomon_cluster_latency_percentile_seconds",
    "fiomon_host_latency_percentile_seconds",
    "fiomon_cluster_latency_percentile_saturated",
    "fiomon_cluster_iops",
    "fiomon_cluster_throughput_bytes_per_second",
)


def _names(text: str) -> set[str]:
    return {name for name, _ in parse_samples(text)}


def _promtool_findings(promtool: str, text: str) -> str:
    r = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    out = (r.stdout + r.stderr).strip()
    return f"exit {r.returncode}: {out}" if r.returncode or out else ""


def git_head() -> str:
    """``git rev-parse HEAD`` of the checkout fiomon is imported from."""
    return subprocess.run(
        ["git", "-C", str(Path(fiomon.__file__).parent), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


async def test_live_metrics_follow_conventions_and_idle_withdraws_them(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    if promtool is None or prometheus is None:
        pytest.fail(
            "promtool/prometheus are missing: run scripts/test or apt-get install prometheus"
        )
    metrics_port, prom_port = free_port(), free_port()
    shutil.copy(DEPLOY / "prometheus" / "fiomon.rules.yml", tmp_path / "fiomon.rules.yml")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{tmp_path / 'fiomon.rules.yml'}']\n"
        "scrape_configs:\n  - job_name: fiomon\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )
    prom = await asyncio.create_subprocess_exec(
        prometheus,
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    cfg = AggregatorConfig(
        broker=BrokerConfig(port=mosquitto.port),
        topic_prefix=PREFIX,
        client_id="fiomon-aggregator-metrics",
        lateness_ms=1500,
        align="epoch",
        listen=f"127.0.0.1:{metrics_port}",
        # Every quantum breaches (p50 read above 1 us): the alert fires during the run.
        sla=(SlaRule("p50-read", "read", 50.0, 1e3, for_quanta=1, min_samples=1),),
    )
    cores: list[AggregatorCore] = []
    stop = asyncio.Event()
    agg = asyncio.create_task(run_aggregator(cfg, stop=stop, ready=cores.append))
    try:
        await wait_http(f"http://127.0.0.1:{prom_port}/-/ready")
        await wait_http(f"http://127.0.0.1:{metrics_port}/metrics")
        await until(lambda: cores and cores[0].broker_connected, what="aggregator connected")
        core = cores[0]
        async with aiomqtt.Client("127.0.0.1", mosquitto.port, identifier="status-h3") as c:
            # An agent that only says it is online (between its runs): seen, no records.
            status = json.dumps({"state": "online", "time_ms": int(time.time() * 1000)})
            await c.publish(f"{PREFIX}/v1/h3/status", status.encode(), qos=1)
        publisher = asyncio.create_task(_publish_seconds(mosquitto.port, ["h1", "h2"], 6))

        # -- active: every family there, promtool finds nothing -------------------------
        async def text_now() -> str:
            return await asyncio.to_thread(scrape_text, metrics_port, 10)

        text = ""
        deadline = asyncio.get_running_loop().time() + DEADLINE_S
        while missing := [n for n in PER_QUANTUM if n not in _names(text)]:
            assert asyncio.get_running_loop().time() < deadline, f"never exported: {missing}"
            await asyncio.sleep(0.2)
            text = await text_now()
        assert not _promtool_findings(promtool, text), _promtool_findings(promtool, text)
        s = parse_samples(text)
        py = next(dict(k[1])["python"] for k in s if k[0] == "fiomon_build_info")
        labels = (("python", py), ("revision", git_head()), ("version", __version__))
        assert s[("fiomon_build_info", labels)] == 1.0
        assert s[("process_resident_memory_bytes", ())] > 20e6  # the aggregator's, not 0
        assert s[("process_open_fds", ())] > 3
        for probe, answer in (
            ("/-/ready", "fiomon is ready."),
            ("/-/healthy", "fiomon is healthy."),
        ):
            assert await asyncio.to_thread(scrape_text, metrics_port, 10, probe) == answer + "\n"
        assert s[("fiomon_broker_connected", ())] == 1.0
        assert s[("fiomon_benchmark_active", ())] == 1.0
        seen = {dict(k[1])["host"] for k in s if k[0] == "fiomon_host_last_seen_timestamp_seconds"}
        assert seen == {"h1", "h2", "h3"}
        clat = (("latency", "clat"),)
        threshold = (("direction", "read"), *clat, ("percentile", "50"), ("rule", "p50-read"))
        assert s[("fiomon_sla_threshold_seconds", threshold)] == 1e-6
        p99 = (("direction", "read"), *clat, ("percentile", "99"))
        assert s[("fiomon_cluster_latency_percentile_seconds", p99)] > 0
        await until(
            lambda: query(prom_port, 'ALERTS{alertname="FiomonSLABreach",alertstate="firing"}'),
            what="Prometheus fires FiomonSLABreach during the run",
        )
        assert await asyncio.to_thread(
            query, prom_port, "fiomon_cluster_latency_percentile_seconds"
        )
        await publisher

        # -- idle: no records for 2 x lateness -------------------------------------------
        await until(lambda: not core.active, what="the aggregator goes idle")
        # /metrics comes from the child process, which may serve the previous rendering
        # for up to 2 s after a newer snapshot: wait for the idle one.
        await until(
            lambda: not [n for n in PER_QUANTUM if n in _names(scrape_text(metrics_port, 10))],
            what="per-quantum series withdrawn from /metrics",
        )
        text = await text_now()
        names = _names(text)
        s = parse_samples(text)
        assert s[("fiomon_benchmark_active", ())] == 0.0
        clat = (("latency", "clat"),)
        assert s[("fiomon_sla_breach", (("host", ""), *clat, ("rule", "p50-read")))] == 0.0
        assert s[("fiomon_sla_breaches_total", (*clat, ("rule", "p50-read")))] == 1.0
        read = (("direction", "read"), *clat)
        assert s[("fiomon_cluster_io_latency_seconds_count", read)] > 0
        assert "fiomon_quantum_end_timestamp_seconds" in names
        assert not _promtool_findings(promtool, text), _promtool_findings(promtool, text)
        # Prometheus: the withdrawn series are stale at once, the alert resolved, and no
        # rule fires or waits (idle is no incident).
        await until(
            lambda: query(prom_port, "fiomon_benchmark_active == 0"),
            what="Prometheus scrapes the idle state",
        )
        for expr in PER_QUANTUM:
            assert not await asyncio.to_thread(query, prom_port, expr), f"{expr} is stale"
        await until(
            lambda: not query(prom_port, "ALERTS"),
            what="no alert firing or pending once idle",
        )
    finally:
        stop.set()
        await asyncio.wait_for(agg, DEADLINE_S)
        prom.terminate()
        await prom.wait()
