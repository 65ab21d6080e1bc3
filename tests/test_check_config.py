"""``fiomon check-config`` lists every problem of a file in one pass: keys and files.

Bad files are made so that root (the tests may run as root) cannot read them either: a
missing file, a directory in place of a file, bytes that are not UTF-8, text that is
not PEM.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fiomon.config import AgentConfig, load_agent_config, private_tmp, watch_warnings
from fiomon.errors import ConfigError
from tests.conftest import DEADLINE_S, free_port


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fiomon", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_agent_schema_and_file_problems_come_in_one_pass(tmp_path: Path) -> None:
    folder = tmp_path / "a-directory"
    folder.mkdir()
    not_pem = tmp_path / "client.pem"
    not_pem.write_text("not a certificate\n")
    state_file = tmp_path / "state"
    state_file.write_text("a file, not a directory\n")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"watch: ['{tmp_path}/results/*.json']\n"
        f"state_dir: {state_file}\n"
        "flush_interval: soon\n"  # a schema problem
        "colour: blue\n"  # an unknown key
        "broker:\n"
        "  port: 99999\n"  # a schema problem in the same section as the files
        f"  password_file: {tmp_path}/no-such-password\n"
        "  tls:\n"
        f"    ca_file: {folder}\n"
        f"    cert_file: {not_pem}\n"
        f"    key_file: {not_pem}\n"
    )
    r = check_config(cfg)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if not x.startswith(f"{cfg}: warning")]
    wanted = [
        f"{cfg}: flush_interval: ",
        f"{cfg}: colour: unknown key",
        f"{cfg}: broker.port: ",
        f"{cfg}: broker.password_file: cannot read {tmp_path}/no-such-password (No such file",
        f"{cfg}: broker.tls.ca_file: cannot read {folder} (Is a directory)",
        f"{cfg}: broker.tls.cert_file/key_file: {not_pem} and {not_pem} are not a certificate",
        f"{cfg}: state_dir: {state_file} exists and is not a directory",
    ]
    for start in wanted:
        assert any(x.startswith(start) for x in lines), f"{start!r} not in:\n{r.stderr}"
    assert lines[-1] == f"{cfg}: {len(wanted)} problem(s)", r.stderr
    assert "Traceback" not in r.stderr
    # The agent refuses to start with the same list, not the schema half of it.
    with pytest.raises(ConfigError) as caught:
        load_agent_config(cfg)
    assert len(caught.value.problems) == len(wanted), caught.value.problems


def test_aggregator_schema_and_file_problems_come_in_one_pass(tmp_path: Path) -> None:
    latin1 = tmp_path / "password"
    latin1.write_bytes(b"p\xe4ssw\xf6rd\n")  # Latin-1, not UTF-8: the broker login would die
    cfg = tmp_path / "aggregator.yaml"
    cfg.write_text(
        "quantum: 1 fortnight\n"
        "sla:\n"
        "  - {name: r, direction: sideways, percentile: 99, threshold: 5ms}\n"
        f"broker: {{password_file: {latin1}}}\n"
        f"tls_cert: {tmp_path}/missing-cert.pem\n"
        f"tls_key: {tmp_path}\n"
        "cell: east\n"
        "state_dir: " + str(tmp_path / "state") + "\n"
        "align: epoch\n"
        f"partials: {{broker: {{tls: {{ca_file: {tmp_path}/no-ca.pem}}}}}}\n"
    )
    r = check_config(cfg)
    assert r.returncode == 2, r.stdout + r.stderr
    wanted = [
        f"{cfg}: quantum: ",
        f"{cfg}: sla[0].direction: ",
        f"{cfg}: broker.password_file: {latin1} is not UTF-8 text",
        f"{cfg}: partials.broker.tls.ca_file: cannot read {tmp_path}/no-ca.pem",
        f"{cfg}: tls_cert: cannot read {tmp_path}/missing-cert.pem",
        f"{cfg}: tls_key: cannot read {tmp_path} (Is a directory)",
    ]
    lines = r.stderr.splitlines()
    for start in wanted:
        assert any(x.startswith(start) for x in lines), f"{start!r} not in:\n{r.stderr}"
    assert lines[-1] == f"{cfg}: {len(wanted)} problem(s)", r.stderr


def test_a_valid_file_with_good_files_still_passes(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("sécret\n")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"watch: ['{tmp_path}/*.json']\nstate_dir: {tmp_path}/state\n"
        f"broker: {{password_file: {password}}}\n"
    )
    r = check_config(cfg)
    assert r.returncode == 0, r.stderr
    assert "valid agent configuration" in r.stdout


def test_check_config_warns_that_the_unit_hides_tmp(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("watch: ['/tmp/fio/*.json', '/var/lib/fio/*.json']\nstate_dir: /var/lib/x\n")
    r = check_config(cfg)
    assert r.returncode == 0, r.stderr
    warned = [x for x in r.stderr.splitlines() if "PrivateTmp" in x]
    assert len(warned) == 1, r.stderr
    assert warned[0].startswith(f"{cfg}: warning: watch[0]: '/tmp/fio/*.json' is under /tmp")


PRIVATE_TMP = (
    "import sys\n"
    "from pathlib import Path\n"
    "from fiomon.config import AgentConfig, private_tmp, watch_warnings\n"
    "cfg = AgentConfig(watch=('/tmp/fio/*.json',), state_dir=Path(sys.argv[1]))\n"
    "print(private_tmp())\n"
    "print(*watch_warnings(cfg), sep='\\n')\n"
)


def _private_target() -> str:
    """Which of systemd's two private folders to mount over: /var/tmp, unless this test's
    Python or checkout lives there (a CI checkout under /tmp would vanish under a /tmp
    mount). systemd's PrivateTmp=yes replaces both; the agent looks at both."""
    used = (sys.prefix, sys.executable, str(Path(__file__).resolve()))
    if any(p.startswith("/var/tmp/") for p in used):  # noqa: S108
        return "/tmp"  # noqa: S108 -- the namespace's own private folder
    return "/var/tmp"  # noqa: S108 -- the namespace's own private folder


def test_the_agent_names_a_private_tmp_as_systemd_makes_it(tmp_path: Path) -> None:
    """A real mount namespace with /tmp bind-mounted from a systemd-private-* folder."""
    if os.geteuid() != 0:
        pytest.skip("a mount namespace needs root (CI runs as root)")
    private = tmp_path / "systemd-private-0123abcd-fiomon-agent.service-XyZ12" / "tmp"
    private.mkdir(parents=True)
    script = (
        f"mount --bind {private} {_private_target()} && "
        f'exec {sys.executable} -c "$0" {tmp_path}/state'  # $0: the Python program
    )
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, PRIVATE_TMP],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    first, *warnings = r.stdout.splitlines()
    assert first == "True"
    assert any("runs with a private /tmp (systemd PrivateTmp=yes)" in w for w in warnings), r.stdout
    # Outside such a namespace the agent says nothing of /tmp (tests and shells use it).
    assert not private_tmp()
    here = AgentConfig(watch=(str(tmp_path / "fio" / "*.json"),), state_dir=tmp_path / "s")
    assert not any("PrivateTmp" in w for w in watch_warnings(here))


def test_the_agent_warns_at_start_when_its_tmp_is_private(tmp_path: Path) -> None:
    """The real agent, started in a mount namespace whose /tmp is a systemd-private-* one.

    No broker listens (the agent keeps retrying): the warning comes at start, before it.
    """
    if os.geteuid() != 0:
        pytest.skip("a mount namespace needs root (CI runs as root)")
    private = tmp_path / "systemd-private-0123abcd-fiomon-agent.service-XyZ12" / "tmp"
    private.mkdir(parents=True)
    # Seen from inside the namespace, `private` is `target`.
    target = _private_target()
    (private / "agent.yaml").write_text(
        f"watch: ['/tmp/fio/*.json']\nstate_dir: {target}/state\n"
        f"broker: {{host: 127.0.0.1, port: {free_port()}}}\n"
    )
    script = f'mount --bind {private} {target} && exec "$@"'
    proc = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            sys.executable,
            "-m",
            "fiomon",
            "agent",
            "--config",
            f"{target}/agent.yaml",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            if "PrivateTmp" in line:
                break
    finally:
        proc.terminate()
        proc.communicate(timeout=DEADLINE_S)
    warned = [x for x in seen if "PrivateTmp" in x]
    assert warned, "".join(seen)
    assert "watch[0]: '/tmp/fio/*.json' is under /tmp or /var/tmp" in warned[0]
    assert "runs with a private /tmp (systemd PrivateTmp=yes)" in warned[0]


def test_a_key_given_twice_does_not_hide_the_other_problems(tmp_path: Path) -> None:
    # A duplicate key stopped check-config before the schema and files were looked at.
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"watch: ['{tmp_path}/*.json']\n"
        f"state_dir: {tmp_path}\n"
        "flush_interval: soon\n"
        f"broker: {{password_file: {tmp_path}/no-such-password}}\n"
        "host: a\n"
        "host: b\n"
    )
    r = check_config(cfg)
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert f"{cfg}: line 6: key 'host' given twice" in lines
    assert any(x.startswith(f"{cfg}: flush_interval:") for x in lines), r.stderr
    assert any(x.startswith(f"{cfg}: broker.password_file: cannot read") for x in lines), r.stderr
    assert lines[-1] == f"{cfg}: 3 problem(s)"
    with pytest.raises(ConfigError, match="line 6: key 'host' given twice"):
        load_agent_config(cfg)  # the services still refuse it


def test_recursive_and_wildcard_patterns_warn_of_a_missing_root_and_of_slash(
    tmp_path: Path,
) -> None:
    # `**` patterns (and any wildcard folder) were never checked: a typo in the results
    # folder of `/srv/bench/resluts/**/*.json` passed silently, as did `/**/*.json`.
    (tmp_path / "results").mkdir()
    cfg = AgentConfig(
        watch=(
            f"{tmp_path}/resluts/**/*.json",
            f"{tmp_path}/missing/*/x.json",
            f"{tmp_path}/results/**/*.json",
            "/**/*.json",
        ),
        state_dir=tmp_path,
    )
    got = [w for w in watch_warnings(cfg) if "PrivateTmp" not in w]
    assert got == [
        f"watch[0]: folder {tmp_path}/resluts does not exist (yet): "
        f"'{tmp_path}/resluts/**/*.json' matches nothing",
        f"watch[1]: folder {tmp_path}/missing does not exist (yet): "
        f"'{tmp_path}/missing/*/x.json' matches nothing",
        "watch[3]: '/**/*.json' scans every folder under / (the first 100 000 a scan): "
        "point ** at the results folder (agents/README.md, section 2)",
    ], got


def test_check_config_takes_the_latency_kind_and_warns_of_hist_logs_it_would_refuse(
    tmp_path: Path,
) -> None:
    # Issue 27: `latency: lat` publishes fio's total latency; hist logs hold clat only.
    cfg = tmp_path / "agent.yaml"
    base = f"state_dir: {tmp_path}/state\n"
    watch = f"watch: ['{tmp_path}/*.json', '{tmp_path}/*_clat_hist.*.log']\n"
    cfg.write_text(watch + base + "latency: lat\n")
    r = check_config(cfg)
    assert r.returncode == 0, r.stderr
    assert load_agent_config(cfg).latency == "lat"
    said = [ln for ln in (r.stdout + r.stderr).splitlines() if "hold clat only" in ln]
    assert len(said) == 1 and "watch[1]" in said[0] and "lat_percentiles=1" in said[0], said
    cfg.write_text(watch + base)  # the default, clat: hist logs are fine
    assert load_agent_config(cfg).latency == "clat"
    assert "hold clat only" not in check_config(cfg).stdout
    cfg.write_text(watch + base + "latency: total\n")
    r = check_config(cfg)
    assert r.returncode != 0
    assert "latency: expected one of clat, lat, slat, got 'total'" in r.stdout + r.stderr
