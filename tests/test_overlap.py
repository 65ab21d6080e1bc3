"""One truth per I/O offline: which inputs describe the same I/Os, and --source."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fiomon.bins import plat_val_to_idx
from fiomon.errors import OverlapError
from fiomon.offline.sources import choose_sources
from fiomon.overlap import Declaration, hist_log_name
from fiomon.tools.simulate import format_line
from tests.agent.agentkit import report_samples

T0 = 1_795_000_000_000
BIN = int(plat_val_to_idx(np.array([20480]))[0])


def hist(path: Path, t0: int, n: int = 3, value: int = 4) -> Path:
    counts = np.zeros(1856, dtype=np.int64)
    counts[BIN] = value  # where status() puts its I/Os
    path.write_text("".join(format_line(t0 + 1000 * (k + 1), 0, 4096, counts) for k in range(n)))
    return path


def status(path: Path, t0: int, jobs: list[tuple[str, str | None]], n: int = 3) -> Path:
    """A json+ stream: ``jobs`` as (name, own write_hist_log or None), global prefix 'g'."""
    docs = []
    for k in range(1, n + 1):
        entries = []
        for name, own in jobs:
            opts = {"write_hist_log": own} if own else {}
            entries.append(
                {
                    "jobname": name,
                    "job options": opts,
                    "job_runtime": 1000 * k,
                    "read": {"io_bytes": 4096 * 5 * k, "clat_ns": {"bins": {"20480": 5 * k}}},
                }
            )
        doc = {"timestamp_ms": t0 + 1000 * k, "global options": {"write_hist_log": "g"}}
        doc["jobs"] = entries
        docs.append(json.dumps(doc))
    path.write_text("\n".join(docs) + "\n")
    return path


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("h_clat_hist.2.log", "h"),
        ("h_clat_hist.log", "h"),
        ("run.x_clat_hist.12.log.fz", "run.x"),
        ("h_clat_hist.1.log.127.0.0.2", "h"),
        ("h_lat.1.log", None),
        ("h_clat.1.log", None),
    ],
)
def test_hist_log_names(name: str, prefix: str | None) -> None:
    assert hist_log_name(f"/some/where/{name}") == prefix


def test_a_declaration_names_a_log_and_overlaps_its_time() -> None:
    d = Declaration("run.json", frozenset({"h"}), T0, T0 + 60_000, 10_000)
    assert d.names_log("/x/h_clat_hist.1.log")
    assert d.overlaps((T0 + 1000, T0 + 61_000))
    assert d.overlaps(None)  # relative stamps: the content decides
    assert not d.overlaps((T0 + 3_600_000, T0 + 3_660_000))
    assert not d.names_log("/x/other_clat_hist.1.log")


def test_both_views_are_refused_then_each_choice_counts_every_io_once(tmp_path: Path) -> None:
    run = status(tmp_path / "run.json", T0, [("a", None), ("b", "bh")])
    ga = hist(tmp_path / "g_clat_hist.1.log", T0 - 1000)  # job a (thread 1), global prefix
    bh = hist(tmp_path / "bh_clat_hist.2.log", T0 - 1000)  # job b (thread 2), its own
    with pytest.raises(OverlapError, match="--source json"):
        choose_sources([run, ga, bh], None)
    paths, _, skips = choose_sources([run, ga, bh], "json")
    assert paths == [run]
    # --source hist: jobs with hist logs are read from them, only the others from run.json
    paths, notes, skips = choose_sources([run, ga], "hist")
    assert paths == [run, ga]
    assert skips == {str(run): frozenset({0})}
    assert any("not reading 1 of its 2 jobs" in n for n in notes)
    json_ios = report_samples([run], "--source", "json")
    hist_ios = report_samples([ga])
    assert report_samples([run, ga], "--source", "hist") == pytest.approx(json_ios / 2 + hist_ios)


def test_copied_results_and_a_file_given_twice(tmp_path: Path) -> None:
    (tmp_path / "copy").mkdir()
    run = status(tmp_path / "copy" / "run.json", T0, [("a", "/data/results/h")])
    h = hist(tmp_path / "h_clat_hist.1.log", T0)  # fio wrote /data/results/h...: moved since
    with pytest.raises(OverlapError):
        choose_sources([run, h], None)
    paths, notes, _ = choose_sources([h, tmp_path / "." / "h_clat_hist.1.log"], None)
    assert paths == [h]
    assert "read once" in notes[0]


def test_a_hist_log_of_another_run_with_the_same_name_is_not_covered(tmp_path: Path) -> None:
    run = status(tmp_path / "run.json", T0, [("a", "h")])
    later = hist(tmp_path / "h_clat_hist.1.log", T0 + 7_200_000)  # two hours later
    paths, notes, skips = choose_sources([run, later], None)
    assert paths == [run, later]
    assert skips == {}
    assert notes == [
        f"note: {later} has a name a json+ stream declares, but no stream given holds its "
        "I/Os (folder, time or counts differ): read as I/Os of their own"
    ]
