"""One truth per I/O: which hist logs describe the same I/Os as a json+ status stream.

fio can write both views of a job: the json+ stream (``--status-interval``, cumulative
histograms, live) and hist logs (``write_hist_log=PREFIX``, written when the job exits).
Counting both counts every I/O twice. The rule fiomon applies everywhere:

* A json+ stream *declares* the hist-log prefixes of its jobs: ``write_hist_log`` under
  ``global options`` (command line and ``[global]``) or a job's ``job options``.
* A hist log is *covered* by that stream when its name is what fio makes of a declared
  prefix: ``PREFIX_clat_hist.N.log`` (or ``PREFIX_clat_hist.log`` with
  ``per_job_logs=0``, ``.fz`` when compressed, ``.<host>`` appended in client/server
  mode). A relative prefix is relative to fio's working directory, which the stream does
  not say: it matches the hist log's path by its trailing path components.
* The agent publishes the json+ stream (live, and it holds the last partial interval
  that hist logs never write) and not the hist logs it covers; a hist log that no
  followed stream covers is published. Offline commands stop and ask (``--source``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

_HIST_NAME = re.compile(r"^(?P<prefix>.+)_clat_hist(?:\.\d+)?\.log(?:\.fz)?(?:\.[^/]+)?$")


def hist_log_prefix(path: str) -> str | None:
    """The ``write_hist_log`` prefix (absolute, normalised) that names ``path``, or None."""
    m = _HIST_NAME.match(os.path.abspath(path))
    return m.group("prefix") if m else None


def _tail_parts(prefix: str) -> list[str]:
    """A relative prefix's path components, without leading ``.``/``..`` (unknowable)."""
    parts = [p for p in os.path.normpath(prefix).split(os.sep) if p not in ("", ".")]
    while parts and parts[0] == "..":
        parts.pop(0)
    return parts


def prefix_names(declared: str, hist_path: str) -> bool:
    """Whether fio, told ``write_hist_log=declared``, could have written ``hist_path``."""
    actual = hist_log_prefix(hist_path)
    if actual is None or not declared:
        return False
    if os.path.isabs(declared):
        return os.path.normpath(declared) == actual
    want = _tail_parts(declared)
    have = actual.split(os.sep)
    return bool(want) and have[-len(want) :] == want


def covering(hist_path: str, streams: Iterable[tuple[str, Iterable[str]]]) -> str | None:
    """The first stream (name, declared prefixes) that covers ``hist_path``, or None."""
    for name, prefixes in streams:
        if any(prefix_names(p, hist_path) for p in prefixes):
            return name
    return None
