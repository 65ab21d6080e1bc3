"""``fiomon fit``: the head + tail fit of a run's latencies, whole or per quantum."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TextIO

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout
from fiomon.errors import FiomonError, FitError
from fiomon.fio.problems import ProblemLog
from fiomon.fit import Fit, describe, fit_histogram
from fiomon.model import DIRECTION_LABELS
from fiomon.offline.exact import open_reader, whole_hists
from fiomon.offline.iosources import is_iolog
from fiomon.offline.quanta import QuantaOptions
from fiomon.offline.sources import SourceOptions, host_labels
from fiomon.offline.summary import Filters, collect

Format = Literal["text", "json"]


def run_fit(
    paths: Sequence[Path],
    *,
    directions: Sequence[str],
    source: SourceOptions,
    per_quantum_ms: int | None,
    fmt: Format,
    hosts: Filters | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Fit and print; returns the exit code (1 when nothing could be fitted).

    ``hosts`` keeps only the files of those hosts (its ``hosts`` and ``host_from``).
    """
    out = out or sys.stdout
    err = err or sys.stderr
    problems = ProblemLog(strict=source.strict)
    hosts = hosts or Filters()
    try:
        paths = _of_hosts(paths, hosts)
        if per_quantum_ms is None:
            results = _whole(paths, directions, source, problems)
        else:
            results = _per_quantum(paths, directions, source, problems, per_quantum_ms)
    except FiomonError as exc:
        problems.write_to(err)
        err.write(f"fiomon fit: {exc}\n")
        return 1
    problems.write_to(err)
    fitted = 0
    for label, end_ms, hist_fit in results:
        if isinstance(hist_fit, FitError):
            err.write(f"fiomon fit: {label}: cannot fit: {hist_fit}\n")
            continue
        fitted += 1
        if fmt == "json":
            doc = {"direction": label, "end_ms": end_ms, **hist_fit.to_json()}
            out.write(json.dumps({**doc, "latency": source.latency}) + "\n")
        else:
            # Another latency than clat is named with each fit ("read (lat)").
            kind = "" if source.latency == "clat" else f" ({source.latency})"
            name = f"{label}{kind}"
            out.write(describe(name if end_ms is None else f"{name} @ {end_ms}", hist_fit))
    return 0 if fitted else 1


def _of_hosts(paths: Sequence[Path], hosts: Filters) -> list[Path]:
    """The files whose host label is among ``hosts.hosts`` (all when it is empty).

    Raises:
        FiomonError: no file is left.
    """
    if not hosts.hosts:
        return list(paths)
    labels = host_labels(list(paths), hosts.host_from)
    kept = [p for p, h in zip(paths, labels, strict=True) if h in hosts.hosts]
    if not kept:
        here = ", ".join(sorted(set(labels)))
        msg = f"no file of host {', '.join(hosts.hosts)} (hosts here: {here})"
        raise FiomonError(msg)
    return kept


def _whole(
    paths: Sequence[Path], directions: Sequence[str], source: SourceOptions, problems: ProblemLog
) -> list[tuple[str, int | None, Fit | FitError]]:
    if paths and all(map(is_iolog, paths)):  # per-I/O logs: their values, binned
        layout = BinLayout()
        by_dir = whole_hists(paths, source.log_unit, problems)
    else:
        layout, acc = collect(paths, Filters(), source, problems)
        by_dir = {d: a.hist for d, a in acc.items()}
    hists = {DIRECTION_LABELS[d]: h for d, h in by_dir.items()}
    if by_dir:
        hists["all"] = np.sum(list(by_dir.values()), axis=0)
    out: list[tuple[str, int | None, Fit | FitError]] = []
    for label in directions:
        if label in hists:
            out.append((label, None, _try(hists[label], layout)))
    if not out:
        msg = f"no I/O of {', '.join(directions)} in the input"
        raise FiomonError(msg)
    return out


def _per_quantum(
    paths: Sequence[Path],
    directions: Sequence[str],
    source: SourceOptions,
    problems: ProblemLog,
    quantum_ms: int,
) -> list[tuple[str, int | None, Fit | FitError]]:
    # The report's own engine: files read in step (bounded memory), layouts checked.
    opts = QuantaOptions(
        quantum_ms=quantum_ms, directions=tuple(directions), source=source, keep_hists=True
    )
    out: list[tuple[str, int | None, Fit | FitError]] = []
    reader = open_reader(paths, opts)
    try:
        with reader:
            for rows in reader.chunks():
                for row in rows:
                    if row.scope == "cluster" and row.hist is not None:
                        out.append((row.direction, row.end_ms, _try(row.hist, reader.layout)))
    finally:
        problems.merge(reader.problems())
    return out


def _try(hist: npt.NDArray[np.float64], layout: BinLayout) -> Fit | FitError:
    try:
        return fit_histogram(hist, layout)
    except FitError as exc:
        return exc
