"""The one latency formatter, in each of the forms fiomon prints."""

from __future__ import annotations

from typing import Any

import pytest

from fiomon.units import format_latency_ns


@pytest.mark.parametrize(
    ("ns", "kwargs", "text"),
    [
        # summary: the unit the value reaches, 3 significant digits
        (850.0, {}, "850 ns"),
        (1234.0, {}, "1.23 us"),
        (2.5e6, {}, "2.5 ms"),
        (1.5e9, {}, "1.5 s"),
        # fit: ms at most
        (1.5e9, {"largest": "ms"}, "1.5e+03 ms"),
        (999.0, {"largest": "ms"}, "999 ns"),
        # the demo: a ms column, 5 wide, "-" when unknown
        (812_345.0, {"unit": "ms", "width": 5}, "0.812"),
        (12e6, {"unit": "ms", "width": 5}, "   12"),
        (None, {"unit": "ms", "width": 5}, "    -"),
        # report's table: fixed decimals in the table's unit
        (812_345.0, {"unit": "us", "fixed": True}, "812.3"),
        (81_234.5, {"unit": "us", "fixed": True}, "81.234"),
        (2.5e9, {"unit": "s", "fixed": True}, "2.500"),
    ],
)
def test_format_latency_ns(ns: float | None, kwargs: dict[str, Any], text: str) -> None:
    assert format_latency_ns(ns, **kwargs) == text
