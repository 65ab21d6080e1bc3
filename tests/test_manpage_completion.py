"""``fiomon man`` and ``fiomon completion``: generated from the parser, used by real tools.

The bash script is sourced in a real bash and asked what ``fiomon rep<TAB>`` and friends
complete to (``COMP_WORDS``/``COMP_CWORD`` as readline sets them); the zsh script is
loaded by a real zsh's ``compinit``; the man page is rendered by ``groff`` (no warnings)
and ``man -l``, and says every flag ``--help`` says.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fiomon.cli import build_parser
from fiomon.tools.argwalk import commands


def fiomon(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "fiomon", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "fiomon.bash"
    path.write_text(fiomon("completion", "bash"))
    return path


def complete(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """What bash offers for ``line`` (the word under the cursor is its last, maybe empty)."""
    words = line.split(" ")
    program = (
        f"source {shlex.quote(str(script))}\n"
        f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n"
        f"COMP_LINE={shlex.quote(line)}\nCOMP_POINT=${{#COMP_LINE}}\n"
        '_fiomon fiomon "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    r = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )
    assert r.returncode == 0, r.stderr
    assert not r.stderr, r.stderr
    return sorted(x for x in r.stdout.splitlines() if x)


def test_bash_completes_subcommands_flags_values_and_files(
    bash_script: Path, tmp_path: Path
) -> None:
    assert complete(bash_script, "fiomon rep") == ["report"]
    assert complete(bash_script, "fiomon c") == ["check-config", "compare", "completion"]
    assert complete(bash_script, "fiomon report --for") == ["--format"]
    assert complete(bash_script, "fiomon report --format ") == sorted(
        ["table", "csv", "jsonl", "fiologparser"]
    )
    assert complete(bash_script, "fiomon report --format j") == ["jsonl"]
    assert complete(bash_script, "fiomon completion ") == ["bash", "zsh"]
    assert "--final" in complete(bash_script, "fiomon aggregator --")
    assert complete(bash_script, "fiomon agent --log-level w") == ["warning"]
    (tmp_path / "agent.yaml").write_text("watch: []\n")
    (tmp_path / "aggregator.yaml").write_text("{}\n")
    assert complete(bash_script, "fiomon check-config ag", cwd=tmp_path) == [
        "agent.yaml",
        "aggregator.yaml",
    ]
    assert complete(bash_script, "fiomon agent --config agg", cwd=tmp_path) == ["aggregator.yaml"]
    # compare's runs are files, folders or globs; -o a file; --format its own three.
    (tmp_path / "run-before").mkdir()
    assert complete(bash_script, "fiomon compare run-", cwd=tmp_path) == ["run-before"]
    assert complete(bash_script, "fiomon compare -o ag", cwd=tmp_path) == [
        "agent.yaml",
        "aggregator.yaml",
    ]
    assert complete(bash_script, "fiomon compare --format ") == ["csv", "jsonl", "table"]


def test_bash_offers_every_flag_of_every_subcommand(bash_script: Path) -> None:
    for command in commands(build_parser()):
        offered = complete(bash_script, f"fiomon {command.name} -")
        assert offered == sorted(command.flags), command.name


def test_zsh_loads_the_completion_function(tmp_path: Path) -> None:
    (tmp_path / "_fiomon").write_text(fiomon("completion", "zsh"))
    r = subprocess.run(
        ["zsh", "-n", str(tmp_path / "_fiomon")], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    program = (
        f"fpath=({shlex.quote(str(tmp_path))} $fpath)\n"
        f"autoload -Uz compinit && compinit -u -d {shlex.quote(str(tmp_path / 'zcompdump'))}\n"
        "print -r -- $_comps[fiomon]\n"
        "autoload -Uz +X _fiomon && whence -w _fiomon\n"
    )
    r = subprocess.run(
        ["zsh", "-f", "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["_fiomon", "_fiomon:", "function"], r.stdout + r.stderr


def test_the_man_page_renders_and_says_every_flag(tmp_path: Path) -> None:
    page = tmp_path / "fiomon.1"
    page.write_text(fiomon("man"))
    # groff: -ww warns of every roff problem, -rHY=0 keeps flags unhyphenated.
    r = subprocess.run(
        ["groff", "-man", "-Tutf8", "-P-cbou", "-ww", "-rHY=0", "-rLL=200n", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert not r.stderr, r.stderr
    text = r.stdout
    for command in commands(build_parser()):
        assert f"fiomon {command.name}\n" in text, command.name
        for flag in command.flags:
            assert flag in text, (command.name, flag)
    assert "example: fiomon fio --output-dir /var/lib/fio/results -- job.fio" in text
    r = subprocess.run(
        ["man", "-l", str(page)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "MANPAGER": "cat", "MANWIDTH": "100"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("FIOMON(1)")
    assert "SYNOPSIS" in r.stdout and "check-config" in r.stdout
