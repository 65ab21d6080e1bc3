"""Offline sources: a file is classed (json+ or hist log) as the agent classes it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fiomon.cli import main
from tests.conftest import FIXTURES

HIST = FIXTURES / "fio333_randrw_clat_hist.1.log"
JSON = FIXTURES / "fio333_randrw_status.json"


def report(folder: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """``fiomon report --per-host --format jsonl`` of the folder's json+ and hist log."""
    args = ["report", "--format", "jsonl", "--per-host", str(folder / HIST.name)]
    assert main([*args, str(folder / JSON.name)]) == 0
    return capsys.readouterr().out


def test_a_json_document_after_many_blank_bytes_reads_as_without_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """100 blank bytes (more than the 64 once sniffed offline) before a json+ document.

    The agent sniffs a file's first 4096 bytes (:data:`fiomon.fio.parsers.SNIFF_BYTES`); the
    offline commands used to look at 64, took such a file for a hist log and counted its
    covered hist log twice. Same folder layout and names, so the rows must be identical.
    """
    plain, padded = tmp_path / "plain", tmp_path / "padded"
    for d in (plain, padded):
        d.mkdir()
        shutil.copy(HIST, d / HIST.name)
    shutil.copy(JSON, plain / JSON.name)
    (padded / JSON.name).write_bytes(b"\n \n\t" * 25 + JSON.read_bytes())
    want = report(plain, capsys)
    assert want.count("\n") > 3
    assert '"host":"fio333_randrw_status"' in want  # the json+ stream's own host rows
    assert report(padded, capsys) == want
