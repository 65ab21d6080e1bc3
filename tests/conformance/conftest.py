"""The conformance matrix runs once per session; every test reads its results.

The per-case table (fio's totals against what fiomon counted) is printed at the end of
the run and kept as ``table.txt`` in the matrix's folder.
"""

from __future__ import annotations

import pytest

from tests.conformance.check import table
from tests.conformance.harness import Results, run_matrix

_TABLE: list[str] = []


@pytest.fixture(scope="session")
def matrix(tmp_path_factory: pytest.TempPathFactory, fio_bin: str, mosquitto_bin: str) -> Results:
    res = run_matrix(tmp_path_factory.mktemp("conformance"), fio_bin, mosquitto_bin)
    times = ", ".join(f"{k} done at {v:.1f} s" for k, v in res.timings.items())
    text = f"conformance matrix in {res.root} ({times})\n{table(res)}"
    for case, notes in res.notes.items():
        text += "".join(f"\n[{case}] {n}" for n in notes)
    (res.root / "table.txt").write_text(text + "\n")
    _TABLE.append(text)
    return res


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for text in _TABLE:
        terminalreporter.section("fio conformance: fio's total_ios against fiomon")
        terminalreporter.write_line(text)
