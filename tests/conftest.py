"""Shared fixtures: real fio (required, never skipped) and small helpers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def fio_bin() -> str:
    """Path of the real fio binary; the suite fails loudly when it is missing."""
    path = shutil.which("fio")
    if path is None:
        pytest.fail("fio is not installed: run .ci/run (it installs fio) or apt-get install fio")
    return path
