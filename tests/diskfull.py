"""A real filesystem that fills up: a small tmpfs mounted for one test.

Mounting needs root, as CI runs the suite. As root a failed mount fails the test; as any
other user the test is skipped, naming why.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str = "64k") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``folder`` (created) while inside; unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    folder.mkdir(parents=True, exist_ok=True)
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs as root: {r.stderr.strip() or r.returncode}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer may still put on ``folder``'s filesystem."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def fill(folder: Path, leave: int) -> None:
    """Fill the filesystem with ``folder/filler`` so that just ``leave`` bytes stay free.

    ``leave`` is a multiple of the filesystem's block size.
    """
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        block = b"\0" * os.statvfs(folder).f_frsize
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, block)
        assert free_bytes(folder) == 0
        os.ftruncate(fd, os.fstat(fd).st_size - leave)
    finally:
        os.close(fd)
    assert free_bytes(folder) == leave, f"{free_bytes(folder)} bytes free, not {leave}"


def is_enospc(exc: OSError) -> bool:
    """The error a full disk gives."""
    return exc.errno == errno.ENOSPC
