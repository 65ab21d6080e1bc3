"""An AggregatorCore on a fake clock, and the records to feed it (shared by its tests)."""

from __future__ import annotations

from dataclasses import dataclass

from fiomon.aggregator.merger import AggregatorCore
from fiomon.bins import BinLayout
from fiomon.config import AggregatorConfig
from fiomon.model import RecordBatch
from tests.batches import batch as make_batch
from tests.clock import FakeClock

LAY = BinLayout()


def batch(
    ends: list[int], *, direction: int = 0, bin_: int = 700, count: int = 200, label: str = "j"
) -> RecordBatch:
    return make_batch([(e - 1000, e, direction, {bin_: count}) for e in ends], "", label, LAY)


@dataclass(frozen=True)
class Delays:
    """The exported ``fiomon_quantum_close_delay_seconds`` histogram."""

    edges_s: tuple[float, ...]
    cumulative: tuple[float, ...]
    n: float

    def at_most(self, s: float) -> float:
        """Closes that came at most ``s`` after their quantum's end (``s`` an edge)."""
        return self.cumulative[self.edges_s.index(s)]


def close_delays(c: AggregatorCore) -> Delays:
    """The close-delay histogram of ``c``'s current snapshot (what /metrics serves)."""
    ((edges, cumulative, n, _),) = [
        v for k, v in c.snapshot.histograms.items() if k[0] == "fiomon_quantum_close_delay_seconds"
    ]
    return Delays(edges, cumulative, n)


def core(clock: FakeClock[int], **kw: object) -> AggregatorCore:
    cfg = AggregatorConfig(align="epoch", lateness_ms=5000, **kw)  # type: ignore[arg-type]
    return AggregatorCore(cfg, now_ms=clock)
