"""Quantum alignment: where the grid of quanta starts (its phase).

Phase matters more than anything else for accuracy (README.md): a record that straddles a
quantum boundary is split in proportion to overlap, which is exact only if its I/Os were
spread evenly. ``auto`` therefore puts boundaries where the records' own boundaries are.

:func:`auto_phase` minimises the sample-weighted circular distance between record ends and
the grid, ``sum_i w_i * d(e_i - phase mod Q)``, over every phase in 1 ms steps, with one FFT
circular convolution (``O(Q log Q)``), so it stays cheap for long quanta.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from fiomon.model import RecordBatch
from fiomon.units import parse_duration_ms

AlignMode = Literal["epoch", "auto"]
Align = AlignMode | int  # an int is a fixed offset in ms


def parse_align(text: str) -> Align:
    """``epoch``, ``auto`` or an offset duration (``250ms``).

    Raises:
        ConfigError: none of those.
    """
    t = text.strip().lower()
    if t in ("epoch", "auto"):
        return "epoch" if t == "epoch" else "auto"
    return parse_duration_ms(t, what="align")


def auto_phase(
    ends_ms: npt.NDArray[np.int64], weights: npt.NDArray[np.float64], quantum_ms: int
) -> int:
    """The phase in ``[0, quantum_ms)`` that best matches the record ends.

    Args:
        ends_ms: record end stamps (ms).
        weights: per record, its number of samples (heavier records matter more).
        quantum_ms: the quantum length.

    Returns:
        The phase in ms; 0 when there is nothing to align to.
    """
    if quantum_ms <= 1 or len(ends_ms) == 0 or float(weights.sum()) <= 0:
        return 0
    resid = np.mod(ends_ms, quantum_ms)
    hist = np.bincount(resid, weights=weights, minlength=quantum_ms)
    k = np.arange(quantum_ms)
    dist = np.minimum(k, quantum_ms - k).astype(np.float64)
    # cost[p] = sum_r hist[r] * dist[(r - p) mod Q]: a circular cross-correlation.
    cost = np.fft.irfft(np.fft.rfft(hist) * np.conj(np.fft.rfft(dist)), n=quantum_ms)
    # Round away FFT noise so that equal costs tie-break to the smallest phase.
    cost = np.round(cost, 6)
    return int(np.argmin(cost))


def phase_from(batches: Sequence[RecordBatch], quantum_ms: int) -> int:
    """:func:`auto_phase` of the records of ``batches`` (ends weighted by samples).

    The one preamble of ``align: auto``, offline (first chunk of every file) and live
    (what arrived in the first lateness); 0 when there is nothing to align to.
    """
    if not batches:
        return 0
    ends = np.concatenate([b.end_ms for b in batches])
    weights = np.concatenate([b.samples() for b in batches]).astype(np.float64)
    return auto_phase(ends, weights, quantum_ms)


def phase_for(align: Align, quantum_ms: int) -> int | None:
    """The fixed phase of a non-auto alignment (``None`` for ``auto``)."""
    if align == "auto":
        return None
    if align == "epoch":
        return 0
    return int(align) % quantum_ms
