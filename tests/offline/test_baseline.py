"""``fiomon baseline`` on a real fio run: rules that the run itself never fires, and no more.

A short rate-limited fio run (tests/fiorun.py) is the baseline. Its suggested rules must
load as aggregator configuration, and the aggregator's own SLA state machine
(:func:`fiomon.server.alerts.evaluate`), fed the run's quanta as ``fiomon report`` gives
them, must never fire them at ``--margin 1``, yet fire a rule set just below the
sustained worst: the suggestion sits exactly on the boundary, and the margin above it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fiomon.config import SlaRule, aggregator_config_from
from fiomon.offline.baseline import round_up_latency, sustained_worst
from fiomon.server.alerts import AlertState, Phase, evaluate
from fiomon.units import parse_latency_ns
from tests.fiorun import fiomon, job_file, start_fio, wait_fio

FOR = 2


@pytest.fixture(scope="module")
def baseline_run(fio_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 5 s random read/write run at 400 IOPS: its json+ stream (live source of agents)."""
    folder = tmp_path_factory.mktemp("baseline")
    job = job_file(folder, prefix=None, iops=400, runtime=5, rw="randrw")
    out = folder / "run.json"
    wait_fio([start_fio(fio_bin, job, out)])
    return out


def report_rows(*args: str | Path) -> list[dict[str, Any]]:
    r = fiomon("report", "--format", "jsonl", *args)
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines() if x.strip()]


def fires(rule: SlaRule, rows: list[dict[str, Any]]) -> bool:
    """Whether the aggregator's state machine fires ``rule`` on these rows."""
    state = AlertState()
    for row in sorted(rows, key=lambda r: r["end_ms"]):
        if row["direction"] != rule.direction or row["scope"] != rule.scope:
            continue
        value = row["percentiles_ns"].get(f"{rule.percentile:g}")
        state = evaluate(rule, value, row["samples"], state, row["end_ms"])
        if state.phase is Phase.FIRING:
            return True
    return False


def test_suggested_rules_sit_on_the_baseline_s_sustained_worst(baseline_run: Path) -> None:
    r = fiomon("baseline", "--margin", "1", "--for", str(FOR), "--per-host", baseline_run)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# SLA rules from a baseline run"), r.stdout
    rules = yaml.safe_load(r.stdout)["sla"]
    cfg = aggregator_config_from({"sla": rules})  # pastes into aggregator.yaml as is
    by_key = {(x.scope, x.direction): x for x in cfg.sla}
    assert set(by_key) == {
        ("cluster", "read"),
        ("cluster", "write"),
        ("host", "read"),
        ("host", "write"),
    }, r.stdout
    rows = report_rows("--per-host", baseline_run)
    for (scope, direction), rule in by_key.items():
        assert rule.for_quanta == FOR and rule.min_samples == 100 and rule.percentile == 99
        series = [
            row["percentiles_ns"]["99"]
            for row in sorted(rows, key=lambda x: x["end_ms"])
            if row["direction"] == direction
            and row["scope"] == scope
            and row["samples"] >= rule.min_samples
        ]  # one host: host scope is one series
        held = sustained_worst(series, FOR)
        assert held is not None, (scope, direction, series)
        # the brute-force reading of "held for FOR quanta in a row"
        assert held == max(min(series[i : i + FOR]) for i in range(len(series) - FOR + 1))
        assert rule.threshold_ns == parse_latency_ns(round_up_latency(held), what="t")
        assert held <= rule.threshold_ns < held * 1.1
        assert not fires(rule, rows), (rule, series)
        below = SlaRule(
            name="below",
            direction=direction,
            percentile=99,
            threshold_ns=held * 0.999,
            scope=scope,
            for_quanta=FOR,
        )
        assert fires(below, rows), (below, series)


def test_the_margin_and_a_quanta_file_give_the_same_rules(
    baseline_run: Path, tmp_path: Path
) -> None:
    quanta = tmp_path / "quanta.jsonl"
    r = fiomon("report", "--format", "jsonl", "--percentiles", "50,99,99.9", baseline_run)
    assert r.returncode == 0, r.stderr
    quanta.write_text(r.stdout)
    from_logs = fiomon("baseline", "--margin", "1.5", baseline_run)
    from_file = fiomon("baseline", "--margin", "1.5", quanta)
    assert from_logs.returncode == 0, from_logs.stderr
    assert from_file.returncode == 0, from_file.stderr
    assert yaml.safe_load(from_logs.stdout) == yaml.safe_load(from_file.stdout)
    once = {
        x["direction"]: x for x in yaml.safe_load(fiomon("baseline", baseline_run).stdout)["sla"]
    }
    more = {x["direction"]: x for x in yaml.safe_load(from_logs.stdout)["sla"]}
    for d, rule in once.items():  # default margin 2 over 1.5: thresholds grow
        assert parse_latency_ns(rule["threshold"], what="t") > parse_latency_ns(
            more[d]["threshold"], what="t"
        )


def test_round_up_latency_never_rounds_down() -> None:
    assert round_up_latency(4_101_000) == "4.2ms"
    assert round_up_latency(4_100_000) == "4.1ms"
    assert round_up_latency(27_200) == "28us"
    assert round_up_latency(999) == "1000ns"
    assert round_up_latency(12_345_678_900) == "13000ms"
    for ns in (1.0, 987.6, 1234.5, 99_999.0, 5e6, 123_456_789.0):
        assert parse_latency_ns(round_up_latency(ns), what="t") >= ns


def test_a_margin_below_one_is_refused(baseline_run: Path) -> None:
    r = fiomon("baseline", "--margin", "0.8", baseline_run)
    assert r.returncode == 2
    assert "--margin: expected a number of at least 1" in r.stderr
