"""fiomon summary: statistics checked against the exact latencies the simulator drew."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fiomon.cli import main
from fiomon.errors import ConfigError
from fiomon.fio.problems import ProblemLog
from fiomon.offline.sources import SourceOptions
from fiomon.offline.summary import Filters, HistBins, bins_from_yaml, summarize_run
from fiomon.tools.simulate import JobSpec, LatencyModel, format_line, records
from tests.clock import T0


def write_job(path: Path, job: int, seconds: int = 20) -> dict[int, list[tuple[int, np.ndarray]]]:
    """A hist log of one job; returns per direction the (end_ms, exact latencies) records."""
    spec = JobSpec("h", job, 800.0, 37 * job)
    truth: dict[int, list[tuple[int, np.ndarray]]] = {0: [], 1: []}
    with path.open("w") as fh:
        for end, d, counts, lat in records(
            spec,
            start_ms=T0,
            seconds=seconds,
            interval_ms=1000,
            model=LatencyModel(),
            rng=np.random.default_rng(job),
            keep_truth=True,
        ):
            fh.write(format_line(end, d, 4096, counts))
            assert lat is not None
            truth[d].append((end, lat))
    return truth


JOB2: dict[int, list[tuple[int, np.ndarray]]] = {}


@pytest.fixture
def run(tmp_path: Path) -> tuple[list[Path], dict[int, list[tuple[int, np.ndarray]]]]:
    paths = [tmp_path / f"job_clat_hist.{j}.log" for j in (1, 2)]
    merged: dict[int, list[tuple[int, np.ndarray]]] = {0: [], 1: []}
    for j, p in enumerate(paths, start=1):
        per_job = write_job(p, j)
        if j == 2:
            JOB2.clear()
            JOB2.update(per_job)
        for d, recs in per_job.items():
            merged[d] += recs
    return paths, merged


def stats_of(paths: list[Path], **kw: object) -> dict[str, dict[str, Any]]:
    stats = summarize_run(
        paths,
        filters=Filters(**kw),  # type: ignore[arg-type]
        source=SourceOptions(interval_ms=1000),
        percentiles=(50.0, 90.0, 99.0, 99.9),
        bins=HistBins(10_000, 100_000_000, 12, "log"),
        problems=ProblemLog(),
    )
    return {s.operation: s.to_json() for s in stats}


def test_statistics_match_the_exact_latencies_within_their_bounds(run: tuple) -> None:  # type: ignore[type-arg]
    paths, truth = run
    got = stats_of(paths)
    for name, dirs in (("read", [0]), ("write", [1]), ("all", [0, 1])):
        lat = np.concatenate([lt for d in dirs for _, lt in truth[d]]).astype(np.float64)
        s = got[name]
        assert s["ios"] == len(lat)
        assert s["bytes"] == len(lat) * 4096
        assert s["mean_ns"] == pytest.approx(lat.mean(), rel=0.008)  # half a fine bin
        assert s["stddev_ns"] == pytest.approx(lat.std(), rel=0.03)
        assert s["min_ns"] <= lat.min() and s["max_ns"] >= lat.max()
        for k, q in (("50", 50), ("90", 90), ("99", 99)):
            exact = float(np.percentile(lat, q, method="inverted_cdf"))
            assert s["percentiles_ns"][k] == pytest.approx(exact, rel=0.016)  # one fine bin
        hist = s["histogram"]
        inside = sum(b["ios"] for b in hist)
        assert inside + s["below_histogram"] + s["above_histogram"] == pytest.approx(len(lat))
        # Bins on the exact latencies agree within the straddling-bin split.
        edges = [hist[0]["from_ns"]] + [b["to_ns"] for b in hist]
        exact_counts, _ = np.histogram(lat, bins=edges)
        assert np.abs(np.array([b["ios"] for b in hist]) - exact_counts).max() <= 0.02 * len(lat)
        assert s["iops"] == pytest.approx(len(lat) / 20, rel=0.1)


def test_filters_select_what_they_say(run: tuple) -> None:  # type: ignore[type-arg]
    paths, truth = run
    lo, hi = T0 + 5000, T0 + 12_000
    got = stats_of(paths, directions=("read",), from_ms=lo, to_ms=hi)
    expected = sum(len(lt) for end, lt in truth[0] if lo < end <= hi)
    assert set(got) == {"read"}
    assert got["read"]["ios"] == expected
    only_job2 = stats_of(paths, jobs=("hist.2",), directions=("all",))
    assert only_job2["all"]["ios"] == sum(len(lt) for d in (0, 1) for _, lt in JOB2[d])


def test_cli_text_and_json(run: tuple, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:  # type: ignore[type-arg]
    paths, _ = run
    assert main(["summary", *map(str, paths), "--direction", "read"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("read: ") and "percentiles  p50" in text and "#" in text
    cfg = tmp_path / "bins.yaml"
    cfg.write_text("{min: 100us, max: 10ms, bins: 4, scale: linear}\n")
    assert main(["summary", *map(str, paths), "--format", "json", "--hist-config", str(cfg)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["operation"] for d in doc] == ["read", "write", "all"]
    assert [b["from_ns"] for b in doc[0]["histogram"]] == [1e5, 2.575e6, 5.05e6, 7.525e6]


def test_bad_input_gets_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert main(["summary", str(empty)]) == 1
    err = capsys.readouterr().err
    assert "no histogram records" in err and "Traceback" not in err
    bad = tmp_path / "bins.yaml"
    bad.write_text("{min: 5, bins: many, colour: red}\n")
    with pytest.raises(ConfigError) as info:
        bins_from_yaml(bad)
    assert len(info.value.problems) == 3
    assert main(["summary", str(empty), "--hist-min", "1ms"]) == 2
    assert "both --hist-min and --hist-max" in capsys.readouterr().err
