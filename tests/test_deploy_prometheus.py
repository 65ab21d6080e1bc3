"""Prometheus config and rules checked by promtool; the Grafana dashboard's structure."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fiomon.server.alerts import RUNBOOK_BASE

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
RUNBOOK = DEPLOY.parent / "docs" / "runbook.md"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run .ci/run or apt-get install prometheus")
    return path


def _run(*cmd: str, cwd: Path) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def test_rules_check_and_unit_tests_pass(promtool: str) -> None:
    out = _run(promtool, "check", "rules", "fiomon.rules.yml", cwd=DEPLOY / "prometheus")
    assert "SUCCESS: 13 rules found" in out
    # breach -> one alert; one slow host -> the cluster alert with value, threshold and
    # worst hosts, and the host's alert, both saying "ended" once the benchmark stopped;
    # a breach that clears during the run -> "recovered"; 10 minutes idle -> none;
    # aggregator down -> the down alert only;
    # the root closing quanta without a cell -> one ticket naming it; one burst of late
    # records beyond the revision horizon -> a ticket, merged late records -> nothing
    out = _run(promtool, "test", "rules", "fiomon.rules_test.yml", cwd=DEPLOY / "prometheus")
    assert "SUCCESS" in out


def test_every_alert_has_a_severity_and_a_runbook() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "fiomon.rules.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) == 12
    for r in alerts:
        assert r["labels"]["severity"] in ("page", "ticket"), r["alert"]
        assert r["annotations"]["summary"], r["alert"]
        assert_runbook(r)
    # One alert per concern: the SLA comes from the aggregator's state machine only.
    sla = [r["alert"] for r in alerts if "latency" in r["expr"] or "sla" in r["expr"]]
    assert sla == ["FiomonSLABreach"]
    # The SLA page keeps the aggregator and the cluster apart (Alertmanager groups on them),
    # and says which latency kind the rule holds for.
    (breach,) = [r for r in alerts if r["alert"] == "FiomonSLABreach"]
    assert "max by (cluster, instance, rule, host, latency)" in breach["expr"]


def assert_runbook(rule: dict[str, Any]) -> None:
    """The alert's runbook_url is the shipped base plus an anchor docs/runbook.md has."""
    url = rule["annotations"]["runbook_url"]
    base, anchor = url.split("#")
    # The same base as the aggregator's webhook alert; where the wheel installs the file.
    assert base == RUNBOOK_BASE, rule["alert"]
    assert base.endswith("/share/fiomon/docs/runbook.md"), base
    assert anchor == rule["alert"].lower(), rule["alert"]
    headings = re.findall(r"^## (\S+)$", RUNBOOK.read_text(), re.MULTILINE)
    assert anchor in [h.lower() for h in headings], f"no runbook section for {rule['alert']}"


def test_alertmanager_example_pages_once_per_incident(tmp_path: Path) -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.fail("amtool is missing: run .ci/run or apt-get install prometheus-alertmanager")
    example = DEPLOY / "alertmanager" / "alertmanager.example.yml"
    _run(amtool, "check-config", str(example), cwd=tmp_path)
    doc = yaml.safe_load(example.read_text())
    # Every SLA alert of a cluster is one group (one notification) ...
    assert doc["route"]["group_by"] == ["cluster", "alertname"]
    # ... and a firing cluster-scope SLA alert mutes its cluster's host-scope ones of the
    # same latency kind.
    host_rule = {
        "source_matchers": ['alertname="FiomonSLABreach"', 'host=""'],
        "target_matchers": ['alertname="FiomonSLABreach"', 'host=~".+"'],
        "equal": ["cluster", "latency"],
    }
    assert host_rule in doc["inhibit_rules"]
    # The page names the cluster: every shipped Prometheus config sets it.
    for name in ("prometheus.yml", "prometheus-cells.yml"):
        cfg = yaml.safe_load((DEPLOY / "prometheus" / name).read_text())
        assert cfg["global"]["external_labels"]["cluster"], name


def test_shipped_config_sends_alerts_and_scrapes_once_per_quantum() -> None:
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (am,) = cfg["alerting"]["alertmanagers"]
    assert am["static_configs"][0]["targets"] == ["localhost:9093"]
    (job,) = cfg["scrape_configs"]
    agg = yaml.safe_load((DEPLOY.parent / "config" / "aggregator.example.yaml").read_text())
    assert job["scrape_interval"] == agg.get("quantum", "1s")


def test_scrape_config_checks(promtool: str, tmp_path: Path) -> None:
    for name in ("prometheus.yml", "fiomon.rules.yml"):
        shutil.copy(DEPLOY / "prometheus" / name, tmp_path / name)
    out = _run(promtool, "check", "config", "prometheus.yml", cwd=tmp_path)
    assert "SUCCESS" in out


def dashboard_exprs() -> list[str]:
    """Every PromQL expression of the dashboard (panels and annotations)."""
    dash = json.loads((DEPLOY / "grafana" / "fiomon-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [a["expr"] for a in dash["annotations"]["list"]]
    return exprs


def rule_exprs() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "fiomon.rules.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def test_dashboard_structure() -> None:
    dash = json.loads((DEPLOY / "grafana" / "fiomon-dashboard.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS"]["type"] == "datasource"
    assert variables["DS"]["query"] == "prometheus"
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${DS}", p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${DS}", p["title"]
    titles = " | ".join(p["title"] for p in dash["panels"]).lower()
    for needed in ("percentiles", "heatmap", "top 10 hosts", "iops", "throughput", "health"):
        assert needed in titles, needed
    assert any(p["type"] == "heatmap" for p in dash["panels"])
    # Direction: "All" is fiomon's combined direction, never read + write + all summed
    # (which doubled the heatmap); the options are the single directions.
    direction = variables["direction"]
    assert direction["allValue"] == "all"
    assert "all" not in direction["query"].split(",")
    assert variables["host"]["type"] == "query"
    assert "fiomon_host_last_seen_timestamp_seconds" in variables["host"]["definition"]
    # One latency kind at a time (each aggregator's `latency`): kinds never add up.
    kind = variables["latency"]
    assert kind["type"] == "query" and not kind["includeAll"] and not kind["multi"]
    assert "fiomon_cluster_io_latency_seconds_count, latency" in kind["definition"]
    for t in (t for p in dash["panels"] for t in p["targets"]):
        if re.search(r"fiomon_(cluster|host)_(latency_percentile|io_latency)|sla_", t["expr"]):
            assert 'latency=~"$latency"' in t["expr"], t["expr"]
    targets = [t for p in dash["panels"] for t in p["targets"]]
    assert not any("quantile}}" in t.get("legendFormat", "") for t in targets), "legend p0.99"
    assert any("$host" in t["expr"] for t in targets)
    # The SLA line comes from the aggregator's configuration, not a number in the JSON.
    (latency,) = [p for p in dash["panels"] if "percentiles" in p["title"].lower()]
    assert "thresholds" not in latency["fieldConfig"]["defaults"]
    assert any("fiomon_sla_threshold_seconds" in t["expr"] for t in latency["targets"])
    (top,) = [p for p in dash["panels"] if "top 10 hosts" in p["title"].lower()]
    assert top["targets"][0]["expr"].startswith("topk by (direction) (10,")
    assert dash["annotations"]["list"][0]["expr"]
    for f in (DEPLOY / "grafana" / "provisioning").rglob("*.yml"):
        doc = yaml.safe_load(f.read_text())
        assert doc["apiVersion"] == 1, f


def test_every_expression_parses(promtool: str, tmp_path: Path) -> None:
    # promtool parses expressions inside rule files: wrap every dashboard query in one.
    exprs = [_grafana_to_promql(e) for e in dashboard_exprs()]
    groups = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"x:dash:{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    f = tmp_path / "dashboard.rules.yml"
    f.write_text(yaml.safe_dump(groups))
    _run(promtool, "check", "rules", str(f), cwd=tmp_path)


def _grafana_to_promql(
    expr: str,
    rate_interval: str = "1m",
    direction: str = "read|write",
    host: str = ".*",
    latency: str = "clat",
) -> str:
    """A dashboard query with Grafana's variables filled in (regex values, as Grafana's).

    ``$__interval`` (a panel's step) gets ``rate_interval`` too: a window at least one
    scrape long, so every query has data at any instant.
    """
    return (
        expr.replace("$__rate_interval", rate_interval)
        .replace("$__interval", rate_interval)
        .replace("$direction", direction)
        .replace("$host", host)
        .replace("$latency", latency)
    )


# -- cells (deploy/README.md, "Cells: past one aggregator") -------------------------------


def test_cells_rules_check_and_unit_tests_pass(promtool: str) -> None:
    out = _run(promtool, "check", "rules", "fiomon-cells.rules.yml", cwd=DEPLOY / "prometheus")
    assert "SUCCESS: 10 rules found" in out
    # a down cell, a disconnected cell, all cells gone -> FiomonCellsMissing; healthy
    # cells -> no alert and the p99 of the summed buckets; a mislabelled target.
    out = _run(promtool, "test", "rules", "fiomon-cells.rules_test.yml", cwd=DEPLOY / "prometheus")
    assert "SUCCESS" in out


def test_cells_config_checks_and_labels_every_target(promtool: str, tmp_path: Path) -> None:
    for name in ("prometheus-cells.yml", "fiomon.rules.yml", "fiomon-cells.rules.yml"):
        shutil.copy(DEPLOY / "prometheus" / name, tmp_path / name)
    out = _run(promtool, "check", "config", "prometheus-cells.yml", cwd=tmp_path)
    assert "SUCCESS: 2 rule files found" in out
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus-cells.yml").read_text())
    (job,) = cfg["scrape_configs"]  # one job: the rules count its targets as the cells
    assert job["job_name"] == "fiomon"
    cells = [s["labels"]["cell"] for s in job["static_configs"]]
    assert len(cells) >= 2 and len(set(cells)) == len(cells)
    single = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert job["scrape_interval"] == single["scrape_configs"][0]["scrape_interval"]


def test_cells_alerts_have_a_severity_and_a_runbook() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "fiomon-cells.rules.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert [r["alert"] for r in alerts] == [
        "FiomonCellsMissing",
        "FiomonCellMislabelled",
        "FiomonCellBucketsDiffer",
    ]
    for r in alerts:
        assert r["labels"]["severity"] in ("page", "ticket"), r["alert"]
        assert_runbook(r)
