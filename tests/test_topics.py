"""Every topic kind, built and parsed by :class:`fiomon.topics.Topics` (docs/wire-format.md)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from fiomon.topics import TopicKind, Topics


@pytest.mark.parametrize("prefix", ["fiomon", "lab/site-1", "a.b_c-d"])
@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("records", "host-01"),
        ("records", "h.example_1"),
        ("status", "host-01"),
        ("partials", "cell-a"),
        ("partials_ack", "cell-a"),
        ("presence", "fiomon-aggregator"),
        ("presence", "site/agg"),  # a client id is not a topic level: it may span levels
        ("conflict", "fiomon-aggregator"),
        ("conflict", "alerts"),  # no clash with the alerts topic: one level more
        ("alerts", ""),
    ],
)
def test_every_kind_parses_back_to_what_built_it(prefix: str, kind: TopicKind, name: str) -> None:
    t = Topics(prefix)
    build: dict[TopicKind, Callable[[str], str]] = {
        "records": t.records,
        "status": t.status,
        "partials": t.partials,
        "partials_ack": t.partials_ack,
        "presence": t.presence,
        "conflict": t.conflict,
        "alerts": lambda _: t.alerts,
    }
    built = build[kind](name)
    assert built.startswith(f"{prefix}/v1/")
    assert t.parse(built) == (kind, name)


def test_the_names_on_the_wire_are_unchanged() -> None:
    # What agents, aggregators, cells and roots of earlier versions publish and subscribe.
    t = Topics("fiomon")
    assert t.records("h1") == "fiomon/v1/h1/records"
    assert t.status("h1") == "fiomon/v1/h1/status"
    assert t.all_records == "fiomon/v1/+/records"
    assert t.all_status == "fiomon/v1/+/status"
    assert t.alerts == "fiomon/v1/_aggregator/alerts"
    assert t.presence("fiomon-aggregator") == "fiomon/v1/_aggregator/fiomon-aggregator/instance"
    assert t.conflict("fiomon-aggregator") == "fiomon/v1/_aggregator/fiomon-aggregator/conflict"
    assert t.partials("c1") == "fiomon/v1/_partials/c1"
    assert t.all_partials == "fiomon/v1/_partials/+"
    # The root's acknowledgements (issue 24): deploy/mosquitto/fiomon.acl lets it write them.
    assert t.partials_ack("c1") == "fiomon/v1/_partials_ack/c1"


@pytest.mark.parametrize(
    "topic",
    [
        "other/v1/h1/records",  # another prefix
        "fiomonx/v1/h1/records",
        "fiomon/v2/h1/records",  # another wire level
        "fiomon/h1/records",
        "fiomon/v1",
        "fiomon/v1/",
        "fiomon/v1/h1",
        "fiomon/v1/h1/records/x",  # too deep
        "fiomon/v1/a/b/records",
        "fiomon/v1/h1/metrics",  # an unknown kind
        "fiomon/v1//records",  # an empty host
        "fiomon/v1/h1/",
        "fiomon/v1/+/records",  # filters are not topics
        "fiomon/v1/#",
        "fiomon/v1/h+1/status",
        "fiomon/v1/_aggregator/status",  # a host named like a namespace is not a host
        "fiomon/v1/_aggregator/records",
        "fiomon/v1/_partials/a/b",
        "fiomon/v1/_partials/",
        "fiomon/v1/_partials_ack/a/b",
        "fiomon/v1/_partials_ack/",
        "fiomon/v1/_aggregator/other",
        "fiomon/v1/_aggregator/x/other",
        "fiomon/v1/_aggregator//instance",
        "fiomon/v1/_aggregator/instance",
    ],
)
def test_foreign_and_malformed_topics_are_refused(topic: str) -> None:
    assert Topics("fiomon").parse(topic) is None


def test_fiomons_namespaces_come_before_host_names() -> None:
    t = Topics("fiomon")
    assert t.parse("fiomon/v1/_partials/records") == ("partials", "records")  # cell "records"
    assert t.parse("fiomon/v1/_partials/status") == ("partials", "status")
    assert t.parse("fiomon/v1/_partials_ack/records") == ("partials_ack", "records")
    assert t.parse("fiomon/v1/partials/records") == ("records", "partials")


def test_a_prefix_of_several_levels_is_matched_whole() -> None:
    t = Topics("lab/site")
    assert t.parse("lab/site/v1/h1/records") == ("records", "h1")
    assert t.parse("lab/v1/site/records") is None
    assert Topics("lab").parse("lab/site/v1/h1/records") is None


def test_topics_load_no_mqtt_client() -> None:
    # The configuration builds the alert topic's default from it: no aiomqtt, no paho.
    code = "import sys, fiomon.config; print(sorted({'aiomqtt', 'paho'} & sys.modules.keys()))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
