"""The Grafana provisioning agrees with the Prometheus scrape: per-quantum panels show
every quantum (deploy/README.md, "Grafana")."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
# Gauges that describe the last closed quantum only: sampled, they skip quanta.
PER_QUANTUM = (
    "fiomon_cluster_latency_percentile_seconds",
    "fiomon_cluster_iops",
    "fiomon_cluster_throughput_bytes_per_second",
    "fiomon_host_latency_percentile_seconds",
)
INSTANT = ("bargauge", "stat")  # panels that show the newest value only


def _dashboard() -> dict[str, Any]:
    out: dict[str, Any] = json.loads((DEPLOY / "grafana" / "fiomon-dashboard.json").read_text())
    return out


def _scrape_interval(name: str) -> str:
    cfg = yaml.safe_load((DEPLOY / "prometheus" / name).read_text())
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "fiomon"]
    interval: str = job["scrape_interval"]
    return interval


def _time_interval() -> str:
    doc = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    (ds,) = doc["datasources"]
    interval: str = ds["jsonData"]["timeInterval"]
    return interval


def test_the_data_source_step_is_the_scrape_interval() -> None:
    # Grafana's smallest step ($__interval) is the data source's timeInterval: longer than
    # the scrape (it was 5s against 1 s scrapes), a per-quantum panel drew one in five.
    assert _time_interval() == _scrape_interval("prometheus.yml")
    assert _time_interval() == _scrape_interval("prometheus-cells.yml")


def test_per_quantum_panels_use_step_windows_and_no_fixed_ones() -> None:
    for panel in _dashboard()["panels"]:
        # A panel's own min interval would override the data source's.
        assert panel.get("interval") in (None, "", _time_interval()), panel["title"]
        for t in panel["targets"]:
            expr = t["expr"]
            # Every range is a step ($__interval) or a rate window ($__rate_interval).
            for window in re.findall(r"\[([^\]]*)\]", expr):
                assert window in ("$__interval", "$__rate_interval"), (panel["title"], expr)
            if panel["type"] in INSTANT:
                continue
            for metric in PER_QUANTUM:
                for m in re.finditer(rf"\b{metric}\b", expr):
                    head = expr[: m.start()]
                    # ..._over_time(<metric>{...}[$__interval]): each step holds its
                    # quanta, each quantum lies in one step.
                    assert re.search(r"(max|avg)_over_time\($", head), (panel["title"], expr)
                    tail = expr[m.end() :]
                    assert re.match(r"(\{[^}]*\})?\[\$__interval\]\)", tail), (
                        panel["title"],
                        expr,
                    )


def test_a_slow_quantum_between_steps_shows(tmp_path: Path) -> None:
    # Prometheus itself (promtool's rule tests) evaluates the panel's query at a 5 s step
    # over 1 s scrapes: the one slow quantum between two steps is drawn, where the plain
    # gauge (the panel before) drew the fast quanta around it only.
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: run .ci/run or apt-get install prometheus")
    (panel,) = [p for p in _dashboard()["panels"] if "percentiles" in p["title"].lower()]
    expr = (
        panel["targets"][0]["expr"]
        .replace("$__interval", "5s")
        .replace('direction=~"$direction"', 'direction=~"read"')
        .replace('latency=~"$latency"', 'latency=~"clat"')
    )
    labels = 'direction="read",latency="clat",percentile="99"'
    series = f"fiomon_cluster_latency_percentile_seconds{{{labels}}}"
    tests = {
        "rule_files": [],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                # 1 ms each quantum but the 8th (7 s): 9 ms.
                "input_series": [{"series": series, "values": "0.001x6 0.009 0.001x4"}],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "10s",
                        "exp_samples": [{"labels": "{" + labels + "}", "value": 0.009}],
                    },
                    {
                        "expr": series,  # the plain gauge at the same step: the spike is gone
                        "eval_time": "10s",
                        "exp_samples": [{"labels": series, "value": 0.001}],
                    },
                ],
            }
        ],
    }
    f = tmp_path / "step_test.yml"
    f.write_text(yaml.safe_dump(tests))
    r = subprocess.run(
        [promtool, "test", "rules", str(f)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr
