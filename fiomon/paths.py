"""Where fiomon's shipped files are: deploy files, example configs, the agents' kit, docs.

The wheel installs them under ``<data>/share/fiomon``, where ``<data>`` is the install
scheme's data directory: the venv itself for a venv install (``/opt/fiomon/share/fiomon``
with the documented ``/opt/fiomon``, where the systemd units point), ``~/.local`` for a
``pip install --user``. Run from a source checkout, they are the checkout's own folders.
``fiomon paths`` prints them; deploy/ansible installs the units from there.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

# name -> the folder under share/fiomon (or the checkout), in the order `fiomon paths` prints
PLACES: dict[str, str] = {
    "share": ".",
    "config": "config",
    "deploy": "deploy",
    "systemd": "deploy/systemd",
    "ansible": "deploy/ansible",
    "agents": "agents",
    "docs": "docs",
}

# A folder is fiomon's share folder if it holds this (the units every install needs).
_MARKER = Path("deploy/systemd")


def _candidates() -> list[Path]:
    checkout = Path(__file__).resolve().parent.parent
    found = []
    if (checkout / "pyproject.toml").is_file():  # imported from a source checkout
        found.append(checkout)
    found.append(Path(sysconfig.get_path("data")) / "share" / "fiomon")
    user = sysconfig.get_preferred_scheme("user")  # pip install --user
    found.append(Path(sysconfig.get_path("data", user)) / "share" / "fiomon")
    found.append(Path(sys.prefix) / "share" / "fiomon")
    return found


def share_dir() -> Path | None:
    """The folder holding fiomon's shipped files, or ``None`` when none is installed."""
    for place in _candidates():
        if (place / _MARKER).is_dir():
            return place
    return None


def shipped_path(name: str) -> Path | None:
    """One of :data:`PLACES` (``"systemd"``, ``"config"``, ...), or ``None`` if absent.

    Raises:
        ValueError: ``name`` is not one of :data:`PLACES`.
    """
    if name not in PLACES:
        msg = f"unknown place {name!r}: one of {', '.join(PLACES)}"
        raise ValueError(msg)
    share = share_dir()
    if share is None:
        return None
    path = (share / PLACES[name]).resolve()
    return path if path.exists() else None
