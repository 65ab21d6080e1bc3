"""One colour per percentile, everywhere fiomon draws (live page, HTML, PNG/SVG).

A percentile's colour depends on the percentile alone, never on which other percentiles
are drawn (``--percentiles 90,99`` and ``--percentiles 50,90,99`` give p99 one colour).
The common percentiles have fixed colours from a colour-blind-safe set (Okabe-Ito); any
other percentile takes the colour of its number of nines, ``-log10(1 - p/100)``,
interpolated along the same ramp, so p99.5 sits between p99 and p99.9.

SLA lines are never a percentile's colour: black, dashed, and labelled where drawn.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from fiomon.histogram import pct_key

# (nines, colour): p50, p90, p95, p99, p99.9, p99.99, p99.999
_RAMP: tuple[tuple[float, str], ...] = (
    (math.log10(2.0), "#0072b2"),  # p50 blue
    (1.0, "#009e73"),  # p90 green
    (math.log10(20.0), "#56b4e9"),  # p95 sky blue
    (2.0, "#e69f00"),  # p99 orange
    (3.0, "#d55e00"),  # p99.9 vermillion
    (4.0, "#cc79a7"),  # p99.99 reddish purple
    (5.0, "#6a3d9a"),  # p99.999 purple
)

SLA_COLOUR = "#000000"
"""SLA threshold lines: black (drawn dashed and labelled)."""

MEAN_COLOUR = "#555555"
"""The mean line."""

SATURATED_COLOUR = "#b00020"
"""Markers of percentiles that fall in fio's last (open) bin."""


def _hex(rgb: tuple[float, float, float]) -> str:
    return "#" + "".join(f"{max(0, min(255, round(c))):02x}" for c in rgb)


def _rgb(colour: str) -> tuple[float, float, float]:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))


def nines(percentile: float) -> float:
    """``-log10(1 - p/100)`` for a percentile ``p`` in (0, 100); 100 maps to 6 nines."""
    if not 0.0 < percentile <= 100.0:
        msg = f"percentile {percentile} not in (0, 100]"
        raise ValueError(msg)
    if percentile >= 100.0:
        return 6.0
    return -math.log10(1.0 - percentile / 100.0)


def percentile_colour(percentile: float) -> str:
    """The colour (``#rrggbb``) of ``percentile`` (in percent, e.g. 99.9)."""
    n = nines(percentile)
    for ramp_n, colour in _RAMP:
        if abs(ramp_n - n) < 1e-9:
            return colour
    if n <= _RAMP[0][0]:
        return _RAMP[0][1]
    if n >= _RAMP[-1][0]:
        return _RAMP[-1][1]
    for (n0, c0), (n1, c1) in itertools.pairwise(_RAMP):
        if n0 <= n <= n1:
            t = (n - n0) / (n1 - n0)
            a, b = _rgb(c0), _rgb(c1)
            return _hex(
                (a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1]), a[2] + t * (b[2] - a[2]))
            )
    return _RAMP[-1][1]  # unreachable: the ramp covers every n


def percentile_colours(percentiles: Sequence[float]) -> dict[str, str]:
    """``{"99.9": "#d55e00", ...}`` keyed as rows key percentiles (``pct_key``)."""
    return {pct_key(p): percentile_colour(p) for p in percentiles}
