"""Real fio on loop devices whose reads a kernel timer paces: a device of known latency.

This machine's real latencies are not repeatable from one run to the next (a loop device
over a cached file is CPU-bound: whole-run p50 20 us in one run, 48 us in the next; the
virtio disk under it: 115 us to 750 us), so "the same job twice" needs a device whose
latency the kernel sets. The blkio controller (cgroup v1; this kernel has no
device-mapper, so no dm-delay) throttles a device's reads to ``bps`` bytes per second in
slices of 100 ms. Below one read per slice (``bps < 10 * block``) every read waits for its
own turn: a 4 KiB read at 20,480 B/s (5 reads a second) completes 200 ms after it was
issued, whatever the CPU or the disk do, and a second read queued behind it (iodepth 2)
after 400 ms.

Not exactly: the timer ticks every 4 ms, and a run-dependent share of the reads (2 % to
17 % seen) ends a tick early or late. A percentile whose rank falls among those few
reads moves by a tick from run to run (p90 of reads all at 200 ms: 199 or 204 ms), which
the intervals rightly call a difference. So each host reads three devices at iodepth 1
(200 ms) and one at iodepth 2 (400 ms): a quarter of the reads take 400 ms, p50 lies two
thirds into the 200 ms reads and p90 in the middle of the 400 ms ones, far from the ticks'
edges, in every run.

Lowering the limit during a run is a throttled device phase that starts and ends when the
test says: at 1.25 reads a second they take 800 ms (1,600 ms at iodepth 2).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import DEADLINE_S
from tests.fiorun import start_fio, wait_fio

BLKIO = Path("/sys/fs/cgroup/blkio")
READ_BPS = BLKIO / "blkio.throttle.read_bps_device"
BASE_READS = 5.0  # reads a second of a device: 200 ms a read (half a read per slice)
SLOW_READS = 1.25  # 800 ms a read
QUEUED_EVERY = 4  # every fourth device is read at iodepth 2

JOB = """[global]
ioengine=psync
rw=randread
direct=1
time_based
runtime={runtime}
write_hist_log=h
log_hist_msec=1000
log_unix_epoch=1
"""


@dataclass(frozen=True, slots=True)
class Loop:
    """A loop device of ours.

    Args:
        path: ``/dev/loopN``.
        dev: its ``major:minor``.
        block: the size of its reads, bytes: each device its own, so that no two jobs
            write the same hist log (same stamps and bins: fiomon's one-truth rule reads
            such files once, as copies of one file); the limit scales with it.
    """

    path: Path
    dev: str
    block: int

    def throttle(self, reads_per_s: float) -> None:
        """Limit it to ``reads_per_s`` reads of ``block`` a second (0: no limit)."""
        READ_BPS.write_text(f"{self.dev} {round(self.block * reads_per_s)}\n")


@contextlib.contextmanager
def loop_devices(folder: Path, count: int) -> Iterator[list[Loop]]:
    """``count`` loop devices over 1 MiB files in ``folder``, each at BASE_READS.

    Their blocks: 512 B times ``count``, ``count - 1``, ... 1.

    The limits are lifted and the devices detached at the end (a later user of the same
    device number must not inherit a limit).
    """
    if not READ_BPS.exists():
        pytest.fail(f"{READ_BPS} is missing: these tests need the cgroup v1 blkio controller")
    folder.mkdir(parents=True, exist_ok=True)
    loops: list[Loop] = []
    try:
        for i in range(count):
            backing = folder / f"loop{i}.img"
            backing.write_bytes(os.urandom(1 << 20))
            out = subprocess.run(
                ["losetup", "--find", "--show", str(backing)],
                capture_output=True,
                text=True,
                check=True,
                timeout=DEADLINE_S,
            )
            path = Path(out.stdout.strip())
            dev = (Path("/sys/block") / path.name / "dev").read_text().strip()
            loops.append(Loop(path, dev, 512 * (count - i)))
            loops[-1].throttle(BASE_READS)
        yield loops
    finally:
        for loop in loops:
            loop.throttle(0)
            subprocess.run(["losetup", "--detach", str(loop.path)], check=False, timeout=DEADLINE_S)


def write_job(path: Path, loops: Sequence[Loop], runtime: int) -> Path:
    """A job file: a random-read job per loop device (hist logs h_clat_hist.N).

    Every QUEUED_EVERY-th device is read at iodepth 2 (libaio), the others at iodepth 1.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    text = JOB.format(runtime=runtime)
    for i, loop in enumerate(loops, 1):
        queued = "ioengine=libaio\niodepth=2\n" if i % QUEUED_EVERY == 0 else ""
        text += f"[d{i}]\nfilename={loop.path}\nbs={loop.block}\n{queued}"
    path.write_text(text)
    return path


@dataclass(frozen=True, slots=True)
class Phase:
    """When a host's devices were slow (epoch ms, each taken right at the switch)."""

    on_ms: int
    off_ms: int


class StatusStream:
    """fio's json+ status stream as it grows: its jobs' runtime so far.

    Args:
        path: the ``--output`` file of ``--output-format=json+ --status-interval=N``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.read_to = 0  # end of the last whole document
        self.runtime_ms = 0

    def poll(self) -> int:
        """The first job's runtime in the newest whole document (0 before the first)."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.read_to)
                text = fh.read().decode("latin-1")  # one character a byte: offsets agree
        except FileNotFoundError:
            return 0
        decoder = json.JSONDecoder()
        pos = 0
        while (start := text.find("{", pos)) >= 0:
            try:
                doc, pos = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                break  # fio is still writing it
            self.runtime_ms = int(doc["jobs"][0]["job_runtime"])
        self.read_to += pos
        return self.runtime_ms

    def wait(self, ms: int) -> None:
        """Wait until the jobs have run ``ms``."""
        deadline = time.monotonic() + ms / 1000 + DEADLINE_S
        while self.poll() < ms:
            assert time.monotonic() < deadline, f"{self.path}: fio never reached {ms} ms"
            time.sleep(0.05)


def run_hosts(
    fio_bin: str,
    folder: Path,
    hosts: Mapping[str, Sequence[Loop]],
    *,
    runtime: int = 30,
    slow: tuple[str, int, int] | None = None,
) -> Phase | None:
    """One fio per host at once, each in ``folder/HOST`` (out.json and the hist logs).

    The job files go beside ``folder`` (``folder.jobs/HOST.fio``): a run folder holds only
    fio's output, as ``fiomon compare FOLDER`` reads every file in it.

    Args:
        fio_bin: fio.
        folder: the run's folder.
        hosts: each host's loop devices.
        runtime: seconds.
        slow: ``(host, on_ms, off_ms)``: that host's devices run at SLOW_READS from when its
            jobs have run ``on_ms`` until they have run ``off_ms``.

    Returns:
        When the slow phase really was, or None.
    """
    procs = []
    for host, loops in hosts.items():
        out = folder / host
        out.mkdir(parents=True, exist_ok=True)
        job = folder.with_name(f"{folder.name}.jobs") / f"{host}.fio"
        write_job(job, loops, runtime)
        procs.append(start_fio(fio_bin, job, out / "out.json", cwd=out))
    phase = None
    try:
        if slow is not None:
            host, on, off = slow
            status = StatusStream(folder / host / "out.json")
            status.wait(on)
            for loop in hosts[host]:
                loop.throttle(SLOW_READS)
            on_ms = time.time_ns() // 1_000_000
            status.wait(off)
            for loop in hosts[host]:
                loop.throttle(BASE_READS)
            phase = Phase(on_ms, time.time_ns() // 1_000_000)
    finally:
        wait_fio(procs)
    return phase
