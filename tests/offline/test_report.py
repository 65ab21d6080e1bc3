"""The offline report's pipeline: parallel reading must not lose or double anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from fiomon.offline.quanta import QuantaOptions, QuantaReader
from fiomon.offline.sources import SourceOptions
from fiomon.tools.simulate import write_cluster


def _file_samples(paths: list[Path]) -> int:
    return sum(
        sum(int(x) for x in line.split(",")[3:])
        for p in paths
        for line in p.read_text().splitlines()
    )


@pytest.mark.parametrize("per_host", [False, True])
def test_parallel_report_conserves_every_sample(tmp_path: Path, per_host: bool) -> None:
    # Small chunks and many files give the worker threads many chances to run ahead of
    # the merge; closing must follow what has been merged (a worker that advanced its
    # file's progress before its batch was merged once made whole records late).
    paths = write_cluster(tmp_path, hosts=6, jobs_per_host=2, seconds=40, iops=300, seed=5)
    expected = _file_samples(paths)
    for _ in range(3):
        opts = QuantaOptions(per_host=per_host, workers=2, source=SourceOptions(chunk_bytes=8192))
        with QuantaReader(paths, opts) as reader:
            rows = [r for chunk in reader.chunks() for r in chunk]
        got = sum(r.stats.samples for r in rows if r.scope == "cluster" and r.direction == "all")
        assert reader.late_records == 0
        assert got == pytest.approx(expected, rel=1e-12)
        if per_host:
            hosts = sum(r.stats.samples for r in rows if r.scope == "host" and r.direction == "all")
            assert hosts == pytest.approx(expected, rel=1e-12)
