"""The conformance matrix runs once per session; every test reads its results."""

from __future__ import annotations

import pytest

from tests.conformance.check import table
from tests.conformance.harness import Results, run_matrix


@pytest.fixture(scope="session")
def matrix(tmp_path_factory: pytest.TempPathFactory, fio_bin: str, mosquitto_bin: str) -> Results:
    res = run_matrix(tmp_path_factory.mktemp("conformance"), fio_bin, mosquitto_bin)
    t = res.timings
    text = table(res)
    (res.root / "table.txt").write_text(text + "\n")
    print(
        f"\nconformance matrix in {res.root}: " + ", ".join(f"{k} {v:.1f} s" for k, v in t.items())
    )
    print(text)
    return res
