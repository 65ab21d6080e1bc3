"""Reading a Prometheus text exposition in tests: one parser for every test that scrapes.

A scrape becomes ``{(sample name, sorted labels): value}``, so a test asks for one series
with ``s[("fiomon_records_total", (("result", "received"),))]``. Parsing goes through
prometheus_client's own parser (the format's reference reader), not regular expressions.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from typing import Any

from tests.conftest import DEADLINE_S

Labels = tuple[tuple[str, str], ...]
Samples = dict[tuple[str, Labels], float]


def parse_samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and sorted labels."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def scrape_text(port: int, timeout: float = 20, path: str = "/metrics") -> str:
    """The body of ``http://127.0.0.1:<port><path>``.

    Raises:
        OSError: nothing answers (yet), or the request timed out.
    """
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        body: bytes = r.read()
    return body.decode()


def scrape(port: int, timeout: float = 20) -> Samples:
    """The samples ``/metrics`` on ``port`` serves now."""
    return parse_samples(scrape_text(port, timeout))


def scrape_or_none(port: int) -> Samples | None:
    """:func:`scrape`, or None while nothing answers on ``port``."""
    try:
        return scrape(port, timeout=2)
    except OSError:
        return None


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def query(port: int, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    """A Prometheus instant query on ``port``, now or ``at`` a Unix time (s)."""
    params: dict[str, str | float] = {"query": expr}
    if at is not None:
        params["time"] = at
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", (expr, doc)
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


async def wait_http(url: str, seconds: float = DEADLINE_S) -> None:
    """Until ``url`` answers at all (Prometheus ``/-/ready``, a ``/metrics`` endpoint)."""
    async with asyncio.timeout(seconds):
        while True:
            try:
                await asyncio.to_thread(urllib.request.urlopen, url, None, 2)
                return
            except OSError:
                await asyncio.sleep(0.2)
