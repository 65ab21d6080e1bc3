"""fiomon paths: where the shipped files are, from a checkout (the installed case is in
tests/test_packaging.py, from a venv made from the release wheel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fiomon.cli import main
from fiomon.paths import PLACES, shipped_path

ROOT = Path(__file__).resolve().parent.parent


def test_a_checkout_is_its_own_share_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["paths"]) == 0
    lines = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines())
    assert list(lines) == list(PLACES)
    assert lines["share"] == str(ROOT)
    assert lines["systemd"] == str(ROOT / "deploy/systemd")
    assert lines["config"] == str(ROOT / "config")
    assert lines["ansible"] == str(ROOT / "deploy/ansible")


def test_one_name_prints_one_path_for_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["paths", "systemd"]) == 0
    assert capsys.readouterr().out == f"{ROOT / 'deploy/systemd'}\n"
    assert shipped_path("docs") == ROOT / "docs"


def test_an_unknown_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["paths", "etc"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown place 'etc'"):
        shipped_path("etc")
