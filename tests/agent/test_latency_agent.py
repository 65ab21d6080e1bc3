"""The agent's latency kind (issue 27) on real fio output: json+ bins of that kind, every
message says it, and hist logs (clat only) refused, logged and counted."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from fiomon.agent.follow import Follower
from fiomon.bins import BinLayout, plat_val_to_idx
from fiomon.model import LatencyKind
from fiomon.wire import decode
from tests.fiorun import job_file, last_document, start_fio, wait_fio


def _follow(folder: Path, latency: LatencyKind) -> tuple[Follower, list[bytes]]:
    """A follower of the run's json+ stream and hist log, polled until both are read."""
    f = Follower(
        (str(folder / "*.log"), str(folder / "*.json")),
        agent="client-07",
        max_message_bytes=256 * 1024,
        log_hist_msec=250,
        latency=latency,
    )
    payloads: list[bytes] = []
    for final in (False, False, True):
        payloads += [m.payload for m in f.poll(final=final)]
    return f, payloads


@pytest.mark.fio
def test_an_agent_with_latency_lat_publishes_lat_ns_bins_and_refuses_the_hist_log(
    tmp_path: Path, fio_bin: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fiomon.agent")
    run = tmp_path / "run"
    # libaio, buffered: submission takes tens of us, completion one: lat and clat differ.
    job = job_file(run, runtime=2, iops=200, extra="ioengine=libaio\niodepth=4\nlat_percentiles=1")
    wait_fio([start_fio(fio_bin, job, run / "run.json")])
    (hist,) = run.glob("run_clat_hist.*.log")
    final = last_document(run / "run.json")["jobs"][0]["read"]

    f, payloads = _follow(run, "lat")
    try:
        msgs = [decode(p) for p in payloads]
        assert msgs, "the json+ stream went out"
        assert {m.latency for m in msgs} == {"lat"}, "every message says its kind"
        assert {Path(m.stream.rsplit("@", 1)[0]).name for m in msgs} == {"run.json"}
        # The records' bins summed are fio's final cumulative lat_ns bins, exactly.
        layout = BinLayout()
        got = np.zeros(layout.nbins, dtype=np.int64)
        for m in msgs:
            np.add.at(got, m.batch.bins, m.batch.counts)
        for kind, equal in (("lat_ns", True), ("clat_ns", False)):
            bins = final[kind]["bins"]
            want = np.zeros(layout.nbins, dtype=np.int64)
            keys = np.array([int(k) for k in bins], dtype=np.int64)
            np.add.at(want, plat_val_to_idx(keys), np.array(list(bins.values()), np.int64))
            assert np.array_equal(got, want) is equal, kind
        # The hist log (clat only): refused, named in the log, counted.
        assert f.stats.files_refused == 1
        said = [r.getMessage() for r in caplog.records if str(hist) in r.getMessage()]
        assert len(said) == 1, said
        assert "not published" in said[0] and "clat" in said[0] and "lat" in said[0]
    finally:
        f.close()

    # The same files with the default kind: clat bins, the bytes agents sent before kinds
    # (flag bits 2-3 clear), and the hist log is paired with the stream, not refused.
    g, plain = _follow(run, "clat")
    try:
        assert plain and all(p[5] & 0x0C == 0 for p in plain)
        assert {decode(p).latency for p in plain} == {"clat"}
        assert g.stats.files_refused == 0
    finally:
        g.close()
