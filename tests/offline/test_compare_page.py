"""``fiomon compare``'s pictures: the page's data, its charts in Chromium, the static figure."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fiomon.errors import PlotError
from fiomon.histogram import pct_key
from fiomon.offline.compare.model import CompareOptions, CompareResult, Verdict
from fiomon.offline.compare.page import (
    IMPROVEMENT_COLOUR,
    REGRESSION_COLOUR,
    document,
    figure_kind,
    write_figure,
)
from fiomon.offline.compare.run import RunInput, run_compare, run_files
from fiomon.offline.quanta import QuantaOptions
from fiomon.offline.sources import SourceOptions
from fiomon.tools.simulate import write_cluster
from tests.browser import Browser
from tests.offline.compare_fixtures import hand_result
from tests.pixels import Box, Pixels, chart_box, inked, load, near, x_of

HOSTILE = "runs/</script><script>window.pwned = 1</script>"


def _embedded(html: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="fiomon-data">(.*?)</script>', html, re.S)
    assert m is not None
    doc: dict[str, Any] = json.loads(m.group(1))
    return doc


def _steps(start: list[float], end: list[float], values: list[float | None]) -> list[Any]:
    """The page's step points (compare.js ``steps``), computed here from the result."""
    out: list[Any] = []
    for i, (s, e, v) in enumerate(zip(start, end, values, strict=True)):
        if i > 0 and s > end[i - 1]:
            out.append([(end[i - 1] + s) / 2, None])
        out += [[s, v], [e, v]]
    return out


def _r(x: float | None, digits: int = 6) -> float | None:
    """``x`` at the page's precision: latencies 6 significant digits, ratios and IOPS 5."""
    return None if x is None else float(f"{x:.{digits}g}")


def _ms(v: float | None) -> float | None:
    """A latency (ns) as the page draws it: at its precision, in ms."""
    r = _r(v)
    return None if r is None else r / 1e6


def _windows(result: CompareResult, scope: str, host: str | None, d: str, k: str) -> list[Verdict]:
    return [
        v
        for v in result.verdicts
        if not v.whole_run
        and (v.scope, v.host, v.direction, pct_key(v.percentile)) == (scope, host, d, k)
    ]


# -- the document -----------------------------------------------------------------------


def test_the_document_holds_the_results_numbers() -> None:
    result = hand_result()
    doc = document(result, "t")
    assert doc["percentiles"] == ["50", "90", "99", "99.9"]
    assert doc["directions"] == ["read", "write"]
    assert doc["hosts"] == ["h1", "h2"]
    assert doc["level"] == 0.95
    assert doc["window_s"] == 10.0
    assert doc["method"] == "windows: mover; whole run: mover+bootstrap (2000 resamples, seed 1)"
    assert doc["runs"][1]["alignment"] == "0 = its start +5 s (2026-11-18 11:06:45 UTC)"
    series = {(s["run"], s["scope"], s["host"], s["direction"]): s for s in doc["series"]}
    assert set(series) == set(result.series)
    opened = 0
    for key, points in result.series.items():
        s = series[key]
        assert s["start"] == [w.start_s for w in points]
        assert s["end"] == [w.end_s for w in points]
        assert s["ios"] == [w.ios for w in points]
        assert s["iops"] == [_r(w.iops, 5) for w in points]
        for k in doc["percentiles"]:
            assert s["p"][k] == [_r(w.values_ns[k]) for w in points]
            assert s["lo"][k] == [_r(w.ci_ns[k][0]) for w in points]
            assert s["hi"][k] == [_r(w.ci_ns[k][1]) for w in points]
            opened += s["lo"][k].count(None) + s["hi"][k].count(None)
    assert opened == 3 * 3  # cluster, h1, h2: three open sides each, kept open (null)
    ratios = {(r["scope"], r["host"], r["direction"], r["percentile"]): r for r in doc["ratios"]}
    for (scope, host, d, k), r in ratios.items():
        vs = _windows(result, scope, host, d, k)
        assert r["start"] == [v.window_start_s for v in vs]
        assert r["end"] == [v.window_end_s for v in vs]
        assert r["ratio"] == [_r(v.ratio, 5) for v in vs]
        assert r["lo"] == [_r(v.ratio_ci[0], 5) for v in vs]
        assert r["hi"] == [_r(v.ratio_ci[1], 5) for v in vs]
        assert r["significant"] == [v.significant for v in vs]
    assert len(ratios) == 3 * 2 * 4
    p999 = ratios[("cluster", None, "read", "99.9")]
    assert p999["lo"][0] is None
    assert p999["hi"][1] is None
    assert p999["hi"][4] is None
    whole = [v.to_json() for v in result.verdicts if v.whole_run]
    assert sorted(map(json.dumps, doc["whole"])) == sorted(map(json.dumps, whole))


def test_a_bad_extension_or_a_kind_the_name_does_not_say_is_refused(tmp_path: Path) -> None:
    result = hand_result(per_host=False)
    with pytest.raises(PlotError, match=r"\.html, \.png or \.svg"):
        figure_kind(tmp_path / "x.pdf")
    assert figure_kind(tmp_path / "x.HTM") == "html"
    with pytest.raises(PlotError, match=r"\.html, \.png or \.svg"):
        write_figure(result, tmp_path / "x.pdf", "html", "t")
    with pytest.raises(PlotError, match=r"a png file must end in \.png"):
        write_figure(result, tmp_path / "x.svg", "png", "t")
    assert list(tmp_path.iterdir()) == []


def test_nothing_to_draw_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    result = hand_result(per_host=False)
    result.series = {
        k: [dataclasses.replace(w, ios=0) for w in v] for k, v in result.series.items()
    }
    with pytest.raises(PlotError, match="nothing to draw"):
        write_figure(result, tmp_path / "x.html", "html", "t")
    assert list(tmp_path.iterdir()) == []


def test_png_without_matplotlib_names_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from pathlib import Path\n"
        "from fiomon.offline.compare.page import write_figure\n"
        "from tests.offline.compare_fixtures import hand_result\n"
        f"write_figure(hand_result(), Path({str(tmp_path / 'x.png')!r}), 'png', 't')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 1
    assert "fiomon[plot]" in out.stderr
    assert "PlotError" in out.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(("kind", "magic"), [("png", b"\x89PNG"), ("svg", b"<?xml")])
def test_static_figure(tmp_path: Path, kind: str, magic: bytes) -> None:
    target = tmp_path / f"cmp.{kind}"
    write_figure(hand_result(), target, kind, "hand-made")  # type: ignore[arg-type]
    body = target.read_bytes()
    assert body.startswith(magic)
    assert len(body) > 60_000
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temporary left
    if kind == "svg":
        text = body.decode()
        for label in ("p99 candidate", "p99 baseline", "candidate / baseline", "IOPS baseline"):
            assert label in text, label
        # read and write: three panels each; the significant windows shaded by sign
        assert text.count('id="slower') == 2
        assert text.count('id="faster') == 1
        assert "write latency (ms)" in text


# -- in a real browser ------------------------------------------------------------------


def _blend(colour: str, opacity: float) -> str:
    """``colour`` at ``opacity`` over white, as the page paints a translucent area."""
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - opacity * (255 - c)):02x}" for c in rgb)


def _column(img: Pixels, box: Box, x0: int, x1: int, rows: slice) -> Pixels:
    return box.crop(img, x0 + 3, x1 - 3)[rows]


def _check_drawn(
    state: dict[str, Any], result: CompareResult, scope: str, host: str | None, direction: str
) -> None:
    """Every number the page's charts hold for one scope and direction is the result's."""
    charts = state["charts"]
    keys = [pct_key(p) for p in result.options.quanta.percentiles]
    assert state["order"] == ["latency", *(f"ratio-{k}" for k in keys), "iops"]
    lat = {s["id"]: s for s in charts["latency"]}
    iops = {s["id"]: s for s in charts["iops"]}
    runs = [r for r in ("baseline", "candidate") if (r, scope, host, direction) in result.series]
    assert runs == ["baseline", "candidate"]
    assert len(lat) == len(runs) * len(keys) * 2  # a line and a band per run and percentile
    for run in runs:
        pts = result.series[(run, scope, host, direction)]  # type: ignore[index]
        start, end = [w.start_s for w in pts], [w.end_s for w in pts]
        for k in keys:
            vals = [_ms(w.values_ns.get(k)) for w in pts]
            assert lat[f"{run}-p{k}"]["data"] == _steps(start, end, vals), (run, k)
            band = [
                [w.start_s, w.end_s, *(_ms(x) for x in w.ci_ns.get(k, (None, None))), v]
                for w, v in zip(pts, vals, strict=True)
            ]
            assert lat[f"{run}-band-{k}"]["data"] == band, (run, k)
        assert iops[f"{run}-iops"]["data"] == _steps(start, end, [_r(w.iops, 5) for w in pts])
    for k in keys:
        vs = _windows(result, scope, host, direction, k)
        line, band = charts[f"ratio-{k}"]
        assert line["data"] == _steps(
            [v.window_start_s or 0.0 for v in vs],
            [v.window_end_s or 0.0 for v in vs],
            [_r(v.ratio, 5) for v in vs],
        )
        assert band["data"] == [
            [v.window_start_s, v.window_end_s, *(_r(x, 5) for x in (*v.ratio_ci, v.ratio))]
            for v in vs
        ]
        assert line["markLines"] == [1]
        want = [
            [v.window_start_s, v.window_end_s, "slower" if (v.ratio or 0) > 1 else "faster"]
            for v in vs
            if v.significant
        ]
        assert line["areas"] == want, k
        assert state["axes"][f"ratio-{k}"]["type"] == "log"
    assert state["axes"]["latency"]["type"] == "log"


def _check_cluster_read(state: dict[str, Any], result: CompareResult) -> None:
    """The hand-made result's cluster read charts: its numbers, its known verdicts."""
    _check_drawn(state, result, "cluster", None, "read")
    charts = state["charts"]
    assert charts["ratio-99"][0]["areas"] == [[20, 30, "slower"], [30, 40, "slower"]]
    assert charts["ratio-50"][0]["areas"] == [[50, 60, "faster"]]
    assert state["axes"]["ratio-99"]["min"] < 1 < state["axes"]["ratio-99"]["max"]
    # latencies on whole decades
    assert (state["axes"]["latency"]["min"], state["axes"]["latency"]["max"]) == (0.1, 10)


def test_the_page_draws_the_result_in_chromium(tmp_path: Path) -> None:
    result = hand_result()
    result.baseline = dataclasses.replace(result.baseline, spec=HOSTILE)
    target = tmp_path / "cmp.html"
    write_figure(result, target, "html", "hand-made <test>")
    html = target.read_text()
    assert not re.search(r"<script[^>]+src=", html), "every script is inline"
    assert not re.search(r"<link[^>]+href=", html), "no external style sheets"
    assert _embedded(html) == json.loads(json.dumps(document(result, "hand-made <test>")))
    with Browser(1400, 2400) as b:
        b.goto(target.as_uri())
        state = b.state()
        b.screenshot(tmp_path / "cmp.png")
        charts = ("latency", "ratio-50", "ratio-99", "ratio-99.9", "iops")
        boxes = {c: chart_box(b, c) for c in charts}
        xs = {c: [x_of(b, c, t) for t in range(0, 70, 10)] for c in charts}
        header = str(b.evaluate("document.getElementById('runs').textContent"))
        settings = str(b.evaluate("document.getElementById('settings').textContent"))
        whole = str(b.evaluate("document.getElementById('whole').textContent"))
        notes = str(b.evaluate("document.getElementById('notes').textContent"))
        pwned = b.evaluate("window.pwned === undefined")
        _check_cluster_read(state, result)
        assert (state["direction"], state["scope"]) == ("read", "cluster")
        assert state["whole_rows"] == 8  # cluster: 2 directions x 4 percentiles
        # The other direction: the baseline's missing window breaks its lines.
        b.evaluate(
            "(function () { var s = document.getElementById('direction'); s.value = 'write';"
            " s.dispatchEvent(new Event('change')); return 0; })()"
        )
        b.wait_for("window.fiomonState.draws === 2 && window.fiomonState.rendered", "write")
        write = json.loads(b.evaluate("JSON.stringify(window.fiomonState)"))
        # A host: its own series and verdicts.
        b.evaluate(
            "(function () { var s = document.getElementById('scope'); s.value = 'host:h2';"
            " s.dispatchEvent(new Event('change')); return 0; })()"
        )
        b.wait_for("window.fiomonState.draws === 3 && window.fiomonState.rendered", "host h2")
        host = json.loads(b.evaluate("JSON.stringify(window.fiomonState)"))
        errors = list(b.errors)
    assert errors == []
    assert pwned, "a spec's </script> ended the data block"
    assert HOSTILE in header
    assert "24,000" in header
    assert "0 = its start +5 s" in header
    assert "window 10 s" in settings
    assert "level 95 %" in settings
    assert "mover+bootstrap (2000 resamples" in settings
    assert "[1.38, 1.69]" in whole  # the significant whole-run p99 line
    assert "h1 90 %" in whole  # its top host
    assert "quantum grid" in notes
    # write: the baseline's window at 20 s is missing, so its lines break there
    wlat = {s["id"]: s for s in write["charts"]["latency"]}
    assert [25.0, None] in wlat["baseline-p99"]["data"]
    assert [25.0, None] not in wlat["candidate-p99"]["data"]
    assert write["direction"] == "write"
    # host h2 (the direction stays write): its series' numbers
    pts = result.series[("candidate", "host", "h2", "write")]
    hlat = {s["id"]: s for s in host["charts"]["latency"]}
    assert (host["scope"], host["direction"]) == ("host:h2", "write")
    assert hlat["candidate-p99"]["data"] == _steps(
        [w.start_s for w in pts], [w.end_s for w in pts], [_ms(w.values_ns["99"]) for w in pts]
    )
    assert host["whole_rows"] == 8
    # The pixels: every chart drew, the significant windows are shaded in their colours,
    # and an unbounded side runs to the axis' edge while a bounded one stops short of it.
    img = load(tmp_path / "cmp.png")
    for c in charts:
        assert inked(boxes[c].crop(img)) > 2000, f"{c}: blank"
    red, green = _blend(REGRESSION_COLOUR, 0.16), _blend(IMPROVEMENT_COLOUR, 0.16)
    r99, x = boxes["ratio-99"], xs["ratio-99"]
    assert near(_column(img, r99, x[2], x[4], slice(None)), red, 6) > 1000
    assert near(_column(img, r99, x[0], x[2], slice(None)), red, 6) == 0
    r50, x = boxes["ratio-50"], xs["ratio-50"]
    assert near(_column(img, r50, x[5], x[6], slice(None)), green, 6) > 500
    r999, x = boxes["ratio-99.9"], xs["ratio-99.9"]
    top, bottom = slice(0, 4), slice(-4, None)
    assert inked(_column(img, r999, x[1], x[2], top)) > 0  # 10-20 s: high side open
    assert inked(_column(img, r999, x[2], x[3], top)) == 0  # 20-30 s: bounded
    assert inked(_column(img, r999, x[0], x[1], bottom)) > 0  # 0-10 s: low side open
    assert inked(_column(img, r999, x[2], x[3], bottom)) == 0
    # the candidate's p99.9 latency band at 10-20 s is open upwards too
    lat, x = boxes["latency"], xs["latency"]
    assert inked(_column(img, lat, x[1], x[2], top)) > 0
    assert inked(_column(img, lat, x[2], x[3], top)) == 0
    assert math.isclose(state["axes"]["ratio-99"]["max"] / 1.6 / 1.1, 1.0, rel_tol=0.2)


# -- a simulated comparison through the engine ------------------------------------------


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> CompareResult:
    """Two simulated runs of 3 hosts; the candidate's client-01 3x slower from 20 to 40 s."""
    root = tmp_path_factory.mktemp("compare-page")
    for name, seed, slow in (("baseline", 1, 0), ("candidate", 2, 1)):
        write_cluster(
            root / name, hosts=3, jobs_per_host=1, seconds=60, iops=300, slow_hosts=slow,
            slow_window_s=(20, 40), slow_factor=3.0, seed=seed,
        )  # fmt: skip
    runs = [
        RunInput(name, str(root / name), tuple(run_files(str(root / name))), SourceOptions())
        for name in ("baseline", "candidate")
    ]
    opts = CompareOptions(quanta=QuantaOptions(per_host=True))
    return run_compare(runs[0], runs[1], opts, io.StringIO())


def test_a_simulated_comparison_draws_the_engines_numbers(
    tmp_path: Path, simulated: CompareResult
) -> None:
    result = simulated
    target = tmp_path / "sim.html"
    write_figure(result, target, "html", "client-01 3x slower")
    assert _embedded(target.read_text()) == json.loads(
        json.dumps(document(result, "client-01 3x slower"))
    )
    with Browser(1400, 2400) as b:
        b.goto(target.as_uri())
        state = b.state()
        b.screenshot(tmp_path / "sim.png")
        box, x = chart_box(b, "ratio-90"), [x_of(b, "ratio-90", t) for t in (0, 10, 20, 30, 40)]
        scopes = b.evaluate(
            "Array.from(document.getElementById('scope').options).map(o => o.value).join(',')"
        )
        b.evaluate(
            "(function () { var s = document.getElementById('scope'); s.value = 'host:client-01';"
            " s.dispatchEvent(new Event('change')); return 0; })()"
        )
        b.wait_for("window.fiomonState.draws === 2 && window.fiomonState.rendered", "client-01")
        host = json.loads(b.evaluate("JSON.stringify(window.fiomonState)"))
        errors = list(b.errors)
    assert errors == []
    assert scopes == "cluster,host:client-01,host:client-02,host:client-03"
    _check_drawn(state, result, "cluster", None, "read")
    _check_drawn(host, result, "host", "client-01", "read")
    # The slow phase is what the shading says: p90 flagged slower in the windows at 20
    # and 30 s, not in the first two.
    areas = state["charts"]["ratio-90"][0]["areas"]
    assert [20, 30, "slower"] in areas
    assert [30, 40, "slower"] in areas
    assert not [a for a in areas if a[0] < 20]
    img = load(tmp_path / "sim.png")
    red = _blend(REGRESSION_COLOUR, 0.16)
    assert near(_column(img, box, x[2], x[4], slice(None)), red, 6) > 1000
    assert near(_column(img, box, x[0], x[2], slice(None)), red, 6) == 0
    png = tmp_path / "sim-figure.png"
    write_figure(result, png, "png", "client-01 3x slower")
    assert png.read_bytes().startswith(b"\x89PNG")
    assert png.stat().st_size > 100_000


def _band_ys(ax: Any) -> list[float]:
    """Every y of the band polygons (fill_between) of a panel."""
    ys: list[float] = []
    for coll in ax.collections:
        for path in coll.get_paths():
            ys += [float(y) for y in path.vertices[:, 1]]
    return ys


def test_static_bands_are_the_intervals_and_open_sides_run_off_the_axis() -> None:
    from fiomon.offline.compare.figure import build_figure  # noqa: PLC0415

    result = hand_result(per_host=False)
    fig = build_figure(document(result, "t"))
    axes = {ax.get_label(): ax for ax in fig.axes}
    assert {"lat-read", "ratio-read", "iops-read", "lat-write", "ratio-write"} <= set(axes)
    sides = {
        "lat-read": [
            x / 1e6
            for run in ("baseline", "candidate")
            for w in result.series[(run, "cluster", None, "read")]
            for ci in w.ci_ns.values()
            for x in ci
            if x is not None
        ],
        "ratio-read": [
            x
            for v in result.verdicts
            if not v.whole_run and v.scope == "cluster" and v.direction == "read"
            for x in v.ratio_ci
            if x is not None
        ],
    }
    for name, want in sides.items():
        ax = axes[name]
        bottom, top = ax.get_ylim()
        ys = _band_ys(ax)
        assert ys, name
        assert min(ys) > 0, f"{name}: an open side drawn as 0"
        # every band edge is an interval side of the result, or beyond the axis (open)
        inside = [y for y in ys if bottom <= y <= top]
        assert len(inside) > 0.8 * len(ys), f"{name}: bands off the axis (units?)"
        assert all(any(math.isclose(y, x, rel_tol=1e-4) for x in want) for y in inside), name
        assert any(y > top for y in ys), f"{name}: no open high side"
        assert any(y < bottom for y in ys), f"{name}: no open low side"
    # write has no unbounded side: its bands stay within the axis
    assert all(axes["ratio-write"].get_ylim()[0] <= y for y in _band_ys(axes["ratio-write"]))
