"""Image assertions on screenshots of the chart page: where a chart draws, in which colour.

A chart's plot area (its ECharts grid) and the pixel column of a time come from the page
itself (``convertToPixel``), so the checks read the pixels a reader would see there.
Screenshots are taken at device scale 1 (:meth:`tests.browser.Browser.screenshot`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image

from tests.browser import Browser

Pixels = npt.NDArray[np.int16]


def load(path: Path) -> Pixels:
    """The screenshot as an (height, width, 3) array of RGB values."""
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int16)


def rgb(colour: str) -> tuple[int, int, int]:
    """``#rrggbb`` as a triple."""
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


@dataclass(frozen=True, slots=True)
class Box:
    """A chart's plot area in page pixels (``left``/``top`` inclusive, ``right``/``bottom``
    exclusive) and the page x of some times (ms)."""

    left: int
    top: int
    right: int
    bottom: int

    def crop(self, img: Pixels, x0: int | None = None, x1: int | None = None) -> Pixels:
        """The plot area's pixels, between page columns ``x0`` and ``x1`` if given, less
        a 2 px border (the axis lines)."""
        lo = self.left + 2 if x0 is None else max(self.left + 2, x0)
        hi = self.right - 2 if x1 is None else min(self.right - 2, x1)
        return img[self.top + 2 : self.bottom - 2, lo:hi]


def chart_box(b: Browser, chart: str) -> Box:
    """The plot area of chart ``chart`` (``lat-read``, ``throughput``...) on the page."""
    got = b.evaluate(
        "(function () {"
        f"  var c = window.fiomonRenderer.charts[{json.dumps(chart)}];"
        "  var el = c.getDom().getBoundingClientRect();"
        "  var r = c.getModel().getComponent('grid').coordinateSystem.getRect();"
        "  var top = el.top + window.scrollY + r.y;"
        "  return JSON.stringify([el.left + r.x, top, r.width, r.height]);"
        "})()"
    )
    left, top, width, height = json.loads(got)
    return Box(round(left), round(top), round(left + width), round(top + height))


def x_of(b: Browser, chart: str, ms: float) -> int:
    """The page column of time ``ms`` on chart ``chart``'s time axis."""
    got = b.evaluate(
        "(function () {"
        f"  var c = window.fiomonRenderer.charts[{json.dumps(chart)}];"
        "  var el = c.getDom().getBoundingClientRect();"
        f"  return el.left + c.convertToPixel({{xAxisIndex: 0}}, {ms});"
        "})()"
    )
    return round(float(got))


def near(img: Pixels, colour: str, tolerance: int = 24) -> int:
    """How many pixels are within ``tolerance`` of ``colour`` in every channel."""
    want = np.array(rgb(colour), dtype=np.int16)
    return int((np.abs(img - want).max(axis=-1) <= tolerance).sum())


def inked(img: Pixels) -> int:
    """Pixels that are neither background nor grid lines: coloured (channels apart by
    more than 30, which a translucent band also is) or darker than light grey."""
    spread = img.max(axis=-1) - img.min(axis=-1)
    return int(((spread > 30) | (img.max(axis=-1) < 200)).sum())


def black(img: Pixels, limit: int = 40) -> int:
    """Pixels of the SLA colour (black): every channel below ``limit``."""
    return int((img.max(axis=-1) < limit).sum())


def dashes(img: Pixels, limit: int = 40) -> int:
    """Black runs along the pixel row with the most black: a dashed line has many."""
    mask = img.max(axis=-1) < limit
    row = mask[int(mask.sum(axis=1).argmax())]
    return int((row[1:] & ~row[:-1]).sum() + row[0])
