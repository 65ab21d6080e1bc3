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


def test_a_relative_time_run_is_not_dated_1970(fio_bin: str, tmp_path: Path) -> None:
    # fio logs without log_unix_epoch count ms from the job's start: the header said
    # "run: 1969-12-31 23:59:59 to 00:00:04 UTC".
    job = job_file(tmp_path, iops=200, runtime=4, epoch=0)
    wait_fio([start_fio(fio_bin, job, tmp_path / "out.json")])
    (log,) = tmp_path.glob("run_clat_hist.*.log")
    r = fiomon("baseline", "--for", "2", log)
    assert r.returncode == 0, r.stderr
    (span,) = [x for x in r.stdout.splitlines() if x.startswith("# run: ")]
    assert "1969" not in span and "1970" not in span, span
    assert "s since job start" in span, span


def test_run_picks_the_baseline_out_of_a_quanta_file_of_many_runs(
    baseline_run: Path, tmp_path: Path
) -> None:
    # An aggregator's quanta file holds every run it saw; without --run a later slow run
    # raised every suggested threshold, and there was no way to pick the baseline.
    r = fiomon("report", "--format", "jsonl", "--run", "base", baseline_run)
    assert r.returncode == 0, r.stderr
    slow = []
    for line in r.stdout.splitlines():
        row = json.loads(line)
        row["runs"] = ["slow"]
        row["start_ms"] += 3_600_000
        row["end_ms"] += 3_600_000
        row["percentiles_ns"] = {k: v * 100 for k, v in row["percentiles_ns"].items()}
        slow.append(json.dumps(row) + "\n")
    quanta = tmp_path / "quanta.jsonl"
    quanta.write_text(r.stdout + "".join(slow))
    alone = fiomon("baseline", baseline_run)
    picked = fiomon("baseline", "--run", "base", quanta)
    assert picked.returncode == 0, picked.stderr
    assert yaml.safe_load(picked.stdout) == yaml.safe_load(alone.stdout)
    mixed = fiomon("baseline", quanta)
    assert yaml.safe_load(mixed.stdout) != yaml.safe_load(alone.stdout)
    missing = fiomon("baseline", "--run", "bsae", quanta)
    assert missing.returncode == 1
    assert "no row holds records of run 'bsae'; its runs: base, slow" in missing.stderr
    assert fiomon("baseline", "--run", "base", baseline_run).returncode == 2  # fio output


def test_an_idle_or_tiny_run_says_why_it_gives_no_rule(tmp_path: Path) -> None:
    # A run without I/O printed "sla: []" and exited 1 with nothing on stderr.
    import numpy as np  # noqa: PLC0415

    from fiomon.bins import BinLayout  # noqa: PLC0415
    from fiomon.tools.simulate import format_line  # noqa: PLC0415

    zero = np.zeros(BinLayout().nbins, np.int64)
    few = zero.copy()
    few[300] = 5
    t0 = 1_795_750_000_000
    for name, counts, why in (
        ("idle", zero, "no I/O in the directions read,write,trim,mixed (an idle run): no rule"),
        ("tiny", few, "no quantum in the directions read,write,trim,mixed has --min-samples 100"),
    ):
        log = tmp_path / f"{name}_clat_hist.1.log"
        log.write_text("".join(format_line(t0 + i * 1000, 0, 4096, counts) for i in range(1, 8)))
        r = fiomon("baseline", log)
        assert r.returncode == 1, r.stderr
        assert why in r.stderr, r.stderr
