"""Cells: the host -> cell assignment is stable, balanced and moves few hosts; the config.

The pinned answers below were computed once with blake2b; they hold on every machine and
Python version (a salted ``hash()`` would change them in every process), so an agent
configured on one host and checked with ``fiomon check-config`` on another agree.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fiomon.cells import assign_cell, cell_score
from fiomon.config import agent_config_from, aggregator_config_from
from fiomon.errors import ConfigError

NAMES = [f"client-{i:05d}" for i in range(10_000)]


def test_assignment_is_pinned() -> None:
    # The hash itself: 8 bytes of blake2b("a|client-01"), big-endian.
    assert cell_score("a", "client-01") == 3717914963088452521
    cells = ["east", "west", "north"]
    got = {h: assign_cell(h, cells) for h in ("client-01", "client-03", "bench-7.example")}
    assert got == {"client-01": "north", "client-03": "west", "bench-7.example": "east"}
    # The order of the list does not matter, only the names.
    assert assign_cell("client-03", ["north", "west", "east"]) == "west"
    with pytest.raises(ValueError, match="no cells"):
        assign_cell("client-01", [])


def test_hosts_spread_evenly_and_adding_a_cell_moves_only_its_share() -> None:
    three = {h: assign_cell(h, ["c1", "c2", "c3"]) for h in NAMES}
    per_cell = Counter(three.values())
    # 10,000 names over 3 cells: 3333 each, binomial sd ~47; 5 sd of slack.
    assert all(abs(n - len(NAMES) / 3) < 250 for n in per_cell.values()), per_cell
    four = {h: assign_cell(h, ["c1", "c2", "c3", "c4"]) for h in NAMES}
    moved = [h for h in NAMES if three[h] != four[h]]
    # Every host that moved went to the new cell (nothing reshuffled among the old ones)...
    assert {four[h] for h in moved} == {"c4"}
    # ... and they are about 1/4 of the hosts (2500, sd ~43).
    assert abs(len(moved) - len(NAMES) / 4) < 250, len(moved)
    # Removing the cell again puts exactly those hosts back.
    assert {h: assign_cell(h, ["c1", "c2", "c3"]) for h in moved} == {h: three[h] for h in moved}


AGENT = {"watch": ["/srv/fio/*.json"], "state_dir": "/var/lib/fiomon-agent"}
CELLS = [
    {"name": "east", "broker": {"host": "mqtt-east", "port": 1884}},
    {"name": "west", "broker": {"host": "mqtt-west"}, "topic_prefix": "fio-west"},
    {"name": "north", "broker": {"host": "mqtt-north"}},
]


def test_agent_config_picks_its_cell_by_hash_or_by_name() -> None:
    base = {**AGENT, "broker": {"username": "client-03", "keepalive": "10s"}}
    cfg = agent_config_from({**base, "host": "client-03", "cells": CELLS})
    assert cfg.cell == "west"
    # The cell's broker keys over the top-level ones; its own topic prefix.
    b = cfg.broker
    assert (b.host, b.port, b.username) == ("mqtt-west", 1883, "client-03")
    assert cfg.broker.keepalive_s == 10
    assert cfg.topic_prefix == "fio-west"
    named = agent_config_from({**base, "host": "client-03", "cells": CELLS, "cell": "east"})
    assert (named.cell, named.broker.host, named.broker.port) == ("east", "mqtt-east", 1884)
    assert named.topic_prefix == "fiomon"
    plain = agent_config_from(base)
    assert plain.cell is None
    assert plain.broker.host == "127.0.0.1"


def test_bad_cells_are_reported_with_their_paths() -> None:
    bad = [
        {"name": "east", "broker": {"port": "x"}},
        {"name": "east", "color": "blue"},
        {"broker": {}},
    ]
    with pytest.raises(ConfigError) as err:
        agent_config_from({**AGENT, "cells": bad, "cell": "south"})
    text = "\n".join(err.value.problems)
    assert "cells[0].broker.port: expected an integer" in text
    assert "cells[1].name: duplicate cell name 'east'" in text
    assert "cells[1].color: unknown key" in text
    assert "cells[2].name: required" in text
    with pytest.raises(ConfigError, match="'south' is not among the cells"):
        agent_config_from({**AGENT, "cells": CELLS, "cell": "south"})
    with pytest.raises(ConfigError, match="no cells are listed"):
        agent_config_from({**AGENT, "cell": "east"})
    with pytest.raises(ConfigError, match="cells: expected a list"):
        agent_config_from({**AGENT, "cells": {"east": {}}})


def test_aggregator_cell_and_export_resolution() -> None:
    cfg = aggregator_config_from({"cell": "east", "export": {"buckets_per_octave": 16}})
    assert cfg.cell == "east"
    assert cfg.export.buckets_per_octave == 16
    default = aggregator_config_from({})
    assert (default.cell, default.export.buckets_per_octave) == (None, 4)
    with pytest.raises(ConfigError, match=r"export.buckets_per_octave: expected an integer"):
        aggregator_config_from({"export": {"buckets_per_octave": 0}})
    with pytest.raises(ConfigError, match=r"export.buckets: unknown key"):
        aggregator_config_from({"export": {"buckets": 16}})


def test_check_config_prints_the_chosen_cell(tmp_path: Path) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text(
        f"watch: ['{tmp_path}/*.json']\nstate_dir: {tmp_path / 'state'}\nhost: client-01\n"
        "cells:\n  - {name: east, broker: {host: mqtt-east}}\n"
        "  - {name: west, broker: {host: mqtt-west}}\n"
        "  - {name: north, broker: {host: mqtt-north, port: 1884}, topic_prefix: n}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "fiomon", "check-config", str(f)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "cell north (broker mqtt-north:1884, n)" in r.stdout
    agg = tmp_path / "aggregator.yaml"
    agg.write_text("cell: north\nexport: {buckets_per_octave: 16}\n")
    r = subprocess.run(
        [sys.executable, "-m", "fiomon", "check-config", str(agg)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "; cell north" in r.stdout


def test_a_cells_partials_take_its_name_from_the_top_level_cell() -> None:
    base = {"align": "epoch", "state_dir": "state", "partials": {"broker": {"host": "root"}}}
    cfg = aggregator_config_from({**base, "cell": "north"})
    assert cfg.partials is not None
    assert (cfg.partials.cell, cfg.partials.client_id) == ("north", "fiomon-cell-north")
    own = aggregator_config_from({**base, "partials": {"cell": "n2"}})  # no top-level cell
    assert own.partials is not None and own.partials.cell == "n2"
    with pytest.raises(ConfigError, match=r"partials\.cell: required \(or the top-level cell\)"):
        aggregator_config_from(base)


def test_partials_and_root_problems_name_their_own_keys(tmp_path: Path) -> None:
    base = {"align": "epoch", "state_dir": "state", "cell": "north"}
    bad = {
        **base,
        "partials": {"cell": "south", "broker": {"port": 0, "client_id": "x"}},
        "root": {"cells": ["a", "b", "a"]},
    }
    with pytest.raises(ConfigError) as info:
        aggregator_config_from(bad)
    text = "\n".join(info.value.problems)
    assert "partials.broker.port: expected an integer in [1, 65535], got 0" in text
    assert "partials.broker.client_id: this connection's id is partials.client_id" in text
    assert "partials.cell: 'south' differs from the top-level cell 'north'" in text
    assert "root.cells: each cell once, got a more than once" in text
    # The root broker's password file is checked like the aggregator's own.
    cfg = tmp_path / "cell.yaml"
    cfg.write_text(
        "align: epoch\nstate_dir: state\ncell: north\n"
        f"partials: {{broker: {{host: root, password_file: {tmp_path / 'missing.pass'}}}}}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "fiomon", "check-config", str(cfg)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2, r
    assert "partials.broker.password_file" in r.stderr, r.stderr
