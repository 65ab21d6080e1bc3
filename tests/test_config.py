"""Configuration: the examples load, and every bad key is reported at once with its path."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from fiomon.config import (
    BrokerConfig,
    load_agent_config,
    parse_broker_address,
    with_broker,
)
from fiomon.errors import ConfigError
from fiomon.units import parse_size

CONFIG = Path(__file__).resolve().parent.parent / "config"


def test_agent_example_loads_with_its_documented_values() -> None:
    cfg = load_agent_config(CONFIG / "agent.example.yaml")
    assert cfg.broker.host == "127.0.0.1"
    assert cfg.broker.port == 1883
    assert cfg.broker.keepalive_s == 30
    assert cfg.topic_prefix == "fiomon"
    assert cfg.watch == (
        "/var/lib/fio/results/**/*.json",
        "/var/lib/fio/results/**/*_clat_hist*.log",
    )
    assert cfg.state_dir == Path("/var/lib/fiomon-agent")
    assert cfg.flush_interval_ms == 1000
    assert cfg.poll_interval_ms == 500
    assert cfg.spool_bytes == 64 * 1024**2
    assert cfg.max_message_bytes == 256 * 1024
    assert cfg.host  # the machine's name


def test_every_problem_is_listed_with_its_path(tmp_path: Path) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text(
        "broker: {port: nope, tls: {cert_file: /x}, colour: red}\n"
        "watch: []\n"
        "flush_interval: soon\n"
        "spool_size: 12 parsecs\n"
        "host: 'bad host/name'\n"
        "typo_key: 1\n"
    )
    with pytest.raises(ConfigError) as info:
        load_agent_config(f)
    text = "\n".join(info.value.problems)
    for needle in (
        "broker.port: expected an integer",
        "broker.colour: unknown key",
        "broker.tls: cert_file and key_file go together",
        "watch: expected a list of glob patterns",
        "flush_interval: 'soon' is not a duration",
        "spool_size: expected a size",
        "host: 'bad host/name'",
        "typo_key: unknown key",
        "state_dir: required",
    ):
        assert needle in text, needle
    assert all(p.startswith(str(f)) for p in info.value.problems)


@pytest.mark.parametrize("name", ["_aggregator", "_partials", "_partials_ack"])
def test_a_host_named_like_fiomons_own_topics_is_refused(tmp_path: Path, name: str) -> None:
    # <prefix>/v1/_aggregator/... and _partials/... are the aggregators' and cells' topics:
    # such a host's records would never be read as records (dropped, uncounted).
    f = tmp_path / "agent.yaml"
    f.write_text(f"host: {name}\nwatch: ['/tmp/x/*.log']\nstate_dir: {tmp_path / 's'}\n")
    with pytest.raises(ConfigError) as info:
        load_agent_config(f)
    assert f"host: {name!r} is reserved for fiomon's own topics" in "\n".join(info.value.problems)


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text("watch: [a\nstate_dir: /x\n")
    with pytest.raises(ConfigError, match=r"agent\.yaml:\d+: not valid YAML"):
        load_agent_config(f)


@pytest.mark.parametrize(
    ("text", "value"),
    [(65536, 65536), ("256KiB", 262144), ("64MiB", 64 * 1024**2), ("1GB", 10**9), ("1.5k", 1500)],
)
def test_sizes(text: object, value: int) -> None:
    assert parse_size(text, what="x") == value


def test_aggregator_example_loads_with_its_rules() -> None:
    from fiomon.config import load_aggregator_config  # noqa: PLC0415

    cfg = load_aggregator_config(CONFIG / "aggregator.example.yaml")
    assert (cfg.quantum_ms, cfg.lateness_ms, cfg.align) == (1000, 5000, "auto")
    assert cfg.listen_addr == ("127.0.0.1", 10027)
    assert cfg.alert_topic == "fiomon/v1/_aggregator/alerts"
    assert cfg.confidence_level == 0.95
    first, second = cfg.sla  # one rule per percentile: one incident, one page
    assert first.confidence is None
    # The commented-out alternative to p99-read (with confidence) is valid as shown.
    text = (CONFIG / "aggregator.example.yaml").read_text()
    start = text.index("  # - {name: p99-read")
    snippet = "".join(ln[4:] + "\n" for ln in text[start:].splitlines()[:2])
    from fiomon.config import aggregator_config_from  # noqa: PLC0415

    (sure,) = aggregator_config_from({"sla": yaml.safe_load(snippet)}).sla
    assert (sure.name, sure.confidence, sure.clear_ns) == ("p99-read", 0.95, 5e6)
    assert (first.name, first.threshold_ns, first.for_quanta, first.clear_ns) == (
        "p99-read",
        5e6,
        3,
        4.5e6,
    )
    assert (second.scope, second.min_samples, second.clear_ns, second.clear_for) == (
        "host",
        200,
        15e6,
        5,
    )


def test_aggregator_problems_are_all_listed(tmp_path: Path) -> None:
    from fiomon.config import load_aggregator_config  # noqa: PLC0415

    f = tmp_path / "agg.yaml"
    f.write_text(
        "quantum: fast\nlisten: nowhere\npercentiles: [50, 200]\n"
        "sla:\n  - {name: x, direction: up, percentile: 95, threshold: 5}\n  - {name: x}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_aggregator_config(f)
    text = "\n".join(info.value.problems)
    for needle in (
        "quantum: 'fast' is not a duration",
        "listen: expected host:port",
        "percentiles: expected a list of percentiles",
        "sla[0].direction: expected one of read, write, trim, mixed, all",
        "sla[0].threshold: expected a latency with units",
        "sla[0].percentile: 95 is not among the computed percentiles",
        "sla[1].direction: required",
        "sla[1].name: duplicate rule name 'x'",
    ):
        assert needle in text, needle


def test_confidence_levels_are_checked_and_rules_must_use_the_computed_one() -> None:
    from fiomon.config import aggregator_config_from  # noqa: PLC0415

    rule = {"name": "r", "direction": "read", "percentile": 99, "threshold": "5ms"}
    off = aggregator_config_from({"confidence_level": False})
    assert off.confidence_level is None
    with pytest.raises(ConfigError) as info:
        aggregator_config_from(
            {
                "confidence_level": 0.9,
                "sla": [{**rule, "confidence": 0.95}, {**rule, "name": "s", "confidence": 1}],
            },
            source="agg.yaml",
        )
    assert info.value.problems == [
        "agg.yaml: sla[0].confidence: 0.95 differs from confidence_level (0.9); the bounds "
        "are computed at confidence_level, so set both to the same level",
        "agg.yaml: sla[1].confidence: expected a confidence level in (0, 1) such as 0.95, got 1",
    ]
    with pytest.raises(ConfigError, match=r"confidence_level: expected a confidence level"):
        aggregator_config_from({"confidence_level": "95%"})


def test_sla_incomplete_is_hold_or_evaluate() -> None:
    from fiomon.config import aggregator_config_from  # noqa: PLC0415

    rule = {"name": "r", "direction": "read", "percentile": 99, "threshold": "5ms"}
    cfg = aggregator_config_from({"sla": [rule, {**rule, "name": "s", "incomplete": "evaluate"}]})
    assert [r.incomplete for r in cfg.sla] == ["hold", "evaluate"]
    with pytest.raises(ConfigError) as info:
        aggregator_config_from({"sla": [{**rule, "incomplete": "skip"}]}, source="agg.yaml")
    assert info.value.problems == [
        "agg.yaml: sla[0].incomplete: expected one of hold, evaluate, got 'skip'"
    ]


def test_duplicate_keys_binary_files_and_deep_nesting_are_clear_errors(tmp_path: Path) -> None:
    dup = tmp_path / "dup.yaml"
    dup.write_text("watch: [/x/*.json]\nstate_dir: /tmp/s\nbroker: {port: 1883}\nwatch: [/y]\n")
    with pytest.raises(ConfigError, match="line 4: key 'watch' given twice"):
        load_agent_config(dup)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="not a text file"):
        load_agent_config(binary)
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 100_000)
    with pytest.raises(ConfigError):
        load_agent_config(deep)


def test_missing_password_and_tls_files_fail_at_load(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        "watch: [/x/*.json]\nstate_dir: /tmp/s\n"
        f"broker: {{password_file: {tmp_path}/nope, tls: {{ca_file: {tmp_path}/ca.pem}}}}\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_agent_config(cfg)
    text = "\n".join(exc.value.problems)
    assert "broker.password_file: cannot read" in text
    assert "broker.tls.ca_file: cannot read" in text


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("broker.example", "broker.example", None),
        ("broker.example:8883", "broker.example", 8883),
        ("10.0.0.7:1884", "10.0.0.7", 1884),
        ("[2001:db8::7]:8883", "2001:db8::7", 8883),
        ("[::1]", "::1", None),
        ("2001:db8::7", "2001:db8::7", None),  # a bare IPv6 address is all host
    ],
)
def test_broker_addresses_from_flags_and_the_environment(
    text: str, host: str, port: int | None
) -> None:
    assert parse_broker_address(text, what="--broker") == (host, port)


@pytest.mark.parametrize("text", ["", ":1883", "broker:0", "broker:70000", "broker:x", "[::1]x"])
def test_bad_broker_addresses_name_their_source(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^FIOMON_BROKER: "):
        parse_broker_address(text, what="FIOMON_BROKER")


def test_an_override_keeps_the_files_port_unless_it_has_one() -> None:
    file = BrokerConfig(host="a", port=8883, username="client-07")
    assert with_broker(file, "b", what="--broker") == replace(file, host="b")
    assert with_broker(file, "b:1884", what="--broker") == replace(file, host="b", port=1884)


def _documented_keys(example: Path) -> set[str]:
    """Top-level and ``broker.`` keys an example shows, set or commented out."""
    keys = set()
    section = ""
    for line in example.read_text().splitlines():
        m = re.match(r"^(\s*)#?\s?(\w+):(?:\s|$)", line)
        if m is None:
            continue
        indent, key = m.groups()
        if not indent and not line.startswith("# "):
            section = key
            keys.add(key)
        elif not indent:
            keys.add(key)  # a commented-out top-level key
        elif section == "broker" and len(indent) == 2:
            keys.add(f"broker.{key}")
    return keys


def _accepted_keys(kind: str) -> set[str]:
    """The keys the loader accepts, read back from its "unknown key" messages."""
    from fiomon import config  # noqa: PLC0415

    reader = config.agent_config_from if kind == "agent" else config.aggregator_config_from
    data: dict[str, object] = {"watch": ["x"], "state_dir": "s"} if kind == "agent" else {}
    with pytest.raises(ConfigError) as info:
        reader({**data, "no_such_key": 1, "broker": {"no_such_key": 1}})
    keys = set()
    for problem in info.value.problems:
        where, _, known = problem.partition(": unknown key (known here: ")
        prefix = "broker." if where.endswith("broker.no_such_key") else ""
        keys |= {prefix + k for k in known.rstrip(")").split(", ") if k}
    return keys


@pytest.mark.parametrize("kind", ["agent", "aggregator"])
def test_every_key_is_in_the_example(kind: str) -> None:
    # config/README.md and the top-level README promise it: "every key, with its default".
    accepted = _accepted_keys(kind)
    assert {"broker", "broker.host", "broker.keepalive"} <= accepted
    shown = _documented_keys(CONFIG / f"{kind}.example.yaml")
    assert not accepted - shown, f"config/{kind}.example.yaml lacks {sorted(accepted - shown)}"


def test_the_example_aggregator_writes_only_where_its_unit_may() -> None:
    from fiomon.config import load_aggregator_config  # noqa: PLC0415

    unit = (CONFIG.parent / "deploy/systemd/fiomon-aggregator.service").read_text()
    (state,) = re.findall(r"(?m)^StateDirectory=(\S+)$", unit)
    cfg = load_aggregator_config(CONFIG / "aggregator.example.yaml")
    writable = Path("/var/lib") / state
    assert cfg.state_dir == writable
    assert cfg.quanta_file is not None and cfg.quanta_file.parent == writable


def test_the_aggregator_refuses_a_broker_client_id_it_would_ignore() -> None:
    from fiomon.config import aggregator_config_from  # noqa: PLC0415

    with pytest.raises(ConfigError) as info:
        aggregator_config_from({"broker": {"client_id": "x"}}, source="agg.yaml")
    assert info.value.problems == [
        "agg.yaml: broker.client_id: the aggregator's id is the top-level client_id"
    ]
