"""``fiomon plot``: the page's data, its charts in a real browser, the static figure, sizes."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.heat import _bucket_of_bin, bucket_edge_ns, heat_counts
from fiomon.histogram import HistStats
from fiomon.offline.plotdata import PlotData
from fiomon.palette import percentile_colour
from fiomon.tools.simulate import JobSpec, LatencyModel, format_line, records
from tests.browser import Browser
from tests.pixels import chart_box, inked, load, near, x_of

ROOT = Path(__file__).resolve().parents[2]
START_MS = 1_795_000_000_000
SLOW_HOST = "host02"


def _shots() -> Path | None:
    """Where to copy screenshots for the docs (FIOMON_SCREENSHOTS), if anywhere."""
    folder = os.environ.get("FIOMON_SCREENSHOTS")
    return Path(folder) if folder else None


def make_logs(
    folder: Path,
    hosts: int = 4,
    seconds: int = 60,
    *,
    seed: int = 3,
    slow: tuple[str, int, int, float] | None = (SLOW_HOST, 20_000, 35_000, 8.0),
    phases: Sequence[int] | None = None,
    idle: tuple[int, int] | None = None,
) -> list[Path]:
    """Simulated hist logs ``hostNN_clat_hist.1.log`` of ``hosts`` hosts, 400 IOPS each.

    ``slow``: ``(host, from s, to s, factor)`` relative to START_MS (default: host02 is 8x
    slower from 20 s to 35 s); ``phases``: each host's record phase in ms (default: drawn
    from the seeded generator); ``idle``: an epoch-ms window ``(after, up to]`` with no I/O,
    where fio keeps writing records, all zero.
    """
    rng = np.random.default_rng(seed)
    model = LatencyModel(head_mean_ns=300_000, head_sd_ns=80_000, tail_share=0.05)
    empty = np.zeros(BinLayout().nbins, np.int64)
    paths = []
    for h in range(hosts):
        name = f"host{h:02d}"
        phase = int(rng.integers(0, 1000)) if phases is None else phases[h]
        spec = JobSpec(name, 1, iops=400, phase_ms=phase)
        window = None
        if slow is not None and name == slow[0]:
            window = (START_MS + slow[1], START_MS + slow[2], slow[3])
        path = folder / f"{name}_clat_hist.1.log"
        with path.open("w") as fh:
            for end, d, counts, _ in records(
                spec,
                start_ms=START_MS,
                seconds=seconds,
                interval_ms=1000,
                model=model,
                rng=rng,
                slow=window,
            ):
                quiet = idle is not None and idle[0] < end <= idle[1]
                fh.write(format_line(end, d, 4096, empty if quiet else counts))
        paths.append(path)
    return paths


def fiomon(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fiomon", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def report_rows(logs: list[Path], *extra: str) -> list[dict[str, Any]]:
    out = fiomon("report", "--format", "jsonl", *extra, *logs)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


# -- pure parts -------------------------------------------------------------------------


@pytest.mark.parametrize("coarseness", [0, 1, 3, 5])
def test_every_fio_bin_lies_wholly_in_its_heat_bucket(coarseness: int) -> None:
    layout = BinLayout(coarseness=coarseness)
    lower, upper = layout.edges_ns()
    k = _bucket_of_bin(layout)
    lo = np.array([bucket_edge_ns(int(i)) for i in k])
    hi = np.array([bucket_edge_ns(int(i) + 1) for i in k])
    real = lower >= 64  # below, coarse bins are a few ns wide (see fiomon/heat.py)
    assert (lower[real] >= lo[real]).all()
    assert (upper[real] <= hi[real]).all()


def test_heat_keeps_every_io() -> None:
    layout = BinLayout()
    rng = np.random.default_rng(1)
    hist = np.zeros(layout.nbins)
    hist[rng.integers(100, 1500, 500)] += rng.random(500) * 10
    heat = heat_counts(hist, layout)
    assert heat is not None
    assert math.isclose(sum(heat["counts"]), hist.sum(), rel_tol=1e-6)
    assert heat_counts(np.zeros(layout.nbins), layout) is None


def _row(
    end_ms: int,
    p99: float,
    samples: float = 10.0,
    ci: dict[str, tuple[float | None, float | None]] | None = None,
) -> ClosedQuantum:
    stats = HistStats(samples, p99 / 4, p99 / 3, p99 * 2, {"50": p99 / 3, "99": p99}, ())
    return ClosedQuantum(
        end_ms - 1000, end_ms, "cluster", None, "read", stats, 10.0, 4e4, 1, 0, ci_ns=ci
    )


def test_downsampled_bands_stay_conservative() -> None:
    data = PlotData([50.0, 99.0], None, relative=False)
    rng = np.random.default_rng(7)
    p99 = rng.uniform(1e6, 2e6, 1000)
    lo = p99 * rng.uniform(0.5, 0.99, 1000)
    hi = p99 * rng.uniform(1.01, 3.0, 1000)
    rows = []
    for i in range(1000):
        high = None if i == 433 else float(hi[i])  # one quantum whose p99 has no upper bound
        ci = {"50": (p99[i] / 4, p99[i] / 2), "99": (float(lo[i]), high)}
        rows.append(_row(START_MS + 1000 * i, float(p99[i]), ci=ci))
    data.write(rows)
    doc = data.document(title="t", max_points=100)
    (s,) = doc["series"]
    f = doc["downsampled"]
    assert f == 20
    for g in range(len(s["end"]) // 2):
        span = slice(g * f, (g + 1) * f)
        for j in (2 * g, 2 * g + 1):  # both points of a group carry the group's widest band
            assert math.isclose(s["lo"]["99"][j], lo[span].min(), rel_tol=1e-5)
            if g * f <= 433 < (g + 1) * f:
                assert s["hi"]["99"][j] is None  # unbounded in one quantum: unbounded
            else:
                assert math.isclose(s["hi"]["99"][j], hi[span].max(), rel_tol=1e-5)
            # the band holds the line's envelope points
            assert s["lo"]["99"][j] <= s["p"]["99"][j]
            assert s["hi"]["99"][j] is None or s["hi"]["99"][j] >= s["p"]["99"][j]


def test_rows_without_bounds_carry_no_band() -> None:
    data = PlotData([99.0], None, relative=False)
    data.write([_row(START_MS + 1000 * i, 1e6) for i in range(5)])
    (s,) = data.document(title="t")["series"]
    assert "lo" not in s
    assert "hi" not in s


def test_downsampling_keeps_the_spike_the_dip_and_the_total() -> None:
    data = PlotData([50.0, 99.0], None, relative=False)
    values = np.full(1000, 1e6)
    values[377] = 50e6  # one spike
    values[611] = 1e3  # one dip
    data.write([_row(START_MS + 1000 * i, v) for i, v in enumerate(values)])
    doc = data.document(title="t", max_points=100)
    (s,) = doc["series"]
    assert doc["downsampled"] == 20
    assert len(s["end"]) == 100
    assert max(s["p"]["99"]) == 50e6
    assert min(s["p"]["99"]) == 1e3
    assert math.isclose(sum(s["samples"]), 10.0 * 1000)
    # the spike sits on the max point of its group, within the group's time span
    i = s["p"]["99"].index(50e6)
    assert s["end"][i - 1] <= 377_000 <= s["end"][i]


def test_a_short_run_is_not_downsampled() -> None:
    data = PlotData([99.0], None, relative=False)
    data.write([_row(START_MS + 1000 * i, 1e6 + 1000 * i) for i in range(50)])
    doc = data.document(title="t", max_points=100)
    assert doc["downsampled"] == 1
    assert doc["series"][0]["p"]["99"] == [1e6 + 1000 * i for i in range(50)]


def test_the_vendored_library_is_the_one_the_readme_names() -> None:
    vendor = ROOT / "fiomon/web/vendor"
    readme = (vendor / "README.md").read_text()
    want = re.search(r"`dist/echarts.min.js` sha256 \| `([0-9a-f]{64})`", readme)
    assert want is not None
    got = hashlib.sha256((vendor / "echarts.min.js").read_bytes()).hexdigest()
    assert got == want.group(1)
    assert (vendor / "LICENSE-echarts").read_text().startswith("\n") or "Apache" in (
        vendor / "LICENSE-echarts"
    ).read_text()


# -- the command ------------------------------------------------------------------------


def test_plot_refuses_an_unknown_extension_and_a_bad_sla(tmp_path: Path) -> None:
    logs = make_logs(tmp_path, hosts=1, seconds=5)
    out = fiomon("plot", *logs, "-o", tmp_path / "x.pdf")
    assert out.returncode == 2
    assert ".html, .png or .svg" in out.stderr
    out = fiomon("plot", "--sla", "fast", *logs, "-o", tmp_path / "x.html")
    assert out.returncode == 2
    assert "--sla" in out.stderr


def test_png_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    logs = make_logs(tmp_path, hosts=1, seconds=5)
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from fiomon.cli import main\n"
        f"raise SystemExit(main(['plot', {str(logs[0])!r}, '-o', {str(tmp_path / 'x.png')!r}]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 1
    assert "fiomon[plot]" in out.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(("suffix", "magic"), [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_static_figure(tmp_path: Path, suffix: str, magic: bytes) -> None:
    logs = make_logs(tmp_path, hosts=3, seconds=20)
    target = tmp_path / f"run{suffix}"
    out = fiomon("plot", "--per-host", "--sla", "2ms", *logs, "-o", target)
    assert out.returncode == 0, out.stderr
    body = target.read_bytes()
    assert body.startswith(magic)
    if suffix == ".svg":
        text = body.decode()
        assert "p99" in text
        assert "per host" in text
        assert "fill-opacity: 0.18" in text  # the confidence bands


def _embedded(html: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="fiomon-data">(.*?)</script>', html, re.S)
    assert m is not None
    doc: dict[str, Any] = json.loads(m.group(1))
    return doc


def test_the_page_is_self_contained(tmp_path: Path) -> None:
    logs = make_logs(tmp_path, hosts=2, seconds=10)
    target = tmp_path / "run.html"
    assert fiomon("plot", *logs, "-o", target).returncode == 0
    html = target.read_text()
    assert not re.search(r"<script[^>]+src=", html), "every script is inline"
    assert not re.search(r"<link[^>]+href=", html), "no external style sheets"
    doc = _embedded(html)
    assert doc["version"] == 1
    assert {s["direction"] for s in doc["series"]} == {"read", "write", "all"}


# -- in a real browser ------------------------------------------------------------------


def test_offline_page_draws_the_reports_numbers(tmp_path: Path) -> None:
    logs = make_logs(tmp_path)
    target = tmp_path / "run.html"
    sla = ("--sla", "2ms", "--sla", "p99:write:3ms")
    out = fiomon("plot", "--per-host", *sla, *logs, "-o", target)
    assert out.returncode == 0, out.stderr
    want = report_rows(logs, "--per-host")
    with Browser() as b:
        b.goto(target.as_uri())
        state = b.state()
        b.screenshot(tmp_path / "plot.png")
    charts = state["charts"]
    assert set(state["directions"]) == {"read", "write", "all"}
    assert state["rows"] == len(want)
    assert state["hosts"] == 4
    for key in ("heat", "surface", "hosts", "throughput", "lat-read", "lat-write", "lat-all"):
        assert key in charts, key
        drawn = [s for s in charts[key] if s["type"] != "scatter" and s["name"] != "SLA"]
        assert all(s["points"] > 0 for s in drawn), key  # SLA: mark lines, no points
    # Every percentile line and the mean, point for point, equal the report's rows.
    for d in ("read", "write", "all"):
        rows = [r for r in want if r["scope"] == "cluster" and r["direction"] == d]
        series = {s["name"]: s for s in charts[f"lat-{d}"]}
        for k in ("50", "90", "99", "99.9"):
            got = series[f"p{k}"]["data"]
            assert [x for x, _ in got] == [r["end_ms"] for r in rows]
            for (_, y), r in zip(got, rows, strict=True):
                assert math.isclose(y, r["percentiles_ns"][k] / 1e6, rel_tol=1e-5)
        for (_, y), r in zip(series["mean"]["data"], rows, strict=True):
            assert math.isclose(y, r["mean_ns"] / 1e6, rel_tol=1e-5)
        # Each percentile's band, point for point, is the report's confidence interval.
        bands = {s["id"]: s for s in charts[f"lat-{d}"] if s.get("id", "").startswith("band-")}
        assert set(bands) == {"band-50", "band-90", "band-99", "band-99.9"}
        assert {s["name"] for s in bands.values()} == {"confidence bands"}  # one legend entry
        unbounded = dict.fromkeys(bands, 0)
        for k in ("50", "90", "99", "99.9"):
            got = bands[f"band-{k}"]["data"]
            assert [x for x, _, _ in got] == [r["end_ms"] for r in rows]
            for (_, lo, hi), r in zip(got, rows, strict=True):
                for side, v in zip((lo, hi), r["percentiles_ci_ns"][k], strict=True):
                    if v is None:
                        unbounded[f"band-{k}"] += 1
                        assert side is None
                    else:
                        assert side is not None
                        assert math.isclose(side, v / 1e6, rel_tol=1e-5)
        assert unbounded["band-50"] == unbounded["band-90"] == 0  # hundreds of I/Os bound these
    # `--sla 2ms` names no direction: a labelled line on every chart; `p99:write:3ms` is
    # on the write chart only.
    for d in ("read", "write", "all"):
        line = {s["name"]: s for s in charts[f"lat-{d}"]}["SLA"]
        if d == "write":
            assert line["markLines"] == [2.0, 3.0]
            assert line["labels"] == ["SLA 2 ms", "SLA p99 write 3 ms"]
        else:
            assert (line["markLines"], line["labels"]) == ([2.0], ["SLA 2 ms"])
    # The surface: the page's 30 percentiles from the histograms, every quantum.
    doc = _embedded(target.read_text())
    assert len(doc["surface_percentiles"]) == 30
    reads = [r for r in want if r["scope"] == "cluster" and r["direction"] == "read"]
    assert charts["surface"][0]["points"] == 30 * len(reads)
    # IOPS as the report has it
    iops = {s["name"]: s["data"] for s in charts["throughput"]}["IOPS read"]
    rows = [r for r in want if r["scope"] == "cluster" and r["direction"] == "read"]
    assert len(iops) == len(rows)
    for (_, y), r in zip(iops, rows, strict=True):  # rates keep 5 significant digits
        assert math.isclose(y, r["iops"], rel_tol=1e-4)
    # The host heatmap has one row per host and the slow host's cells are the hot ones.
    hosts_series = charts["hosts"][0]
    assert hosts_series["type"] == "heatmap"
    assert hosts_series["points"] == len(
        [r for r in want if r["scope"] == "host" and r["direction"] == "read"]
    )
    assert (tmp_path / "plot.png").stat().st_size > 50_000
    dest = _shots()
    if dest is not None:
        (dest / "plot-page.png").write_bytes((tmp_path / "plot.png").read_bytes())


def test_saturated_values_are_marked(tmp_path: Path) -> None:
    # A record with I/Os in fio's last bin: p99 and p99.9 are lower bounds.
    layout = BinLayout()
    path = tmp_path / "sat_clat_hist.1.log"
    with path.open("w") as fh:
        for i in range(5):
            counts = np.zeros(layout.nbins, np.int64)
            counts[800] = 900
            counts[-1] = 100 if i == 2 else 0
            fh.write(format_line(START_MS + 1000 * (i + 1), 0, 4096, counts))
    target = tmp_path / "sat.html"
    assert fiomon("plot", path, "-o", target).returncode == 0
    with Browser(1200, 900) as b:
        b.goto(target.as_uri())
        state = b.state()
    marks = {s["name"]: s for s in state["charts"]["lat-read"]}["saturated (lower bound)"]
    assert marks["points"] == 2  # p99 and p99.9 of the third quantum
    assert {p["value"][0] for p in marks["data"]} == {START_MS + 3000}


@pytest.mark.parametrize("max_points", [2000, 14])
def test_offline_page_draws_missing_quanta_as_a_gap_in_palette_colours(
    tmp_path: Path, max_points: int
) -> None:
    # A quanta file with 20 quanta missing (an aggregator that got no records then);
    # down-sampled too (14 points: groups of 6 quanta, one of them across the gap).
    logs = make_logs(tmp_path, hosts=2, seconds=60)
    out = fiomon("report", "--format", "jsonl", *logs)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    ends = sorted({json.loads(line)["end_ms"] for line in lines})
    before, after = ends[19], ends[39]  # quanta ending after `before`, up to `after`, go
    kept = [line for line in lines if not before < json.loads(line)["end_ms"] <= after]
    quanta = tmp_path / "quanta.jsonl"
    quanta.write_text("\n".join(kept) + "\n")
    target = tmp_path / "gap.html"
    plotted = fiomon("plot", "--max-points", str(max_points), quanta, "-o", target)
    assert plotted.returncode == 0, plotted.stderr
    charts = ("lat-read", "lat-write", "throughput")
    with Browser(1400, 2000) as b:
        b.goto(target.as_uri())
        state = b.state()
        info = str(b.evaluate("document.getElementById('info').textContent"))
        b.screenshot(tmp_path / "gap.png")
        boxes = {c: chart_box(b, c) for c in charts}
        gap = {c: (x_of(b, c, before) + 3, x_of(b, c, after) - 3) for c in charts}
        busy = {c: (x_of(b, c, ends[5]), x_of(b, c, ends[15])) for c in charts}
    img = load(tmp_path / "gap.png")
    # The lines break: a null point inside the gap, no point in it with a value.
    p99 = {s["name"]: s for s in state["charts"]["lat-read"]}["p99"]["data"]
    assert any(before < x < after and y is None for x, y in p99)
    assert not any(before < x < after and y is not None for x, y in p99)
    if max_points < len(ends):
        assert "min and max of 6 quanta" in info
    iops = {s["name"]: s for s in state["charts"]["throughput"]}["IOPS read"]["data"]
    assert not any(before < x < after and y is not None for x, y in iops)
    # And the pixels say so: nothing drawn inside the gap, lines and bands next to it.
    for c in charts:
        x0, x1 = gap[c]
        assert x1 - x0 > 100, (c, x0, x1)
        assert inked(boxes[c].crop(img, x0, x1)) == 0, f"{c}: ink inside the missing quanta"
        assert inked(boxes[c].crop(img, *busy[c])) > 100, f"{c}: no ink where quanta are"
    # Every percentile line in its palette colour, none in ECharts' default palette.
    read = boxes["lat-read"].crop(img)
    for p in (50.0, 90.0, 99.0, 99.9):
        assert near(read, percentile_colour(p), 8) > 100, f"p{p:g}: no {percentile_colour(p)}"
    for default in ("#5470c6", "#91cc75", "#fac858", "#ee6666"):
        assert near(read, default, 8) == 0, f"{default}: ECharts' palette, not fiomon's"
