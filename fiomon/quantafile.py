"""The aggregator's quanta file: every closed quantum as a closed-quantum JSON line.

The lines are exactly what ``fiomon report --format jsonl`` prints for the same input, so
a run can be audited and plotted later with the same tools. The file is rotated by size
(``quanta.jsonl`` -> ``quanta.jsonl.1`` -> ... -> ``quanta.jsonl.<keep>``, the oldest
deleted) and flushed after every close, so a crash loses no closed quantum.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from fiomon.windows import ClosedQuantum

log = logging.getLogger("fiomon.aggregator")


class QuantaFile:
    """Appends closed quanta to ``path``, rotating past ``max_bytes``.

    Args:
        path: the file (its folder is created).
        max_bytes: rotate once the file is larger than this.
        keep: rotated files kept.
    """

    def __init__(self, path: Path, max_bytes: int = 64 * 1024**2, keep: int = 5) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("a", encoding="utf-8")
        self.rows = 0
        self.failures = 0

    def write(self, rows: Sequence[ClosedQuantum]) -> None:
        """Append ``rows`` and flush; an I/O error is logged and counted, not raised."""
        if not rows:
            return
        text = "".join(json.dumps(r.to_json(), separators=(",", ":")) + "\n" for r in rows)
        try:
            self._fh.write(text)
            self._fh.flush()
            self.rows += len(rows)
            if self._fh.tell() > self.max_bytes:
                self._rotate()
        except OSError as exc:
            self.failures += 1
            log.error("quanta file %s: %s (%d rows not written)", self.path, exc, len(rows))

    def _rotate(self) -> None:
        self._fh.close()
        for i in range(self.keep, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def close(self) -> None:
        """Flush and close."""
        self._fh.close()
