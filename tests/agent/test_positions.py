"""The positions file: atomic, versioned, and damaged files start afresh with new ids."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from fiomon.agent.follow import Follower
from fiomon.agent.positions import FollowState, load_positions, save_positions
from fiomon.tools.simulate import format_line
from fiomon.wire import decode
from tests.clock import T0


def line(i: int) -> str:
    counts = np.zeros(1856, dtype=np.int64)
    counts[700 + i] = 3 + i
    return format_line(T0 + 1000 * (i + 1), 0, 4096, counts)


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0) + line(1))
    with Follower((str(p),), agent="h", max_message_bytes=1 << 18) as f:
        stream = decode(next(iter(f.poll())).payload).stream
        state = f.state({stream: 2})
    save_positions(tmp_path / "positions.json", state)
    loaded, problems = load_positions(tmp_path / "positions.json")
    assert problems == []
    assert loaded.to_json() == state.to_json()
    assert not list(tmp_path.glob(".*.tmp"))


def test_damaged_files_and_entries_are_reported_and_start_afresh(tmp_path: Path) -> None:
    path = tmp_path / "positions.json"
    for raw in (b"", b"\n", b"{not json", b"[1, 2]", b'{"version": 99}', b"[" * 100_000):
        path.write_bytes(raw)
        state, problems = load_positions(path)
        assert state.streams == {}
        assert len(problems) == 1
        assert str(path) in problems[0]
        assert "moved aside" in problems[0]
        assert not path.exists()  # moved aside, kept for a post-mortem
        assert (tmp_path / "positions.json.damaged").read_bytes() == raw
    path.write_text(json.dumps({"version": 2, "streams": {"x@1": {"path": 3}}}))
    state, problems = load_positions(path)
    assert state.streams == {}
    assert "x@1" in problems[0]


def test_version_1_positions_resume_their_stream(tmp_path: Path) -> None:
    """An agent upgraded in place neither resends nor renames what it had published."""
    p = tmp_path / "a_clat_hist.1.log"
    p.write_text(line(0) + line(1) + line(2))
    st = p.stat()
    head = hashlib.blake2b(p.read_bytes()[:64], digest_size=16).hexdigest()
    v1 = {
        "version": 1,
        "files": {
            str(p): {
                "generation": 3,
                "dev": st.st_dev,
                "ino": st.st_ino,
                "head": head,
                "acked_seq": 2,
                "time_offset_ms": None,
            }
        },
    }
    (tmp_path / "positions.json").write_text(json.dumps(v1))
    state, problems = load_positions(tmp_path / "positions.json")
    assert problems == []
    assert state.next_generation == 4
    with Follower((str(p),), agent="h", max_message_bytes=1 << 18, state=state) as f:
        out = [decode(m.payload) for m in f.poll()]
    assert [(m.stream, m.seqs.tolist()) for m in out] == [(f"{p}@3", [2])]


def test_empty_state_is_version_2() -> None:
    assert FollowState().to_json()["version"] == 2
