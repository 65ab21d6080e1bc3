"""QuantaFile: rotation, and the very line `fiomon report --format jsonl` writes."""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fiomon.closed import ClosedQuantum
from fiomon.histogram import HistStats
from fiomon.offline.output import JsonlWriter
from fiomon.server.quantafile import QuantaFile
from fiomon.wire import encode
from tests.aggregator.corekit import batch, core
from tests.clock import T0, FakeClock


def test_quanta_file_rotates_and_keeps(tmp_path: Path) -> None:
    clock = FakeClock(T0 + 60_000)
    c = core(clock)
    c.on_records("h1", encode("h1", "s@1", 0, batch([T0 + 1000 * i for i in range(1, 40)])))
    rows = c.tick()
    qf = QuantaFile(tmp_path / "q.jsonl", max_bytes=4096, keep=2)
    for r in rows:
        qf.write([r])
    qf.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["q.jsonl", "q.jsonl.1", "q.jsonl.2"]
    for p in tmp_path.iterdir():
        for line in p.read_text().splitlines():
            assert json.loads(line)["scope"] in ("cluster", "host")


_EDGE_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, 2.0**53, 2.0**53 + 2, 1 / 3, 123456.5, 1e21]),
    st.integers(min_value=0, max_value=2**62).map(float),
)


@st.composite
def _closed_rows(draw: st.DrawFn) -> ClosedQuantum:
    keys = draw(st.lists(st.sampled_from(["50", "90", "99", "99.9"]), unique=True, max_size=4))
    opt = st.one_of(st.none(), _EDGE_FLOATS)
    end = draw(st.integers(min_value=-(2**40), max_value=2**45))
    return ClosedQuantum(
        start_ms=end - draw(st.integers(min_value=1, max_value=10**6)),
        end_ms=end,
        scope=draw(st.sampled_from(["cluster", "host"])),
        host=draw(st.one_of(st.none(), st.text(max_size=8))),
        direction=draw(st.sampled_from(["read", "write", "trim", "all"])),
        stats=HistStats(
            samples=draw(_EDGE_FLOATS),
            min_ns=draw(_EDGE_FLOATS),
            mean_ns=draw(_EDGE_FLOATS),
            max_ns=draw(_EDGE_FLOATS),
            percentiles_ns={k: draw(_EDGE_FLOATS) for k in keys},
            saturated=tuple(draw(st.lists(st.sampled_from(keys), unique=True))) if keys else (),
        ),
        iops=draw(opt),
        bytes_per_second=draw(opt),
        streams=draw(st.integers(min_value=0, max_value=10**6)),
        late_records=draw(st.integers(min_value=0, max_value=10**6)),
        ci_ns=draw(st.one_of(st.none(), st.just({k: (draw(opt), draw(opt)) for k in keys}))),
        target_met=draw(st.one_of(st.none(), st.booleans())),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(_closed_rows(), min_size=1, max_size=20))
def test_quanta_file_and_report_write_the_identical_line(rows: list[ClosedQuantum]) -> None:
    # The report == aggregator contract: the quanta file and `fiomon report --format
    # jsonl` hold the same bytes for the same rows, NaN, infinities, None and huge or tiny
    # floats included; and that line is the compact json.dumps of to_json().
    with tempfile.TemporaryDirectory() as tmp:
        qf = QuantaFile(Path(tmp) / "q.jsonl")
        qf.write(rows)
        qf.close()
        written = (Path(tmp) / "q.jsonl").read_text(encoding="utf-8")
    out = io.StringIO()
    JsonlWriter(out).write(rows)
    assert written == out.getvalue()
    assert written == "".join(json.dumps(r.to_json(), separators=(",", ":")) + "\n" for r in rows)
    assert len(written.splitlines()) == len(rows)
