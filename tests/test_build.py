"""``fiomon_build_info``'s revision: the REVISION file, else git HEAD of the checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

from fiomon import build
from fiomon.build import UNKNOWN, revision, revision_of


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_this_checkout_reports_its_head() -> None:
    package = Path(build.__file__).parent
    assert revision() == git(package, "rev-parse", "HEAD")


def test_the_revision_file_wins_then_git_then_unknown(tmp_path: Path) -> None:
    # a checkout of its own, fiomon/ at its top level
    repo = tmp_path / "repo"
    (repo / "fiomon").mkdir(parents=True)
    (repo / "fiomon" / "x.py").write_text("")
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = git(repo, "rev-parse", "HEAD")
    assert revision_of(repo / "fiomon") == head
    # a release: the file written by the build wins (first line, stripped)
    (repo / "fiomon" / "REVISION").write_text("0123abcd\nignored\n")
    assert revision_of(repo / "fiomon") == "0123abcd"
    # installed somewhere inside another repository's tree: not that tree's commit
    other = repo / "venv" / "site-packages" / "fiomon"
    other.mkdir(parents=True)
    assert revision_of(other) == UNKNOWN
    # neither a file nor a checkout
    (tmp_path / "plain" / "fiomon").mkdir(parents=True)
    assert revision_of(tmp_path / "plain" / "fiomon") == UNKNOWN
