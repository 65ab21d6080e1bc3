"""The release as a user installs it: scripts/release, a fresh venv, the files where units point.

scripts/release builds the sdist and, from it, the wheel (``python -m build``, hatchling
in an isolated build environment), writes fiomon/REVISION into both and checks them
(``twine check --strict``, METADATA against pyproject.toml). The wheel alone is installed
with its runtime dependencies into a new virtual environment, the way deploy/README.md
installs fiomon into ``/opt/fiomon``, and run from a folder outside the checkout with no
PYTHONPATH. Then: every example config, unit, Mosquitto, Prometheus and Grafana file is
under ``<venv>/share/fiomon`` and ``fiomon paths`` finds them there; what the units name
(``ExecStart=``, ``Documentation=``) exists once ``/opt/fiomon`` is read as that venv; the
example configs pass ``fiomon check-config``; and ``fiomon demo`` runs without the test
extra.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from fiomon import __version__
from tests.release import ROOT, Release, clean_env, run

SHIPPED = ("config", "deploy", "agents", "docs")


@pytest.fixture(scope="module")
def wheel(release: Release) -> Path:
    return release.wheel


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (as /opt/fiomon) with the wheel and its runtime dependencies only."""
    prefix = tmp_path_factory.mktemp("opt") / "fiomon"
    started = time.monotonic()
    run(sys.executable, "-m", "venv", prefix)
    run(prefix / "bin/python", "-m", "pip", "install", "-q", wheel)
    print(f"fresh venv with the wheel: {time.monotonic() - started:.1f} s")
    return prefix


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working folder away from the checkout (so no ``fiomon/`` beside the cwd)."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return cwd


def _run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run(*cmd, cwd=cwd)


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


def test_release_builds_checked_sdist_and_wheel_carrying_the_revision(release: Release) -> None:
    assert release.sdist.is_file() and release.wheel.is_file(), release.output
    assert re.search(r"Checking \S+\.whl: .*PASSED", release.output), release.output
    assert re.search(r"Checking \S+\.tar\.gz: .*PASSED", release.output), release.output
    assert f"checked {release.sdist} and {release.wheel}" in release.output
    with zipfile.ZipFile(release.wheel) as z:
        assert z.read("fiomon/REVISION").decode() == release.revision + "\n"
        meta = z.read(f"fiomon-{__version__}.dist-info/METADATA").decode()
    assert f"Name: fiomon\nVersion: {__version__}\n" in meta
    assert "Description-Content-Type: text/markdown" in meta
    with tarfile.open(release.sdist) as t:
        rev = t.extractfile(f"fiomon-{__version__}/fiomon/REVISION")
        assert rev is not None and rev.read().decode() == release.revision + "\n"
        # the sdist alone builds the wheel (scripts/release builds it from the sdist)
        assert f"fiomon-{__version__}/pyproject.toml" in t.getnames()
    # REVISION goes into the artifacts only: the checkout is left as it was
    assert not (ROOT / "fiomon/REVISION").exists()


def test_installed_fiomon_runs_its_examples_and_the_demo_without_test_tools(
    venv: Path, outside: Path
) -> None:
    fiomon = venv / "bin/fiomon"
    assert _run(fiomon, "--version", cwd=outside).stdout == f"fiomon {__version__}\n"
    where = _run(venv / "bin/python", "-c", "import fiomon; print(fiomon.__file__)", cwd=outside)
    assert where.stdout.startswith(str(venv)), "fiomon imported from outside the venv"
    share = venv / "share/fiomon"
    assert _run(fiomon, "paths", "share", cwd=outside).stdout == f"{share}\n"
    assert _run(fiomon, "paths", "systemd", cwd=outside).stdout == f"{share}/deploy/systemd\n"
    assert sorted(p.name for p in (share / "deploy/systemd").glob("*.service")) == [
        "fiomon-agent.service",
        "fiomon-aggregator.service",
    ]
    for example in ("agent", "aggregator"):
        conf = venv / f"share/fiomon/config/{example}.example.yaml"
        checked = _run(fiomon, "check-config", conf, cwd=outside)
        assert f"valid {example} configuration" in checked.stdout
    absent = subprocess.run(
        [venv / "bin/python", "-c", "import pytest"],
        capture_output=True,
        check=False,
        cwd=outside,
        env=clean_env(),
    )
    assert absent.returncode != 0, "the wheel's runtime dependencies pulled in pytest"
    demo = _run(fiomon, "demo", "--duration", "5", "--hosts", "2", "--jobs", "1", cwd=outside)
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
