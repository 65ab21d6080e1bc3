"""``fiomon demo``: the whole live system on one machine, with nothing to set up.

A simulated cluster (default 8 hosts x 4 fio jobs; normal head plus power-law tail, see
:mod:`fiomon.tools.simulate`) writes genuine fio hist-log lines as time passes, one record per
job and direction per second, like a benchmark harness logging live. For every host the
real agent code (:class:`~fiomon.agent.follow.Follower`: file following, parsing, sequence
numbers, wire encoding) reads them; its wire-format messages go, through an in-process
transport instead of a broker, to the real aggregator core (dedup, quanta, close,
percentiles, SLA rules), whose ``/metrics`` is served on localhost as in production.

A "storage node failure" slows some hosts tenfold for a while, so the SLA rule
(p99 read above 2 ms for 3 quanta) fires and then resolves. Without ``--duration`` the
failure repeats every minute until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

import numpy as np
import numpy.typing as npt

from fiomon.agent.follow import Follower
from fiomon.aggregator.merger import AggregatorCore
from fiomon.closed import ClosedQuantum
from fiomon.config import AggregatorConfig, SlaRule
from fiomon.server.alerts import Phase
from fiomon.server.metrics_server import MetricsProcess
from fiomon.tools.simulate import JobSpec, LatencyModel, format_line, records
from fiomon.units import format_latency_ns

RULE = SlaRule("p99-read", "read", 99.0, 2e6, for_quanta=3, min_samples=50)
# The shortest --duration in which the simulated failure both fires and resolves the
# alert (3 quanta to fire, 3 clean ones to resolve, 3 s of lateness for each):
# tests/test_cli.py runs the demo for this long and expects one of each.
RESOLVE_S = 14
TICK_S = 0.25
Record = tuple[int, int, npt.NDArray[np.int64], npt.NDArray[np.int64] | None]


def failure_window(start_ms: int, seconds: int | None) -> Callable[[int], bool]:
    """When the simulated storage node is down (a window, or 15 s of every minute)."""
    if seconds is not None:
        lo = start_ms + 1000 * (seconds // 3)
        hi = lo + 1000 * max(4, seconds // 4)
        return lambda t: lo <= t < hi
    return lambda t: 20_000 <= (t - start_ms) % 60_000 < 35_000


class _Job:
    """One simulated fio job appending its hist-log lines as their time comes."""

    def __init__(self, path: Path, gen: Iterator[Record]) -> None:
        self.path = path
        self.gen = gen
        self.next: Record | None = next(gen, None)

    def write_due(self, now_ms: int) -> None:
        lines = []
        while self.next is not None and self.next[0] <= now_ms:
            end, d, counts, _ = self.next
            lines.append(format_line(end, d, 4096, counts))
            self.next = next(self.gen, None)
        if lines:
            with self.path.open("a") as fh:
                fh.write("".join(lines))


def _start_fio(
    fio: str, folder: Path, names: list[str], *, jobs: int, seconds: int, slow_hosts: int
) -> list[subprocess.Popen[bytes]]:
    """One real fio process per host, json+ status every second into its folder.

    The first ``slow_hosts`` hosts switch to 64 MiB reads (several ms each, from the page
    cache; 8 MiB took under the SLA's 2 ms on a fast machine) after a quarter of the run,
    for a quarter of it (at least 4 s): the "failing storage node".
    """
    before = max(2, seconds // 4)
    failing = max(4, seconds // 4)
    after = max(4, seconds - before - failing)  # long enough for the alert to resolve
    procs = []
    for h, name in enumerate(names):
        (folder / name).mkdir(parents=True, exist_ok=True)
        data = folder / f"{name}.dat"
        with data.open("wb") as fh:  # laid out up front, so every host starts together
            fh.write(np.random.default_rng(h).bytes(64 * 1024 * 1024))
        common = [
            "--ioengine=psync",
            f"--filename={data}",
            "--size=64M",
            "--time_based",
            "--status-interval=1",
            "--output-format=json+",
            f"--output={folder / name / 'run.json'}",
            "--eta=never",
            f"--numjobs={jobs}",
            # Read the page cache (the file was just written): fio's default invalidate=1
            # drops it at every job start, and reads from disk can take longer than the
            # SLA's 2 ms even on the healthy hosts, so the alert would not resolve.
            "--invalidate=0",
        ]
        fast = ["--rw=randread", "--bs=4k", "--rate_iops=200"]
        if h < slow_hosts:
            # The "failing" phase reads 64 MiB blocks: milliseconds each from the page
            # cache even on a fast machine (32 MiB took about 2 ms on one, under the SLA).
            phases = [
                *("--name=before", *fast, f"--runtime={before}"),
                *("--name=failing", "--stonewall", "--rw=read", "--bs=64M", "--rate_iops=20"),
                f"--runtime={failing}",
                *("--name=after", "--stonewall", *fast, f"--runtime={after}"),
            ]
        else:
            phases = ["--name=steady", *fast, f"--runtime={before + failing + after}"]
        procs.append(
            subprocess.Popen(
                [fio, *common, *phases], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )
    return procs


class _View:
    """One line per closed quantum: cluster percentiles, IOPS, hosts, delivery, SLA."""

    def __init__(self, out: TextIO, hosts: int) -> None:
        self.out = out
        self.hosts = hosts

    def header(self) -> None:
        self.out.write(
            "quantum end  read p50   p90   p99 p99.9 | write p50   p99 |    IOPS | hosts "
            "| late lost | SLA p99 read > 2 ms\n"
        )

    def show(self, rows: list[ClosedQuantum], core: AggregatorCore) -> None:
        by_end: dict[int, dict[tuple[str, str | None], ClosedQuantum]] = {}
        for r in rows:
            by_end.setdefault(r.end_ms, {})[
                (r.direction, r.host if r.scope == "host" else None)
            ] = r
        state = core.publisher.alerts.states.get((RULE.name, None))
        phase = state.phase.value if state is not None else Phase.INACTIVE.value
        lost = sum(core.counts.lost.values())
        late = sum(core.engine.late_records.values()) if core.engine else 0
        for end, got in sorted(by_end.items()):
            rd, wr, al = got.get(("read", None)), got.get(("write", None)), got.get(("all", None))
            rp = rd.stats.percentiles_ns if rd else {}
            wp = wr.stats.percentiles_ns if wr else {}
            hosts = len({h for (_, h) in got if h is not None})
            stamp = time.strftime("%H:%M:%S", time.localtime(end / 1000))
            # ms with 3 significant digits (page-cache reads take microseconds)
            r50, r90, r99, r999 = (
                format_latency_ns(rp.get(k), "ms", width=5) for k in ("50", "90", "99", "99.9")
            )
            w50, w99 = (format_latency_ns(wp.get(k), "ms", width=5) for k in ("50", "99"))
            self.out.write(
                f"{stamp}     {r50} {r90} {r99} {r999} |     {w50} {w99} | "
                f"{(al.iops or 0) if al else 0:7.0f} | {hosts:2d}/{self.hosts:<2d} | "
                f"{late:4d} {lost:4d} | {phase.upper() if phase == 'firing' else phase}\n"
            )
        self.out.flush()


def run_demo(
    *,
    hosts: int = 8,
    jobs: int = 4,
    seconds: int | None = 30,
    keep: Path | None = None,
    listen: str = "127.0.0.1:0",
    real_fio: bool = False,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Run the live demo; returns the exit code (0, also after Ctrl-C).

    Args:
        hosts: simulated client hosts.
        jobs: fio jobs per host.
        seconds: run this long (None: until Ctrl-C).
        keep: write the simulated logs here (kept) instead of a temporary folder.
        listen: ``host:port`` of ``/metrics`` (port 0: any free port).
        real_fio: run real fio jobs (json+ status every second) instead of the simulator.
        out: the live view.
        err: narration.
    """
    with tempfile.TemporaryDirectory(prefix="fiomon-demo-") as tmp:
        folder = keep or Path(tmp)
        fio = shutil.which("fio") if real_fio else None
        if real_fio and fio is None:
            err.write("fiomon demo: --real-fio needs fio (apt-get install fio)\n")
            return 2
        return _run(hosts, jobs, seconds, folder, listen=listen, fio=fio, out=out, err=err)


def _run(
    hosts: int,
    jobs: int,
    seconds: int | None,
    folder: Path,
    *,
    listen: str,
    fio: str | None,
    out: TextIO,
    err: TextIO,
) -> int:
    now_ms = time.time_ns() // 1_000_000
    start = now_ms // 1000 * 1000
    slow_hosts = max(1, hosts // 4)
    down = failure_window(start, seconds)
    rng = np.random.default_rng(7)
    model = LatencyModel()
    names = [f"client-{h + 1:02d}" for h in range(hosts)]
    sim: list[_Job] = []
    procs = (
        _start_fio(fio, folder, names, jobs=jobs, seconds=seconds or 60, slow_hosts=slow_hosts)
        if fio is not None
        else []
    )
    for h, name in enumerate(names if fio is None else []):
        (folder / name).mkdir(parents=True, exist_ok=True)
        host_phase = int(rng.integers(0, 1000))
        slow = h < slow_hosts

        def factor(t: int, slow: bool = slow) -> float:
            return 10.0 if slow and down(t) else 1.0

        for j in range(jobs):
            spec = JobSpec(name, j + 1, 500.0, (host_phase + 3 * j) % 1000)
            gen = records(
                spec,
                start_ms=start,
                seconds=seconds + 2 if seconds is not None else 10**7,
                interval_ms=1000,
                model=model,
                rng=np.random.default_rng(1000 * h + j),
                factor_at=factor,
            )
            sim.append(_Job(folder / name / f"job_clat_hist.{j + 1}.log", gen))
    cfg = AggregatorConfig(
        quantum_ms=1000, lateness_ms=3000, align="auto", listen=listen, sla=(RULE,)
    )
    core = AggregatorCore(cfg)
    core.link.connected = True  # the in-process transport is always up
    followers = {
        name: Follower(
            (str(folder / name / "*.log"), str(folder / name / "*.json")),
            agent=name,
            max_message_bytes=256 * 1024,
            log_hist_msec=1000,
        )
        for name in names
    }
    addr, port = cfg.listen_addr
    # As the aggregator serves them: /metrics and the live page from a child process.
    server = MetricsProcess(addr, port, lambda: core.snapshot)
    server.start()
    url = f"http://{addr}:{server.port}/metrics"
    page = f"http://{addr}:{server.port}/"
    if fio is not None:
        window = "a quarter into the run, for a quarter of it (its host reads 64 MiB blocks)"
    elif seconds is not None:
        window = f"from {seconds // 3} s for {max(4, seconds // 4)} s"
    else:
        window = "for 15 s of every minute"
    err.write(
        f"fiomon demo: {hosts} {'real fio' if fio else 'simulated'} hosts x {jobs} fio jobs, "
        "agents -> in-process "
        f"transport -> aggregator; Prometheus metrics on {url}\n"
        f"fiomon demo: live page (open it in a browser): {page}\n"
        f"fiomon demo: a storage node fails {window}, slowing {slow_hosts} host(s); "
        f"watch p99 rise and the SLA fire and resolve{'' if seconds else ' (Ctrl-C stops)'}\n"
    )
    if seconds is not None and seconds < RESOLVE_S and fio is None:
        err.write(
            f"fiomon demo: {seconds} s ends before the alert can resolve "
            f"(--duration {RESOLVE_S} or more shows both)\n"
        )
    view = _View(out, hosts)
    view.header()
    fired = resolved = 0
    deadline = None if seconds is None else time.monotonic() + seconds
    try:

        def running() -> bool:
            in_time = deadline is None or time.monotonic() < deadline
            if procs:  # real fio: until every fio has finished (and the deadline passed)
                return any(p.poll() is None for p in procs) or (deadline is not None and in_time)
            return in_time

        while running():
            now = time.time_ns() // 1_000_000
            for job in sim:
                job.write_due(now)
            for name, f in followers.items():
                for msg in f.poll():
                    core.on_records(name, msg.payload)
            rows = core.tick()
            for t in core.transitions:
                fired += t.new is Phase.FIRING
                resolved += t.new is Phase.RESOLVED
            core.transitions.clear()
            if rows:
                view.show(rows, core)
            time.sleep(TICK_S)
    except KeyboardInterrupt:
        err.write("\nfiomon demo: interrupted\n")
    finally:
        for p in procs:  # fio writes its final dump at exit
            if p.poll() is None:
                p.terminate()
            p.wait(10)
        for name, f in followers.items():
            for msg in f.poll():
                core.on_records(name, msg.payload)
        rows = core.flush()
        with contextlib.suppress(BrokenPipeError):
            if rows:
                view.show(rows, core)
        server.close()
        for f in followers.values():
            f.close()
    err.write(
        f"fiomon demo: {core.counts.records['received']} records from {hosts} agents, "
        f"{core.counts.quanta_closed} quanta closed; SLA fired {fired}x, resolved {resolved}x; "
        f"lost {sum(core.counts.lost.values())}, duplicates {core.counts.records['duplicate']}\n"
    )
    if seconds is not None and core.counts.quanta_closed == 0:
        return 1
    return 0
