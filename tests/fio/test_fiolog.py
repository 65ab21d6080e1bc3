"""Hist-log parsing: fio's record semantics and every kind of bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fiomon.errors import ParseError
from fiomon.fio.fiolog import HistLogOptions, HistLogParser, interval_from_job_file
from fiomon.fio.linescan import scan, scan_vectorised
from fiomon.fio.problems import ProblemLog
from fiomon.model import RecordBatch
from tests.clock import T0
from tests.conftest import FIXTURES

NB = 1856


def line(t: int, d: int, counts: dict[int, int], bs: int = 4096, sep: str = ", ") -> str:
    row = [0] * NB
    for i, c in counts.items():
        row[i] = c
    return sep.join(map(str, [t, d, bs, *row])) + "\n"


def parse(text: str | bytes, **opts: object) -> tuple[RecordBatch | None, HistLogParser]:
    data = text.encode() if isinstance(text, str) else text
    p = HistLogParser("x.log", options=HistLogOptions(**opts))  # type: ignore[arg-type]
    batch = p.feed(data)
    p.finish()
    return batch, p


def test_real_fio_log_parses_exactly() -> None:
    raw = (FIXTURES / "fio333_randrw_clat_hist.1.log").read_bytes()
    batch, p = parse(raw)
    assert batch is not None
    ref = np.array([[int(x) for x in ln.split(",")] for ln in raw.decode().splitlines()])
    assert (batch.dense() == ref[:, 3:]).all()
    assert batch.end_ms.tolist() == ref[:, 0].tolist()
    assert p.time_kind == "epoch"
    assert p.problems.counts == {}


def test_records_are_end_stamped_and_chain_per_direction() -> None:
    text = (
        line(T0 + 1000, 0, {300: 5})
        + line(T0 + 1010, 1, {300: 2})
        + line(T0 + 2000, 0, {301: 4})
        + line(T0 + 2010, 1, {302: 1})
    )
    batch, _ = parse(text, interval_ms=1000)
    assert batch is not None
    assert batch.start_ms.tolist() == [T0, T0 + 10, T0 + 1000, T0 + 1010]
    assert batch.end_ms.tolist() == [T0 + 1000, T0 + 1010, T0 + 2000, T0 + 2010]
    assert batch.samples().tolist() == [5, 2, 4, 1]
    assert batch.nbytes.tolist() == [5 * 4096, 2 * 4096, 4 * 4096, 4096]


def test_first_span_defaults_to_median_spacing() -> None:
    text = "".join(line(T0 + k * 500, 0, {200: 1}) for k in range(1, 6))
    batch, p = parse(text)
    assert p.interval_ms == 500
    assert batch is not None
    assert batch.start_ms[0] == T0


def test_stall_catch_up_records_are_added_not_dropped() -> None:
    # After a 3 s stall fio writes one long record, then catch-up records with the SAME
    # stamp (fio writes them after a stall): their I/Os must count.
    text = (
        line(T0 + 1000, 0, {300: 10})
        + line(T0 + 5000, 0, {300: 1})
        + line(T0 + 5000, 0, {310: 1})
        + line(T0 + 5000, 0, {320: 1})
    )
    batch, p = parse(text, interval_ms=1000)
    assert batch is not None
    assert batch.samples().sum() == 13
    assert batch.start_ms.tolist() == [T0, T0 + 1000, T0 + 5000, T0 + 5000]
    assert batch.end_ms.tolist() == [T0 + 1000, T0 + 5000, T0 + 5000, T0 + 5000]
    assert p.problems.counts == {}


def test_trim_direction_is_supported() -> None:
    batch, _ = parse(line(T0 + 1000, 2, {400: 3}), interval_ms=1000)
    assert batch is not None
    assert batch.direction.tolist() == [2]


def test_relative_time_is_flagged() -> None:
    batch, p = parse(line(1000, 0, {1: 1}) + line(2000, 0, {1: 1}))
    assert batch is not None
    assert p.time_kind == "relative"
    assert p.problems.counts["relative-time"] == 1
    assert p.problems.dropped == 0


def test_relative_restart_starts_a_new_stream() -> None:
    text = line(1000, 0, {1: 1}) + line(2000, 0, {1: 1}) + line(3000, 0, {1: 1})
    text += line(1000, 0, {1: 2}) + line(2000, 0, {1: 2})
    batch, p = parse(text)
    assert batch is not None
    assert len(batch.streams) == 2
    assert batch.stream_idx.tolist() == [0, 0, 0, 1, 1]
    assert p.problems.counts["restart"] == 1


def test_coarse_and_fio2_layouts_detected() -> None:
    row = ", ".join(["0"] * 116)
    batch, p = parse(f"{T0 + 1000}, 0, 4096, {row}\n")
    assert p.layout is not None
    assert (p.layout.group_nr, p.layout.coarseness) == (29, 4)
    row2 = ", ".join(["1"] * 1216)
    batch, p = parse(f"{T0 + 1000}, 0, 4096, {row2}\n")
    assert p.layout is not None
    assert p.layout.unit == "us"
    assert batch is not None
    assert batch.samples().tolist() == [1216]


BAD_CASES = [
    ("non-numeric", lambda: line(T0 + 2000, 0, {300: 1}).replace(", 0, 0,", ", abc, 0,", 1)),
    ("negative", lambda: line(T0 + 2000, 0, {300: 1}).replace(", 0, 0,", ", -4, 0,", 1)),
    ("columns", lambda: f"{T0 + 2000}, 0, 4096, " + ", ".join(["0"] * 997) + "\n"),
    ("direction", lambda: line(T0 + 2000, 7, {300: 1})),
    ("decreasing", lambda: line(T0 + 500, 0, {300: 1})),
    ("binary", lambda: "\x00\x01\xff\xfe garbage\n"),
    ("empty-field", lambda: line(T0 + 2000, 0, {300: 1}).replace(", 0, 0,", ", , 0,", 1)),
]


@pytest.mark.parametrize(("kind", "make"), BAD_CASES, ids=[k for k, _ in BAD_CASES])
def test_bad_line_is_named_counted_and_skipped(kind: str, make: object) -> None:
    assert callable(make)
    good1 = line(T0 + 1000, 0, {300: 5})
    good2 = line(T0 + 3000, 0, {300: 7})
    text = good1 + make() + good2
    batch, p = parse(text.encode("latin-1"), interval_ms=1000)
    assert batch is not None
    assert batch.samples().tolist() == [5, 7], "the good lines around it still count"
    assert p.problems.counts[kind] == 1
    msg = str(p.problems.kept[0])
    assert msg.startswith("x.log:2: "), msg


@pytest.mark.parametrize(("kind", "make"), BAD_CASES, ids=[k for k, _ in BAD_CASES])
def test_strict_makes_bad_line_fatal(kind: str, make: object) -> None:
    assert callable(make)
    p = HistLogParser(
        "x.log", options=HistLogOptions(interval_ms=1000), problems=ProblemLog(strict=True)
    )
    with pytest.raises(ParseError, match=r"x\.log:2: "):
        p.feed((line(T0 + 1000, 0, {300: 5}) + make()).encode("latin-1"))


def test_truncated_last_line_waits_then_is_reported() -> None:
    full = line(T0 + 1000, 0, {300: 5})
    part = line(T0 + 2000, 0, {300: 9})[:-40]
    p = HistLogParser("x.log", options=HistLogOptions(interval_ms=1000))
    batch = p.feed((full + part).encode())
    assert batch is not None
    assert len(batch) == 1
    p.finish()
    assert p.problems.counts["truncated"] == 1
    assert str(p.problems.kept[0]) == "x.log:2: last line has no newline (truncated?)"


def test_partial_line_completed_by_next_chunk() -> None:
    text = (line(T0 + 1000, 0, {300: 5}) + line(T0 + 2000, 0, {301: 6})).encode()
    p = HistLogParser("x.log", options=HistLogOptions(interval_ms=1000))
    got = [b for b in (p.feed(text[:7000]), p.feed(text[7000:])) if b is not None]
    p.finish()
    assert [b.samples().tolist() for b in got] == [[5], [6]]
    assert p.problems.counts == {}


def test_empty_file_is_a_warning() -> None:
    batch, p = parse(b"")
    assert batch is None
    assert p.problems.counts == {"empty": 1}


def test_crlf_and_tight_commas_are_accepted() -> None:
    text = line(T0 + 1000, 0, {300: 5}, sep=",").replace("\n", "\r\n")
    text += line(T0 + 2000, 0, {300: 6}, sep=",  ")
    batch, p = parse(text, interval_ms=1000)
    assert batch is not None
    assert batch.samples().tolist() == [5, 6]
    assert p.problems.counts == {}


def test_job_file_interval(tmp_path: Path) -> None:
    job = tmp_path / "j.fio"
    job.write_text("[global]\ndirect\n; log_hist_msec=5\nlog_hist_msec = 250 # ms\n[a]\n")
    assert interval_from_job_file(job) == 250


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**40),
            st.integers(0, 2),
            st.lists(st.integers(0, 10**12), min_size=4, max_size=12),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([", ", ","]),
)
def test_scan_equals_naive_parse(rows: list[tuple[int, int, list[int]]], sep: str) -> None:
    width = 12
    text = "".join(
        sep.join(map(str, [t, d, 4096, *(vals + [0] * width)[:width]])) + "\n"
        for t, d, vals in rows
    ).encode()
    ref = np.array([[int(x) for x in ln.split(",")] for ln in text.decode().splitlines()])
    for res in (scan(text), scan_vectorised(text)):  # the small-input path and the main one
        assert not res.bad
        assert res.lines == len(rows)
        assert (res.header == ref[:, :3]).all()
        dense = np.zeros((len(ref), width), dtype=np.int64)
        rr = np.repeat(np.arange(len(ref)), np.diff(res.indptr))
        dense[rr, res.bins] = res.counts
        assert (dense == ref[:, 3:]).all()


def test_scan_of_nothing_is_empty() -> None:
    res = scan(b"")
    assert len(res.header) == 0
    assert res.bad == []
    with pytest.raises(ValueError, match="complete lines"):
        scan(b"1, 0, 4096, 5")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 999), min_size=6, max_size=6), min_size=1, max_size=5),
    st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from(list(b"0123456789, -x.\x00+"))),
        max_size=4,
    ),
)
def test_small_input_path_agrees_with_the_vectorised_scan(
    rows: list[list[int]], edits: list[tuple[int, int]]
) -> None:
    raw = bytearray(
        "".join(
            ", ".join(map(str, [1_795_000_000_000 + i, 0, 4096, *r])) + "\n"
            for i, r in enumerate(rows)
        ).encode()
    )
    for pos, byte in edits:
        at = pos % len(raw)
        if raw[at] != 10:  # keep the line structure
            raw[at] = byte
    buf = bytes(raw)
    a, b = scan(buf, 9), scan_vectorised(buf, 9)
    assert [(x.index, x.kind) for x in a.bad] == [(x.index, x.kind) for x in b.bad]
    for name in ("line_index", "header", "indptr", "bins", "counts"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.lines == b.lines == len(rows)


def test_per_job_logs_0_blocks_of_epoch_stamps_are_each_read() -> None:
    """per_job_logs=0: every job appends its block at exit; stamps go back between blocks."""
    job1 = [line(T0 + 1000 * k, 0, {300: 2}) for k in range(1, 4)]
    job2 = [line(T0 + 1000 * k + 7, 0, {310: 3}) for k in range(1, 4)]
    batch, p = parse("".join(job1 + job2), interval_ms=1000)
    assert batch is not None
    assert int(batch.samples().sum()) == 3 * 2 + 3 * 3
    assert len(batch.streams) == 2
    assert p.problems.counts["restart"] == 1
    assert "decreasing" not in p.problems.counts
