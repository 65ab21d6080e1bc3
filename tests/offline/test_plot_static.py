"""``fiomon plot -o .png|.svg``: the static figure checked as a picture, not only "not blank".

The runs are simulated fio hist logs (:mod:`fiomon.tools.simulate`, fio's own format and
binning) read by the report's engine, exactly as ``fiomon plot`` reads them; the checks look
at the drawn matplotlib objects, the rendered pixels and the SVG's text.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm, to_hex, to_rgb
from matplotlib.figure import Figure

from fiomon.bins import BinLayout
from fiomon.errors import ConfigError
from fiomon.offline.plotdata import SURFACE_PERCENTILES, PlotData, SlaLine, parse_sla
from fiomon.offline.plotstatic import build_figure, log_ticks
from fiomon.offline.quanta import QuantaOptions
from fiomon.offline.report import run_report
from fiomon.palette import SLA_COLOUR, percentile_colour
from fiomon.tools.simulate import JobSpec, LatencyModel, format_line, records
from tests.offline.test_plot import START_MS, fiomon, make_logs

GAP = (START_MS + 20_000, START_MS + 40_000)  # no I/O in this window (gapped runs)


def gapped_logs(folder: Path, hosts: int = 2, seconds: int = 60) -> list[Path]:
    """Hist logs with no I/O from 20 s to 40 s: fio keeps writing records, all zero.

    host01 is 6x slower from 45 s to 52 s.
    """
    return make_logs(
        folder,
        hosts,
        seconds,
        seed=5,
        slow=("host01", 45_000, 52_000, 6.0),
        phases=[100 * h for h in range(hosts)],
        idle=GAP,
    )


def plot_doc(
    logs: list[Path],
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9),
    *,
    per_host: bool = False,
    sla: tuple[SlaLine, ...] = (),
    max_points: int = 2000,
) -> dict[str, Any]:
    """The document ``fiomon plot`` draws, built the way it builds it."""
    opts = QuantaOptions(percentiles=percentiles, per_host=per_host)
    holder: list[PlotData] = []

    def sink(layout: BinLayout, relative: bool) -> PlotData:
        holder.append(PlotData(opts.percentiles, layout, relative))
        return holder[0]

    run_report(logs, opts, io.StringIO(), sink=sink)
    hosts = [p.name.split("_")[0] for p in logs]
    return holder[0].document(title="test", sla=sla, hosts=hosts, max_points=max_points)


def axes(fig: Figure, label: str) -> Axes:
    (ax,) = [a for a in fig.axes if a.get_label() == label]
    return ax


def pixels(fig: Figure) -> npt.NDArray[np.uint8]:
    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # type: ignore[no-untyped-call]
    rgba: npt.NDArray[np.uint8] = np.asarray(canvas.buffer_rgba())  # type: ignore[no-untyped-call]
    return rgba[:, :, :3]


def near(img: npt.NDArray[np.uint8], colour: str, tol: int = 40) -> npt.NDArray[np.bool_]:
    want = np.asarray(to_rgb(colour)) * 255
    close: npt.NDArray[np.bool_] = np.abs(img.astype(np.int64) - want).max(axis=2) <= tol
    return close


def column_span(fig: Figure, ax: Axes, t0_ms: float, t1_ms: float) -> tuple[slice, slice]:
    """Image rows and columns of ``ax`` between two epoch-ms times."""
    from matplotlib.dates import date2num  # noqa: PLC0415

    x0, x1 = (
        float(date2num(np.datetime64(int(t), "ms")))  # type: ignore[no-untyped-call]
        for t in (t0_ms, t1_ms)
    )
    (px0, _), (px1, _) = ax.transData.transform([(x0, 1.0), (x1, 1.0)])
    box = ax.get_window_extent()
    height = fig.bbox.height
    rows = slice(int(height - box.y1) + 2, int(height - box.y0) - 2)  # image rows go down
    return rows, slice(int(np.ceil(px0)), int(px1))


@pytest.fixture(scope="module")
def run4(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Four hosts, 60 s; host02 is 8x slower from 20 s to 35 s."""
    return make_logs(tmp_path_factory.mktemp("run4"), hosts=4, seconds=60)


# -- time axes and titles -----------------------------------------------------------------


def test_time_axes_are_utc_clock_times_and_the_title_names_hosts_and_date(
    run4: list[Path], tmp_path: Path
) -> None:
    fig = build_figure(plot_doc(run4, per_host=True))
    pixels(fig)  # draws: tick labels exist after a draw
    for label in ("lat-read", "throughput", "surface"):  # inner panels hide the labels
        ax = axes(fig, label)
        lo, hi = ax.get_xlim()
        ticks = ax.xaxis.get_major_formatter().format_ticks(
            [x for x in ax.get_xticks() if lo <= x <= hi]
        )
        assert len(ticks) >= 3, ticks
        assert all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in ticks), ticks
    assert axes(fig, "surface").get_xlabel() == "time (UTC)"
    assert [t.get_text() for t in axes(fig, "surface").get_xticklabels()] == ticks
    title = fig.get_suptitle()
    assert "4 hosts: host00, host01, host02, host03" in title
    assert "2026-11-18 11:06:39 - 11:07:41 UTC (62 s)" in title  # START_MS is 11:06:40 UTC
    # The command's SVG says the same (matplotlib keeps each text as a comment).
    target = tmp_path / "run.svg"
    out = fiomon("plot", *run4, "-o", target)
    assert out.returncode == 0, out.stderr
    svg = target.read_text()
    assert "epoch s" not in svg
    assert "time (UTC)" in svg
    assert "4 hosts: host00, host01, host02, host03" in svg
    assert re.search(r"<!-- 11:07:00 -->", svg)


def test_many_hosts_and_runs_are_abbreviated_in_the_title(run4: list[Path]) -> None:
    doc = plot_doc(run4[:1])
    doc["hosts"] = [f"node{i:03d}" for i in range(40)]
    doc["runs"] = ["randread-4k", "seqwrite-1m"]
    title = build_figure(doc).get_suptitle()
    assert "40 hosts: node000, node001, node002, node003, node004, node005 and 34 more" in title
    assert "2 runs: randread-4k, seqwrite-1m" in title
    assert "node006" not in title


# -- colours ------------------------------------------------------------------------------


def test_a_percentile_keeps_its_colour_whatever_else_is_drawn(run4: list[Path]) -> None:
    got = []
    for pcts in ((50.0, 99.0), (90.0, 95.0, 99.0, 99.9)):
        fig = build_figure(plot_doc(run4[:2], pcts))
        for d in ("read", "write"):
            (line,) = [x for x in axes(fig, f"lat-{d}").get_lines() if x.get_label() == "p99"]
            got.append(to_hex(line.get_color()))
    assert set(got) == {percentile_colour(99.0)}
    # ... and the pixels of the line are that colour
    img = pixels(fig)
    rows, cols = column_span(fig, axes(fig, "lat-read"), START_MS + 5_000, START_MS + 55_000)
    assert near(img[rows, cols], percentile_colour(99.0), tol=10).sum() > 100


def test_colour_bars_are_in_ms_with_several_ticks_on_a_log_scale(
    run4: list[Path], tmp_path: Path
) -> None:
    fig = build_figure(plot_doc(run4, per_host=True))
    pixels(fig)
    for name in ("cbar-hosts", "cbar-surface"):
        cbar = axes(fig, name)
        assert "(ms)" in cbar.get_ylabel()
        assert "log10" not in cbar.get_ylabel()
        labels = [t.get_text() for t in cbar.get_yticklabels() if t.get_text()]
        assert len(labels) >= 3, labels
        values = [float(t) for t in labels]  # plain ms numbers, not exponents
        assert values == sorted(values)
        assert values[-1] / values[0] >= 2
    for label in ("hosts", "surface"):
        (mesh,) = axes(fig, label).collections
        assert isinstance(mesh.norm, LogNorm)
        assert mesh.get_cmap().name == "viridis"
    target = tmp_path / "run.svg"
    assert fiomon("plot", "--per-host", *run4, "-o", target).returncode == 0
    assert "log10" not in target.read_text()


@pytest.mark.parametrize(
    ("lo", "hi"), [(0.31, 0.34), (0.3, 0.9), (0.2, 30.0), (1.5, 3000.0), (12.0, 15.0)]
)
def test_log_ticks_are_at_least_three_inside_the_range(lo: float, hi: float) -> None:
    ticks = log_ticks(lo, hi)
    assert len(ticks) >= 3
    assert all(lo * 0.95 <= t <= hi * 1.05 for t in ticks)


# -- SLA lines ----------------------------------------------------------------------------


def test_parse_sla() -> None:
    assert parse_sla("p99:read:5ms") == SlaLine(5e6, "99", "read")
    assert parse_sla("p99:read:5ms").label == "SLA p99 read 5 ms"
    assert parse_sla("write:500us").label == "SLA write 0.5 ms"
    assert parse_sla("2ms").label == "SLA 2 ms"
    assert parse_sla("p99.9:2ms") == SlaLine(2e6, "99.9", None)
    for bad in ("p99:reed:5ms", "p200:5ms", "read:write:5ms", "p99:fast"):
        with pytest.raises(ConfigError):
            parse_sla(bad)


def test_the_sla_line_is_labelled_black_dashed_and_only_on_its_direction(
    run4: list[Path], tmp_path: Path
) -> None:
    fig = build_figure(plot_doc(run4, sla=(parse_sla("p99:read:2ms"),)))
    label = "SLA p99 read 2 ms"
    read, write = axes(fig, "lat-read"), axes(fig, "lat-write")
    assert [t.get_text() for t in read.texts] == [label]
    (line,) = [x for x in read.get_lines() if x.get_label() == label]
    assert to_hex(line.get_color()) == SLA_COLOUR
    assert line.get_linestyle() == "--"
    assert to_hex(line.get_color()) != percentile_colour(99.9)
    assert np.asarray(line.get_ydata(), float).tolist() == [2.0, 2.0]
    for ax in (write, axes(fig, "lat-all")):
        assert not ax.texts
        assert label not in [x.get_label() for x in ax.get_lines()]
    # The command: the label is drawn twice (on the line and in the legend), once per panel.
    target = tmp_path / "sla.svg"
    out = fiomon("plot", "--sla", "p99:read:2ms", *run4, "-o", target)
    assert out.returncode == 0, out.stderr
    assert target.read_text().count(f"<!-- {label} -->") == 2
    out = fiomon("plot", "--sla", "p99:sideways:2ms", *run4, "-o", tmp_path / "x.svg")
    assert out.returncode == 2
    assert "p99:read:5ms" in out.stderr


# -- gaps ---------------------------------------------------------------------------------


def test_an_idle_gap_stays_empty(tmp_path: Path) -> None:
    logs = gapped_logs(tmp_path)
    doc = plot_doc(logs, per_host=True)
    fig = build_figure(doc)
    img = pixels(fig)
    inside = (GAP[0] + 2_000, GAP[1] - 2_000)  # well within the idle window
    before = (START_MS + 3_000, GAP[0] - 2_000)
    for d in ("read", "write"):
        ax = axes(fig, f"lat-{d}")
        for k in ("50", "99"):
            (line,) = [x for x in ax.get_lines() if x.get_label() == f"p{k}"]
            colour = to_hex(line.get_color())
            rows, cols = column_span(fig, ax, *before)
            assert near(img[rows, cols], colour, tol=10).sum() > 50, (d, k)  # drawn before
            rows, cols = column_span(fig, ax, *inside)
            assert near(img[rows, cols], colour, tol=40).sum() == 0, (d, k)  # not across
    # IOPS lines break too, and the heatmaps leave the idle columns blank.
    ax = axes(fig, "throughput")
    rows, cols = column_span(fig, ax, *inside)
    for line in ax.get_lines():
        assert near(img[rows, cols], to_hex(line.get_color()), tol=30).sum() == 0
    for label in ("surface", "hosts"):
        rows, cols = column_span(fig, axes(fig, label), *inside)
        blank = near(img[rows, cols], "#ffffff", tol=3)
        assert blank.mean() > 0.97, (label, blank.mean())
        rows, cols = column_span(fig, axes(fig, label), *before)
        assert near(img[rows, cols], "#ffffff", tol=3).mean() < 0.05
    for host in ("host00", "host01"):
        ax = axes(fig, f"host-lat-{host}")
        rows, cols = column_span(fig, ax, *inside)
        assert near(img[rows, cols], percentile_colour(99.0), tol=40).sum() == 0


def test_the_latency_heatmap_counts_every_io(run4: list[Path]) -> None:
    for max_points in (2000, 40):  # as is, and down-sampled (a group's counts spread out)
        doc = plot_doc(run4, max_points=max_points)
        (read,) = [s for s in doc["series"] if s["scope"] == "cluster" and s["direction"] == "read"]
        fig = build_figure(doc)
        ax = axes(fig, "heat")
        (mesh,) = ax.collections
        values = mesh.get_array()
        assert values is not None
        total = float(np.ma.sum(values))
        assert abs(total - sum(read["samples"])) < 1e-3 * total, max_points
        assert ax.get_yscale() == "log"
        assert "(ms)" in ax.get_ylabel()
        pixels(fig)
        labels = [t.get_text() for t in axes(fig, "cbar-heat").get_yticklabels() if t.get_text()]
        assert len(labels) >= 3


def test_downsampled_heatmaps_cover_every_quantum(run4: list[Path]) -> None:
    # Host series of different lengths are grouped at different quanta when down-sampled;
    # each cell must still cover its own time (no holes where another host's group ends).
    doc = plot_doc(run4, per_host=True, max_points=40)
    assert doc["downsampled"] > 1
    fig = build_figure(doc)
    for label in ("hosts", "surface"):
        (mesh,) = axes(fig, label).collections
        values = mesh.get_array()
        assert values is not None
        cells = np.ma.getmaskarray(values)
        inner = cells[:, 1:-1]  # a host's first and last quanta may be another's edge
        assert inner.mean() == 0, (label, inner.mean())


# -- the surface --------------------------------------------------------------------------


def test_the_surface_has_thirty_percentiles_from_the_histograms(
    run4: list[Path], tmp_path: Path
) -> None:
    doc = plot_doc(run4)
    keys = doc["surface_percentiles"]
    assert keys[0] == "50"
    assert keys[-1] == "99.99"
    assert len(keys) == len(SURFACE_PERCENTILES) == 30
    nines = -np.log10(1 - np.asarray(keys, float) / 100)
    assert np.diff(nines).max() < 0.2  # spread evenly on the nines axis
    (read,) = [s for s in doc["series"] if s["scope"] == "cluster" and s["direction"] == "read"]
    surface = np.asarray([read["surface"][k] for k in keys], float)
    assert surface.shape == (30, len(read["end"]))
    assert (np.diff(surface, axis=0) >= 0).all()  # latency grows with the percentile
    for k in ("50", "90", "99", "99.9"):  # the same numbers as the rows' own percentiles
        np.testing.assert_allclose(surface[keys.index(k)], read["p"][k], rtol=1e-3)
    fig = build_figure(doc)
    (mesh,) = axes(fig, "surface").collections
    assert mesh.get_array().shape[0] == 30  # type: ignore[union-attr]
    ticks = [t.get_text() for t in axes(fig, "surface").get_yticklabels()]
    assert ticks == ["p50", "p90", "p99", "p99.9", "p99.99"]
    # The page gets the same surface.
    target = tmp_path / "run.html"
    assert fiomon("plot", *run4, "-o", target).returncode == 0
    m = re.search(r'id="fiomon-data">(.*?)</script>', target.read_text(), re.S)
    assert m is not None
    page = json.loads(m.group(1))
    assert page["surface_percentiles"] == keys
    (pread,) = [s for s in page["series"] if s["scope"] == "cluster" and s["direction"] == "read"]
    assert pread["surface"] == read["surface"]


# -- per-host small multiples -------------------------------------------------------------


def test_per_host_small_multiples_share_their_axes(run4: list[Path], tmp_path: Path) -> None:
    fig = build_figure(plot_doc(run4, per_host=True))
    lat = [axes(fig, f"host-lat-host{i:02d}") for i in range(4)]
    iops = [axes(fig, f"host-iops-host{i:02d}") for i in range(4)]
    for a in lat[1:]:
        assert lat[0].get_shared_y_axes().joined(lat[0], a)
        assert lat[0].get_shared_x_axes().joined(lat[0], a)
    for a in iops[1:]:
        assert iops[0].get_shared_y_axes().joined(iops[0], a)
    assert [a.get_title() for a in lat] == ["host00", "host01", "host02", "host03"]
    for a in lat:
        assert [x.get_label() for x in a.get_lines()][:4] == ["p50", "p90", "p99", "p99.9"]
    # host02, slow from 20 s to 35 s, has the highest p99 of the four
    peaks = [np.nanmax(a.get_lines()[2].get_ydata()) for a in lat]
    assert int(np.argmax(peaks)) == 2
    for a in iops:
        y = np.asarray(a.get_lines()[0].get_ydata(), float)
        assert 300 < np.nanmedian(y) < 500  # each simulated host does 400 IOPS per direction
    # One host: no small multiples.
    fig = build_figure(plot_doc(run4[:1], per_host=True))
    assert not [a for a in fig.axes if str(a.get_label()).startswith("host-lat-")]
    target = tmp_path / "hosts.svg"
    assert fiomon("plot", "--per-host", *run4, "-o", target).returncode == 0
    assert "per host: read percentiles" in target.read_text()


def test_the_command_draws_the_documented_figure(tmp_path: Path) -> None:
    """The README's picture (FIOMON_SCREENSHOTS=docs copies it there): 4 hosts, one gap."""
    logs = gapped_logs(tmp_path, hosts=4)
    target = tmp_path / "plot.png"
    out = fiomon("plot", "--per-host", "--sla", "p99:read:2ms", *logs, "-o", target)
    assert out.returncode == 0, out.stderr
    body = target.read_bytes()
    assert body.startswith(b"\x89PNG")
    assert len(body) > 100_000
    folder = os.environ.get("FIOMON_SCREENSHOTS")
    if folder:
        (Path(folder) / "plot-offline.png").write_bytes(body)


def test_relative_times_are_labelled_seconds_since_job_start(tmp_path: Path) -> None:
    # fio logs without log_unix_epoch count from the job's start, and quanta start before
    # the first record: the axis read "s since the earliest record" and went negative.
    counts = np.zeros(BinLayout().nbins, np.int64)
    counts[400] = 300
    log = tmp_path / "h_clat_hist.1.log"
    log.write_text("".join(format_line(t, 0, 4096, counts) for t in (505, 1505, 2505, 3505)))
    fig = build_figure(plot_doc([log]))
    label = axes(fig, "surface").get_xlabel()
    assert label == "s since job start", label
    assert "relative times" in fig.get_suptitle()


def test_every_hosts_iops_line_is_inside_the_shared_iops_axis(tmp_path: Path) -> None:
    # Each panel's set_ylim(bottom=0) froze the shared axis at the first host's top: a
    # 10-IOPS host first gave every panel 0..11 IOPS, and a 500-IOPS host's line vanished.
    rng = np.random.default_rng(7)
    model = LatencyModel(head_mean_ns=300_000, head_sd_ns=80_000, tail_share=0.05)
    logs = []
    for name, rate in (("h1", 10), ("h2", 500)):
        path = tmp_path / f"{name}_clat_hist.1.log"
        spec = JobSpec(name, 1, iops=rate, phase_ms=0)
        with path.open("w") as fh:
            for end, d, counts, _ in records(
                spec, start_ms=START_MS, seconds=10, interval_ms=1000, model=model, rng=rng
            ):
                fh.write(format_line(end, d, 4096, counts))
        logs.append(path)
    fig = build_figure(plot_doc(logs, per_host=True))
    pixels(fig)
    for h in ("h1", "h2"):
        ax = axes(fig, f"host-iops-{h}")
        y = np.asarray(ax.get_lines()[0].get_ydata(), float)
        lo, hi = ax.get_ylim()
        assert lo == 0
        assert np.nanmax(y) < hi * 0.97, (h, np.nanmax(y), hi)  # inside, off the frame


def test_a_selection_with_no_io_is_an_error_not_an_empty_1970_chart(
    run4: list[Path], tmp_path: Path
) -> None:
    # `--directions trim` on a run without trims wrote an empty chart titled
    # "1970-01-01 00:00:00 - 00:00:00 UTC (0 s)" and exited 0.
    for name in ("t.png", "t.svg", "t.html"):
        r = fiomon("plot", "--directions", "trim", *run4, "-o", tmp_path / name)
        assert r.returncode == 1, (name, r.stderr)
        assert "nothing to draw: no I/O in the directions shown (trim" in r.stderr
        assert not (tmp_path / name).exists()
