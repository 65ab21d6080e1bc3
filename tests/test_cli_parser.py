"""The parser itself, in process: every flag explained, the input flags the same wherever
they apply, durations and bounds checked as argparse reads them, and every ``fiomon``
command the documentation shows still parses."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest

from fiomon.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "deploy/README.md", ROOT / "agents/README.md"]
OFFLINE = ("report", "plot", "compare", "summary", "fit")
INPUT_FLAGS = (
    "--source",
    "--directions",
    "--host-from",
    "--log-hist-msec",
    "--job-file",
    "--group-nr",
    "--usbin",
    "--strict",
)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _flags(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in p._actions for s in a.option_strings}


def test_every_subcommand_is_in_the_table_and_every_flag_is_explained() -> None:
    subs = _subparsers()
    assert list(subs) == list(COMMANDS)
    for name, p in subs.items():
        for action in p._actions:
            assert action.help, f"fiomon {name} {action.option_strings or action.dest}: no help"


def test_the_input_flags_are_the_same_wherever_fio_output_is_read() -> None:
    subs = _subparsers()
    for flag in INPUT_FLAGS:
        helps = {name: _flags(subs[name])[flag].help for name in OFFLINE}
        assert len(set(helps.values())) == 1, (flag, helps)


@pytest.mark.parametrize("name", ["summary", "fit", "report", "plot"])
def test_direction_is_a_hidden_alias_of_directions(name: str) -> None:
    extra = ["-o", "x.html"] if name == "plot" else []
    parser = build_parser()
    old = parser.parse_args([name, "--direction", "read,all", "x.log", *extra])
    new = parser.parse_args([name, "--directions", "read,all", "x.log", *extra])
    assert old.directions == new.directions == ("read", "all")
    alias = _flags(_subparsers()[name])["--direction"]
    assert alias.help == argparse.SUPPRESS


def test_durations_take_units_everywhere() -> None:
    parser = build_parser()
    report = parser.parse_args(["report", "--quantum", "250ms", "--max-span", "2m", "x.log"])
    assert (report.quantum, report.max_span) == (250, 120_000)
    # Not given: 1s for fio output, a quanta file's own quantum for one (the handler decides).
    assert parser.parse_args(["report", "x.log"]).quantum is None
    assert parser.parse_args(["fit", "--per-quantum", "--", "x.log"]).per_quantum == 1000
    assert parser.parse_args(["fit", "--per-quantum", "10s", "x.log"]).per_quantum == 10_000
    assert parser.parse_args(["fit", "x.log"]).per_quantum is None
    assert parser.parse_args(["fio", "--quantum", "0", "--", "j.fio"]).quantum == 0
    assert parser.parse_args(["demo", "--duration", "14"]).duration == 14_000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "--quantum", "soon", "x.log"], "--quantum: 'soon' is not a duration"),
        (["report", "--quantum", "0", "x.log"], "--quantum: must be at least 1ms"),
        (["fit", "--per-quantum", "0s", "x.log"], "--per-quantum: must be at least 1ms"),
        (["demo", "--duration", "2"], "--duration: must be at least 3s"),
        (["demo", "--hosts", "0"], "--hosts: expected an integer at least 1"),
        (["summary", "--group-nr", "7", "x.log"], "--group-nr: expected an integer in 19..58"),
        (["report", "--log-hist-msec", "0", "x.log"], "--log-hist-msec: expected an integer"),
        (["plot", "--max-points", "5", "-o", "x.html", "x.log"], "--max-points: expected"),
        (["report", "--confidence-level", "1", "x.log"], "--confidence-level: expected a level"),
        (["report", "--target-error", "0", "x.log"], "--target-error: expected a relative"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def _documented_commands() -> list[tuple[str, list[str]]]:
    """``fiomon`` command lines in the docs' code blocks and the parser's own epilogs."""
    texts = [(str(p.relative_to(ROOT)), p.read_text()) for p in DOCS]
    texts += [(f"fiomon {n} --help", p.epilog or "") for n, p in _subparsers().items()]
    found = []
    for where, text in texts:
        blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.DOTALL) if "```" in text else [text]
        for block in blocks:
            for line in block.splitlines():
                m = re.match(r"^\s*(?:\$ |example: )?(?:\S*/)?fiomon (\S.*)$", line)
                if m is None or "-->" in line or "<--" in line:
                    continue
                command = m.group(1).split(" # ")[0].split(" > ")[0].strip()
                if "[" in command or "..." in command:
                    continue  # a synopsis, not a command
                found.append((where, shlex.split(command)))
    return found


def test_the_documented_commands_parse() -> None:
    commands = _documented_commands()
    assert {argv[0] for _, argv in commands} >= {"report", "plot", "agent", "check-config", "fio"}
    parser = build_parser()
    for where, argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit as exc:  # pragma: no cover - the message says which
            pytest.fail(f"{where}: fiomon {shlex.join(argv)} does not parse ({exc})")


def test_every_flag_the_docs_name_exists() -> None:
    # Inline mentions such as `fiomon summary --host` or `fiomon report --format jsonl`.
    subs = _subparsers()
    seen = 0
    for doc in DOCS:
        for span in re.findall(r"`fiomon ([a-z-]+)((?: [^`]*)?)`", doc.read_text()):
            name, rest = span
            if name not in subs:
                continue
            known = _flags(subs[name])
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
                seen += 1
                assert flag in known, f"{doc.name}: `fiomon {name}{rest}`: no {flag}"
    assert seen > 5


HIST = ROOT / "tests/fixtures/fio333_randrw_clat_hist.1.log"


@pytest.mark.parametrize("name", ["summary", "fit"])
def test_summary_and_fit_read_with_the_input_flags_of_report(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad_clat_hist.1.log"
    bad.write_bytes(HIST.read_bytes().replace(b", 0, 0,", b", x, 0,", 1))
    job = tmp_path / "job.fio"
    job.write_text("[global]\nwrite_hist_log=h\nlog_hist_msec=1000 ; as fio wrote it\n")
    json_args = ["--format", "json", "--directions", "read"]
    assert main([name, *json_args, "--job-file", str(job), str(bad)]) == 0
    skipped = capsys.readouterr()
    assert f"{bad}:1" in skipped.err  # counted and skipped
    assert main([name, *json_args, "--strict", str(bad)]) == 1
    assert f"{bad}:1" in capsys.readouterr().err
    # µs bins: every latency a thousand times the ns reading of the same file.
    means = []
    for unit in ([], ["--usbin"]):
        assert main([name, *json_args, *unit, str(HIST)]) == 0
        out = capsys.readouterr().out
        if name == "summary":
            means.append(json.loads(out)[0]["mean_ns"])
        else:
            means.append(json.loads(out.splitlines()[0])["head"]["mean_ns"])
    assert means[1] / means[0] == pytest.approx(1000, rel=0.01)
