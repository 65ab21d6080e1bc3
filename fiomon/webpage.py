r"""The chart page: ``fiomon/web/page.html`` with the chart library, the renderer and data.

One page serves both uses. ``fiomon plot`` inlines a packed document
(:mod:`fiomon.offline.plotdata`) and the page draws it once; the aggregator serves the page with
no data and a ``live`` flag, and the page polls ``/api/v1/quanta``. Everything is inline
(ECharts, ``fiomon.js``, the data), so the page needs no network to draw: it opens from
a file, on a machine with no internet access, years later.

Script text is inlined verbatim: the vendored files are checked to hold no ``</script``,
and the JSON data has every ``</`` written as ``<\/`` (the same string to JSON).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any

from fiomon import palette

_WEB = "fiomon.web"


@functools.cache
def asset(name: str) -> str:
    """The text of one file under ``fiomon/web/`` (cached: they never change)."""
    text = resources.files(_WEB).joinpath(name).read_text(encoding="utf-8")
    if name.endswith(".js") and "</script" in text.lower():
        msg = f"{name} holds '</script' and cannot be inlined"
        raise ValueError(msg)
    return text


def colours(percentile_keys: Sequence[str] = ()) -> dict[str, Any]:
    """The page's colours (:mod:`fiomon.palette`): fixed ones and ``percentile_keys``'."""
    return {
        "sla": palette.SLA_COLOUR,
        "mean": palette.MEAN_COLOUR,
        "saturated": palette.SATURATED_COLOUR,
        "percentiles": palette.percentile_colours(
            [float(k) for k in percentile_keys if _number(k)]
        ),
    }


def page_html(*, data: dict[str, Any] | None, live: bool, title: str) -> str:
    """The whole page: offline (``data`` given) or live (``live``, data fetched).

    The page's config carries the colours of :mod:`fiomon.palette`: of the data's
    percentiles offline; live, the API's ``meta.colours`` adds the aggregator's.
    """
    keys = [] if data is None else [str(k) for k in data.get("percentiles", ())]
    config = {"live": live, "api": "api/v1/quanta", "poll_ms": 1000, "colours": colours(keys)}
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    html = asset("page.html")
    parts = {
        "{{TITLE}}": _escape(title),
        "/*{{ECHARTS}}*/": asset("vendor/echarts.min.js"),
        "/*{{FIOMON_JS}}*/": asset("fiomon.js"),
        "{{CONFIG}}": json.dumps(config),
        "{{DATA}}": payload,
    }
    # One pass: inserted text (the library, the data) is never searched for markers.
    pattern = re.compile("|".join(re.escape(k) for k in parts))
    return pattern.sub(lambda m: parts[m.group(0)], html)


def _number(key: str) -> bool:
    try:
        return 0.0 < float(key) <= 100.0
    except ValueError:
        return False


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
