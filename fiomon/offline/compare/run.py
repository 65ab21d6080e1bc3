"""Both runs read, aligned into windows and judged: :func:`run_compare`.

(Stub for the helpers: the lead fills it in. The signature is the contract.)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from fiomon.offline.compare.model import CompareOptions, CompareResult, RunName
from fiomon.offline.sources import SourceOptions


@dataclass(frozen=True, slots=True)
class RunInput:
    """One run as the command line resolved it.

    Args:
        name: ``baseline`` or ``candidate``.
        spec: what the user gave (for messages).
        files: the files to read (after the one-truth choice of ``_read_inputs``).
        source: how to parse them (its ``skip_jobs`` are this run's).
    """

    name: RunName
    spec: str
    files: tuple[Path, ...]
    source: SourceOptions


def run_compare(
    baseline: RunInput, candidate: RunInput, opts: CompareOptions, err: TextIO = sys.stderr
) -> CompareResult:
    """Read both runs, align them and judge every window (see :mod:`.model`).

    Raises:
        FiomonError: a run cannot be read, has no I/O, or the alignment is impossible.
    """
    raise NotImplementedError
