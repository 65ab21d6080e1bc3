"""Hist logs of ``fio --client``: running sums two entries back, read as intervals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fiomon.offline.sources import FileSource, SourceOptions
from fiomon.tools.simulate import format_line
from tests.clock import T0


def _intervals(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        counts = np.zeros(1856, dtype=np.int64)
        counts[rng.integers(500, 900, 20)] += rng.integers(1, 9, 20)
        out.append(counts)
    return out


def _read(path: Path) -> tuple[dict[int, np.ndarray], list[str]]:
    """Total counts per direction, and the problems reported, reading ``path``."""
    src = FileSource(path, "h", SourceOptions())
    totals: dict[int, np.ndarray] = {}
    for batch in src.batches():
        dense = batch.dense()
        for d in (0, 1):
            rows = dense[batch.direction == d]
            totals[d] = totals.get(d, np.zeros(1856, np.int64)) + rows.sum(axis=0)
    return totals, src.problems.summary_lines()


def test_running_sums_two_back_are_read_as_intervals(tmp_path: Path) -> None:
    # What fio 3.33's client_flush_hist_samples writes: entry k = interval k + entry k-2.
    truth = {d: _intervals(d, 12) for d in (0, 1)}
    lines = []
    for d in (0, 1):
        entries: list[np.ndarray] = []
        for k, counts in enumerate(truth[d]):
            entries.append(counts + (entries[k - 2] if k >= 2 else 0))
            lines.append((T0 + 1000 * (k + 1), d, entries[-1]))
    lines.sort(key=lambda x: (x[0], x[1]))  # fio interleaves the directions
    log = tmp_path / "h_clat_hist.1.log.10.0.0.7"
    log.write_text("".join(format_line(t, d, 4096, c) for t, d, c in lines))
    totals, problems = _read(log)
    for d in (0, 1):
        assert (totals[d] == sum(truth[d])).all()
    assert any("written by fio --client" in p for p in problems)
    # The same lines under a local name (pbench-fio drops the server's name): recognised
    # by their content, and undone the same way.
    local = tmp_path / "h_clat_hist.1.log"
    local.write_text(log.read_text())
    totals, problems = _read(local)
    for d in (0, 1):
        assert (totals[d] == sum(truth[d])).all()
    assert any("recognised by content" in p for p in problems)


@pytest.mark.parametrize("shape", ["level", "ramp", "one-bin", "short", "noisy-ramp", "from-idle"])
def test_a_log_fio_wrote_itself_is_never_taken_for_running_sums(tmp_path: Path, shape: str) -> None:
    rng = np.random.default_rng(7)
    rows = []
    for k in range(4 if shape == "short" else 40):
        counts = np.zeros(1856, dtype=np.int64)
        if shape == "one-bin":
            counts[700] = 25
        elif shape == "level":
            counts[rng.integers(600, 620, 25)] += 1
        elif shape == "ramp":
            counts[700:710] = 10 * (k + 1)  # load climbing evenly: bin by bin monotone
        elif shape == "from-idle":  # idle, then a load that steps up two records at a time
            counts[700] = 10 * max(0, k // 2 - 1)
            counts[701] = k % 2
        elif shape == "noisy-ramp":
            counts[700:710] = 10 * (k + 1) + rng.integers(0, 3, 10)
        else:
            counts[700] = 10 * (k // 2 + 1)  # a staircase, but too few records to tell
        rows.append(counts)
    log = tmp_path / "h_clat_hist.1.log"
    log.write_text("".join(format_line(T0 + 250 * (k + 1), 0, 4096, c) for k, c in enumerate(rows)))
    totals, problems = _read(log)
    assert (totals[0] == sum(rows)).all()
    assert not any("running sums" in p for p in problems)


def test_a_client_log_that_is_not_in_that_form_is_read_as_it_is(tmp_path: Path) -> None:
    # Plain intervals (a fio that fixed its writer): the first entry smaller than the one
    # two before stops the differencing, says so, and nothing after it is changed.
    truth = _intervals(3, 6)
    truth[2] = truth[0] // 2  # smaller than entry 0 in some bin
    log = tmp_path / "h_clat_hist.1.log.srv-b"
    log.write_text(
        "".join(format_line(T0 + 1000 * (k + 1), 0, 4096, c) for k, c in enumerate(truth))
    )
    totals, problems = _read(log)
    assert (totals[0] == sum(truth)).all()
    assert any("not the running sums fio --client writes" in p for p in problems)
