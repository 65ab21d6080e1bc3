"""fiomon: cluster-wide latency percentiles over time from fio's histograms.

The offline engine (``fiomon report``) and the live aggregator share one record model
(:class:`RecordBatch`), one set of bin layouts (:class:`BinLayout`) and one quantum
engine (:class:`QuantumEngine`), so the same input gives the same numbers both ways.

The names below are the library API; everything else is private to fiomon. For example::

    from fiomon import QuantaOptions, iter_quanta

    for q in iter_quanta(paths, QuantaOptions(quantum_ms=1000, per_host=True)):
        print(q.end_ms, q.host, q.direction, q.stats.percentiles_ns["99"])

``iter_quanta`` and ``QuantaOptions`` live in :mod:`fiomon.offline.quanta` and are loaded
on first use, so ``import fiomon`` (and the agent and aggregator, which import it) stays
free of the offline code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from fiomon.bins import BinLayout, detect_layout, merged_layout
from fiomon.closed import ClosedQuantum
from fiomon.engine import QuantumEngine
from fiomon.errors import (
    ConfigError,
    FiomonError,
    LayoutError,
    OverlapError,
    ParseError,
    WireFormatError,
)
from fiomon.fio.fiojson import JsonStatusParser
from fiomon.fio.fiolog import HistLogOptions, HistLogParser
from fiomon.fio.parsers import RecordParser, open_parser, sniff
from fiomon.histogram import HistStats, pct_key, summarize
from fiomon.model import Direction, RecordBatch, StreamInfo
from fiomon.wire import Message, decode, encode

if TYPE_CHECKING:
    from fiomon.offline.quanta import QuantaOptions, iter_quanta

__version__ = "0.1.0"

__all__ = [
    "BinLayout",
    "ClosedQuantum",
    "ConfigError",
    "Direction",
    "FiomonError",
    "HistLogOptions",
    "HistLogParser",
    "HistStats",
    "JsonStatusParser",
    "LayoutError",
    "Message",
    "OverlapError",
    "ParseError",
    "QuantaOptions",
    "QuantumEngine",
    "RecordBatch",
    "RecordParser",
    "StreamInfo",
    "WireFormatError",
    "__version__",
    "decode",
    "detect_layout",
    "encode",
    "iter_quanta",
    "merged_layout",
    "open_parser",
    "pct_key",
    "sniff",
    "summarize",
]

_LAZY = {"iter_quanta": "fiomon.offline.quanta", "QuantaOptions": "fiomon.offline.quanta"}


def __getattr__(name: str) -> object:
    """Load the offline API on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        msg = f"module 'fiomon' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
