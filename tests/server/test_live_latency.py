"""The live page names the latency kind of an aggregator that merges lat or slat."""

from __future__ import annotations

import json

from fiomon.config import SlaRule
from fiomon.server.live import LiveFeed

RULES = [
    SlaRule("p99-read", "read", 99.0, 5e6, for_quanta=1, min_samples=1),
    SlaRule("p99-write-host", "write", 99.9, 2e6, for_quanta=1, min_samples=1, scope="host"),
]


def test_sla_labels_and_meta_name_lat_and_slat_but_not_clat() -> None:
    labels = {}
    for kind in ("clat", "lat", "slat"):
        meta = json.loads(LiveFeed((50.0, 99.0), RULES, 1000, latency=kind).meta)
        assert meta["latency"] == kind
        labels[kind] = [s["label"] for s in meta["sla"]]
    assert labels["clat"] == ["SLA p99 read 5 ms", "SLA p99.9 write 2 ms (each host)"]
    assert labels["lat"] == ["SLA p99 lat read 5 ms", "SLA p99.9 lat write 2 ms (each host)"]
    assert labels["slat"][0] == "SLA p99 slat read 5 ms"


def test_a_reload_keeps_the_kind_in_the_labels() -> None:
    feed = LiveFeed((99.0,), RULES[:1], 1000, latency="lat")
    feed.set_rules(RULES[1:])
    (line,) = json.loads(feed.meta)["sla"]
    assert line["label"] == "SLA p99.9 lat write 2 ms (each host)"
