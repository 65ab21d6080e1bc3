"""The webhook path (sites without Prometheus): what a real HTTP receiver gets.

The aggregator posts the alert Prometheus' rule would raise: ``FiomonSLABreach`` with
``severity: page``, the value and the threshold in ms, the hosts holding the cluster's
tail, a description and a runbook, then the same labels with ``endsAt`` when it resolves,
saying "ended" when it resolves because the input went idle (the benchmark stopped).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from fiomon.aggregator.merger import AggregatorCore
from fiomon.config import AggregatorConfig, SlaRule, WebhookConfig, aggregator_config_from
from fiomon.errors import ConfigError
from fiomon.server.alerts import AlertDispatcher
from fiomon.wire import encode
from tests.aggregator.corekit import batch
from tests.clock import T0, FakeClock
from tests.conftest import until


class _Receiver(BaseHTTPRequestHandler):
    posts: ClassVar[list[tuple[str, list[dict[str, Any]]]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Receiver.posts.append((self.path, json.loads(body)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


async def test_webhook_alerts_carry_severity_and_resolve_when_idle() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Receiver.posts = []
    clock = FakeClock(T0)
    rule = SlaRule("p99-read", "read", 99.0, 5e6, for_quanta=1, min_samples=1)
    c = AggregatorCore(AggregatorConfig(align="epoch", lateness_ms=5000, sla=(rule,)), now_ms=clock)
    hook = WebhookConfig(
        f"http://127.0.0.1:{server.server_port}",
        timeout_ms=5000,
        labels=(("cluster", "bench"), ("instance", "agg-1")),
        runbook="https://wiki.example.net/storage/fiomon-runbook",
    )
    deliveries: Counter[tuple[str, str]] = Counter()
    dispatcher = AlertDispatcher(hook, deliveries, clock)
    stop = asyncio.Event()
    runner = asyncio.create_task(dispatcher.run(stop))
    try:
        clock.advance(8_000)
        ends = [T0 + 1000 * i for i in range(1, 8)]
        # h2 is slow (127 ms); h1 is fast (64 us), with as many I/Os.
        c.on_records("h1", encode("h1", "s@1", 0, batch(ends, bin_=700)))
        c.on_records("h2", encode("h2", "s@1", 0, batch(ends, bin_=1400)))
        clock.advance(5001)
        c.tick()
        dispatcher.offer(c.publisher.alerts, c.transitions)
        c.transitions.clear()
        await until(lambda: len(_Receiver.posts) >= 1, what="the firing alert is posted")
        clock.advance(c.idle_after_ms)
        c.tick()  # idle: the alert resolves
        assert [t.idle for t in c.transitions] == [True]
        dispatcher.offer(c.publisher.alerts, c.transitions)
        await until(lambda: len(_Receiver.posts) >= 2, what="the resolution is posted")
    finally:
        stop.set()
        await runner
        server.shutdown()
        server.server_close()
    (path, firing), (_, resolved) = _Receiver.posts[:2]
    assert path == "/api/v2/alerts"
    (alert,) = firing
    assert alert["labels"] == {
        "alertname": "FiomonSLABreach",
        "rule": "p99-read",
        "direction": "read",
        "percentile": "99",
        "latency": "clat",  # the aggregator's latency kind, as on fiomon_sla_breach
        "severity": "page",
        "cluster": "bench",  # the site's labels (webhook.labels), as external_labels
        "instance": "agg-1",
    }
    notes = alert["annotations"]
    assert notes["runbook_url"] == "https://wiki.example.net/storage/fiomon-runbook#fiomonslabreach"
    assert notes["summary"] == "p99 clat read 127 ms > 5 ms (cluster)"
    assert (notes["value"], notes["threshold"]) == ("127 ms", "5 ms")
    assert notes["worst_hosts"] == "h2 100%"
    assert "p99 clat read latency stayed above 5 ms" in notes["description"]
    (end,) = resolved
    assert end["labels"] == alert["labels"]
    assert "endsAt" in end
    assert end["annotations"]["resolution"].startswith("ended: the benchmark stopped")
    assert end["annotations"]["summary"].startswith("ended (the benchmark stopped): p99 clat read")
    assert end["annotations"]["worst_hosts"] == "h2 100%"
    assert deliveries[("webhook", "sent")] == 2


def test_webhook_labels_and_runbook_are_read_and_checked() -> None:
    hook = aggregator_config_from(
        {
            "webhook": {
                "url": "http://127.0.0.1:9093",
                "labels": {"cluster": "bench", "instance": "agg-1"},
                "runbook": "https://wiki.example.net/fiomon",
            }
        }
    ).webhook
    assert hook is not None
    assert hook.labels == (("cluster", "bench"), ("instance", "agg-1"))
    assert hook.runbook == "https://wiki.example.net/fiomon"
    with pytest.raises(ConfigError) as caught:
        aggregator_config_from(
            {
                "webhook": {
                    "url": "http://127.0.0.1:9093",
                    "labels": {"9bad": "x", "host": "h1", "cluster": ""},
                    "runbook": "wiki/fiomon",
                }
            }
        )
    text = "\n".join(caught.value.problems)
    assert "'9bad' is not a label name" in text
    assert "webhook.labels.host: set by fiomon itself" in text
    assert "webhook.labels.cluster: expected a non-empty string" in text
    assert "webhook.runbook: expected a URL" in text
