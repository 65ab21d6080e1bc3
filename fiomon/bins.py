"""fio's latency histogram bin layouts: exact edges, index <-> value, detection.

Contract (fio ``stat.h`` and ``stat.c``: ``plat_idx_to_val``, ``plat_val_to_idx``):

* A layout has ``group_nr`` groups of 64 buckets: ``group_nr * 64`` *fine* bins.
  fio 3 builds use 29 groups (1856 bins) with values in ns; fio 2 used 19 groups
  (1216 bins) with values in µs. Users who rebuild fio change ``group_nr``.
* Fine bin ``j < 128`` holds exactly the integer value ``j``; as latencies are
  truncated to integers, its exact edges are ``[j, j + 1)``.
* Fine bin ``j >= 128``: ``e = (j >> 6) - 1``, ``k = j & 63``,
  ``lower = 2**(e + 6) + k * 2**e``, ``upper = lower + 2**e``. The relative
  half-width is at most 1/128 (0.78 %); fio reports the midpoint.
* A log written with ``log_hist_coarseness = c`` has ``group_nr * 64 >> c`` bins; coarse
  bin ``i`` is the sum of fine bins ``i * 2**c .. (i + 1) * 2**c - 1``, so its edges are
  the lower edge of the first and the upper edge of the last of those (width up to
  ``2**c / 64`` of the value).
* fio clamps every value at or above the last bin's lower edge into the last bin, so the
  last bin's upper edge (``2**(group_nr + 5)`` units: about 17.18 s for fio 3) is a cap,
  not a bound: a percentile landing there is *saturated* and only its lower edge is known.

All functions are vectorised over numpy arrays and exact in integer arithmetic; edges are
returned as float64 nanoseconds, exact up to 2**53 ns.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from fiomon.errors import LayoutError

PLAT_BITS = 6
PLAT_VAL = 1 << PLAT_BITS  # buckets per group
MIN_GROUP_NR = 19
MAX_GROUP_NR = 58  # 2**(58 + 5) still fits a signed 64-bit value
MAX_COARSENESS = 6
FIO3_GROUP_NR = 29
FIO2_GROUP_NR = 19

Unit = Literal["ns", "us"]
_UNIT_NS: dict[Unit, int] = {"ns": 1, "us": 1000}

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class BinLayout:
    """One fio histogram layout.

    Args:
        group_nr: fio's ``FIO_IO_U_PLAT_GROUP_NR`` (29 for fio 3, 19 for fio 2).
        coarseness: ``log_hist_coarseness`` of the log, 0..6 (json+ bins are always 0).
        unit: the unit of fio's values: ``"ns"`` (fio >= 3) or ``"us"`` (fio 2).
    """

    group_nr: int = FIO3_GROUP_NR
    coarseness: int = 0
    unit: Unit = "ns"

    def __post_init__(self) -> None:
        if not MIN_GROUP_NR <= self.group_nr <= MAX_GROUP_NR:
            msg = f"group_nr must be {MIN_GROUP_NR}..{MAX_GROUP_NR}, got {self.group_nr}"
            raise ValueError(msg)
        if not 0 <= self.coarseness <= MAX_COARSENESS:
            msg = f"coarseness must be 0..{MAX_COARSENESS}, got {self.coarseness}"
            raise ValueError(msg)
        if self.unit not in _UNIT_NS:
            msg = f"unit must be 'ns' or 'us', got {self.unit!r}"
            raise ValueError(msg)

    @classmethod
    def from_codes(cls, group_nr: int, coarseness: int, unit: str) -> BinLayout:
        """The layout of codes read from outside (a message, a state file), checked.

        Args:
            group_nr: fio's GROUP_NR, :data:`MIN_GROUP_NR`..:data:`MAX_GROUP_NR`.
            coarseness: 0..:data:`MAX_COARSENESS`.
            unit: the unit's name, ``"ns"`` or ``"us"``.

        Raises:
            LayoutError: a code out of range or an unknown unit (the text says which).
        """
        for known in _UNIT_NS:  # the Literal value itself, so no cast is needed
            if unit == known:
                try:
                    return cls(group_nr, coarseness, known)
                except ValueError as exc:
                    raise LayoutError(str(exc)) from None
        msg = f"unit must be 'ns' or 'us', got {unit!r}"
        raise LayoutError(msg)

    @property
    def fine_nbins(self) -> int:
        """Number of fine bins, ``group_nr * 64``."""
        return self.group_nr * PLAT_VAL

    @property
    def nbins(self) -> int:
        """Number of bins in this layout (columns of a hist-log line minus 3)."""
        return self.fine_nbins >> self.coarseness

    @property
    def unit_ns(self) -> int:
        """Nanoseconds per fio value unit (1 for ns, 1000 for µs)."""
        return _UNIT_NS[self.unit]

    def edges_ns(self) -> tuple[FloatArray, FloatArray]:
        """Exact lower and upper edge of every bin, in ns (read-only float64 arrays)."""
        return _edges_ns(self.group_nr, self.coarseness, self.unit_ns)

    def mids_ns(self) -> FloatArray:
        """Midpoint of every bin, in ns (read-only)."""
        return _mids_ns(self.group_nr, self.coarseness, self.unit_ns)

    @property
    def cap_ns(self) -> float:
        """Lower edge of the last bin: every latency at or above it is clamped there."""
        return float(self.edges_ns()[0][-1])

    def describe(self) -> str:
        """Short human description, e.g. ``1856 bins (GROUP_NR 29, coarseness 0, ns)``."""
        return (
            f"{self.nbins} bins (GROUP_NR {self.group_nr}, coarseness {self.coarseness}, "
            f"{self.unit})"
        )


def fine_lower_upper(fine_idx: IntArray) -> tuple[IntArray, IntArray]:
    """Exact integer edges ``[lower, upper)`` of fine bins, in fio's value unit."""
    j = np.asarray(fine_idx, dtype=np.int64)
    small = j < 2 * PLAT_VAL
    e = np.maximum((j >> PLAT_BITS) - 1, 0)
    k = j & (PLAT_VAL - 1)
    width = np.left_shift(np.int64(1), e)
    lower = np.where(small, j, np.left_shift(np.int64(1), e + PLAT_BITS) + k * width)
    upper = np.where(small, j + 1, lower + width)
    return lower, upper


def plat_idx_to_val(fine_idx: IntArray) -> IntArray:
    """Fio's ``plat_idx_to_val``: the value fio reports for a fine bin (its midpoint).

    Bins below 128 report their exact value; above, ``lower + 2**(e - 1)``.
    """
    j = np.asarray(fine_idx, dtype=np.int64)
    lower, upper = fine_lower_upper(j)
    return np.where(j < 2 * PLAT_VAL, j, lower + (upper - lower) // 2)


def plat_val_to_idx(values: IntArray, group_nr: int = FIO3_GROUP_NR) -> IntArray:
    """Fio's ``plat_val_to_idx``: the fine bin of each value, clamped to the last bin."""
    v = np.asarray(values, dtype=np.int64)
    if v.size and int(v.min()) < 0:
        msg = "latency values must be non-negative"
        raise ValueError(msg)
    # frexp gives v = m * 2**exp with m in [0.5, 1): msb = exp - 1 (exact below 2**53;
    # anything that large is clamped into the last bin anyway).
    msb = np.where(v > 0, np.frexp(v.astype(np.float64))[1].astype(np.int64) - 1, 0)
    error_bits = np.maximum(msb - PLAT_BITS, 0)
    base = (error_bits + 1) << PLAT_BITS
    offset = (PLAT_VAL - 1) & np.right_shift(v, error_bits)
    last = group_nr * PLAT_VAL - 1
    return np.where(msb <= PLAT_BITS, v, np.minimum(base + offset, last)).astype(np.int64)


@functools.cache
def _edges_ns(group_nr: int, coarseness: int, unit_ns: int) -> tuple[FloatArray, FloatArray]:
    n = (group_nr * PLAT_VAL) >> coarseness
    stride = 1 << coarseness
    first = np.arange(n, dtype=np.int64) * stride
    lower, _ = fine_lower_upper(first)
    _, upper = fine_lower_upper(first + stride - 1)
    lo = lower.astype(np.float64) * unit_ns
    hi = upper.astype(np.float64) * unit_ns
    lo.flags.writeable = False
    hi.flags.writeable = False
    return lo, hi


@functools.cache
def _mids_ns(group_nr: int, coarseness: int, unit_ns: int) -> FloatArray:
    lo, hi = _edges_ns(group_nr, coarseness, unit_ns)
    mids = (lo + hi) / 2
    mids.flags.writeable = False
    return mids


def candidate_layouts(nbins: int, group_nr: int | None = None) -> list[BinLayout]:
    """Every layout with ``nbins`` bins, finest first (smallest coarseness).

    Args:
        nbins: number of histogram columns in a hist-log line (columns minus 3).
        group_nr: restrict to this GROUP_NR (``--group-nr``).
    """
    found = []
    for c in range(MAX_COARSENESS + 1):
        fine = nbins << c
        if fine % PLAT_VAL:
            continue
        g = fine // PLAT_VAL
        if group_nr is not None and g != group_nr:
            continue
        if MIN_GROUP_NR <= g <= MAX_GROUP_NR:
            unit: Unit = "us" if g == FIO2_GROUP_NR else "ns"
            found.append(BinLayout(g, c, unit))
    return found


def detect_layout(
    nbins: int, *, group_nr: int | None = None, unit: Unit | None = None
) -> BinLayout:
    """The layout of a histogram with ``nbins`` bins.

    The finest candidate wins (1856 bins is GROUP_NR 29 at coarseness 0, not 58 at 1).
    A 1216-family count implies fio 2 and µs unless ``unit`` says otherwise.

    Raises:
        LayoutError: no layout has that many bins; the message lists the counts that
            would fit.
    """
    found = candidate_layouts(nbins, group_nr)
    if not found:
        groups = [group_nr] if group_nr is not None else [FIO3_GROUP_NR, FIO2_GROUP_NR]
        counts = ", ".join(
            f"{(g * PLAT_VAL) >> c} (GROUP_NR {g}, coarseness {c})"
            for g in groups
            for c in range(MAX_COARSENESS + 1)
        )
        hint = "" if group_nr is not None else "; pass --group-nr if fio was rebuilt"
        msg = f"{nbins} histogram bins fit no fio layout; counts that would: {counts}{hint}"
        raise LayoutError(msg)
    layout = found[0]
    if unit is not None and unit != layout.unit:
        layout = BinLayout(layout.group_nr, layout.coarseness, unit)
    return layout


def merged_layout(a: BinLayout, b: BinLayout) -> BinLayout:
    """The layout histograms of ``a`` and ``b`` both merge into exactly: the coarser one.

    This is fiomon's one layout-merge rule: the same ``group_nr`` and unit are needed
    (bins of different groups or units have no common edges), and a finer histogram is
    summed into the coarser one's bins (:func:`coarsen_counts`), never the other way.

    Raises:
        LayoutError: the layouts differ in group_nr or unit; the message names both.
    """
    if a.group_nr != b.group_nr or a.unit != b.unit:
        msg = (
            f"bin layouts {a.describe()} and {b.describe()} cannot merge exactly "
            "(GROUP_NR and unit must match)"
        )
        raise LayoutError(msg)
    return a if a.coarseness >= b.coarseness else b


def coarsen_counts(bins: IntArray, source: BinLayout, target: BinLayout) -> IntArray:
    """Map bin indices of ``source`` onto the coarser ``target`` (same group_nr and unit).

    Coarsening is exact aggregation (a target bin is a union of source bins), never a
    resampling.

    Raises:
        LayoutError: the layouts differ in group_nr or unit, or target is finer.
    """
    if source == target:
        return bins
    if merged_layout(source, target) != target:
        msg = f"cannot merge histograms of {source.describe()} into {target.describe()}"
        raise LayoutError(msg)
    return np.right_shift(bins, target.coarseness - source.coarseness)


def coarsen_hist(hist: FloatArray, source: BinLayout, target: BinLayout) -> FloatArray:
    """Dense counts per bin of ``source`` summed into the bins of the coarser ``target``.

    The dense form of :func:`coarsen_counts` (the same index map, one rule): target bin
    ``i`` holds the sum of the source bins whose index ``>> (target.coarseness -
    source.coarseness)`` is ``i``. Exact aggregation, never a resampling; float counts
    are summed in bin order.

    Raises:
        LayoutError: the layouts differ in group_nr or unit, target is finer, or ``hist``
            is not ``source.nbins`` long.
    """
    if len(hist) != source.nbins:
        msg = f"a histogram of {len(hist)} bins is not of {source.describe()}"
        raise LayoutError(msg)
    if source == target:
        return hist
    index = coarsen_counts(np.arange(source.nbins, dtype=np.int64), source, target)
    return np.bincount(index, weights=hist, minlength=target.nbins).astype(np.float64, copy=False)
