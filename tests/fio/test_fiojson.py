"""json+ status streams: splitting, differencing, restarts, the final dump."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fiomon.bins import plat_idx_to_val
from fiomon.fio.fiojson import JsonSplitter, JsonStatusParser
from fiomon.fio.problems import ProblemLog
from fiomon.model import RecordBatch
from tests.clock import T0
from tests.conftest import FIXTURES
from tests.fiorun import job_file, start_fio, wait_fio


def doc(ts: int, jobs: list[tuple[str, dict[int, int], int]]) -> str:
    """A minimal fio json+ document: per job (name, cumulative read bins, runtime ms)."""
    out = []
    for name, bins, runtime in jobs:
        keyed = {str(int(plat_idx_to_val(np.array([i]))[0])): c for i, c in bins.items()}
        io = sum(bins.values()) * 4096
        out.append(
            {
                "jobname": name,
                "job_runtime": runtime,
                "read": {"io_bytes": io, "clat_ns": {"N": sum(bins.values()), "bins": keyed}},
                "write": {"io_bytes": 0, "clat_ns": {"N": 0}},
            }
        )
    return json.dumps({"fio version": "fio-3.33", "timestamp_ms": ts, "jobs": out}, indent=1)


def run(text: str, chunk: int | None = None) -> tuple[list[RecordBatch], JsonStatusParser]:
    p = JsonStatusParser("s.json")
    data = text.encode()
    step = chunk or len(data) or 1
    got = [p.feed(data[i : i + step]) for i in range(0, len(data), step)]
    got.append(p.finish())
    return [b for b in got if b is not None], p


def test_real_fio_stream_covers_final_partial_interval() -> None:
    batches, p = run((FIXTURES / "fio333_randrw_status.json").read_text())
    b = RecordBatch.concat(batches)
    assert p.splitter.documents == 4
    # Two jobs, read and write, four dumps: 16 records; the last dump (at exit, 201 ms
    # after the third) holds the partial interval that hist logs never write.
    assert len(b) == 16
    last = b.end_ms == b.end_ms.max()
    assert (b.end_ms[last] - b.start_ms[last] == 201).all()
    assert b.samples()[last].sum() > 0
    raw = json.JSONDecoder()
    text = (FIXTURES / "fio333_randrw_status.json").read_text()
    final, _ = raw.raw_decode(text, text.rindex('{\n  "fio version"'))
    total = sum(j["read"]["total_ios"] + j["write"]["total_ios"] for j in final["jobs"])
    assert b.samples().sum() == total, "differences must add up to fio's final totals"
    assert p.problems.counts == {}


def test_differencing_and_spans() -> None:
    text = (
        doc(T0 + 1000, [("a", {300: 5}, 900)])
        + "\n"
        + doc(T0 + 2000, [("a", {300: 8, 310: 2}, 1900)])
        + "\n"
    )
    batches, _ = run(text)
    b = RecordBatch.concat(batches)
    assert b.start_ms.tolist() == [T0 + 100, T0 + 1000]
    assert b.end_ms.tolist() == [T0 + 1000, T0 + 2000]
    dense = b.dense()
    assert dense[0, 300] == 5
    assert (dense[1, 300], dense[1, 310]) == (3, 2)
    assert b.nbytes.tolist() == [5 * 4096, 5 * 4096]


def test_byte_by_byte_feeding_equals_one_feed() -> None:
    text = doc(T0 + 1000, [("a", {300: 5}, 1000)]) + doc(T0 + 2000, [("a", {300: 9}, 2000)])
    whole = RecordBatch.concat(run(text)[0])
    pieces = RecordBatch.concat(run(text, chunk=7)[0])
    assert (whole.dense() == pieces.dense()).all()
    assert whole.end_ms.tolist() == pieces.end_ms.tolist()


def test_numjobs_repeated_names_are_separate_streams() -> None:
    text = doc(T0 + 1000, [("a", {300: 5}, 1000), ("a", {300: 7}, 1000)])
    b = RecordBatch.concat(run(text)[0])
    assert len(b.streams) == 2
    assert b.samples().tolist() == [5, 7]


def test_decrease_is_a_restart_with_a_new_stream() -> None:
    text = (
        doc(T0 + 1000, [("a", {300: 50}, 1000)])
        + doc(T0 + 2000, [("a", {300: 90}, 2000)])
        + doc(T0 + 3000, [("a", {300: 4}, 500)])
    )
    batches, p = run(text)
    b = RecordBatch.concat(batches)
    assert b.samples().tolist() == [50, 40, 4]
    assert len(b.streams) == 2
    assert b.start_ms[-1] == T0 + 2500, "a restarted job's first record spans its runtime"
    assert p.problems.counts["restart"] == 1


def test_half_written_last_document_is_reported_truncated() -> None:
    text = doc(T0 + 1000, [("a", {300: 5}, 1000)])
    second = doc(T0 + 2000, [("a", {300: 9}, 2000)])
    batches, p = run(text + second[: len(second) // 2])
    assert sum(len(b) for b in batches) == 1
    assert p.problems.counts["truncated"] == 1


def test_text_between_documents_is_skipped_counted_and_warned_once() -> None:
    text = (
        "fio: some warning\n"
        + doc(T0 + 1000, [("a", {300: 5}, 1000)])
        + "\n<garbage>\n"
        + doc(T0 + 2000, [("a", {300: 9}, 2000)])
    )
    batches, p = run(text)
    assert sum(len(b) for b in batches) == 2
    assert p.splitter.text_blocks == 2
    assert p.problems.counts["text"] == 1  # one warning for the file, not one per stretch
    assert p.problems.dropped == 0


def test_a_utf8_bom_before_the_first_document_is_no_text() -> None:
    # Fed raw (as the overlap check reads a json+ file), byte by byte.
    data = b"\xef\xbb\xbf" + doc(T0 + 1000, [("a", {300: 5}, 1000)]).encode()
    problems = ProblemLog()
    splitter = JsonSplitter("f", problems)
    docs = [d for i in range(len(data)) for d in splitter.feed(data[i : i + 1])]
    assert len(docs) == 1
    assert splitter.text_blocks == 0
    assert not problems.counts


def test_broken_document_is_skipped() -> None:
    text = '{"timestamp_ms": 5, "jobs": [}\n' + doc(T0 + 1000, [("a", {300: 5}, 1000)])
    batches, p = run(text)
    assert sum(len(b) for b in batches) == 1
    assert p.problems.counts["json"] == 1


def test_wrong_shape_is_reported() -> None:
    batches, p = run('{"hello": 1}\n')
    assert batches == []
    assert p.problems.counts["json-shape"] == 1
    assert "not fio json+ output" in str(p.problems.kept[0])


def test_splitter_bounds_a_never_ending_document() -> None:
    log = ProblemLog()
    sp = JsonSplitter("s.json", log, max_document_bytes=100)
    out = list(sp.feed(b'{"a": [' + b"1, " * 100))
    assert out == []
    assert log.counts["json"] == 1


def test_a_group_reporting_stream_starts_where_fio_started(fio_bin: str, tmp_path: Path) -> None:
    """fio sums ``job_runtime`` over a group_reporting entry's threads (numjobs=8: 8 s at
    1 s of wall time); the first record must still start at the job's start, within the
    first second before fio's first document, not 7 s before it (report and compare
    spread the first interval's I/Os over that span)."""
    job = job_file(tmp_path, prefix=None, iops=50, runtime=3, extra="numjobs=8\ngroup_reporting")
    wait_fio([start_fio(fio_bin, job, tmp_path / "out.json")])
    text = (tmp_path / "out.json").read_text()
    first = json.JSONDecoder().raw_decode(text, text.index("{"))[0]
    entry = first["jobs"][0]
    assert entry["job_runtime"] > (entry["elapsed"] + 1) * 1000  # fio summed it
    batches, parser = run(text)
    start = min(int(b.start_ms.min()) for b in batches)
    assert first["timestamp_ms"] - 1100 <= start <= first["timestamp_ms"]
    assert parser.first_ms is not None
    assert first["timestamp_ms"] - 1100 <= parser.first_ms
