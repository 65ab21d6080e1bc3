"""The aggregator's ``state.json`` on a nearly full disk: the old state whole, or the new.

A real small tmpfs (:mod:`tests.diskfull`). The journal's copy of ``write_atomic`` once
wrote once and renamed: on a nearly full disk that left ``state.json`` holding only the
part that fitted.
"""

from __future__ import annotations

import json
from pathlib import Path

from fiomon.aggregator.watermark import KnownStreams
from fiomon.server.journal import GridState
from fiomon.server.quantafile import QuantaWriter
from tests.clock import T0
from tests.diskfull import fill, free_bytes, small_tmpfs


def grid(closed_s: int, streams: int) -> GridState:
    known = KnownStreams(
        T0 + 1000 * closed_s,
        tuple(
            (f"host-{i:04d}", f"/data/run/job{i}.json@1", T0 + 1000 * closed_s)
            for i in range(streams)
        ),
    )
    return GridState(1000, 0, (1, 1, "ns"), T0 + 1000 * closed_s, known)


def test_a_grid_state_too_big_for_the_disk_leaves_the_old_one(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "fs") as fs:
        path = fs / "state.json"
        grid(10, 2).save(path)
        before = path.read_bytes()
        fill(fs, leave=8192)
        big = grid(11, 600)  # ~27 KB of known streams: three times the space left
        assert len(json.dumps(big.to_json())) > 3 * 8192
        problems: list[tuple[str, str]] = []
        writer = QuantaWriter(None, path, lambda kind, text: problems.append((kind, text)))
        writer.submit((), T0 + 11_000, big)
        assert writer.close()
        assert [kind for kind, _ in problems] == ["state-write"]
        assert "No space left on device" in problems[0][1]
        # the mark was not saved: nothing may be released from the journal on its behalf
        assert writer.confirmed_ms is None
        assert path.read_bytes() == before, "state.json is the old one, whole"
        loaded, why = GridState.load(path, KnownStreams.from_json)
        assert why is None
        assert loaded == grid(10, 2)
        assert sorted(p.name for p in fs.iterdir()) == ["filler", "state.json"]
        assert free_bytes(fs) == 8192
        (fs / "filler").unlink()
        big.save(path)  # with room again the new state is written whole
        assert GridState.load(path, KnownStreams.from_json) == (big, None)
