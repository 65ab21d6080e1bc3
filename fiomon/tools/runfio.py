"""``fiomon fio -- JOB...``: run fio with what fiomon needs, starting on a quantum boundary.

Adds to the user's fio arguments: the json+ status stream every second into
``<output dir>/<host>.json`` (the agent's live source), per-job hist logs
(``write_hist_log``, ``log_hist_msec=1000``) for the offline report, and epoch timestamps.
The stream declares the hist logs' prefix, so the agent publishes each I/O once (from the
stream) and ``fiomon report`` asks which view to count (:mod:`fiomon.fio.overlap`).
With ``--name NAME`` the files go to ``<output dir>/NAME/`` (the run's own folder: file
names stay ``<host>.json`` and ``<host>_clat_hist.N.log``, which is how ``fiomon report``
tells hosts apart), and an agent with ``run: "{dir}"`` labels the run's records NAME.
It then waits for the next quantum boundary of the wall clock and replaces itself with
fio, so every host started this way reports on (nearly) the same phase, which is what
keeps the quanta exact (:mod:`fiomon.align`).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def fio_command(
    fio: str, user_args: Sequence[str], *, output_dir: Path, host: str, status_s: int = 1
) -> list[str]:
    """The full fio command line (the user's arguments come last, so they can override)."""
    prefix = output_dir / host
    return [
        fio,
        f"--status-interval={status_s}",
        "--output-format=json+",
        f"--output={prefix}.json",
        "--eta=never",
        f"--write_hist_log={prefix}",
        "--log_hist_msec=1000",
        "--log_unix_epoch=1",
        *user_args,
    ]


def wait_for_boundary(quantum_ms: int, *, now_ns: int | None = None) -> float:
    """Sleep until the next multiple of ``quantum_ms`` of the wall clock; returns the wait (s)."""
    now = time.time_ns() if now_ns is None else now_ns
    q = quantum_ms * 1_000_000
    wait_s = (q - now % q) / 1e9
    time.sleep(wait_s)
    return wait_s


def run_folder(output_dir: Path, name: str | None) -> Path:
    """Where a run's files go: ``output_dir``, or its subfolder ``name`` (``--name``).

    Raises:
        ValueError: ``name`` is no single folder name (empty, ``.``/``..``, a ``/``, or
            over 255 bytes).
    """
    if name is None:
        return output_dir
    bad = any(ord(c) < 32 or ord(c) == 127 for c in name)  # a newline: no run label
    if name in {"", ".", ".."} or "/" in name or bad or len(name.encode()) > 255:
        msg = (
            f"--name must be one folder name (no '/', no control characters, 1..255 bytes), "
            f"got {name!r}"
        )
        raise ValueError(msg)
    return output_dir / name


def run_fio(
    user_args: Sequence[str],
    *,
    output_dir: Path,
    quantum_ms: int = 1000,
    name: str | None = None,
) -> int:
    """Exec fio with fiomon's options at the next quantum boundary (returns only on error).

    ``name``: the run's name; the files go to ``output_dir/name/`` (:func:`run_folder`).

    Raises:
        OSError: fio could not be executed.
    """
    fio = shutil.which("fio")
    if fio is None:
        print("fiomon fio: fio is not installed (apt-get install fio)", file=sys.stderr)
        return 2
    if not user_args:
        print(
            "fiomon fio: give fio's arguments after --, e.g. fiomon fio -- job.fio", file=sys.stderr
        )
        return 2
    try:
        output_dir = run_folder(output_dir, name)
    except ValueError as exc:
        print(f"fiomon fio: {exc}", file=sys.stderr)
        return 2
    output_dir.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".", 1)[0] or "localhost"
    cmd = fio_command(fio, user_args, output_dir=output_dir, host=host)
    print(f"fiomon fio: {' '.join(cmd)}", file=sys.stderr)
    if name is not None:
        print(f"fiomon fio: run {name}: files in {output_dir}", file=sys.stderr)
    wait_for_boundary(quantum_ms)
    # fio replaces us: signals and the exit code are its own.
    os.execv(fio, cmd)  # noqa: S606
