"""``fiomon report`` and ``fiomon summary`` on every case's files against fio's total_ios."""

from __future__ import annotations

import pytest

from tests.conformance.check import describe, offline_problems
from tests.conformance.harness import Results
from tests.conformance.matrix import CASES

PARAMS = [pytest.param(c.name, v, id=f"{c.name}-{v}") for c in CASES for v in c.view_ids]


@pytest.mark.fio
@pytest.mark.parametrize(("case", "view"), PARAMS)
def test_offline(matrix: Results, case: str, view: str) -> None:
    if case in matrix.errors:
        pytest.fail(f"[{case}] the fio run failed:\n{matrix.errors[case]}")
    v = matrix.views[(case, view)]
    o = matrix.offline[(case, view)]
    bad = offline_problems(v, o)
    assert not bad, "\n".join([*bad, describe(case, o)])
