"""Bin layouts against fio's own formulas (stat.c), written out the slow way."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fiomon.bins import (
    BinLayout,
    candidate_layouts,
    coarsen_counts,
    coarsen_hist,
    detect_layout,
    fine_lower_upper,
    merged_layout,
    plat_idx_to_val,
    plat_val_to_idx,
)
from fiomon.errors import LayoutError


def fio_idx_to_val(idx: int, edge: float = 0.5) -> float:
    """stat.c plat_idx_to_val, with an edge fraction (0 lower, 1 upper)."""
    if idx < 128:
        return idx + edge if edge != 0.5 else idx
    error_bits = (idx >> 6) - 1
    base = 1 << (error_bits + 6)
    k = idx % 64
    return base + (k + edge) * (1 << error_bits)


def fio_val_to_idx(val: int, group_nr: int = 29) -> int:
    """stat.c plat_val_to_idx."""
    msb = val.bit_length() - 1 if val else 0
    if msb <= 6:
        return val
    error_bits = msb - 6
    base = (error_bits + 1) << 6
    offset = 63 & (val >> error_bits)
    return min(base + offset, group_nr * 64 - 1)


@pytest.mark.parametrize("group_nr", [19, 29, 30, 40])
def test_fine_edges_match_fio_formula(group_nr: int) -> None:
    n = group_nr * 64
    lower, upper = fine_lower_upper(np.arange(n))
    exp_lo = [fio_idx_to_val(i, 0.0) if i >= 128 else i for i in range(n)]
    exp_hi = [fio_idx_to_val(i, 1.0) if i >= 128 else i + 1 for i in range(n)]
    assert lower.tolist() == exp_lo
    assert upper.tolist() == exp_hi
    assert (lower[1:] == upper[:-1]).all(), "bins must tile the axis without gaps"


def test_midpoints_are_what_fio_reports() -> None:
    idx = np.arange(1856)
    assert plat_idx_to_val(idx).tolist() == [int(fio_idx_to_val(i)) for i in range(1856)]


def test_json_midpoints_map_back_to_their_index() -> None:
    idx = np.arange(1856)
    assert (plat_val_to_idx(plat_idx_to_val(idx)) == idx).all()


@given(st.lists(st.integers(min_value=0, max_value=2**40), min_size=1, max_size=50))
def test_val_to_idx_matches_fio(values: list[int]) -> None:
    got = plat_val_to_idx(np.array(values, dtype=np.int64)).tolist()
    assert got == [fio_val_to_idx(v) for v in values]


def test_values_above_cap_are_clamped_into_last_bin() -> None:
    assert plat_val_to_idx(np.array([2**34, 2**38]), 29).tolist() == [1855, 1855]
    lay = BinLayout()
    assert lay.cap_ns == 2**34 - 2**27  # lower edge of the last bin


@pytest.mark.parametrize("c", range(7))
def test_coarse_edges_are_unions_of_fine_bins(c: int) -> None:
    lay = BinLayout(29, c)
    lo, hi = lay.edges_ns()
    assert len(lo) == 1856 >> c
    stride = 1 << c
    for i in (0, 1, 5, len(lo) // 2, len(lo) - 1):
        assert lo[i] == (i * stride if i * stride < 128 else fio_idx_to_val(i * stride, 0.0))
        j = (i + 1) * stride - 1
        assert hi[i] == (j + 1 if j < 128 else fio_idx_to_val(j, 1.0))


def test_fio2_layout_is_microseconds() -> None:
    lay = detect_layout(1216)
    assert (lay.group_nr, lay.coarseness, lay.unit) == (19, 0, "us")
    lo, _ = lay.edges_ns()
    assert lo[200] == fio_idx_to_val(200, 0.0) * 1000
    assert detect_layout(76) == BinLayout(19, 4, "us")
    assert detect_layout(1216, unit="ns").unit == "ns"


@pytest.mark.parametrize(
    ("nbins", "expected"),
    [
        (1856, (29, 0)),
        (928, (29, 1)),
        (116, (29, 4)),
        (29, (29, 6)),
        (1920, (30, 0)),
        (2048, (32, 0)),
        (608, (19, 1)),
    ],
)
def test_detection_prefers_the_finest_layout(nbins: int, expected: tuple[int, int]) -> None:
    lay = detect_layout(nbins)
    assert (lay.group_nr, lay.coarseness) == expected


def test_group_nr_option_disambiguates() -> None:
    assert detect_layout(1856, group_nr=58) == BinLayout(58, 1)
    assert [c.group_nr for c in candidate_layouts(1856)] == [29, 58]


def test_no_layout_lists_counts_that_would_fit() -> None:
    with pytest.raises(LayoutError) as exc:
        detect_layout(1855)
    msg = str(exc.value)
    assert "1855 histogram bins fit no fio layout" in msg
    assert "1856 (GROUP_NR 29, coarseness 0)" in msg
    assert "1216 (GROUP_NR 19, coarseness 0)" in msg
    assert "--group-nr" in msg


def test_invalid_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="group_nr"):
        BinLayout(7)
    with pytest.raises(ValueError, match="coarseness"):
        BinLayout(29, 9)


def test_layouts_from_codes_are_checked_and_refused_as_layout_errors() -> None:
    # Codes read from a message or a state file: a bad one is a LayoutError, never a
    # layout with an unknown unit.
    assert BinLayout.from_codes(29, 3, "ns") == BinLayout(29, 3)
    assert BinLayout.from_codes(19, 0, "us") == BinLayout(19, 0, "us")
    for codes, what in [((7, 0, "ns"), "group_nr"), ((29, 9, "ns"), "coarseness")]:
        with pytest.raises(LayoutError, match=what):
            BinLayout.from_codes(*codes)
    with pytest.raises(LayoutError, match="unit"):
        BinLayout.from_codes(29, 0, "ms")


def test_merged_layout_is_the_coarser_of_two_compatible_layouts() -> None:
    fine, coarse = BinLayout(29, 0), BinLayout(29, 3)
    assert merged_layout(fine, coarse) == coarse
    assert merged_layout(coarse, fine) == coarse
    assert merged_layout(fine, fine) == fine
    fio2 = BinLayout(19, 0, "us")
    assert merged_layout(fio2, BinLayout(19, 1, "us")) == BinLayout(19, 1, "us")


@pytest.mark.parametrize(
    ("a", "b"),
    [(BinLayout(29, 0), BinLayout(30, 0)), (BinLayout(19, 0, "us"), BinLayout(19, 0, "ns"))],
)
def test_merged_layout_refuses_other_groups_and_units_naming_both(
    a: BinLayout, b: BinLayout
) -> None:
    with pytest.raises(LayoutError) as exc:
        merged_layout(a, b)
    assert a.describe() in str(exc.value)
    assert b.describe() in str(exc.value)
    with pytest.raises(LayoutError):
        coarsen_counts(np.zeros(1, np.int64), a, b)


def test_coarsen_counts_refuses_a_finer_target() -> None:
    with pytest.raises(LayoutError, match="cannot merge histograms"):
        coarsen_counts(np.zeros(1, np.int64), BinLayout(29, 2), BinLayout(29, 1))
    got = coarsen_counts(np.array([0, 7, 8], np.int64), BinLayout(29, 1), BinLayout(29, 3))
    assert got.tolist() == [0, 1, 2]


@given(st.integers(0, 5), st.integers(1, 6), st.lists(st.integers(0, 2**32), max_size=40))
def test_coarsen_hist_sums_fine_bins_as_their_edges_say(c: int, d: int, seed: list[int]) -> None:
    """Dense counts coarsened land where the coarse edges hold the fine bins' latencies."""
    src, dst = BinLayout(29, c), BinLayout(29, min(c + d, 6))
    rng = np.random.default_rng(seed)
    hist = np.zeros(src.nbins)
    idx = rng.integers(0, src.nbins, 30)
    np.add.at(hist, idx, rng.random(30) * 1000)
    got = coarsen_hist(hist, src, dst)
    assert len(got) == dst.nbins
    # Each fine bin's lower edge falls in the coarse bin it was summed into.
    lo_src = src.edges_ns()[0]
    lo_dst, hi_dst = dst.edges_ns()
    want = np.zeros(dst.nbins)
    for i in np.flatnonzero(hist):
        j = int(np.searchsorted(lo_dst, lo_src[i], side="right")) - 1
        assert lo_dst[j] <= lo_src[i] < hi_dst[j] or j == dst.nbins - 1
        want[j] += hist[i]
    assert np.allclose(got, want, rtol=1e-12, atol=0)
    assert coarsen_hist(hist, src, src) is hist


def test_coarsen_hist_refuses_a_finer_target_or_a_wrong_width() -> None:
    with pytest.raises(LayoutError, match="cannot merge histograms"):
        coarsen_hist(np.zeros(BinLayout(29, 2).nbins), BinLayout(29, 2), BinLayout(29, 1))
    with pytest.raises(LayoutError, match="not of 1856 bins"):
        coarsen_hist(np.zeros(10), BinLayout(), BinLayout(29, 1))
