"""Head + tail fit: known parameters recovered; bad input explained; real fio output sane."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from fiomon.bins import BinLayout, plat_val_to_idx
from fiomon.cli import main
from fiomon.errors import FitError
from fiomon.fit import fit_histogram
from fiomon.tools.simulate import LatencyModel
from tests.conftest import FIXTURES

LAY = BinLayout()


def histogram(model: LatencyModel, n: int, seed: int) -> npt.NDArray[np.float64]:
    lat = model.sample(np.random.default_rng(seed), n)
    return np.bincount(plat_val_to_idx(lat), minlength=LAY.nbins).astype(np.float64)


@pytest.mark.parametrize(
    ("tail_alpha", "share"),
    [(2.5, 0.03), (1.8, 0.05), (3.0, 0.10), (1.5, 0.20), (1.2, 0.02)],
)
@pytest.mark.parametrize("seed", [1, 2])
def test_known_exponent_and_tail_share_are_recovered(
    tail_alpha: float, share: float, seed: int
) -> None:
    # The simulator's tail is Pareto with numpy's shape a: density ~ x**-(a + 1).
    model = LatencyModel(tail_share=share, tail_alpha=tail_alpha)
    f = fit_histogram(histogram(model, 100_000, seed), LAY)
    assert f.alpha == pytest.approx(tail_alpha + 1, rel=0.10)
    assert abs(f.tail_share - share) <= 0.02
    assert f.head_mean_ns == pytest.approx(model.head_mean_ns, rel=0.02)
    assert f.head_sd_ns == pytest.approx(model.head_sd_ns, rel=0.10)
    assert f.winner == "power-law"
    assert [m.ks for m in f.tail_models] == sorted(m.ks for m in f.tail_models)


def test_bad_histograms_are_refused_with_a_reason() -> None:
    empty = np.zeros(LAY.nbins)
    with pytest.raises(FitError, match="too few"):
        fit_histogram(empty, LAY)
    one = np.zeros(LAY.nbins)
    one[700] = 5000
    with pytest.raises(FitError, match="1 bin"):
        fit_histogram(one, LAY)
    capped = np.zeros(LAY.nbins)
    capped[-1] = 5000
    capped[700:705] = 10
    with pytest.raises(FitError, match="last bin"):
        fit_histogram(capped, LAY)


def test_cli_on_real_fio_output_is_sane(capsys: pytest.CaptureFixture[str]) -> None:
    paths = [str(FIXTURES / "fio333_randrw_status.json")]
    assert main(["fit", *paths, "--format", "json"]) == 0
    docs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {d["direction"] for d in docs} == {"read", "write", "all"}
    for d in docs:
        assert 0 < d["tail_share"] < 1
        assert d["alpha"] > 1
        assert d["x_min_ns"] > d["head"]["mean_ns"] > 0
        assert d["winner"] in {"power-law", "lognormal", "exponential", "weibull"}
    assert main(["fit", *paths, "--direction", "read"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("read: ") and "winner:" in text


def test_cli_per_quantum_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = FIXTURES / "fio333_randrw_clat_hist.1.log"
    assert main(["fit", str(log), "--per-quantum", "--format", "json"]) in (0, 1)
    out, err = capsys.readouterr()
    lines = [json.loads(x) for x in out.splitlines()]
    assert all("end_ms" in d and d["end_ms"] for d in lines)
    assert "Traceback" not in err
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert main(["fit", str(empty)]) == 1
    err = capsys.readouterr().err
    assert "no histogram records" in err and "Traceback" not in err


def test_aggregator_exports_the_tail_fit_only_when_asked() -> None:
    from fiomon.aggregator.merger import AggregatorCore  # noqa: PLC0415
    from fiomon.config import AggregatorConfig  # noqa: PLC0415
    from fiomon.model import RecordBatch, StreamInfo  # noqa: PLC0415
    from fiomon.wire import encode  # noqa: PLC0415

    t0 = 1_795_000_000_000
    hist = histogram(LatencyModel(tail_share=0.05, tail_alpha=2.0), 100_000, 3).astype(np.int64)
    nz = np.flatnonzero(hist)
    batch = RecordBatch(
        layout=LAY,
        streams=(StreamInfo("h", "job"),),
        stream_idx=np.zeros(1, np.int32),
        direction=np.zeros(1, np.int8),
        start_ms=np.array([t0], np.int64),
        end_ms=np.array([t0 + 1000], np.int64),
        nbytes=np.array([4096 * int(hist.sum())], np.int64),
        indptr=np.array([0, len(nz)], np.int64),
        bins=nz.astype(np.int32),
        counts=hist[nz],
    )
    for fit_tail in (False, True):
        clock = [t0 + 60_000]
        core = AggregatorCore(
            AggregatorConfig(align="epoch", fit_tail=fit_tail),
            now_ms=lambda clock=clock: clock[0],  # type: ignore[misc]
        )
        core.on_records("h", encode("h", "s@1", 0, batch))
        clock[0] += 5001  # no more records: the lateness on the wall clock closes it
        assert core.tick()
        gauges = {k[0]: v for k, v in core.snapshot.gauges.items()}
        if not fit_tail:
            assert "fiomon_cluster_tail_share" not in gauges
            continue
        assert gauges["fiomon_cluster_tail_share"][("read", "clat")] == pytest.approx(
            0.05, abs=0.02
        )
        assert gauges["fiomon_cluster_tail_exponent"][("read", "clat")] == pytest.approx(
            3.0, rel=0.1
        )
