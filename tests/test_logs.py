"""Log lines: one per record, timestamped, in logfmt, JSON or text; journal priorities."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fiomon.errors import ConfigError
from fiomon.logs import LineFormatter, parse_log_format, setup_logging, stream_is_journal

TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def _record(msg: str, level: int = logging.INFO, *, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    text = msg
    if exc:
        try:
            msg = "boom"
            raise ValueError(msg)  # a real traceback to format
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("fiomon.aggregator", level, __file__, 1, text, None, exc_info)


def test_logfmt_quotes_what_needs_it_and_keeps_a_traceback_on_one_line() -> None:
    line = LineFormatter("logfmt").format(_record('broker 127.0.0.1:1883 said "no"', exc=True))
    assert "\n" not in line
    m = re.fullmatch(rf'ts=({TS}) level=info logger=fiomon\.aggregator msg="(.*)" exc="(.*)"', line)
    assert m, line
    assert m.group(2) == r"broker 127.0.0.1:1883 said \"no\""
    assert m.group(3).startswith(r"Traceback (most recent call last):\n")
    assert m.group(3).endswith("ValueError: boom")
    plain = LineFormatter("logfmt").format(_record("subscribed"))
    assert plain.endswith(" msg=subscribed")


def test_json_lines_parse_and_carry_every_field() -> None:
    line = LineFormatter("json").format(_record("stopped: 12 quanta", logging.WARNING, exc=True))
    doc = json.loads(line)
    assert set(doc) == {"ts", "level", "logger", "msg", "exc"}
    assert re.fullmatch(TS, doc["ts"])
    assert doc["level"] == "warning" and doc["msg"] == "stopped: 12 quanta"
    assert "ValueError: boom" in doc["exc"]


def test_text_lines_start_with_the_time() -> None:
    line = LineFormatter("text").format(_record("subscribed"))
    assert re.fullmatch(rf"{TS} INFO fiomon\.aggregator: subscribed", line)


@pytest.mark.parametrize(("level", "prefix"), [(logging.ERROR, "<3>"), (logging.DEBUG, "<7>")])
def test_journal_lines_start_with_their_priority(level: int, prefix: str) -> None:
    line = LineFormatter("logfmt", journal=True).format(_record("x", level))
    assert line.startswith(prefix + "ts=")


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, given back as it was (setup_logging replaces its handlers)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield root
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)


@pytest.mark.usefixtures("root_logger")
def test_the_journal_is_recognised_by_its_device_and_inode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # systemd names the journal socket it connected to stderr in JOURNAL_STREAM
    # ("device:inode"); any other stream, or none named, gets no prefixes.
    with (tmp_path / "journal").open("w") as journal, (tmp_path / "other").open("w") as other:
        st = os.fstat(journal.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        assert stream_is_journal(journal)
        assert not stream_is_journal(other)
        assert not stream_is_journal(io.StringIO())
        setup_logging("info", "text", journal)
        logging.getLogger("fiomon.test").info("to the journal")
        logging.getLogger("fiomon.test").debug("below the level")
        monkeypatch.delenv("JOURNAL_STREAM")
        assert not stream_is_journal(journal)
    lines = (tmp_path / "journal").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("<6>"), lines
    assert lines[0].endswith("INFO fiomon.test: to the journal")


def test_a_bad_format_names_where_it_came_from() -> None:
    with pytest.raises(ConfigError, match="FIOMON_LOG_FORMAT: expected one of logfmt, json"):
        parse_log_format("yaml", what="FIOMON_LOG_FORMAT")
