"""SIGHUP for both services: one loader (the file plus the command line's overrides).

A reload re-reads the file through :func:`fiomon.config.load` with the same
:class:`~fiomon.config.Overrides` the service started with, so what ``--broker``,
``FIOMON_BROKER``, ``--listen`` or ``--log-level`` set is never taken for a change of the
file. The merger takes what it can while running; every other field that differs is
named once in the log as waiting for the next start.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection
from pathlib import Path

from fiomon.config import AggregatorConfig, Overrides, load
from fiomon.errors import ConfigError


def reread(
    path: Path | None, overrides: Overrides | None, log: logging.Logger
) -> AggregatorConfig | None:
    """The configuration as it would be at a start now; None (logged) if unusable.

    Args:
        path: the file the service started from (None: nothing to re-read).
        overrides: the command line's settings, applied over the file as at start.
        log: the service's logger (every problem is logged as ``SIGHUP: ...``).
    """
    if path is None:
        log.warning("SIGHUP: no configuration file to re-read; nothing reloaded")
        return None
    try:
        return load(path, overrides)
    except ConfigError as exc:
        for p in exc.problems:
            log.error("SIGHUP: %s", p)
        log.error("SIGHUP: %s not reloaded; the running configuration stays", path)
        return None


def apply_log_level(cfg: AggregatorConfig) -> None:
    """Set the root logger's level from ``cfg`` (the file's, or the command line's)."""
    if cfg.log_level:
        logging.getLogger().setLevel(cfg.log_level.upper())


def warn_restart_only(
    running: AggregatorConfig,
    new: AggregatorConfig,
    log: logging.Logger,
    ignored: Collection[str] = (),
) -> list[str]:
    """Name the fields that differ and wait for the next start.

    Called after the merger took what it takes while running (``running`` has those
    already). ``ignored``: fields this service does not use at all (never named).
    Returns the fields named (empty: the file and the running configuration agree).
    """
    fixed = [
        f.name
        for f in dataclasses.fields(AggregatorConfig)
        if f.name not in ignored and getattr(new, f.name) != getattr(running, f.name)
    ]
    if fixed:
        log.warning("reload: %s changed but take effect at the next start", ", ".join(fixed))
    return fixed
