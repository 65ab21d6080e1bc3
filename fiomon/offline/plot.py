"""``fiomon plot``: the report's closed quanta drawn as a page (HTML) or a figure (PNG/SVG).

The rows come from the report's own engine (:func:`fiomon.offline.report.run_report` with a
:class:`~fiomon.offline.plotdata.PlotData` sink), so the charts show exactly the numbers
``fiomon report`` prints for the same inputs and options.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from fiomon.bins import BinLayout
from fiomon.errors import PlotError
from fiomon.offline.plotdata import DEFAULT_MAX_POINTS, PlotData, SlaLine
from fiomon.offline.quanta import QuantaOptions
from fiomon.offline.quantafiles import all_quanta_files
from fiomon.offline.report import ReportSummary, run_report
from fiomon.offline.sources import host_labels
from fiomon.runtime import write_atomic
from fiomon.webpage import page_html

PlotKind = Literal["html", "png", "svg"]
KINDS: dict[str, PlotKind] = {".html": "html", ".htm": "html", ".png": "png", ".svg": "svg"}


def plot_kind(path: Path) -> PlotKind:
    """The output kind from the file's extension.

    Raises:
        PlotError: not .html, .png or .svg.
    """
    kind = KINDS.get(path.suffix.lower())
    if kind is None:
        msg = f"-o {path}: the extension must be .html, .png or .svg"
        raise PlotError(msg)
    return kind


def run_plot(
    paths: Sequence[Path],
    opts: QuantaOptions,
    output: Path,
    *,
    kind: PlotKind,
    title: str,
    sla: Sequence[SlaLine] = (),
    max_points: int = DEFAULT_MAX_POINTS,
) -> ReportSummary:
    """Read ``paths`` as ``fiomon report`` would and write the charts to ``output``.

    The file is written whole to a temporary name next to it, then renamed, so a failed
    run never leaves half a page.

    Raises:
        PlotError: a PNG/SVG without matplotlib (the ``plot`` extra).
        FiomonError: as :func:`fiomon.offline.report.run_report`.
    """
    if kind != "html":
        from fiomon.offline.plotstatic import require_matplotlib  # noqa: PLC0415

        require_matplotlib()  # before the work, not after it
    holder: list[PlotData] = []

    def sink(layout: BinLayout, relative: bool) -> PlotData:
        data = PlotData(opts.percentiles, layout, relative)
        holder.append(data)
        return data

    summary = run_report(paths, opts, io.StringIO(), sink=sink)
    if not holder or summary.records == 0:
        return summary
    # The run's hosts name the charts (host series add theirs with --per-host).
    hosts = [] if all_quanta_files(paths) else host_labels(list(paths), opts.host_from)
    doc = holder[0].document(title=title, sla=sla, hosts=hosts, max_points=max_points)
    if not any(s["end"] for s in doc["series"]):  # not an empty chart dated 1970
        shown = ",".join(opts.directions)
        msg = f"nothing to draw: no I/O in the directions shown ({shown}; --directions)"
        raise PlotError(msg)
    if kind == "html":
        body = page_html(data=doc, live=False, title=title).encode()
    else:
        from fiomon.offline.plotstatic import figure_bytes  # noqa: PLC0415

        body = figure_bytes(doc, kind)
    write_atomic(output, body)
    return summary
