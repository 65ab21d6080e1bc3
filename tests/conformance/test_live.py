"""Agents -> Mosquitto -> aggregator, following fio's files as fio writes them.

Per case, the host-scope rows (direction ``all``) of the aggregator's quanta file are
summed over the case's host labels and compared with fio's own total_ios.
"""

from __future__ import annotations

import pytest

from tests.conformance.check import live_problems
from tests.conformance.harness import Results, agent_label
from tests.conformance.matrix import BY_NAME, CASES


@pytest.mark.fio
@pytest.mark.parametrize("case", [c.name for c in CASES])
def test_live(matrix: Results, case: str) -> None:
    if case in matrix.errors:
        pytest.fail(f"[{case}] the fio run failed:\n{matrix.errors[case]}")
    bad = live_problems(matrix, case)
    c = BY_NAME[case]
    labels = [agent_label(c, s) for s in c.agents]
    mine = {*labels, *c.live_labels}
    counted = {h: round(n, 3) for h, n in matrix.live_hosts().items() if h in mine}
    configs = [str(matrix.root / "state" / f"agent-{h}.yaml") for h in labels]
    tail = "\n".join(matrix.agent_logs.get(case, "").splitlines()[-25:])
    assert not bad, "\n".join(
        [
            *bad,
            f"[{case}] live: quanta file {matrix.root / 'quanta.jsonl'} (aggregator exit "
            f"{matrix.aggregator_rc}; its log {matrix.root / 'logs' / 'aggregator.log'})",
            f"this case's hosts counted: {counted}",
            f"$ python -m fiomon agent --config {' / '.join(configs)} (folder "
            f"{matrix.root / 'cases' / case})",
            f"its agents' log (end):\n{tail}",
        ]
    )


@pytest.mark.fio
def test_live_no_stray_hosts(matrix: Results) -> None:
    """Every live host label belongs to a case (nothing published under a made-up name)."""
    known = {agent_label(c, s) for c in CASES for s in c.agents}
    known |= {h for c in CASES for h in c.live_labels}
    stray = {h: n for h, n in matrix.live_hosts().items() if h not in known}
    assert not stray, f"rows for hosts no case runs: {stray}"
