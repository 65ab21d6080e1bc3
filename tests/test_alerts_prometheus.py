"""One slow host, one page: a real aggregator, Prometheus and Alertmanager, counted by a webhook.

Mosquitto, ``fiomon aggregator`` (two SLA rules: the cluster's p99 read and a per-host p99
write, both at 5 ms), Debian's Prometheus with the shipped ``prometheus.yml`` and
``fiomon.rules.yml`` and Debian's Alertmanager with the shipped
``alertmanager.example.yml``; only addresses, timers and the rule's hold window are
rewritten (1 s evaluations, a 4 s hold instead of 30 s, 3 s group_wait, 1 s
group_interval), and the cluster named in ``external_labels``. Three hosts' records are
published each second for a few seconds, near the wall clock: two fast hosts (64 us) and
``slow-1``, whose reads are in part and whose writes all at about 7 ms, so both rules fire.

Checks, on what the webhook receives from Alertmanager: exactly one firing notification
(the two alerts are one incident), carrying the value and the threshold in ms, the
cluster name, the aggregator's instance, the slow host named with its share of the tail
and a runbook URL whose anchor docs/runbook.md has; then, once the records stop (the
aggregator goes idle), exactly one resolved notification, saying "ended (the benchmark
stopped)", never "recovered".
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pytest
import yaml

from fiomon.bins import BinLayout
from fiomon.wire import encode
from tests.batches import batch
from tests.conftest import DEADLINE_S, Mosquitto, free_port, until
from tests.metricskit import query, scrape
from tests.webhookkit import Webhook as _Webhook
from tests.webhookkit import alertmanager_config, notifications, webhook_receiver

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
PREFIX = "fiomonam"
CLUSTER = "bench-test"
FAST_HOSTS = ("fast-1", "fast-2")
SLOW = "slow-1"
LOWER, _ = BinLayout().edges_ns()
FAST_BIN = int(np.searchsorted(LOWER, 64e3))
SLOW_BIN = int(np.searchsorted(LOWER, 7.3e6))  # 7.34 ms
SECONDS = 8


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: apt-get install prometheus prometheus-alertmanager")
    return path


def prometheus_config(folder: Path, metrics_port: int, am_port: int) -> Path:
    """The shipped files: targets, 1 s evaluations, a 4 s hold, the cluster's name."""
    folder.mkdir()
    rules = (DEPLOY / "prometheus/fiomon.rules.yml").read_text()
    shipped = "max_over_time(fiomon_sla_breach[30s])"
    assert rules.count(shipped) == 1
    (folder / "fiomon.rules.yml").write_text(rules.replace(shipped, shipped.replace("30s", "4s")))
    cfg = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    assert cfg["global"]["external_labels"]["cluster"]  # the shipped config names it
    cfg["global"]["external_labels"]["cluster"] = CLUSTER
    cfg["global"]["evaluation_interval"] = "1s"
    cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{am_port}"]
    (job,) = cfg["scrape_configs"]
    job["static_configs"][0]["targets"] = [f"127.0.0.1:{metrics_port}"]
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def records(host: str, end_ms: int) -> Any:
    """One second of a host's reads and writes."""
    start = end_ms - 1000
    if host == SLOW:  # 30 of 200 reads and every write slow: both rules breach
        recs = [
            (start, end_ms, 0, {FAST_BIN: 170, SLOW_BIN: 30}),
            (start, end_ms, 1, {SLOW_BIN: 100}),
        ]
    else:
        recs = [(start, end_ms, 0, {FAST_BIN: 200}), (start, end_ms, 1, {FAST_BIN: 100})]
    return batch(recs, host, "job", nbytes=4096 * 10)


async def publish_run(port: int, seconds: int) -> None:
    """Each second, each host's records of the second that just ended."""
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{time.monotonic_ns()}") as c:
        for s in range(seconds):
            now = time.time()
            await asyncio.sleep(int(now) + 1.05 - now)
            end = int(time.time()) * 1000
            for h in (*FAST_HOSTS, SLOW):
                payload = encode(h, "run.json@1", 2 * s, records(h, end))
                await c.publish(f"{PREFIX}/v1/{h}/records", payload, qos=1)


async def test_one_slow_host_pages_once_with_value_threshold_host_and_ends(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    prometheus, alertmanager = tool("prometheus"), tool("prometheus-alertmanager")
    metrics_port, prom_port, am_port = free_port(), free_port(), free_port()
    cfg = tmp_path / "aggregator.yaml"
    cfg.write_text(
        f"broker: {{port: {mosquitto.port}}}\ntopic_prefix: {PREFIX}\n"
        "client_id: fiomon-aggregator-alerts\nquantum: 1s\nlateness: 1s\nalign: epoch\n"
        f"listen: 127.0.0.1:{metrics_port}\n"
        "sla:\n"
        "  - {name: p99-read, direction: read, percentile: 99, threshold: 5ms, for: 2}\n"
        "  - {name: p99-write-host, direction: write, percentile: 99, threshold: 5ms,"
        " scope: host, for: 2}\n"
    )
    logs = {n: (tmp_path / f"{n}.log").open("wb") for n in ("aggregator", "prom", "am")}
    procs: list[asyncio.subprocess.Process] = []

    async def start(name: str, *cmd: str) -> None:
        procs.append(
            await asyncio.create_subprocess_exec(
                *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=logs[name]
            )
        )

    with webhook_receiver() as hook_port:
        try:
            await start(
                "aggregator", sys.executable, "-m", "fiomon", "aggregator", "--config", str(cfg)
            )
            await start(
                "am",
                alertmanager,
                f"--config.file={alertmanager_config(tmp_path / 'am', hook_port, group_wait='3s')}",
                f"--storage.path={tmp_path / 'am/data'}",
                f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address=",
            )
            await start(
                "prom",
                prometheus,
                f"--config.file={prometheus_config(tmp_path / 'prom', metrics_port, am_port)}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            )
            await mosquitto.wait_for_log("fiomon-aggregator-alerts 1 fiomonam/v1/+/records")
            await until(
                lambda: query(prom_port, 'up{job="fiomon"} == 1'),
                what="Prometheus scraping the aggregator",
            )
            await publish_run(mosquitto.port, SECONDS)
            await until(lambda: notifications("firing"), what="Alertmanager paging")
            shares = {
                dict(k[1])["host"]: v
                for k, v in scrape(metrics_port).items()
                if k[0] == "fiomon_tail_share"
            }
            # The records stopped: the aggregator goes idle (2 x lateness), the rule's
            # hold passes, Alertmanager sends the resolution.
            await until(
                lambda: notifications("resolved"),
                what="Alertmanager's resolved notification",
                within=DEADLINE_S,
            )
            await asyncio.sleep(3.0)  # would a late second notification come? (group_interval 1s)
        except BaseException:
            print(f"webhook posts: {json.dumps(_Webhook.posts, indent=1)}")
            for n, fh in logs.items():
                fh.flush()
                print(n, (tmp_path / f"{n}.log").read_text()[-3000:])
            raise
        finally:
            for p in procs:
                if p.returncode is None:
                    p.terminate()
                    try:
                        await asyncio.wait_for(p.wait(), DEADLINE_S)
                    except TimeoutError:
                        p.kill()
                        await p.wait()
            for fh in logs.values():
                fh.close()
    posts = list(_Webhook.posts)
    print(f"tail shares while firing: {shares}; notifications: {json.dumps(posts, indent=1)}")
    assert [path for path, _ in posts] == ["/page", "/page"], "one page, then its resolution"
    (firing,) = notifications("firing")
    (resolved,) = notifications("resolved")
    # The page: the cluster's alert (the slow host's own write alert is the same incident:
    # grouped with it and muted by it), in the cluster, from this aggregator.
    (alert,) = firing["alerts"]
    labels = alert["labels"]
    assert labels["alertname"] == "FiomonSLABreach"
    assert labels["rule"] == "p99-read"
    assert "host" not in labels
    assert labels["cluster"] == CLUSTER
    assert labels["instance"] == f"127.0.0.1:{metrics_port}"
    notes = alert["annotations"]
    m = re.fullmatch(
        rf"p99 read (\d+(?:\.\d+)?)ms > 5ms on the cluster \({CLUSTER}, 127\.0\.0\.1:\d+\)",
        notes["summary"],
    )
    assert m, notes["summary"]
    assert 5.0 < float(m.group(1)) < 7.5, "the value, in ms, the slow bin's"
    assert notes["worst_hosts"].startswith(f"{SLOW} 100%"), notes["worst_hosts"]
    assert f"{SLOW} 100%" in notes["description"]
    anchor = notes["runbook_url"].rsplit("#", 1)[1]
    assert anchor == "fiomonslabreach"
    assert "\n## FiomonSLABreach" in (REPO / "docs/runbook.md").read_text()
    # The end: the benchmark stopped, said so; nothing says recovered.
    ended = [a["annotations"]["summary"] for a in resolved["alerts"]]
    assert ended, resolved
    assert all(s.startswith("ended (the benchmark stopped): p99 ") for s in ended), ended
    assert not any("recovered" in a["annotations"]["summary"] for a in resolved["alerts"])
