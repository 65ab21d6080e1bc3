"""One truth per I/O: which hist logs describe the same I/Os as a json+ status stream.

fio can write both views of a job: the json+ stream (``--status-interval``, cumulative
histograms, live) and hist logs (``write_hist_log=PREFIX``, written when the job exits).
Counting both counts every I/O twice. The rule fiomon applies everywhere:

* A json+ stream *declares* the hist logs of its jobs: the ``write_hist_log`` values
  under ``global options`` (command line and ``[global]``) and each job's ``job
  options``, and its job names (a bare ``write_hist_log`` names the logs after the job).
* A hist log is *covered* by that stream when both hold:

  - **name**: the log's file name is what fio makes of a declared prefix
    (``PREFIX_clat_hist.N.log``, ``PREFIX_clat_hist.log``, ``.fz`` when compressed,
    ``.<host>`` appended by client/server mode). Only the prefix's last path component
    is compared: fio's working directory, symlinks, bind mounts and copied result
    folders all change the directories, never the name;
  - **time**: the log's records overlap the time the stream covers (from its first
    dump minus the job's runtime to its last dump), give or take ``slack_ms`` (fio
    writes hist logs at job exit, up to a status interval after its last dump). A log
    of another run with the same prefix, before or after, is not covered. Logs with
    relative stamps cannot be placed exactly, so for them the name decides.

* The agent publishes the json+ stream (live, and it holds each job's last partial
  interval, which hist logs never get) and not the hist logs it covers; a hist log that
  no stream covers is published. Offline commands stop and ask (``--source``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

_HIST_NAME = re.compile(r"^(?P<prefix>.+)_clat_hist(?:\.\d+)?\.log(?:\.fz)?(?:\.[^/]+)?$")
MIN_SLACK_MS = 10_000


def hist_log_name(path: str) -> str | None:
    """The prefix part of a fio hist log's file name (``h`` for ``h_clat_hist.2.log``)."""
    m = _HIST_NAME.match(os.path.basename(path))
    return m.group("prefix") if m else None


def prefix_name(declared: str) -> str:
    """The last path component of a declared ``write_hist_log`` value."""
    return os.path.basename(os.path.normpath(declared)) if declared else ""


@dataclass(frozen=True, slots=True)
class Declaration:
    """What one json+ stream says about the hist logs of its jobs.

    Args:
        stream: its name (the agent's stream id, or the file offline).
        names: hist-log name prefixes it declares (prefix last components, job names).
        first_ms: earliest time its I/Os cover (first dump minus job runtime), or None.
        last_ms: its last dump, or None.
        slack_ms: how far outside that span a covered hist log may reach.
    """

    stream: str
    names: frozenset[str]
    first_ms: int | None = None
    last_ms: int | None = None
    slack_ms: int = MIN_SLACK_MS

    def covers(self, hist_path: str, span: tuple[int, int] | None) -> bool:
        """Whether a hist log holds the same I/Os as this stream.

        Args:
            hist_path: the hist log.
            span: epoch ms of its first record's start and last record's end, or None
                when its stamps are relative (the name alone decides then).
        """
        name = hist_log_name(hist_path)
        if name is None or name not in self.names:
            return False
        if span is None or self.first_ms is None or self.last_ms is None:
            return True
        first, last = span
        return first <= self.last_ms + self.slack_ms and last >= self.first_ms - self.slack_ms


def covering(
    hist_path: str, span: tuple[int, int] | None, declarations: Iterable[Declaration]
) -> str | None:
    """The first stream that covers the hist log, or None."""
    for d in declarations:
        if d.covers(hist_path, span):
            return d.stream
    return None
