"""``fiomon man``: the fiomon(1) manual page in roff, generated from the parser.

Every subcommand with its usage, description, each option's help and its epilog, so the
page says exactly what ``--help`` says. Install it once per host::

    fiomon man > /usr/local/share/man/man1/fiomon.1 && mandb -q    # then: man fiomon
    fiomon man > fiomon.1 && man -l fiomon.1                      # or read it at once
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from fiomon import __version__
from fiomon.tools.argwalk import Command, Option, commands, top_options

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]

SEE_ALSO = r"""fio(1), mosquitto(8), prometheus(1).
The README, deploy/README.md and docs/ of the project (installed under
\fI<prefix>/share/fiomon/\fR with the wheel) hold the guides: deployment, metrics,
the wire format and when quanta close."""


def _esc(text: str) -> str:
    """``text`` safe as roff: backslashes and hyphens escaped, no line starting a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        "\\&" + line if line.startswith((".", "'")) else line for line in text.splitlines()
    )


def _paragraphs(text: str) -> list[str]:
    """Paragraphs of a help text; lines indented or in a list keep their breaks."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        if len(lines) > 1 and any(x.startswith((" ", "-", "*")) for x in lines[1:]):
            out.append(".nf\n" + _esc(block) + "\n.fi")
        else:
            out.append(_esc(" ".join(x.strip() for x in lines)))
    return out


def _option(o: Option) -> str:
    head = ", ".join(f"\\fB{_esc(f)}\\fR" for f in o.flags)
    if o.metavar:
        head += (" " if head else "") + f"\\fI{_esc(o.metavar)}\\fR"
        if o.repeats and not o.flags:
            head += " ..."
    return f".TP\n{head}\n{_esc(o.help) or '(no description)'}"


def _command(c: Command) -> str:
    parts = [
        f'.SS "fiomon {c.name}"',
        f"{_esc(c.summary)}.",
        ".PP",
        ".nf",
        _esc(c.usage),
        ".fi",
    ]
    for para in _paragraphs(c.description):
        parts += [".PP", para]
    parts += [_option(o) for o in c.options]
    for para in _paragraphs(c.epilog):
        parts += [".PP", para]
    return "\n".join(parts)


def man_page(parser: argparse.ArgumentParser) -> str:
    """The fiomon(1) page in roff (``man -l``, ``groff -man``)."""
    cmds = commands(parser)
    listing = "\n".join(f".TP\n\\fB{_esc(c.name)}\\fR\n{_esc(c.summary)}" for c in cmds)
    top = "\n".join(_option(o) for o in top_options(parser))
    return "\n".join(
        [
            f'.TH FIOMON 1 "" "fiomon {_esc(__version__)}" "User Commands"',
            ".SH NAME",
            "fiomon \\- " + _esc(parser.description or ""),
            ".SH SYNOPSIS",
            ".B fiomon",
            "[\\fB\\-\\-version\\fR] [\\fB\\-h\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
            ".SH DESCRIPTION",
            "fiomon merges fio's per-interval latency histograms across every job and host,"
            " cuts time into quanta and gives exact percentiles per quantum and direction:"
            " offline from finished logs (\\fBreport\\fR, \\fBplot\\fR, \\fBsummary\\fR,"
            " \\fBfit\\fR), or live, with an \\fBagent\\fR on each client host publishing"
            " over MQTT to an \\fBaggregator\\fR that exports Prometheus metrics and pages"
            " on SLA breaches.",
            ".SH OPTIONS",
            top,
            ".SH COMMANDS",
            listing,
            *(_command(c) for c in cmds),
            ".SH EXIT STATUS",
            "0 on success; 2 for a bad command line or configuration; 1 when a command"
            " fails (an unreadable input, a service that cannot start).",
            ".SH SEE ALSO",
            SEE_ALSO,
            "",
        ]
    )


def add_parser(sub: SubParsers) -> argparse.ArgumentParser:
    """``fiomon man``."""
    return sub.add_parser(
        "man",
        help="print the fiomon(1) manual page (roff)",
        description="Print the manual page, generated from fiomon's own parser: every "
        "subcommand with its options, as --help shows them.",
        epilog="example: fiomon man > /usr/local/share/man/man1/fiomon.1 && man fiomon",
    )


def run(args: argparse.Namespace) -> int:
    """Print the page."""
    del args
    from fiomon.cli import build_parser  # noqa: PLC0415 -- the CLI imports this module

    print(man_page(build_parser()), end="")
    return 0
