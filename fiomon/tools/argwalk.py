"""The command line as data, read off its argparse parser (for the man page and completion).

One walk of :func:`fiomon.cli.build_parser`'s parser gives each subcommand's flags, their
values (fixed choices, files, or free text) and its positional arguments, so the man page
and the completion scripts can never disagree with ``--help``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

FILE_METAVARS = {"FILE", "DIR", "LOG", "JOB", "PATH", "BASELINE", "CANDIDATE"}


@dataclass(frozen=True, slots=True)
class Option:
    """One flag or positional argument.

    Args:
        flags: its option strings (``("-o", "--output")``); empty for a positional.
        metavar: the name of its value (``FILE``), or "" for a switch.
        help: the help text, or "" when argparse hides it.
        choices: the values it accepts, when it has a fixed set.
        files: its value names a file or folder (a ``Path`` type or a file-like metavar).
        repeats: a positional that takes more than one value.
    """

    flags: tuple[str, ...]
    metavar: str
    help: str
    choices: tuple[str, ...] = ()
    files: bool = False
    repeats: bool = False


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: its name, one-line help, description, epilog, usage and options."""

    name: str
    summary: str
    description: str
    epilog: str
    usage: str
    options: tuple[Option, ...]

    @property
    def flags(self) -> list[str]:
        """Every option string, ``-h`` and ``--help`` included."""
        return [f for o in self.options for f in o.flags]

    @property
    def positionals(self) -> list[Option]:
        """The positional arguments, in order."""
        return [o for o in self.options if not o.flags]


def _option(action: argparse.Action, prog: str) -> Option | None:
    if action.help == argparse.SUPPRESS:
        return None
    text = action.help or ""
    if "%(" in text:  # argparse's own expansion, as --help does it
        text %= {**vars(action), "prog": prog}
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    if not metavar and action.nargs != 0 and not isinstance(action, argparse._VersionAction):
        metavar = action.dest.upper()
    choices = tuple(str(c) for c in action.choices) if action.choices else ()
    if choices and not action.metavar:
        metavar = "{" + ",".join(choices) + "}"
    names = set(metavar.replace("[", " ").replace("]", " ").replace(".", " ").split())
    files = action.type is Path or bool(names & FILE_METAVARS)
    return Option(
        flags=tuple(action.option_strings),
        metavar=metavar if action.nargs != 0 else "",
        help=" ".join(text.split()),
        choices=choices,
        files=files and not choices,
        repeats=action.nargs in ("+", "*", argparse.REMAINDER),
    )


def _usage(p: argparse.ArgumentParser) -> str:
    """``p``'s usage without ``usage:``, wrapped lines indented by four spaces."""
    first, *rest = p.format_usage().removeprefix("usage: ").strip().splitlines()
    return "\n".join([first, *("    " + x.strip() for x in rest)])


def commands(parser: argparse.ArgumentParser) -> list[Command]:
    """The subcommands of ``parser`` (``fiomon``'s), in the order of ``fiomon --help``."""
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {a.dest: a.help or "" for a in sub._choices_actions}
    out = []
    for name, p in sub.choices.items():
        options = tuple(o for a in p._actions if (o := _option(a, p.prog)) is not None)
        out.append(
            Command(
                name=name,
                summary=summaries.get(name, ""),
                description=p.description or "",
                epilog=p.epilog or "",
                usage=_usage(p),
                options=options,
            )
        )
    return out


def top_options(parser: argparse.ArgumentParser) -> list[Option]:
    """The options of ``fiomon`` itself (``--help``, ``--version``)."""
    return [
        o
        for a in parser._actions
        if not isinstance(a, argparse._SubParsersAction) and (o := _option(a, parser.prog))
    ]
