"""Every default lives on its dataclass: a file that leaves a key out, or sets it to null,
gets exactly the dataclass's value, and every example configuration loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from fiomon.config import (
    MQTTS_PORT,
    AgentConfig,
    AggregatorConfig,
    BrokerConfig,
    SlaRule,
    TlsConfig,
    WebhookConfig,
    agent_config_from,
    aggregator_config_from,
    load_agent_config,
    load_aggregator_config,
    read_yaml,
)
from fiomon.errors import ConfigError

CONFIG = Path(__file__).resolve().parent.parent / "config"
AGENT_REQUIRED = {"watch": ["/x/*.json"], "state_dir": "/var/lib/fiomon-agent"}


def _differences(got: object, want: object) -> list[str]:
    """The fields (by name) where two configurations differ, nested ones as ``a.b``."""
    assert dataclasses.is_dataclass(got) and type(got) is type(want)
    out = []
    for f in dataclasses.fields(got):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if dataclasses.is_dataclass(a) and type(a) is type(b):
            out += [f"{f.name}.{d}" for d in _differences(a, b)]
        elif a != b:
            out.append(f"{f.name}: loaded {a!r}, dataclass default {b!r}")
    return out


def _known_keys(reader: Any, data: dict[str, object]) -> list[str]:
    """The top-level keys a loader knows, read back from its "unknown key" message."""
    with pytest.raises(ConfigError) as info:
        reader({**data, "no_such_key": 1})
    (problem,) = info.value.problems
    return problem.partition("(known here: ")[2].rstrip(")").split(", ")


def test_an_empty_aggregator_file_is_the_dataclass_defaults(tmp_path: Path) -> None:
    empty = tmp_path / "agg.yaml"
    empty.write_text("{}  # nothing set\n")
    assert _differences(load_aggregator_config(empty), AggregatorConfig()) == []
    # The alert topic follows the prefix, whether the prefix is the default or not.
    lab = aggregator_config_from({"topic_prefix": "lab"})
    assert lab.alert_topic == "lab/v1/_aggregator/alerts"


def test_a_minimal_agent_file_is_the_dataclass_defaults() -> None:
    cfg = agent_config_from(AGENT_REQUIRED)
    want = AgentConfig(watch=("/x/*.json",), state_dir=Path("/var/lib/fiomon-agent"))
    assert _differences(cfg, want) == []


@pytest.mark.parametrize("kind", ["agent", "aggregator"])
def test_a_null_key_is_the_default_as_if_absent(kind: str) -> None:
    reader: Any = agent_config_from if kind == "agent" else aggregator_config_from
    base: dict[str, object] = dict(AGENT_REQUIRED) if kind == "agent" else {}
    keys = [k for k in _known_keys(reader, base) if k not in base]
    assert len(keys) > 10  # the hint lists the keys, so this covers each one
    nulls = reader({**base, **dict.fromkeys(keys)})
    assert _differences(nulls, reader(base)) == []


def test_nested_sections_take_their_dataclass_defaults() -> None:
    tls = agent_config_from({**AGENT_REQUIRED, "broker": {"tls": True}}).broker
    # The one default the loader adds: TLS moves the port to MQTT's TLS port.
    assert _differences(tls, BrokerConfig(port=MQTTS_PORT, tls=TlsConfig())) == []
    agg = aggregator_config_from(
        {
            "webhook": {"url": "http://127.0.0.1:9093"},
            "sla": [{"name": "r", "direction": "read", "percentile": 99, "threshold": "5ms"}],
        }
    )
    assert agg.webhook is not None
    assert _differences(agg.webhook, WebhookConfig(url="http://127.0.0.1:9093")) == []
    (rule,) = agg.sla
    assert _differences(rule, SlaRule("r", "read", 99.0, 5e6)) == []


@pytest.mark.parametrize("example", sorted(CONFIG.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_configuration_loads(example: Path) -> None:
    data = read_yaml(example)
    assert isinstance(data, dict) and data, example
    # check-config tells the two apart the same way: an agent has `watch`.
    if "watch" in data:
        assert load_agent_config(example).watch
    else:
        assert load_aggregator_config(example).sla


def test_one_default_percentiles_and_one_directions_constant() -> None:
    import inspect  # noqa: PLC0415

    from fiomon.engine import QuantumEngine  # noqa: PLC0415
    from fiomon.model import DEFAULT_PERCENTILES, DIRECTIONS  # noqa: PLC0415
    from fiomon.offline.quanta import QuantaOptions  # noqa: PLC0415

    (agg,) = [f.default for f in dataclasses.fields(AggregatorConfig) if f.name == "percentiles"]
    assert agg is QuantaOptions().percentiles is DEFAULT_PERCENTILES
    assert QuantaOptions().directions is DIRECTIONS
    # The engine's own defaults: the same objects.
    engine = inspect.signature(QuantumEngine).parameters
    assert engine["percentiles"].default is DEFAULT_PERCENTILES
    assert engine["directions"].default is DIRECTIONS
