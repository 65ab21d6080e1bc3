"""Log lines of the services: one line per record, timestamped, in three formats.

``logfmt`` (the default, as Prometheus and its exporters log) and ``json`` are for
machines, ``text`` for a person at a terminal::

    logfmt: ts=2026-11-22T20:41:00.123Z level=info logger=fiomon.aggregator msg="subscribed"
    json:   {"ts": "2026-11-22T20:41:00.123Z", "level": "info", "logger": "fiomon.aggregator",
             "msg": "subscribed"}   (on one line)
    text:   2026-11-22T20:41:00.123Z INFO fiomon.aggregator: subscribed

Times are UTC with milliseconds (RFC 3339). A traceback stays on the record's one line
(``exc=`` in logfmt and JSON, escaped newlines), so line-based collectors keep it whole.
Under systemd, when stderr is the journal (``JOURNAL_STREAM`` names it, systemd.exec(5)),
each line also starts with its syslog priority (``<6>`` for info, sd-daemon(3)): journald
strips the prefix and files the line at that priority, so ``journalctl -p warning`` works.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Literal, TextIO

from fiomon.errors import ConfigError

LogFormat = Literal["logfmt", "json", "text"]
LOG_FORMATS: tuple[LogFormat, ...] = ("logfmt", "json", "text")
LEVELS = ("debug", "info", "warning", "error")

# sd-daemon(3) prefixes: the syslog priorities of Python's levels.
_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


def parse_log_format(text: str, *, what: str) -> LogFormat:
    """``logfmt``, ``json`` or ``text``.

    Raises:
        ConfigError: anything else, naming ``what`` (the flag or variable).
    """
    for fmt in LOG_FORMATS:
        if text == fmt:
            return fmt
    msg = f"{what}: expected one of {', '.join(LOG_FORMATS)}, got {text!r}"
    raise ConfigError([msg])


def parse_log_level(text: str, *, what: str) -> str:
    """``debug``, ``info``, ``warning`` or ``error``.

    Raises:
        ConfigError: anything else, naming ``what``.
    """
    if text not in LEVELS:
        msg = f"{what}: expected one of {', '.join(LEVELS)}, got {text!r}"
        raise ConfigError([msg])
    return text


def _timestamp(record: logging.LogRecord) -> str:
    when = datetime.fromtimestamp(record.created, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _logfmt_value(value: str) -> str:
    """A logfmt value: bare when it is one plain word, else quoted with escapes."""
    if value and not any(c in value for c in ' ="\\\n\t'):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\t", "\\t") + '"'


class LineFormatter(logging.Formatter):
    """Formats a record as one ``logfmt``, ``json`` or ``text`` line.

    Args:
        fmt: the line format.
        journal: start each line with its syslog priority (``<6>``) for journald.
    """

    def __init__(self, fmt: LogFormat = "logfmt", *, journal: bool = False) -> None:
        super().__init__()
        self.line_format: LogFormat = fmt
        self.journal = journal

    def format(self, record: logging.LogRecord) -> str:
        """The record's line, without the trailing newline."""
        ts = _timestamp(record)
        level = record.levelname.lower()
        msg = record.getMessage()
        exc = self.formatException(record.exc_info) if record.exc_info else ""
        if self.line_format == "json":
            doc = {"ts": ts, "level": level, "logger": record.name, "msg": msg}
            if exc:
                doc["exc"] = exc
            line = json.dumps(doc, ensure_ascii=False)
        elif self.line_format == "text":
            line = f"{ts} {record.levelname} {record.name}: {msg}"
            if exc:
                line += " | " + exc.replace("\n", "\\n")
        else:
            pairs = [("ts", ts), ("level", level), ("logger", record.name), ("msg", msg)]
            if exc:
                pairs.append(("exc", exc))
            line = " ".join(f"{k}={_logfmt_value(v)}" for k, v in pairs)
        if self.journal:
            line = f"<{_PRIORITY.get(record.levelno, 6)}>{line}"
        return line


def stream_is_journal(stream: TextIO) -> bool:
    """Whether ``stream`` is the journal socket systemd gave us (``JOURNAL_STREAM``)."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    dev, _, inode = expected.partition(":")
    if not (dev.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError):  # no file descriptor (a test's StringIO), or closed
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(inode))


def setup_logging(level: str, fmt: LogFormat, stream: TextIO | None = None) -> None:
    """Send the ``fiomon`` and library loggers to ``stream`` (stderr) as one-line records.

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error``.
        fmt: ``logfmt``, ``json`` or ``text``.
        stream: where to write (default ``sys.stderr``).
    """
    out = stream or sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(LineFormatter(fmt, journal=stream_is_journal(out)))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
