"""Run identity: the wire's run label, rows that name their runs, quanta files, the gauge."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fiomon.agent.follow import run_label
from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.config import load_agent_config
from fiomon.engine import QuantumEngine
from fiomon.errors import ConfigError, WireFormatError
from fiomon.model import RecordBatch, StreamInfo
from fiomon.offline.quantafiles import parse_row
from fiomon.server.metrics import RUN_INFO, QuantumGauges
from fiomon.wire import FLAG_RUN, Decoder, decode, encode, encoded_size, split
from tests.batches import Rec, batch

REC = [(0, 1000, 0, {900: 10, 901: 3}), (1000, 2000, 1, {950: 2**33})]


def _batch() -> RecordBatch:
    return batch(REC, host="client-07", stream="job.json:0:j")


def test_a_message_without_a_run_is_byte_for_byte_what_fiomon_sent_before_runs() -> None:
    p = encode("client-07", "/r/run1/out.json@abc", 5, _batch())
    # sha256 of the same message encoded by main before run labels existed (32ae676)
    assert (len(p), hashlib.sha256(p).hexdigest()) == (
        169,
        "bc05ebe486ac6e4e7c5dcc48e1ba6cb687dd7c7161f42f2cff68f513c6d66b64",
    )
    assert decode(p).run is None
    assert {s.run for s in decode(p).batch.streams} == {None}


def test_the_run_label_follows_the_stream_id_under_flag_bit_1() -> None:
    b = _batch()
    p = encode("client-07", "out.json@abc", 5, b, "nightly-1")
    assert p[5] & FLAG_RUN
    stream_end = 26 + 2 + len("client-07") + 2 + len("out.json@abc")
    assert p[stream_end : stream_end + 2 + 9] == b"\x09\x00nightly-1"
    assert len(p) == encoded_size("client-07", "out.json@abc", b, "nightly-1")
    m = decode(p)
    assert (m.run, m.stream, m.first_seq) == ("nightly-1", "out.json@abc", 5)
    assert {s.run for s in m.batch.streams} == {"nightly-1"}
    assert m.batch.counts.tolist() == b.counts.tolist()


def test_messages_with_and_without_runs_decode_together_and_again_on_the_fast_path() -> None:
    d = Decoder()
    plain = encode("client-07", "a@1", 0, _batch())
    a = encode("client-07", "a@1", 2, _batch(), "run-a")
    b = encode("client-07", "b@1", 0, _batch(), "run-b")
    for _ in range(2):  # the second time the label tables are cached (the quick path)
        out = d.decode_many([plain, a, b, a])
        assert not out.errors
        (g,) = out.groups
        assert [g.message(k).run for k in range(len(g))] == [None, "run-a", "run-b", "run-a"]
        assert [g.labels[k][0].run for k in range(len(g))] == [None, "run-a", "run-b", "run-a"]


def test_unknown_flags_and_bad_run_labels_are_refused() -> None:
    p = bytearray(encode("client-07", "a@1", 0, _batch(), "run-a"))
    bad = bytearray(p)
    bad[5] |= 0x10  # bits 2-3 are the latency kind (issue 27)
    with pytest.raises(WireFormatError, match="unknown flags 0x13"):
        decode(bytes(bad))
    at = 26 + 2 + len("client-07") + 2 + len("a@1")
    zero = p[:at] + b"\x00\x00" + p[at + 2 :]
    with pytest.raises(WireFormatError, match="run label length 0"):
        decode(bytes(zero))
    with pytest.raises(ValueError, match=r"run label must be 1\.\.512"):
        encode("client-07", "a@1", 0, _batch(), "")


def test_split_counts_the_run_label_in_every_message() -> None:
    b = batch([(i * 1000, i * 1000 + 1000, 0, {900 + j: 1 for j in range(40)}) for i in range(50)])
    run = "r" * 300
    parts = list(split("client-07", "s@1", 0, b, 2000, run=run))
    assert len(parts) > 1
    assert all(len(p.payload) <= 2000 for p in parts)
    assert all(decode(p.payload).run == run for p in parts)
    assert sum(p.records for p in parts) == len(b)


def test_rows_name_the_runs_of_the_records_they_merge() -> None:
    """Hosts a and b in run-a, host c in run-b, host d without a label; quanta 1 and 2."""
    e = QuantumEngine(layout=BinLayout(), quantum_ms=1000, per_host=True)

    def labelled(host: str, run: str | None, recs: list[Rec]) -> RecordBatch:
        b = batch(recs, host=host)
        return replace(b, streams=tuple(StreamInfo(s.host, s.stream, run) for s in b.streams))

    e.add(labelled("a", "run-a", [(0, 1000, 0, {900: 5})]))
    e.add(labelled("b", "run-a", [(0, 1000, 1, {900: 5}), (1000, 2000, 0, {900: 1})]))
    e.add(labelled("c", "run-b", [(0, 1000, 0, {900: 5})]))
    e.add(labelled("d", None, [(1000, 2000, 0, {900: 5})]))
    rows = {(r.end_ms, r.scope, r.host, r.direction): r for r in e.flush()}
    assert rows[1000, "cluster", None, "read"].runs == ("run-a", "run-b")
    assert rows[1000, "cluster", None, "write"].runs == ("run-a",)
    assert rows[1000, "cluster", None, "all"].runs == ("run-a", "run-b")
    assert rows[1000, "host", "c", "all"].runs == ("run-b",)
    assert rows[2000, "cluster", None, "all"].runs == ("run-a",)
    assert rows[2000, "host", "d", "read"].runs == ()
    line = rows[1000, "cluster", None, "all"].to_json_line()
    assert line.endswith(',"runs":["run-a","run-b"]}\n')
    assert json.loads(line) == rows[1000, "cluster", None, "all"].to_json()
    assert parse_row(json.loads(line)).runs == ("run-a", "run-b")
    assert '"runs"' not in rows[2000, "host", "d", "read"].to_json_line()
    assert "runs" not in rows[2000, "host", "d", "read"].to_json()


def test_rows_without_labels_are_written_as_before() -> None:
    e = QuantumEngine(layout=BinLayout(), quantum_ms=1000)
    e.add(batch([(0, 1000, 0, {900: 5})]))
    (row, *_) = e.flush()
    assert row.runs == ()
    assert "runs" not in row.to_json_line()


def test_the_run_gauge_names_the_runs_of_the_last_closed_quantum() -> None:
    def row(end: int, runs: tuple[str, ...]) -> ClosedQuantum:
        r = parse_row(
            json.loads(
                '{"start_ms":0,"end_ms":0,"scope":"cluster","host":null,"direction":"all",'
                '"samples":1,"min_ns":1,"mean_ns":1,"max_ns":1,"percentiles_ns":{"50":1},'
                '"saturated":[],"iops":1,"bytes_per_second":1,"streams":1,"late_records":0}'
            )
        )
        return replace(r, end_ms=end, runs=runs)

    g = QuantumGauges(percentiles=(50.0,))
    g.observe([row(1000, ("run-a",)), row(2000, ("run-b", "run-c"))], now_ms=2500)
    assert list(g.runs) == ["run-b", "run-c"]
    g.revise([row(2000, ("run-d",))])
    assert list(g.runs) == ["run-b", "run-c", "run-d"]
    assert RUN_INFO[0] == "fiomon_run_info"


def test_the_agent_run_setting(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"watch: ['/r/**/*.json']\nstate_dir: {tmp_path}\nrun: 'nightly-{{dir}}'\n")
    assert load_agent_config(cfg).run == "nightly-{dir}"
    cfg.write_text(f"watch: ['/r/*.json']\nstate_dir: {tmp_path}\n")
    assert load_agent_config(cfg).run is None
    cfg.write_text(f"watch: ['/r/*.json']\nstate_dir: {tmp_path}\nrun: '{{host}}'\n")
    with pytest.raises(ConfigError, match="the only placeholders are \\{dir\\}"):
        load_agent_config(cfg)
    cfg.write_text(f"watch: ['/r/**/*.json']\nstate_dir: {tmp_path}\nrun: '{{dir:2}}-{{dir}}'\n")
    assert load_agent_config(cfg).run == "{dir:2}-{dir}"
    cfg.write_text(f"watch: ['/r/*.json']\nstate_dir: {tmp_path}\nrun: '{{dir:x}}'\n")
    with pytest.raises(ConfigError, match="placeholders"):
        load_agent_config(cfg)


def test_dir_n_names_a_folder_above_the_files_folder() -> None:
    # A harness tree (pbench-fio: fio_rw/1-read-4KiB/sample1/...): the run is a folder
    # above the one holding the files.
    path = "/var/lib/fio/results/fio_rw/1-read-4KiB/sample1/h1_clat_hist.1.log"
    assert run_label("{dir:2}", path) == "fio_rw"
    assert run_label("{dir:2}/{dir:1}", path) == "fio_rw/1-read-4KiB"
    assert run_label("{dir:0}", path) == run_label("{dir}", path) == "sample1"
    assert run_label("{dir:9}", path) == "?"  # above the path's first folder


def test_run_labels_hold_no_control_characters(tmp_path: Path) -> None:
    # A newline in a run label split the table's "# run:" line (a bare "b" line in the
    # table) and made multi-line CSV fields: refused where given, escaped from folders.
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"watch: ['/r/**/*.json']\nstate_dir: {tmp_path}\nrun: \"a\\nb\"\n")
    with pytest.raises(ConfigError, match="no control characters"):
        load_agent_config(cfg)
    r = subprocess.run(
        [sys.executable, "-m", "fiomon", "report", "--run", "a\nb", str(cfg)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2
    assert "without control characters" in r.stderr
    assert run_label("{dir}", "/r/a\nb/x.json") == "a\\x0ab"
    assert run_label("nightly-{dir}", "/r/42/x.json") == "nightly-42"


def test_a_revision_names_the_runs_of_its_late_records() -> None:
    # Revisions repeated the runs of the first close: late records of run-b merged into a
    # run-a quantum left it "runs: [run-a]", and host b's rows, first published by those
    # late records, had no runs at all (report --run run-b missed them).
    e = QuantumEngine(layout=BinLayout(), quantum_ms=1000, per_host=True, revise_within_ms=60_000)

    def labelled(host: str, run: str | None, recs: list[Rec]) -> RecordBatch:
        b = batch(recs, host=host)
        return replace(b, streams=tuple(StreamInfo(s.host, s.stream, run) for s in b.streams))

    e.add(labelled("a", "run-a", [(0, 1000, 0, {900: 5})]))
    first = {(r.scope, r.host, r.direction): r for r in e.close_through(1000)}
    assert first["cluster", None, "read"].runs == ("run-a",)
    e.add(labelled("b", "run-b", [(0, 1000, 0, {900: 5})]))
    e.add(labelled("c", None, [(0, 1000, 0, {900: 5})]))
    rows = {(r.scope, r.host, r.direction): r for r in e.close_through(1000) + e.flush()}
    cluster = rows["cluster", None, "read"]
    assert (cluster.revision, cluster.stats.samples) == (1, 15)
    assert cluster.runs == ("run-a", "run-b")
    assert rows["cluster", None, "all"].runs == ("run-a", "run-b")
    assert rows["host", "b", "read"].runs == ("run-b",)
    assert rows["host", "c", "read"].runs == ()
