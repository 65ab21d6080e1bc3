"""A percentile's colour is its own: fixed for the common ones, independent of the set drawn."""

from __future__ import annotations

import pytest

from fiomon.palette import SLA_COLOUR, nines, percentile_colour, percentile_colours


def test_common_percentiles_fixed_and_distinct() -> None:
    common = [50, 90, 95, 99, 99.9, 99.99, 99.999]
    colours = [percentile_colour(p) for p in common]
    assert len(set(colours)) == len(colours)
    assert SLA_COLOUR not in colours
    assert percentile_colour(99) == "#e69f00"


def test_colour_independent_of_the_set() -> None:
    assert percentile_colours([90, 99])["99"] == percentile_colours([50, 90, 99, 99.9])["99"]
    assert set(percentile_colours([50, 99.9])) == {"50", "99.9"}


def test_in_between_interpolates() -> None:
    c = percentile_colour(99.5)
    assert c not in (percentile_colour(99), percentile_colour(99.9))
    assert c.startswith("#") and len(c) == 7
    assert percentile_colour(1) == percentile_colour(50)  # below the ramp: its first colour
    assert nines(99.9) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        nines(0)
