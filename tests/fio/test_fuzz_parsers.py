"""Fuzzing the line scanner and both fio parsers: no input makes them raise or grow.

Hostile input seen in the field: numeric fields of 22 and 30 digits (a RecursionError
and an IndexError before), 20 MB without a newline (unbounded memory), JSON nested
100,000 deep, integers beyond int64. Every case must end as counted bad input.
"""

from __future__ import annotations

import json
import re

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fiomon.fio.fiojson import JsonSplitter, JsonStatusParser
from fiomon.fio.fiolog import HistLogOptions, HistLogParser
from fiomon.fio.linescan import scan, scan_vectorised
from fiomon.fio.parsers import SNIFF_BYTES, open_parser, sniff
from fiomon.fio.problems import ProblemLog
from tests.clock import T0

NCOLS = 3 + 1856
_FIELD = re.compile(rb"[0-9]{1,18}")


def good_line(t: int, hot: int = 10, count: int = 5) -> bytes:
    row = [b"0"] * 1856
    row[hot] = str(count).encode()
    return b", ".join([str(t).encode(), b"0", b"4096", *row]) + b"\n"


def reference(line: bytes, ncols: int) -> list[int] | None:
    """What a line means, decided field by field in plain Python (None: rejected)."""
    if any(b > 126 or (b < 32 and b not in (9, 13)) for b in line):
        return None
    fields = [f.strip() for f in line.split(b",")]
    if len(fields) != ncols or not all(_FIELD.fullmatch(f) for f in fields):
        return None
    return [int(f) for f in fields]


# Pieces a hostile or broken line is made of: digit runs of every length around the
# int64 limit, separators in odd places, signs, junk and non-ASCII bytes.
_PIECES = st.one_of(
    st.integers(1, 40).map(lambda n: b"9" * n),
    st.integers(0, 10**18).map(lambda v: str(v).encode()),
    st.sampled_from([b",", b", ", b",  ", b" ", b"\t", b"-", b"+", b"x", b"\x00", b"\xff", b"\r"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(_PIECES, max_size=12).map(b"".join), min_size=1, max_size=6),
    st.lists(st.integers(0, 5), max_size=4),
)
def test_scanner_accepts_exactly_the_well_formed_lines(
    junk: list[bytes], good_at: list[int]
) -> None:
    ncols = 7
    lines = [ln.replace(b"\n", b"") for ln in junk]
    well_formed = b", ".join([b"1", b"0", b"9" * 18, b"0", b"2", b"0", b"3"])
    for k in good_at:  # mix in well-formed lines, with an 18-digit field
        lines.insert(k % (len(lines) + 1), well_formed)
    buf = b"\n".join(lines) + b"\n"
    for res in (scan(buf, ncols), scan_vectorised(buf, ncols), scan(buf * 40, ncols)):
        n = res.lines
        assert len(res.line_index) + len(res.bad) == n
        assert not set(res.line_index.tolist()) & {b.index for b in res.bad}
        text = (buf * (n // len(lines))).split(b"\n")[:-1]
        expect = [reference(text[i].replace(b"\r", b""), ncols) for i in range(n)]
        assert res.line_index.tolist() == [i for i, e in enumerate(expect) if e is not None]
        dense = np.zeros((len(res.line_index), ncols - 3), dtype=np.int64)
        rows = np.repeat(np.arange(len(res.line_index)), np.diff(res.indptr))
        dense[rows, res.bins] = res.counts
        for k, i in enumerate(res.line_index.tolist()):
            want = expect[i]
            assert want is not None
            assert res.header[k].tolist() == want[:3]
            assert dense[k].tolist() == want[3:]


def test_long_digit_runs_among_good_lines_are_rejected_not_crashing() -> None:
    for digits in (19, 22, 30, 400):
        for field in (0, 1, 2, 3, 1000, NCOLS - 1):
            fields = good_line(T0).rstrip(b"\n").split(b", ")
            fields[field] = b"7" * digits
            bad = b", ".join(fields) + b"\n"
            buf = good_line(T0) + bad + good_line(T0 + 1000)
            for res in (scan(buf), scan(buf * 30)):
                assert len(res.line_index) == 2 * (res.lines // 3)
                assert {b.kind for b in res.bad} == {"overflow"}


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=4000), st.lists(st.integers(1, 5000), max_size=6))
def test_hist_parser_survives_any_bytes_in_any_chunking(noise: bytes, cuts: list[int]) -> None:
    data = good_line(T0) + noise + b"\n" + good_line(T0 + 1000) + good_line(T0 + 2000)
    problems = ProblemLog()
    cap = 8000  # a good line is ~5.6 kB
    p = HistLogParser("fuzz.log", options=HistLogOptions(max_line_bytes=cap), problems=problems)
    pos = 0
    records = 0
    for c in [*sorted(cuts), len(data)]:
        batch = p.feed(data[pos:c])
        records += len(batch) if batch is not None else 0
        pos = max(pos, c)
        assert len(p._tail) <= cap
    p.finish()
    # The noise ends in a newline of its own, so the two lines after it are intact
    # whatever it holds; the first is intact unless the noise continues it.
    assert records >= 2
    assert p.lines_seen >= 3


def test_a_line_that_never_ends_costs_no_memory() -> None:
    p = HistLogParser("endless.log", options=HistLogOptions(max_line_bytes=1 << 20))
    assert p.feed(good_line(T0)) is not None
    chunk = b"7" * (4 << 20)
    for _ in range(5):  # 20 MB of digits, no newline
        assert p.feed(chunk) is None
        assert len(p._tail) <= 1 << 20
    batch = p.feed(b"\n" + good_line(T0 + 1000))
    assert batch is not None
    assert len(batch) == 1
    assert p.problems.counts["line-too-long"] == 1
    assert p.lines_seen == 3


def _fio_doc(ts: object, bins: object, runtime: object = 1000, io_bytes: object = 4096) -> bytes:
    doc = {
        "timestamp_ms": ts,
        "global options": {"write_hist_log": "h"},
        "jobs": [
            {
                "jobname": "j",
                "job_runtime": runtime,
                "read": {"io_bytes": io_bytes, "clat_ns": {"bins": bins}},
            }
        ],
    }
    return json.dumps(doc).encode() + b"\n"


_JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=10),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_JSON_VALUES, _JSON_VALUES, _JSON_VALUES, _JSON_VALUES)
def test_json_parser_survives_any_values_where_fio_puts_numbers(
    ts: object, bins: object, runtime: object, io_bytes: object
) -> None:
    p = JsonStatusParser("fuzz.json", problems=ProblemLog())
    good = _fio_doc(T0, {"1000": 3})
    p.feed(good)
    p.feed(_fio_doc(ts, bins, runtime, io_bytes))
    p.feed(_fio_doc(T0 + 2000, {"1000": 9}))
    p.finish()
    assert p.splitter.documents == 3


def test_json_parser_survives_deep_nesting_and_huge_integers() -> None:
    p = JsonStatusParser("hostile.json", problems=ProblemLog())
    hostile = [
        b"[" * 100_000,
        b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        b'{"timestamp_ms": ' + b"9" * 5000 + b', "jobs": []}\n',
        _fio_doc(T0, {"1000": 10**30}),
        _fio_doc(T0, {"9" * 40: 3}),
        _fio_doc(10**30, {"1000": 3}),
    ]
    for data in hostile:
        p.feed(data)
        p.feed(b"\n")
    batch = p.feed(_fio_doc(T0 + 5000, {"1000": 4}))
    assert batch is not None
    assert int(batch.counts.sum()) == 4
    assert sum(p.problems.counts.values()) >= 5


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=3000), st.lists(st.integers(1, 3000), max_size=5))
def test_json_splitter_survives_any_bytes(data: bytes, cuts: list[int]) -> None:
    s = JsonSplitter("fuzz.json", ProblemLog(), max_document_bytes=1000)
    pos = 0
    for c in [*sorted(cuts), len(data)]:
        list(s.feed(data[pos:c]))
        pos = max(pos, c)
        assert len(s._buf) <= 1000 + 3000
    list(s.finish())


_HEADS = [
    b"",
    b"\x1f\x8b",
    b"BZh9",
    b"\xfd7zXZ\x00",
    b"\xef\xbb\xbf",
    b"\xff\xfe",
    b"\xfe\xff",
    b"x\x9c",
]


@settings(max_examples=120, deadline=None)
@given(
    st.sampled_from(_HEADS),
    st.binary(max_size=3000),
    st.lists(st.integers(1, 3000), max_size=5),
)
def test_open_parser_survives_any_bytes_behind_any_magic(
    head: bytes, data: bytes, cuts: list[int]
) -> None:
    """Compressed, BOM'd, UTF-16 or refused: whatever follows the first bytes, no raise."""
    raw = head + data
    problems = ProblemLog()
    parser = open_parser(raw[:SNIFF_BYTES] or b"x", "f", problems)
    pos = 0
    for cut in [*sorted(cuts), len(raw)]:
        parser.feed(raw[pos:cut])
        pos = max(pos, cut)
    parser.finish()
    sniff(raw)
    assert parser.refusal is None or isinstance(parser.refusal, str)
