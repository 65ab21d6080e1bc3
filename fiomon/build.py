"""Which fiomon runs: the version, and the revision it was built from.

:func:`revision` is ``fiomon_build_info``'s ``revision`` label, found once per process:

1. the file ``fiomon/REVISION`` beside this module (one line, the git commit; the
   release build writes it into the sdist and wheel);
2. else ``git rev-parse HEAD`` of the checkout this package is imported from (only when
   the package directory is that checkout's ``fiomon/``, so a wheel installed under some
   other repository's tree does not take that tree's commit);
3. else ``"unknown"``.
"""

from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path

from fiomon import __version__

PACKAGE = Path(__file__).resolve().parent
UNKNOWN = "unknown"
GIT_TIMEOUT_S = 5.0


@functools.cache
def revision() -> str:
    """The commit this fiomon was built from (see the module docstring); never raises."""
    return revision_of(PACKAGE)


def revision_of(package: Path) -> str:
    """The commit of the fiomon package in ``package`` (its ``REVISION``, git, unknown)."""
    try:
        text = (package / "REVISION").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        text = ""
    if text:
        return text.splitlines()[0].strip()
    return _git_head(package) or UNKNOWN


def _git_head(package: Path) -> str | None:
    """HEAD of the git checkout whose ``fiomon/`` is ``package``; None otherwise."""
    try:
        out = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.splitlines()
    if out.returncode != 0 or len(lines) != 2:  # the top level, then HEAD
        return None
    top, head = lines
    if Path(top).resolve() / "fiomon" != package.resolve():
        return None
    return head


def build_labels() -> tuple[str, str, str]:
    """``fiomon_build_info``'s ``(version, revision, python)``."""
    return __version__, revision(), platform.python_version()
