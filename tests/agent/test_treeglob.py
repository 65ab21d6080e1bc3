"""Recursive ``**`` patterns: glob's semantics, new folders seen, bounded scans."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from fiomon.agent.treeglob import RACY_NS, TreeGlob, is_recursive

FILES = [
    "a_clat_hist.1.log",
    "run1/a_clat_hist.1.log",
    "run1/out.json",
    "2026-11-27/run2/hist/b_clat_hist.2.log",
    "fio_rw/1-read-4KiB/sample1/clients/c1/fio_clat_hist.1.log",
    ".hidden/a_clat_hist.1.log",
    "run1/.a_clat_hist.9.log",
    "run1/notes.txt",
]


def tree(root: Path) -> None:
    for name in FILES:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")


@pytest.mark.parametrize(
    "pattern",
    [
        "**/*_clat_hist.*.log",
        "**/*.json",
        "run*/**/*.log",
        "**/hist/*.log",
        "**/sample*/**/*.log",
        "**/.*.log",
        "2026-11-27/**",
        "**/**/*.log",
    ],
)
def test_matches_what_recursive_glob_matches(tmp_path: Path, pattern: str) -> None:
    tree(tmp_path)
    full = str(tmp_path / pattern)
    t = TreeGlob(full)
    t.refresh()
    want = sorted({p.rstrip("/") for p in glob.glob(full, recursive=True)} - {t.root})
    assert t.paths == want
    assert t.paths, "each pattern matches something in the tree"


def test_relative_patterns_give_relative_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    t = TreeGlob("**/*_clat_hist.*.log")
    t.refresh()
    assert t.paths == sorted(glob.glob("**/*_clat_hist.*.log", recursive=True))


def test_only_whole_double_star_components_recurse() -> None:
    assert is_recursive("/r/**/*.log")
    assert is_recursive("**/x")
    assert not is_recursive("/r/**.log")
    assert not is_recursive("/r/*/*.log")
    with pytest.raises(ValueError, match="no \\*\\* component"):
        TreeGlob("/r/*.log")


def test_folders_created_later_are_found_and_unchanged_folders_are_not_listed(
    tmp_path: Path,
) -> None:
    now = [0]
    t = TreeGlob(str(tmp_path / "results" / "**" / "*.log"), wall_ns=lambda: now[0])
    assert not t.refresh()  # the root does not exist yet
    assert t.paths == []
    (tmp_path / "results" / "run1").mkdir(parents=True)
    (tmp_path / "results" / "run1" / "a.log").write_text("x")
    now[0] = os.stat(tmp_path / "results").st_mtime_ns + RACY_NS
    assert t.refresh()
    assert t.paths == [str(tmp_path / "results" / "run1" / "a.log")]
    assert (t.folders, t.listed) == (2, 2)
    assert not t.refresh()  # nothing changed: one stat per folder, no listing
    assert (t.folders, t.listed) == (2, 0)
    deep = tmp_path / "results" / "run2" / "sample1" / "clients" / "c1"
    deep.mkdir(parents=True)
    (deep / "b.log").write_text("x")
    assert t.refresh()
    assert t.paths[-1] == str(deep / "b.log")


def test_a_folder_listed_within_its_mtime_tick_is_listed_again(tmp_path: Path) -> None:
    """Coarse timestamps: two changes in one tick leave one mtime; the listing is redone."""
    (tmp_path / "r").mkdir()
    mtime = os.stat(tmp_path / "r").st_mtime_ns
    now = [mtime + 1000]
    t = TreeGlob(str(tmp_path / "r" / "**" / "*.log"), wall_ns=lambda: now[0])
    t.refresh()
    (tmp_path / "r" / "a.log").write_text("x")
    os.utime(tmp_path / "r", ns=(mtime, mtime))  # the same tick as the listing saw
    assert t.refresh()
    assert t.paths == [str(tmp_path / "r" / "a.log")]


def test_link_loops_end_and_big_trees_are_cut(tmp_path: Path) -> None:
    tree(tmp_path)
    os.symlink(tmp_path, tmp_path / "run1" / "loop")
    t = TreeGlob(str(tmp_path / "**" / "*.log"))
    t.refresh()
    assert str(tmp_path / "run1" / "a_clat_hist.1.log") in t.paths
    small = TreeGlob(str(tmp_path / "**" / "*.log"), max_folders=3)
    small.refresh()
    assert small.truncated
    assert small.folders == 3


def test_links_inside_the_root_keep_real_names_and_links_out_are_not_followed(
    tmp_path: Path,
) -> None:
    results, other = tmp_path / "results", tmp_path / "h2" / "results"
    (results / "run5").mkdir(parents=True)
    (results / "run5" / "a_clat_hist.1.log").write_text("x")
    other.mkdir(parents=True)
    (other / "b_clat_hist.1.log").write_text("x")
    os.symlink("run5", results / "latest")  # a harness's "latest run" link: inside the root
    os.symlink(other, results / "h2")  # another host's results: out of the root
    t = TreeGlob(str(results / "**" / "*.log"))
    t.refresh()
    # run5's file once, under its real name (not latest/), and nothing of h2's
    assert t.paths == [str(results / "run5" / "a_clat_hist.1.log")]
    assert t.escaped == {str(results / "h2")}
    # glob itself follows both links: three names for two files
    assert len(glob.glob(str(results / "**" / "*.log"), recursive=True)) == 3
