"""The wheel as a user installs it: a real build, a fresh venv, the files where units point.

One wheel is built from this checkout (``pip wheel``, hatchling in an isolated build
environment) and installed with its runtime dependencies only into a new virtual
environment, the way deploy/README.md installs fiomon into ``/opt/fiomon``. Then: every
example config, unit, Mosquitto, Prometheus and Grafana file is under ``<venv>/share/fiomon``;
what the units name (``ExecStart=``, ``Documentation=``) exists once ``/opt/fiomon`` is read
as that venv; the example configs pass ``fiomon check-config``; and ``fiomon demo`` runs
without the test extra.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fiomon import __version__
from tests.conftest import DEADLINE_S

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("config", "deploy", "agents", "docs")
# Building and installing with dependencies from the package index takes a while.
INSTALL_TIMEOUT_S = 600


def _run(*cmd: str | Path, timeout: float = DEADLINE_S) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}:\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, ROOT,
         timeout=INSTALL_TIMEOUT_S)  # fmt: skip
    (built,) = out.glob("fiomon-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (as /opt/fiomon) with the wheel and its runtime dependencies only."""
    prefix = tmp_path_factory.mktemp("opt") / "fiomon"
    _run(sys.executable, "-m", "venv", prefix)
    _run(prefix / "bin/python", "-m", "pip", "install", "-q", wheel, timeout=INSTALL_TIMEOUT_S)
    return prefix


def _repo_files(folder: str) -> set[str]:
    return {
        str(p.relative_to(ROOT))
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_the_wheel_carries_every_shipped_file(wheel: Path) -> None:
    data = f"fiomon-{__version__}.data/data/share/fiomon/"
    with zipfile.ZipFile(wheel) as z:
        names = {n[len(data) :] for n in z.namelist() if n.startswith(data)}
    expected = set().union(*(_repo_files(f) for f in SHIPPED)) | {"README.md"}
    assert expected <= names, sorted(expected - names)
    for needed in (
        "config/aggregator.example.yaml",
        "deploy/systemd/fiomon-aggregator.service",
        "deploy/mosquitto/fiomon.conf",
        "deploy/prometheus/fiomon.rules.yml",
        "deploy/grafana/fiomon-dashboard.json",
    ):
        assert needed in names


def test_units_point_where_the_wheel_lands(venv: Path) -> None:
    share = venv / "share/fiomon"
    units = sorted((share / "deploy/systemd").glob("*.service"))
    assert [u.name for u in units] == ["fiomon-agent.service", "fiomon-aggregator.service"]
    for unit in units:
        text = unit.read_text()
        named = re.findall(r"(?m)^ExecStart=(\S+)", text) + re.findall(
            r"(?m)^Documentation=file://(\S+)", text
        )
        assert len(named) == 2, text
        for path in named:
            assert path.startswith("/opt/fiomon/"), path
            assert (venv / path.removeprefix("/opt/fiomon/")).is_file(), f"{unit.name}: {path}"


def test_installed_fiomon_runs_its_examples_and_the_demo_without_test_tools(venv: Path) -> None:
    fiomon = venv / "bin/fiomon"
    assert _run(fiomon, "--version").stdout == f"fiomon {__version__}\n"
    for example in ("agent", "aggregator"):
        conf = venv / f"share/fiomon/config/{example}.example.yaml"
        assert f"valid {example} configuration" in _run(fiomon, "check-config", conf).stdout
    absent = subprocess.run(
        [venv / "bin/python", "-c", "import pytest"], capture_output=True, check=False
    )
    assert absent.returncode != 0, "the wheel's runtime dependencies pulled in pytest"
    demo = _run(fiomon, "demo", "--duration", "5", "--hosts", "2", "--jobs", "1")
    assert "quanta closed" in demo.stderr


def test_the_wheel_carries_the_chart_page_and_its_library(wheel: Path) -> None:
    # fiomon plot and the live page inline these at run time (importlib.resources).
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    web = {
        f"fiomon/web/{p.relative_to(ROOT / 'fiomon/web')}"
        for p in (ROOT / "fiomon/web").rglob("*")
        if p.is_file()
    }
    assert "fiomon/web/vendor/echarts.min.js" in web
    assert "fiomon/web/vendor/LICENSE-echarts" in web
    assert web <= names, sorted(web - names)
