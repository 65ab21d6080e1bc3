"""SLA thresholds from a baseline run: what a healthy run never held for ``for`` quanta.

An SLA rule (``aggregator.yaml``'s ``sla``) fires when a quantum's percentile is above its
threshold for ``for`` quanta in a row, counting only quanta with at least
``min_samples`` I/Os (the others are no evidence and break no run). So the one number of
a healthy baseline run that decides whether a threshold would have fired on it is its
**sustained worst**: the highest value it held for ``for`` evidence quanta in a row (the
largest minimum over every ``for`` consecutive evidence quanta). A threshold at or above
it never fires on the baseline; :func:`suggest_rules` puts it at ``margin`` times that,
rounded up to two significant digits.

Per host (``scope: host``) the sustained worst is the highest of the hosts' own.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from fiomon.closed import ClosedQuantum
from fiomon.histogram import pct_key
from fiomon.units import format_latency_ns


@dataclass(frozen=True, slots=True)
class Baseline:
    """One (scope, direction, percentile) of a baseline run.

    Args:
        scope: ``cluster`` or ``host``.
        direction: ``read``, ``write``, ``trim``, ``mixed`` or ``all``.
        percentile: in percent.
        quanta: evidence quanta (at least ``min_samples`` I/Os), over every host for host
            scope.
        median_ns: the median of the evidence quanta's values.
        worst_ns: the highest value of one quantum.
        sustained_ns: the highest value held for ``for_quanta`` evidence quanta in a row;
            None when no series has that many.
        host: for host scope, the host whose sustained worst is the highest.
    """

    scope: str
    direction: str
    percentile: float
    quanta: int
    median_ns: float
    worst_ns: float
    sustained_ns: float | None
    host: str | None = None


def sustained_worst(values: Sequence[float], for_quanta: int) -> float | None:
    """The highest value held for ``for_quanta`` values in a row (None: too few values)."""
    if len(values) < for_quanta:
        return None
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(values), for_quanta)
    return float(windows.min(axis=1).max())


def baselines(
    rows: Iterable[ClosedQuantum],
    percentiles: Sequence[float],
    *,
    for_quanta: int,
    min_samples: float,
) -> list[Baseline]:
    """The baseline of each (scope, direction, percentile) the rows hold."""
    series: dict[tuple[str, str, float, str | None], list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        if row.stats.samples < min_samples:
            continue
        for q in percentiles:
            value = row.stats.percentiles_ns.get(pct_key(q))
            if value is not None:
                series[(row.scope, row.direction, q, row.host)].append((row.end_ms, value))
    grouped: dict[tuple[str, str, float], list[tuple[str | None, list[float]]]] = defaultdict(list)
    for (scope, direction, q, host), points in series.items():
        grouped[(scope, direction, q)].append((host, [v for _, v in sorted(points)]))
    out = []
    for (scope, direction, q), per_host in sorted(grouped.items(), key=_order):
        values = [v for _, vs in per_host for v in vs]
        held = [(sustained_worst(vs, for_quanta), host) for host, vs in per_host]
        known = [(s, h) for s, h in held if s is not None]
        top, host = max(known, key=lambda x: x[0]) if known else (None, None)
        out.append(
            Baseline(
                scope=scope,
                direction=direction,
                percentile=q,
                quanta=len(values),
                median_ns=float(np.median(values)),
                worst_ns=max(values),
                sustained_ns=top,
                host=host if scope == "host" else None,
            )
        )
    return out


_DIRECTION_ORDER = ("read", "write", "trim", "mixed", "all")


def _order(item: tuple[tuple[str, str, float], object]) -> tuple[int, int, float]:
    (scope, direction, q), _ = item
    d = _DIRECTION_ORDER.index(direction) if direction in _DIRECTION_ORDER else 9
    return (scope != "cluster", d, q)


def round_up_latency(ns: float) -> str:
    """``ns`` rounded up to two significant digits, as a config latency (``410us``)."""
    unit, scale = ("ms", 1e6) if ns >= 1e6 else ("us", 1e3) if ns >= 1e3 else ("ns", 1.0)
    v = ns / scale
    step = 10.0 ** (math.floor(math.log10(v)) - 1)
    rounded = math.ceil(v / step - 1e-9) * step
    return f"{float(f'{rounded:.2g}'):g}{unit}"


def _lat(ns: float) -> str:
    return format_latency_ns(ns)


def suggest_rules(
    found: Sequence[Baseline],
    *,
    margin: float,
    for_quanta: int,
    min_samples: int,
    quantum_ms: int | None,
    span_ms: tuple[int, int] | None,
) -> tuple[str, list[str]]:
    """The ``sla:`` block of suggested rules (YAML with comments), and notes for stderr."""
    notes = []
    quantum = f"{quantum_ms / 1000:g} s" if quantum_ms else "the run's"
    lines = ["# SLA rules from a baseline run (fiomon baseline)"]
    if span_ms is not None:
        start, end = (datetime.fromtimestamp(t / 1000, UTC) for t in span_ms)
        lines.append(f"# run: {start:%Y-%m-%d %H:%M:%S} to {end:%H:%M:%S} UTC, quanta of {quantum}")
    lines += [
        f"# threshold: {margin:g} x the sustained worst, the highest value the baseline held",
        f"# for {for_quanta} quanta in a row (quanta under {min_samples} I/Os are no evidence,",
        f"# as in the rule). The aggregator's quantum must be the baseline's ({quantum}).",
        "sla:",
    ]
    for b in found:
        what = f"p{b.percentile:g} {b.direction} ({b.scope})"
        tail = min_samples * (1 - b.percentile / 100)
        if tail < 1 - 1e-9:  # not one I/O above the percentile: one slow I/O decides
            notes.append(
                f"{what}: min_samples {min_samples} leaves {tail:.2g} I/Os above the "
                f"p{b.percentile:g} of a quantum, so one slow I/O decides; raise "
                f"--min-samples to {round(10 / (1 - b.percentile / 100))} (10 I/Os above "
                "it), or give the rule confidence (config/aggregator.example.yaml)"
            )
        if b.sustained_ns is None:
            notes.append(
                f"{what}: {b.quanta} evidence quanta, fewer than for={for_quanta} in a row: "
                "no rule (a longer baseline run, or a smaller --min-samples)"
            )
            continue
        where = f" on {b.host}" if b.host else ""
        lines.append(
            f"  # {what}: median {_lat(b.median_ns)}, worst quantum {_lat(b.worst_ns)}, "
            f"sustained worst {_lat(b.sustained_ns)}{where} ({b.quanta} quanta)"
        )
        name = f"p{b.percentile:g}-{b.direction}"
        name += "-per-host" if b.scope == "host" else ""
        scope = ", scope: host" if b.scope == "host" else ""
        threshold = round_up_latency(margin * b.sustained_ns)
        lines.append(
            f"  - {{name: {name}, direction: {b.direction}, percentile: {b.percentile:g}, "
            f"threshold: {threshold}{scope}, for: {for_quanta}, min_samples: {min_samples}}}"
        )
    if lines[-1] == "sla:":
        lines[-1] = "sla: []"
    return "\n".join(lines) + "\n", notes
