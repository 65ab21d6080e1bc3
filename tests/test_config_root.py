"""The root's configuration: its cells, its grid, its skew bound and a lateness that
holds against the cells' and its cell timeout (issue 24), at load, in check-config and
at ``fiomon root``'s start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fiomon.config import aggregator_config_from, root_problems
from fiomon.errors import ConfigError

ROOT = {"align": "epoch", "lateness": "10s", "root": {"cells": ["a", "b"]}}


def problems(data: dict[str, object]) -> list[str]:
    try:
        aggregator_config_from(data, source="f")
    except ConfigError as exc:
        return exc.problems
    return []


def test_a_root_section_with_its_keys_and_defaults() -> None:
    cfg = aggregator_config_from(ROOT)
    assert cfg.root is not None
    assert (cfg.root.max_skew_ms, cfg.root.cells_lateness_ms, cfg.root.cell_timeout_ms) == (
        5000,
        5000,
        30_000,
    )
    cfg = aggregator_config_from(
        {**ROOT, "root": {"cells": ["a"], "max_skew": "2s", "cells_lateness": "3s"}}
    )
    assert cfg.root is not None
    assert (cfg.root.max_skew_ms, cfg.root.cells_lateness_ms) == (2000, 3000)
    assert root_problems(cfg) == []


@pytest.mark.parametrize(
    ("data", "want"),
    [
        ({**ROOT, "root": {"cell_timeout": "30s"}}, "f: root.cells: required by fiomon root"),
        ({**ROOT, "root": {"cells": []}}, "f: root.cells: required by fiomon root"),
        ({**ROOT, "align": "auto"}, "f: align: the root needs epoch or a fixed offset, not auto"),
        (
            {**ROOT, "lateness": "5s"},
            "f: lateness: the root's (5000 ms) must be above root.cells_lateness (5000 ms",
        ),
        (
            {**ROOT, "root": {"cells": ["a"], "cells_lateness": "20s"}},
            "f: lateness: the root's (10000 ms) must be above root.cells_lateness (20000 ms",
        ),
        (
            {**ROOT, "lateness": "40s"},
            "f: root.cell_timeout (30000 ms) must be at least lateness (40000 ms): a silent "
            "cell would stop being waited for",
        ),
        ({**ROOT, "root": {"cells": ["a"], "max_skew": "1h"}}, "f: root.max_skew: must be at most"),
        ({**ROOT, "root": {"cells": ["a"], "max_skew": "-1s"}}, "f: root.max_skew:"),
    ],
)
def test_what_a_root_cannot_run_with_is_a_config_error(data: dict[str, object], want: str) -> None:
    got = problems(data)
    assert any(p.startswith(want) for p in got), got


def test_a_cell_with_auto_alignment_and_a_root_section_is_told_once() -> None:
    got = problems({**ROOT, "align": "auto", "state_dir": "s", "partials": {"cell": "a"}})
    assert [p for p in got if "auto" in p] == [
        "f: partials/root: need align epoch or a fixed offset, not auto"
    ]


def fiomon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fiomon", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_config_and_fiomon_root_name_the_keys(tmp_path: Path) -> None:
    bad = tmp_path / "root.yaml"
    bad.write_text("align: epoch\nroot: {cells: [a], cell_timeout: 3s}\n")
    r = fiomon("check-config", str(bad))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "lateness: the root's (5000 ms) must be above root.cells_lateness" in r.stderr
    assert "root.cell_timeout (3000 ms) must be at least lateness (5000 ms)" in r.stderr
    # fiomon root with an aggregator's file (no root section): refused before it starts.
    plain = tmp_path / "aggregator.yaml"
    plain.write_text("align: epoch\nlateness: 10s\n")
    r = fiomon("root", "--config", str(plain))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"fiomon root: {plain}: root.cells: required by fiomon root" in r.stderr
    good = tmp_path / "good.yaml"
    good.write_text("align: epoch\nlateness: 10s\nroot: {cells: [a, b], max_skew: 2s}\n")
    r = fiomon("check-config", str(good))
    assert r.returncode == 0, r.stderr
    assert "cells a, b, cell_timeout 30 s, max_skew 2 s, cells_lateness 5 s" in r.stdout
