"""One truth per I/O offline: which inputs describe the same I/Os, and --source."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fiomon.bins import BinLayout, plat_val_to_idx
from fiomon.errors import OverlapError
from fiomon.fio.overlap import (
    Declaration,
    JobContent,
    LogContent,
    assign,
    claims,
    hist_log_name,
    job_contents,
    same_host,
    sibling_folders,
)
from fiomon.offline.sources import choose_sources
from fiomon.tools.simulate import format_line
from tests.agent.agentkit import report_samples
from tests.clock import T0

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
        f"note: {later} is read as I/Os of its own: no json+ stream given holds them "
        f"(checked {run}: its records are outside that stream's time)"
    ]


def _job(pos: int, name: str, counts: dict[int, int], **kw: object) -> JobContent:
    hist = np.zeros(1856, dtype=np.int64)
    for b, n in counts.items():
        hist[b] = n
    return JobContent(pos, name, hist, **kw)  # type: ignore[arg-type]


def _log(path: str, counts: dict[int, int], coarseness: int = 0, **kw: object) -> LogContent:
    layout = BinLayout(coarseness=coarseness)
    hist = np.zeros(layout.nbins, dtype=np.int64)
    for b, n in counts.items():
        hist[b >> coarseness] += n
    return LogContent(path, hist, layout, **kw)  # type: ignore[arg-type]


def test_content_decides_between_streams_with_one_name() -> None:
    a = Declaration("a.json", frozenset({"run"}), jobs=(_job(0, "run", {700: 100}),))
    b = Declaration("b.json", frozenset({"run"}), jobs=(_job(0, "run", {900: 160}),))
    logs = [_log("/x/run_clat_hist.1.log", {900: 156}), _log("/y/run_clat_hist.1.log", {700: 96})]
    assert assign(logs, [a, b]) == {
        "/y/run_clat_hist.1.log": "a.json",
        "/x/run_clat_hist.1.log": "b.json",
    }
    # a log lacking far more than the last partial interval is another run's
    assert assign([_log("/x/run_clat_hist.1.log", {700: 40}, max_record=5)], [a]) == {}
    # a stream without bins declares nothing
    plain = Declaration("p.json", frozenset({"run"}))
    assert assign([_log("/x/run_clat_hist.1.log", {700: 96})], [plain]) == {}


def test_threads_map_to_job_positions_and_each_job_is_claimed_once() -> None:
    jobs = (_job(0, "run", {700: 50}), _job(1, "run", {700: 50}))
    d = Declaration("s.json", frozenset({"run"}), jobs=jobs)
    one, two = _log("/r/run_clat_hist.1.log", {700: 48}), _log("/r/run_clat_hist.2.log", {700: 49})
    assert claims([one, two], [d]) == {
        one.path: ("s.json", frozenset({0})),
        two.path: ("s.json", frozenset({1})),
    }
    # thread 3 has no job 2: not covered
    assert assign([_log("/r/run_clat_hist.3.log", {700: 48})], [d]) == {}
    # per_job_logs=0: one log for both jobs, compared with their sum
    both = _log("/r/run_clat_hist.log", {700: 97})
    assert claims([both], [d]) == {both.path: ("s.json", frozenset({0, 1}))}


def test_group_reporting_folds_threads_into_one_entry() -> None:
    d = Declaration("g.json", frozenset({"run"}), jobs=(_job(0, "run", {700: 100}),), grouped=True)
    logs = [_log(f"/r/run_clat_hist.{n}.log", {700: 48}) for n in (1, 2, 3)]
    got = assign(logs, [d])
    assert sorted(got) == [logs[0].path, logs[1].path]  # a third would not fit in the entry


def test_coarse_logs_and_lat_only_bins_compare() -> None:
    d = Declaration("s.json", frozenset({"run"}), jobs=(_job(0, "run", {700: 30, 701: 30}),))
    assert assign([_log("/r/run_clat_hist.1.log", {700: 58}, coarseness=4)], [d])
    total = Declaration(
        "t.json", frozenset({"run"}), jobs=(_job(0, "run", {900: 60}, total_only=True),)
    )
    assert assign([_log("/r/run_clat_hist.1.log", {700: 58})], [total])  # totals only
    assert not assign([_log("/r/run_clat_hist.1.log", {700: 61})], [total])


def test_hosts_pair_within_one_folder_tree_only() -> None:
    assert same_host("/c/client-01", "/c/client-01/logs")
    assert not same_host("/c/client-01", "/c/client-02")
    assert not same_host("/r1/client-01", "/r2/client-01")
    assert not same_host("/c/client-1", "/c/client-10")
    assert same_host(None, "/anything")
    d = Declaration(
        "s.json", frozenset({"run"}), jobs=(_job(0, "run", {700: 50}),), host="/c/client-01"
    )
    assert not assign(
        [_log("/c/client-02/run_clat_hist.1.log", {700: 48}, host="/c/client-02")], [d]
    )


@pytest.mark.parametrize(
    "job",
    [
        {"jobname": "j", "read": {"clat_ns": {"bins": {"x": 1}}}},
        {"jobname": "j", "read": {"clat_ns": {"bins": {"5": -1}}}},
        {"jobname": "j", "read": {"clat_ns": {"bins": {"9" * 5000: 1}}}},
        {"jobname": "j", "read": {"clat_ns": {"bins": [1, 2]}}},
        {"jobname": 7, "read": None},
        "not a job",
    ],
)
def test_job_contents_of_bad_documents_are_empty_never_a_crash(job: object) -> None:
    assert job_contents({"jobs": [job], "global options": {"write_hist_log": "run"}}) == ()


def test_mixed_sections_compare_when_no_direction_has_bins() -> None:
    doc = {
        "jobs": [
            {"jobname": "j", "read": {"clat_ns": {}}, "mixed": {"clat_ns": {"bins": {"20480": 7}}}}
        ]
    }
    (job,) = job_contents(doc)
    assert int(job.hist.sum()) == 7
    assert job.name == "j"


@pytest.mark.parametrize(
    "text",
    [
        b'{"jobs": "x", "global options": {"write_hist_log": "h"}}\n',
        b'{"timestamp_ms": "soon", "jobs": [{"jobname": "j", "read": 5}]}\n{"jobs": [',
        b'{"global options": {"write_hist_log": "h"}, "jobs": [{}]}\n\x00\xff{{{\n',
        b"{" * 10_000,
    ],
)
def test_bad_json_beside_a_hist_log_never_crashes(tmp_path: Path, text: bytes) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(text)
    log = hist(tmp_path / "h_clat_hist.1.log", T0)
    paths, _, skips = choose_sources([bad, log], None)
    assert paths == [bad, log]
    assert skips == {}


def test_a_dump_older_than_the_log_bounds_its_records_through_that_dump() -> None:
    job = _job(0, "run", {700: 100})
    rows = [{700: 25}] * 6  # four records through the dump at T0 + 4000, two after it
    kept = [(T0 + 1000 * (k + 1), r) for k, r in enumerate(rows)]

    def upto(at: int) -> np.ndarray:
        out = np.zeros(1856, dtype=np.int64)
        for end, r in kept:
            if end <= at:
                for b, n in r.items():
                    out[b] += n
        return out

    log = _log("/r/run_clat_hist.1.log", {700: 150}, max_record=25, end_ms=T0 + 6000, upto=upto)
    at_dump = Declaration("s.json", frozenset({"run"}), jobs=(job,), at_ms=T0 + 4000)
    assert assign([log], [at_dump])  # 100 through the dump: all of the job's 100
    # the log of a later run: nothing of it is as old as the old stream's last dump
    later = Declaration("s.json", frozenset({"run"}), jobs=(job,), at_ms=T0 + 500)
    assert not assign([log], [later])


def test_names_collecting_gives_a_log_pair_with_the_stream_they_name() -> None:
    """Offline (a stream file's stem known): the host put before fio's prefix, or the
    prefix replaced by the stream's stem; a tag agreeing with a stream's stem picks it."""
    jobs = (_job(0, "run", {700: 50}), _job(1, "run", {700: 50}))
    d = Declaration("c/client-01-out.json", frozenset({"run"}), jobs=jobs, stem="client-01-out")
    assert d.log_names("c/client-01-run_clat_hist.2.log") == {"run"}
    assert d.log_tag("c/client-01-run_clat_hist.2.log") == "client-01"
    assert d.log_names("c/client-01-out_clat_hist.1.log") == {"run"}  # the stem
    assert not d.log_names("c/client-01-rerun_clat_hist.1.log")  # no separator before run
    assert not replace(d, stem=None).log_names("c/client-01-run_clat_hist.1.log")  # the agent
    e = replace(d, stream="c/client-02-out.json", stem="client-02-out")
    logs = [
        _log(f"c/{h}-run_clat_hist.{n}.log", {700: 48})
        for h in ("client-01", "client-02")
        for n in (1, 2)
    ]
    assert assign(logs, [d, e]) == {
        "c/client-01-run_clat_hist.1.log": "c/client-01-out.json",
        "c/client-01-run_clat_hist.2.log": "c/client-01-out.json",
        "c/client-02-run_clat_hist.1.log": "c/client-02-out.json",
        "c/client-02-run_clat_hist.2.log": "c/client-02-out.json",
    }
    assert assign(logs[2:], [d]) == {}  # client-02's logs never fill client-01's stream


def test_a_sibling_folder_is_one_hosts_part_unless_the_two_are_one_series() -> None:
    assert sibling_folders("/c/client-01/json", "/c/client-01/hist")
    assert not sibling_folders("/c/client-01/json", "/c/client-02/hist")
    assert not sibling_folders("/c/client-01", "/c/client-02")
    assert not sibling_folders("/r/run1", "/r/run2")
    assert not sibling_folders("/c/json", "/c/json")
    jobs = (_job(0, "run", {700: 50}),)
    d = Declaration("o.json", frozenset({"run"}), jobs=jobs, host="/c/client-01/json")
    log = _log("/c/client-01/hist/run_clat_hist.1.log", {700: 48}, host="/c/client-01/hist")
    assert assign([log], [d]) == {log.path: "o.json"}
    own = _log("/c/client-01/json/run_clat_hist.1.log", {700: 48}, host="/c/client-01/json")
    assert assign([log, own], [d]) == {own.path: "o.json"}  # its folder has its own log
