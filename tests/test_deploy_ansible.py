"""deploy/ansible on this machine: the fleet path, from the release wheel to enabled units.

``ansible-playbook --connection local`` runs deploy/ansible/fiomon.yml with this host in both
groups (``agents`` and ``aggregator``), the way deploy/README.md runs it for a fleet, except
that the venv, the config folder and the systemd root are temporary folders (so the test
leaves /opt, /etc and the running system alone; it does create the ``fiomon`` system user).
What it proves: the wheel from scripts/release goes into a fresh venv, its dependencies
from the release's wheelhouse (no package index); both configurations
are written from variables and pass ``fiomon check-config``; the units come from the
wheel's share/fiomon, point at that venv and config folder, pass ``systemd-analyze verify``,
and are enabled offline (the wants symlinks), never started, since the systemd root is not
/ (and on a machine whose PID 1 is not systemd, never would be); a second run changes
nothing; a rebuilt wheel of the same version is installed over the old one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from fiomon import __version__
from tests.release import ROOT, Release, clean_env, run

PLAYBOOK = ROOT / "deploy/ansible/fiomon.yml"
PLAYBOOK_TIMEOUT_S = 600
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.fixture(scope="module")
def ansible_playbook() -> str:
    path = shutil.which("ansible-playbook")
    if path is None:
        pytest.fail("ansible-playbook is missing: run .ci/run or apt-get install ansible-core")
    return path


def _playbook(ansible: str, tmp: Path, extra_vars: dict[str, Any]) -> dict[str, Any]:
    """One run, with the json callback; returns its report (asserting it succeeded)."""
    inventory = tmp / "inventory.yml"
    inventory.write_text(
        "all:\n  children:\n"
        "    agents: {hosts: {localhost: }}\n"
        "    aggregator: {hosts: {localhost: }}\n"
    )
    variables = tmp / "vars.json"
    variables.write_text(json.dumps(extra_vars))
    home = tmp / "ansible-home"
    env = clean_env(
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_HOME=str(home),
        ANSIBLE_LOCAL_TEMP=str(home / "tmp"),
        ANSIBLE_REMOTE_TEMP=str(home / "tmp"),
        ANSIBLE_PYTHON_INTERPRETER="/usr/bin/python3",
        ANSIBLE_PIPELINING="1",  # no module files copied per task: about twice as fast
    )
    r = subprocess.run(
        [ansible, "--connection", "local", "-i", str(inventory), "-e", f"@{variables}",
         str(PLAYBOOK)],
        capture_output=True, text=True, timeout=PLAYBOOK_TIMEOUT_S, check=False, env=env,
        cwd=tmp,
    )  # fmt: skip
    assert r.returncode == 0, f"ansible-playbook failed:\n{r.stdout[-20000:]}\n{r.stderr}"
    report: dict[str, Any] = json.loads(r.stdout)
    return report


def _stats(report: dict[str, Any]) -> dict[str, int]:
    stats: dict[str, int] = report["stats"]["localhost"]
    return stats


def _task(report: dict[str, Any], name: str, *, role: bool = True) -> dict[str, Any]:
    full = f"fiomon : {name}" if role else name  # the role's tasks carry its name first
    for play in report["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == full:
                result: dict[str, Any] = task["hosts"]["localhost"]
                return result
    pytest.fail(f"no task {name!r} in the run")


def _rebuilt(wheel: Path, out: Path, revision: str) -> Path:
    """The same wheel with another fiomon/REVISION (and a RECORD that says so)."""
    data = f"{revision}\n".encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record_name = f"fiomon-{__version__}.dist-info/RECORD"
    out.mkdir()
    rebuilt = out / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as z:
        for item in src.infolist():
            if item.filename == "fiomon/REVISION":
                z.writestr(item, data)
            elif item.filename == record_name:
                lines = [
                    f"fiomon/REVISION,sha256={digest},{len(data)}"
                    if line.startswith("fiomon/REVISION,")
                    else line
                    for line in src.read(item).decode().splitlines()
                ]
                z.writestr(item, "\n".join(lines) + "\n")
            else:
                z.writestr(item, src.read(item))
    return rebuilt


def test_playbook_installs_configures_and_enables_idempotently(
    ansible_playbook: str, release: Release, tmp_path: Path
) -> None:
    prefix, etc, root = tmp_path / "opt/fiomon", tmp_path / "etc/fiomon", tmp_path / "sysroot"
    extra_vars: dict[str, Any] = {
        "fiomon_wheel": str(release.wheel),
        # no package index: the dependencies come from scripts/release --wheelhouse, built
        # for the interpreter behind this venv, which therefore makes the new one
        "fiomon_wheelhouse": str(release.wheelhouse),
        "fiomon_python": str(BASE_PYTHON),
        "fiomon_prefix": str(prefix),
        "fiomon_etc": str(etc),
        "fiomon_systemd_root": str(root),
        "fiomon_broker": {"host": "mqtt.example.net", "port": 1883},
        "fiomon_mqtt_password": "not-a-secret",
        "fiomon_agent_watch": [f"{tmp_path}/results/*.json"],
        "fiomon_agent_settings": {"flush_interval": "2s"},
        "fiomon_sla": [
            {"name": "p99-read", "direction": "read", "percentile": 99, "threshold": "5ms"}
        ],
        "fiomon_agent_unit_override": "[Service]\nSupplementaryGroups=adm\n",
        "fiomon_bin_link": str(tmp_path / "usr/local/bin/fiomon"),
        "fiomon_man_dir": str(tmp_path / "usr/local/share/man/man1"),
        "fiomon_bash_completion_dir": str(tmp_path / "etc/bash_completion.d"),
    }
    started = time.monotonic()
    first = _playbook(ansible_playbook, tmp_path, extra_vars)
    first_s = time.monotonic() - started
    assert _stats(first)["failures"] == 0
    assert _stats(first)["changed"] > 0
    pip = _task(first, "Install the wheel and its dependencies into the venv")
    assert "--no-index" in pip["cmd"], pip["cmd"]

    # the wheel, in a venv of its own, reporting the revision it was built from
    fiomon = prefix / "bin/fiomon"
    assert run(fiomon, "--version", cwd=tmp_path).stdout == f"fiomon {__version__}\n"
    installed_rev = next((prefix / "lib").glob("python3*/site-packages/fiomon/REVISION"))
    assert installed_rev.read_text() == release.revision + "\n"

    # on PATH, with a man page and completion generated by the installed fiomon
    assert (tmp_path / "usr/local/bin/fiomon").resolve() == fiomon.resolve()
    man = (tmp_path / "usr/local/share/man/man1/fiomon.1").read_text()
    assert man.startswith(".TH FIOMON 1"), man[:200]
    completion = (tmp_path / "etc/bash_completion.d/fiomon").read_text()
    assert "complete" in completion and "check-config" in completion

    # both configurations from the variables, valid, the password where they say
    for service in ("agent", "aggregator"):
        conf = etc / f"{service}.yaml"
        checked = run(fiomon, "check-config", conf, cwd=tmp_path)
        assert f"valid {service} configuration" in checked.stdout
        assert "mqtt.example.net" in conf.read_text()
        assert f"password_file: {etc}/mqtt.pass" in conf.read_text()
        assert conf.stat().st_mode & 0o777 == 0o640
    assert (etc / "mqtt.pass").read_text() == "not-a-secret\n"
    assert (etc / "mqtt.pass").stat().st_mode & 0o777 == 0o640
    assert "flush_interval: 2s" in (etc / "agent.yaml").read_text()
    assert "username: aggregator" in (etc / "aggregator.yaml").read_text()
    assert "threshold: 5ms" in (etc / "aggregator.yaml").read_text()

    # the shipped units, pointed at this venv and config folder, verified and enabled
    units = root / "etc/systemd/system"
    for service in ("agent", "aggregator"):
        unit = units / f"fiomon-{service}.service"
        shipped = (prefix / f"share/fiomon/deploy/systemd/fiomon-{service}.service").read_text()
        assert unit.read_text() == shipped.replace("/opt/fiomon/", f"{prefix}/").replace(
            "/etc/fiomon/", f"{etc}/"
        )
        assert f"ExecStart={fiomon} {service} --config {etc}/{service}.yaml" in unit.read_text()
        v = subprocess.run(
            ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
        )
        assert v.returncode == 0 and not v.stderr.strip(), v.stderr
        wants = units / f"multi-user.target.wants/fiomon-{service}.service"
        assert wants.is_symlink(), f"fiomon-{service} not enabled"
        assert os.readlink(wants) == f"/etc/systemd/system/fiomon-{service}.service"
    dropin = units / "fiomon-agent.service.d/ansible.conf"
    assert dropin.read_text() == "[Service]\nSupplementaryGroups=adm\n"

    # enabled offline, never started: the live path is skipped for a systemd root that is
    # not / and on a machine whose PID 1 is not systemd
    pid1 = Path("/proc/1/comm").read_text().strip()
    # the role's test of "systemd runs this host" is ansible's service_mgr fact, from PID 1
    facts = _task(first, "Gathering Facts", role=False)["ansible_facts"]
    assert (facts["ansible_service_mgr"] == "systemd") == (pid1 == "systemd"), (pid1, facts)
    assert (
        "installed and enabled, not started" in _task(first, "Say why nothing was started")["msg"]
    )
    assert _task(first, "Enable and start the services (systemd runs this host)").get("skipped")
    offline = _task(first, "Enable the services offline (systemd does not run this host; nothing "
                    "is started)")  # fmt: skip
    assert offline.get("changed"), offline
    assert _task(first, "Restart fiomon services").get("skipped")
    print(f"PID 1 is {pid1}; first run {first_s:.1f} s")

    # the second run changes nothing
    started = time.monotonic()
    second = _playbook(ansible_playbook, tmp_path, extra_vars)
    print(f"second run {time.monotonic() - started:.1f} s: {_stats(second)}")
    assert _stats(second)["changed"] == 0, _stats(second)
    assert _stats(second)["failures"] == 0

    # a rebuilt wheel of the same version goes in over the old one
    rebuilt = _rebuilt(release.wheel, tmp_path / "rebuilt", "rebuilt-for-the-test")
    third = _playbook(ansible_playbook, tmp_path, {**extra_vars, "fiomon_wheel": str(rebuilt)})
    assert _task(third, "Reinstall fiomon when the wheel changed").get("changed")
    assert installed_rev.read_text() == "rebuilt-for-the-test\n"
