"""The release artifacts as scripts/release makes them, and a fresh venv from the wheel alone.

Shared by tests/test_packaging.py and tests/test_deploy_ansible.py through the session
fixture ``release`` (tests/conftest.py), so CI builds once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fiomon import __version__

ROOT = Path(__file__).resolve().parent.parent
# Building, and installing with dependencies from the package index, takes a while.
INSTALL_TIMEOUT_S = 600


@dataclass(frozen=True, slots=True)
class Release:
    """What one run of scripts/release --wheelhouse left, and what it printed."""

    sdist: Path
    wheel: Path
    wheelhouse: Path  # the wheel and its runtime dependencies, for this interpreter
    revision: str
    output: str


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that puts a checkout on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    env.update(extra)
    return env


def run(
    *cmd: str | Path, timeout: float = INSTALL_TIMEOUT_S, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in :func:`clean_env`; fail the test, with its output, unless it exits 0."""
    r = subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env=clean_env(),
    )
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}:\n{r.stdout}\n{r.stderr}"
    return r


def build_release(outdir: Path) -> Release:
    """Run scripts/release with this interpreter's venv (which has build and twine)."""
    venv = Path(sys.prefix)
    r = subprocess.run(
        [str(ROOT / "scripts/release"), "--outdir", str(outdir), "--wheelhouse"],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
        env=clean_env(VENV=str(venv)),
    )
    assert r.returncode == 0, f"scripts/release:\n{r.stdout}\n{r.stderr}"
    revision = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Release(
        sdist=outdir / f"fiomon-{__version__}.tar.gz",
        wheel=outdir / f"fiomon-{__version__}-py3-none-any.whl",
        wheelhouse=outdir / "wheelhouse",
        revision=revision,
        output=r.stdout + r.stderr,
    )
