"""Every form of fio output people have, recognised by content (issue 22, item 2).

The outputs come from real fio runs started here (short, rate-limited psync jobs, run
side by side once per module); counts are checked against fio's own ``total_ios`` in the
final JSON document of the same run. Only what fio cannot write itself is made by hand
from those files: a BOM, UTF-16, compression after the run, backup suffixes, and fio 3.7's
``--client`` document (fio 3.33's with ``job_runtime`` removed: fio 3.7 is not installed).
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import lzma
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fiomon.agent.follow import Follower
from fiomon.cli import main
from fiomon.errors import InputError
from fiomon.fio.parsers import SNIFF_BYTES, open_parser, sniff
from fiomon.fio.problems import ProblemLog
from fiomon.model import Direction
from fiomon.offline.quanta import QuantaOptions, iter_quanta
from fiomon.offline.sources import host_labels
from fiomon.wire import decode
from tests.conftest import DEADLINE_S, FIXTURES

JOB = """\
[global]
ioengine=psync
iodepth=4
rw=randrw
bs=4k
size=4m
filename={data}
rate_iops=150,75
runtime=2
time_based=1
log_hist_msec=500
log_unix_epoch=1
[{name}]
{extra}
"""
# name -> (fio arguments, extra job options); each run's stdout is kept in NAME.out.
RUNS: dict[str, tuple[list[str], str]] = {
    # psync with iodepth=4: fio prints a "note:" line on stdout before its JSON.
    "notes": (
        ["--output-format=json+", "--status-interval=1"],
        "write_hist_log=notes\nwrite_lat_log=notes\nwrite_bw_log=notes\nwrite_iops_log=notes",
    ),
    "normal": (["--output-format=json+,normal", "--status-interval=1"], ""),
    "single": (["--output-format=json+"], ""),  # pbench's fio-result.txt: text, then JSON
    "plain": (
        ["--output-format=json"],
        "write_hist_log=plain\nlog_compression=16k\nlog_store_compressed=1",
    ),
    "mixed": (["--output-format=json+", "--status-interval=1"], "unified_rw_reporting=1"),
    "both": (["--output-format=json+", "--status-interval=1"], "unified_rw_reporting=both"),
    "text": (["--output-format=normal"], ""),
}


@pytest.fixture(scope="module")
def runs(fio_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with every run's stdout (NAME.out) and logs; the runs go side by side."""
    d = tmp_path_factory.mktemp("formats")
    procs = []
    for name, (args, extra) in RUNS.items():
        job = d / f"{name}.fio"
        job.write_text(JOB.format(data=d / f"{name}.dat", name=name, extra=extra))
        out = (d / f"{name}.out").open("wb")
        procs.append((subprocess.Popen([fio_bin, *args, job.name], cwd=d, stdout=out), out))
    for proc, out in procs:
        assert proc.wait(timeout=DEADLINE_S) == 0
        out.close()
    return d


def last_document(path: Path) -> dict[str, Any]:
    """The final JSON document of a fio output file (whatever text surrounds it)."""
    text = path.read_text()
    start = text.rfind("\n{") + 1
    doc, _ = json.JSONDecoder().raw_decode(text, start)
    assert isinstance(doc, dict)
    return doc


def total_ios(path: Path) -> dict[str, int]:
    """fio's own ``total_ios`` per direction (all jobs) in the file's final document."""
    out: Counter[str] = Counter()
    for job in last_document(path)["jobs"]:
        for d in ("read", "write", "trim", "mixed"):
            if d in job:
                out[d] += job[d]["total_ios"]
    return dict(out)


def counted(*paths: Path, problems: ProblemLog | None = None) -> dict[str, int]:
    """I/Os fiomon reports per direction (cluster rows summed over the run)."""
    out: dict[str, float] = {}
    for row in iter_quanta(list(paths), QuantaOptions(), problems):
        if row.scope == "cluster":  # records split over quanta: fractions until summed
            out[row.direction] = out.get(row.direction, 0.0) + row.stats.samples
    return {d: round(n) for d, n in out.items()}


def test_json_plus_after_fio_notes_on_stdout_is_a_json_stream(runs: Path) -> None:
    out = runs / "notes.out"
    assert out.read_bytes().startswith(b"note:")  # what makes this case
    truth = total_ios(out)
    problems = ProblemLog()
    got = counted(out, problems=problems)
    assert (got["read"], got["write"]) == (truth["read"], truth["write"])
    assert got["all"] == truth["read"] + truth["write"]
    assert problems.dropped == 0
    assert problems.counts["text"] == 1


def test_json_plus_with_normal_output_in_one_file_warns_once(runs: Path) -> None:
    out = runs / "normal.out"
    text = out.read_text()
    assert text.count("Run status group") >= 2  # normal reports between the documents
    truth = total_ios(out)
    problems = ProblemLog()
    got = counted(out, problems=problems)
    assert (got["read"], got["write"]) == (truth["read"], truth["write"])
    assert problems.dropped == 0
    assert problems.counts["text"] == 1  # one warning for all the text, not thousands


def test_pbench_fio_result_txt_text_then_json(runs: Path, tmp_path: Path) -> None:
    result = tmp_path / "fio-result.txt"
    shutil.copy(runs / "single.out", result)
    assert not result.read_bytes().startswith(b"{")
    truth = total_ios(result)
    got = counted(result)
    assert got["all"] == truth["read"] + truth["write"]


@pytest.mark.parametrize("name", ["notes", "normal"])
def test_text_first_streams_are_recognised_while_they_grow(runs: Path, name: str) -> None:
    """The agent sniffs whatever fio has written so far and feeds the rest in pieces."""
    data = (runs / f"{name}.out").read_bytes()
    first = data[: data.index(b"\n") + 1]  # only fio's first line of text so far
    assert not first.startswith(b"{")
    assert sniff(first) == "json"
    problems = ProblemLog()
    parser = open_parser(first, f"{name}.out", problems)
    n = 0
    for i in range(0, len(data), 777):
        batch = parser.feed(data[i : i + 777])
        n += 0 if batch is None else int(batch.samples().sum())
    last = parser.finish()
    n += 0 if last is None else int(last.samples().sum())
    truth = total_ios(runs / f"{name}.out")
    assert n == truth["read"] + truth["write"]
    assert problems.dropped == 0


def _utf16le(data: bytes) -> bytes:
    return codecs.BOM_UTF16_LE + data.decode().encode("utf-16-le")


def _utf16be(data: bytes) -> bytes:
    return codecs.BOM_UTF16_BE + data.decode().encode("utf-16-be")


ENCODINGS: dict[str, Callable[[bytes], bytes]] = {
    "utf-8-bom": lambda b: codecs.BOM_UTF8 + b,
    "utf-16-le": _utf16le,  # Windows PowerShell's `>`
    "utf-16-be": _utf16be,
}


@pytest.mark.parametrize("encoding", list(ENCODINGS))
def test_json_with_a_bom_or_in_utf16_reads_as_utf8(
    runs: Path, tmp_path: Path, encoding: str
) -> None:
    src = runs / "notes.out"
    f = tmp_path / "out.json"
    f.write_bytes(ENCODINGS[encoding](src.read_bytes()))
    truth = total_ios(src)
    problems = ProblemLog()
    assert counted(f, problems=problems)["all"] == truth["read"] + truth["write"]
    assert problems.dropped == 0


def test_hist_log_with_a_utf8_bom_keeps_its_first_record(runs: Path, tmp_path: Path) -> None:
    src = runs / "notes_clat_hist.1.log"
    f = tmp_path / "bom_clat_hist.1.log"
    f.write_bytes(codecs.BOM_UTF8 + src.read_bytes())
    plain = counted(src)
    truth = total_ios(runs / "notes.out")
    # Hist logs lack fio's last partial interval: at most one 500 ms record per direction.
    assert truth["read"] - 100 <= plain["read"] <= truth["read"]
    problems = ProblemLog()
    assert counted(f, problems=problems) == plain
    assert problems.dropped == 0


COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gz": gzip.compress,
    "bz2": bz2.compress,
    "xz": lzma.compress,
}


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
def test_compressed_logs_and_streams_are_read_by_content(
    runs: Path, tmp_path: Path, suffix: str
) -> None:
    log = runs / "notes_clat_hist.1.log"
    stream = runs / "notes.out"
    zlog = tmp_path / f"notes_clat_hist.1.log.{suffix}"
    zstream = tmp_path / f"notes.json.{suffix}"
    zlog.write_bytes(COMPRESSORS[suffix](log.read_bytes()))
    zstream.write_bytes(COMPRESSORS[suffix](stream.read_bytes()))
    problems = ProblemLog()
    assert counted(zlog, problems=problems) == counted(log)
    truth = total_ios(stream)
    assert counted(zstream, problems=problems)["all"] == truth["read"] + truth["write"]
    assert problems.dropped == 0
    assert problems.counts["client-log"] == 0
    # Not the log of a fio --client server called "gz".
    assert host_labels([zlog, zstream], "file") == ["notes", "notes"]


@pytest.mark.parametrize("suffix", ["1", "bak", "1.gz"])
def test_backup_suffixes_are_not_client_servers(runs: Path, tmp_path: Path, suffix: str) -> None:
    log = runs / "notes_clat_hist.1.log"
    f = tmp_path / f"notes_clat_hist.1.log.{suffix}"
    data = log.read_bytes()
    f.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    problems = ProblemLog()
    # Read as fio --client's running sums, the counts would change.
    assert counted(f, problems=problems) == counted(log)
    assert not [p for p in problems.kept if "fio --client" in p.reason]
    assert host_labels([f], "file") == ["notes"]


def test_compressed_data_cut_short_is_reported_not_crashed(runs: Path, tmp_path: Path) -> None:
    data = gzip.compress((runs / "notes_clat_hist.1.log").read_bytes())
    f = tmp_path / "cut_clat_hist.1.log.gz"
    f.write_bytes(data[: len(data) // 2])
    problems = ProblemLog()
    counted(f, problems=problems)
    assert problems.counts["corrupt"] == 1


def _report_fails(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``fiomon report PATH``'s message; it must fail (exit status != 0)."""
    assert main(["report", str(path)]) != 0
    err = capsys.readouterr().err
    assert str(path) in err
    return err


def test_plain_json_is_an_error_naming_its_ios_and_json_plus(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = runs / "plain.out"
    truth = total_ios(out)
    with pytest.raises(InputError) as info:
        counted(out)
    msg = str(info.value)
    assert str(out) in msg
    assert f"holds {truth['read'] + truth['write']} I/Os" in msg
    assert "--output-format=json+" in msg
    assert "write_hist_log" in msg
    err = _report_fails(out, capsys)
    assert "no I/O" not in err
    assert "--output-format=json+" in err
    assert main(["summary", str(out)]) != 0
    assert "--output-format=json+" in capsys.readouterr().err


def test_fio_log_store_fz_says_what_it_is_and_how_to_inflate(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fz = runs / "plain_clat_hist.1.log.fz"
    assert fz.stat().st_size > 0
    err = _report_fails(fz, capsys)
    assert "log_store_compressed" in err
    # fio --inflate-log restores lat/bw/iops logs but not hist logs (pointers for bins)
    assert "fio --inflate-log=" in err
    assert "log_store_compressed=0" in err
    assert "binary data" not in err


@pytest.mark.parametrize(
    ("suffix", "what"),
    [
        # (per-I/O lat/clat logs are read: tests/offline/test_iolog.py)
        ("bw", "BW log (write_bw_log)"),
        ("iops", "IOPS log (write_iops_log)"),
    ],
)
def test_bw_iops_logs_are_not_histogram_logs(
    runs: Path, capsys: pytest.CaptureFixture[str], suffix: str, what: str
) -> None:
    log = runs / f"notes_{suffix}.1.log"
    err = _report_fails(log, capsys)
    assert f"not a histogram log: it looks like fio's {what}" in err
    assert "--group-nr" not in err


def test_a_lat_log_by_content_alone(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "results.csv"
    shutil.copy(runs / "notes_lat.1.log", f)
    err = _report_fails(f, capsys)
    assert "not a histogram log: it looks like fio's latency, bandwidth or IOPS log" in err


def test_normal_output_alone_is_refused_with_the_option_that_gives_json_plus(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _report_fails(runs / "text.out", capsys)
    assert "no I/O" not in err
    assert "--output-format=json+" in err


def test_unified_rw_reporting_mixed_is_its_own_direction(runs: Path) -> None:
    out = runs / "mixed.out"
    truth = total_ios(out)
    assert set(truth) == {"mixed"}
    got = counted(out)
    assert got == {"mixed": truth["mixed"], "all": truth["mixed"]}


def test_unified_rw_reporting_both_reads_the_directions_not_their_sum(runs: Path) -> None:
    out = runs / "both.out"
    truth = total_ios(out)
    assert truth["mixed"] == truth["read"] + truth["write"] > 0
    got = counted(out)
    assert "mixed" not in got
    assert (got["read"], got["write"]) == (truth["read"], truth["write"])
    assert got["all"] == truth["mixed"]  # not twice


def test_fio_37_client_json_without_job_runtime(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "fio333_client_status.json").read_text())
    for entry in doc["client_stats"]:
        entry.pop("job_runtime", None)  # what fio 3.7 writes
    old = tmp_path / "fio37_client.json"
    old.write_text(json.dumps(doc, indent=2))
    problems = ProblemLog()
    got = counted(old, problems=problems)
    assert got == counted(FIXTURES / "fio333_client_status.json")
    # fio's own final counts: each of the three jobs (two on 127.0.0.2, one on 127.0.0.3)
    # ends with read and write total_ios of 300.
    assert got == {"read": 900, "write": 900, "all": 1800}
    texts = [p.reason for p in problems.kept]
    assert not [t for t in texts if "All clients" in t and not t.startswith("1 ")]
    assert problems.dropped == 0


def test_fio_client_entries_nothing_can_place_refuse_the_file(tmp_path: Path) -> None:
    doc = json.loads((FIXTURES / "fio333_client_status.json").read_text())
    for entry in doc["client_stats"]:
        for key in ("job_runtime", "elapsed"):
            entry.pop(key, None)
        for d in ("read", "write", "trim"):
            entry.get(d, {}).pop("runtime", None)
    f = tmp_path / "client.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="nothing places them in time"):
        counted(f)


def test_sniff_reads_the_same_head_the_agent_hands_it(runs: Path) -> None:
    for name in ("notes", "normal", "single", "mixed"):
        assert sniff((runs / f"{name}.out").read_bytes()[:SNIFF_BYTES]) == "json"
    assert sniff((runs / "notes_clat_hist.1.log").read_bytes()[:SNIFF_BYTES]) == "hist"


def iter_chunks(data: bytes, size: int) -> Iterator[bytes]:
    """``data`` in pieces of ``size`` bytes."""
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_utf16_stream_fed_in_odd_pieces(runs: Path) -> None:
    data = _utf16le((runs / "notes.out").read_bytes())
    problems = ProblemLog()
    parser = open_parser(data[:SNIFF_BYTES], "u16.json", problems)
    n = 0
    for piece in iter_chunks(data, 1001):  # odd: splits UTF-16 code units
        batch = parser.feed(piece)
        n += 0 if batch is None else int(batch.samples().sum())
    last = parser.finish()
    n += 0 if last is None else int(last.samples().sum())
    truth = total_ios(runs / "notes.out")
    assert n == truth["read"] + truth["write"]
    assert problems.dropped == 0


@pytest.mark.parametrize("name", ["notes", "normal", "mixed"])
def test_the_agent_follower_publishes_them_as_fio_writes_them(
    runs: Path, tmp_path: Path, name: str
) -> None:
    """The live path: a growing file sniffed at its first line of text, then fed on."""
    data = (runs / f"{name}.out").read_bytes()
    live = tmp_path / f"{name}.json"
    f = Follower(
        (str(tmp_path / "*.json"),),
        agent="client-07",
        max_message_bytes=256 * 1024,
        log_hist_msec=500,
        clock=lambda: 1000.0,
    )
    out = []
    try:
        cut = data.index(b"\n") + 1
        live.write_bytes(data[:cut])  # fio has written its first line of text only
        out += list(f.poll())
        for i in range(cut, len(data), 4099):
            with live.open("ab") as fh:
                fh.write(data[i : i + 4099])
            out += list(f.poll())
        out += list(f.poll(final=True))
    finally:
        f.close()
    got: Counter[int] = Counter()
    for m in out:
        batch = decode(m.payload).batch
        for d, n in zip(batch.direction.tolist(), batch.samples().tolist(), strict=True):
            got[d] += n
    truth = total_ios(runs / f"{name}.out")
    want = {
        int(Direction[d.upper()]): n
        for d, n in truth.items()
        if n and not (d == "mixed" and name != "mixed")
    }
    assert dict(got) == want
