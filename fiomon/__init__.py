"""fiomon: cluster-wide latency percentiles over time from fio's histograms.

The offline engine (``fiomon report``) and the live aggregator share one record model
(:class:`RecordBatch`), one set of bin layouts (:class:`BinLayout`) and one quantum
engine (:class:`QuantumEngine`), so the same input gives the same numbers both ways.
"""

from fiomon.bins import BinLayout, detect_layout
from fiomon.errors import ConfigError, FiomonError, LayoutError, ParseError
from fiomon.model import Direction, RecordBatch
from fiomon.windows import ClosedQuantum, QuantumEngine

__version__ = "0.1.0"

__all__ = [
    "BinLayout",
    "ClosedQuantum",
    "ConfigError",
    "Direction",
    "FiomonError",
    "LayoutError",
    "ParseError",
    "QuantumEngine",
    "RecordBatch",
    "__version__",
    "detect_layout",
]
