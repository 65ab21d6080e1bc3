"""The fiomon exception tree.

Every class also inherits the builtin that describes it, so callers may catch either
``FiomonError`` or, say, ``ValueError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from pathlib import Path

# Why a payload was refused, for a metric label (WireFormatError.reason); fiomon.wire.REASONS
# lists them in this order.
WireReason = Literal[
    "oversized", "truncated", "not-fiomon", "version", "layout", "inconsistent", "invalid"
]


class FiomonError(Exception):
    """Raised for any failure fiomon reports to its user (base class)."""


class ConfigError(FiomonError, ValueError):
    """Raised when a configuration file or command-line option is invalid.

    Args:
        problems: one message per bad key or option, each naming where it is.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class FitError(FiomonError, ValueError):
    """Raised when a histogram cannot be fitted (too few I/Os, one bin, all saturated)."""


class UsageError(ConfigError):
    """Raised when a command line is wrong in a way its parser cannot see.

    ``fiomon`` prints each problem after the command's name and exits with 2.

    Args:
        problems: one message per problem, each naming the flag.
    """


class LayoutError(FiomonError, ValueError):
    """Raised when no fio bin layout fits a histogram, or two layouts cannot be merged."""


class LocatedError(FiomonError, ValueError):
    """An error in a file's content, located: ``<source>:<line>: <reason>``.

    Args:
        source: the file (or stream) the bad input came from.
        line_no: 1-based line number, or 0 when the problem is not tied to a line.
        reason: what is wrong, for a person.
    """

    def __init__(self, source: str, line_no: int, reason: str) -> None:
        self.source = source
        self.line_no = line_no
        self.reason = reason
        where = f"{source}:{line_no}" if line_no else source
        super().__init__(f"{where}: {reason}")


class ParseError(LocatedError):
    """Raised when input cannot be parsed and the caller asked for strictness.

    Args:
        source: the file (or stream) the bad input came from.
        line_no: 1-based line number, or 0 when the problem is not tied to a line.
        reason: what is wrong, for a person.
    """


class InputError(FiomonError, ValueError):
    """Raised when an input file is fio output that holds no readable histograms.

    For example plain ``--output-format=json`` (no bins), fio's lat/bw/iops logs or its
    ``log_store_compressed`` store. The message names each file, what it is and the fio
    option (or command) that gives a readable one.

    Args:
        refusals: file -> why it cannot be read, in input order.
    """

    def __init__(self, refusals: dict[str, str]) -> None:
        self.refusals = dict(refusals)
        lines = [f"{src}: {why}" for src, why in self.refusals.items()]
        super().__init__(lines[0] if len(lines) == 1 else "\n  ".join(["", *lines]).lstrip("\n"))


class OverlapError(FiomonError, ValueError):
    """Raised when inputs include a json+ stream and the hist logs of the same jobs.

    Counting both would count every I/O twice; the message names the files and the
    ``--source`` choices.
    """


class QuantaFileError(LocatedError):
    """Raised when a quanta file (closed-quantum JSON lines) cannot be read as one.

    Args:
        source: the file.
        line_no: 1-based line number, or 0 when the problem is not tied to a line.
        reason: what is wrong, for a person.
    """


class PlotError(FiomonError, ValueError):
    """Raised when a plot cannot be made: an unknown extension or a missing extra."""


class WireFormatError(FiomonError, ValueError):
    """Raised when an MQTT payload is not a valid fiomon wire-format message.

    The message says why for a person; :attr:`reason` says it for a metric label (a
    :data:`WireReason`: oversized, truncated, not-fiomon, version, layout, inconsistent,
    invalid; ``fiomon.wire.REASONS`` lists them).
    """

    def __init__(self, message: str, reason: WireReason = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


class StateLockedError(FiomonError, RuntimeError):
    """Raised when another process holds a service's state directory (its ``flock``).

    Two aggregators (or roots) on one state directory would each journal and publish the
    other's quanta; the second one refuses to start instead.

    Args:
        folder: the state directory.
        holder: the other process's pid, as its lock file says ("" when unreadable).
        service: who is refused, for the message (``aggregator`` or ``root``).
    """

    def __init__(self, folder: Path, holder: str, service: str = "aggregator") -> None:
        self.folder = folder
        self.holder = holder
        super().__init__(
            f"another {service} (pid {holder or '?'}) uses the state directory {folder}; "
            f"two {service}s must not share one (nor one MQTT client_id)"
        )
