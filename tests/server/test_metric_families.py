"""The cell's and the root's own families follow Prometheus' conventions, like the rest."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from fiomon.server.exporter import Snapshot, render
from fiomon.server.metrics import with_outbox, with_root
from tests.metricskit import parse_samples


def test_cell_and_root_families_pass_promtool() -> None:
    snap = with_outbox(Snapshot(), backlog_bytes=4096, sent=12, dropped=0, refused=3)
    snap = with_root(
        snap,
        cells_up=1,
        cells_expected=2,
        cell_up={"c2": False, "c1": True},
        rows={"merged": 40, "late": 2},
        invalid={"layout": 1},
        closed_by_lateness=5,
    )
    text = render(snap).decode()
    samples = parse_samples(text)
    assert samples[("fiomon_partials_backlog_bytes", ())] == 4096
    assert samples[("fiomon_partials_messages_total", (("result", "refused"),))] == 3
    assert samples[("fiomon_root_cells_up", ())] == 1
    assert samples[("fiomon_root_cells_expected", ())] == 2
    assert samples[("fiomon_root_cell_up", (("cell", "c1"),))] == 1
    assert samples[("fiomon_root_cell_up", (("cell", "c2"),))] == 0
    # Every outcome is present from the start, at 0 (alerts see the series before it grows).
    assert samples[("fiomon_root_partial_rows_total", (("outcome", "duplicate"),))] == 0
    assert samples[("fiomon_root_partial_rows_total", (("outcome", "late"),))] == 2
    assert samples[("fiomon_root_invalid_partials_total", (("reason", "layout"),))] == 1
    assert samples[("fiomon_root_quanta_closed_by_lateness_total", ())] == 5
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run scripts/test or apt-get install prometheus")
    res = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (res.stdout + res.stderr).strip(), res.stdout + res.stderr
