"""Benchmark: one cell against two on one machine, every process's CPU, checked exactly.

The load is ``bench_aggregator.py``'s (``--hosts`` synthetic agents with ``--jobs`` fio
jobs each, one message per host per second, a read and a write record per job, counts
x1, x2, x3 in successive seconds), cut into cells as the agents cut a site: each host
``h<i>`` goes to ``fiomon.cells.assign_cell(h<i>, cells)`` (the agents' rendezvous hash).
Each cell is its own real Mosquitto (the queue limits of ``deploy/mosquitto/fiomon.conf``),
its own real ``fiomon aggregator`` (``cell: cell-a`` / ``cell-b``; lateness 5 s, host
scope, quanta file, journal), its own publisher process (raw MQTT 3.1.1 QoS 1, the wire
format, only that cell's hosts, each at the same moment of the second as in one cell) and
its own scraper pulling ``/metrics`` once a second (gzip) as Prometheus does.

Printed per cell: records offered and received, late, lost, duplicate, invalid, quanta
closed against expected ("NO LOSS"), the quanta file row by row against the rows the same
engine gives offline for that cell's hosts' records ("EXACT"). Summed: the cells' cluster
rows added up (samples, IOPS, bytes/s, streams and late records summed, the mean weighted
by samples, min of the minima, max of the maxima) against the ground truth of all records
in one engine, with the worst relative difference (<= 1e-9 is "EXACT"); percentiles do
not add up, which is what the root is for. ``--root``: also a third Mosquitto and a
``fiomon root`` fed by the cells' partials (``partials:`` in each cell's config), its
quanta file compared with the all-records ground truth row by row (cluster and host rows).

Per process, over the load (from its start to the moment the last quantum closed
everywhere): CPU in per cent of one core and peak RSS, for every aggregator (and its
``/metrics`` child), broker, publisher, scraper and the root, so it shows what the cores
were spent on; the machine's load average at the start and the end of each run. "IN
TIME": every cell's close delay p99 within the lateness plus a second (the intake kept
up). Per cell, records per CPU-second of its aggregator and ``/metrics`` child (all the
records over all the CPU they took, catching up included: what a core of that process
sustains, whatever share of the machine it got). The exit status is 0 only if every run
was NO LOSS and EXACT everywhere.

Usage::

    python benchmarks/bench_cells.py --cells 2 --hosts 1000 --jobs 25 --seconds 60 --repeat 3
    python benchmarks/bench_cells.py --cells 2 --hosts 200 --jobs 5 --seconds 15 --root
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bench_aggregator as ba
from _support import RawPublisher, cpu_seconds, free_port, peak_rss_mb, scrape, start_broker

from fiomon.cells import assign_cell

CELL_NAMES = ("cell-a", "cell-b", "cell-c", "cell-d")
ROOT_LATENESS_S = 30  # a fallback only: the cells' "closed through" marks close the root's quanta
IN_TIME_S = ba.LATENESS_S + 1  # a close delay p99 above this: the intake fell behind
WAIT_S = ba.LATENESS_S + 120  # after the load: a lagging intake may catch up this long


# -- which host goes where, and the ground truth of a set of hosts ---------------------------


def cell_hosts(hosts: int, cells: int) -> dict[str, list[int]]:
    """Host indices per cell name (host ``i`` is agent ``h<i>``), by the agents' hash."""
    names = list(CELL_NAMES[:cells])
    out: dict[str, list[int]] = {c: [] for c in names}
    for h in range(hosts):
        out[assign_cell(f"h{h}", names)].append(h)
    return out


def cluster_rows(
    rows: list[list[dict[str, Any]]], seconds: int
) -> dict[tuple[int, str], dict[str, Any]]:
    """The cluster rows of a ground truth, for every second of the run, by (end, direction)."""
    out = {}
    for s in range(seconds):
        shift = 1000 * (s - s % ba.FACTORS)
        for row in rows[s % ba.FACTORS]:
            if row["scope"] == "cluster":
                out[(row["end_ms"] + shift, row["direction"])] = row
    return out


# -- summing cells' cluster rows ---------------------------------------------------------------

_SUMMED = ("samples", "iops", "bytes_per_second", "streams", "late_records")


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def sum_cells(
    files: list[Path], truth: dict[tuple[int, str], dict[str, Any]]
) -> tuple[float, int, int]:
    """The cells' cluster rows added up per (quantum, direction), against ``truth``.

    What adds up across disjoint sets of hosts: samples, IOPS, bytes per second, streams
    and late records (summed), the mean (weighted by samples), min and max (of the cells').
    Percentiles do not (the root's reason to be).

    Returns:
        (worst relative difference over every summed field, quanta-directions compared,
        quanta-directions of the truth missing from some cell's file).
    """
    per: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for f in files:
        for line in ba.quanta_lines(f):
            d = json.loads(line)
            if d["scope"] == "cluster":
                per.setdefault((d["end_ms"], d["direction"]), []).append(d)
    worst, compared, missing = 0.0, 0, 0
    for k, want in truth.items():
        got = per.get(k, [])
        if len(got) != len(files):
            missing += 1
            continue
        compared += 1
        for name in _SUMMED:
            vals = [g[name] for g in got if g[name] is not None]
            if want[name] is None or not vals:
                worst = max(worst, 0.0 if want[name] is None and not vals else 1.0)
                continue
            worst = max(worst, _rel(sum(vals), want[name]))
        have = [g for g in got if g["samples"]]
        if want["samples"]:
            mean = sum(g["mean_ns"] * g["samples"] for g in have) / sum(g["samples"] for g in have)
            worst = max(
                worst,
                _rel(mean, want["mean_ns"]),
                _rel(min(g["min_ns"] for g in have), want["min_ns"]),
                _rel(max(g["max_ns"] for g in have), want["max_ns"]),
            )
    return worst, compared, missing


# -- processes ---------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """The direct children of a process (from /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(t) for t in (task / "children").read_text().split()]
        except OSError:  # a thread that ended meanwhile
            continue
    return out


def start_fiomon(command: str, cfg: Path, log: Path, log_level: str) -> subprocess.Popen[bytes]:
    """``fiomon <command> --config <cfg>``, its stderr appended to ``log``."""
    with log.open("ab") as err:
        argv = [sys.executable, "-m", "fiomon", command, "--config", str(cfg)]
        return subprocess.Popen([*argv, "--log-level", log_level], stderr=err)


@dataclass
class Cell:
    """One cell's running parts: its folder, broker (and port), aggregator (and its
    ``/metrics`` port)."""

    name: str
    folder: Path
    broker: subprocess.Popen[bytes]
    mqtt_port: int
    http_port: int
    agg: subprocess.Popen[bytes]


def publish(argv: list[str]) -> None:
    """The publisher of one cell (port, hosts, jobs, seconds, start_ms, seed, cell, cells).

    Plays the hosts the hash gives ``cell``, each at the moment of the second it has in
    ``bench_aggregator``'s single publisher (spread over 300 ms by host index), so the
    cells together offer exactly the load one cell gets. Prints a JSON summary with its
    own CPU seconds over the load and peak RSS.
    """
    port, hosts, jobs, seconds, start_ms, seed = (int(a) for a in argv[:6])
    cell, cells = argv[6], int(argv[7])
    mine = cell_hosts(hosts, cells)[cell]
    tpls = ba.templates(jobs, seed)
    payloads = [ba.HostPayload.make(h, tpls[h % ba.TEMPLATES]) for h in mine]
    due = [h * ba.SPREAD_MS // hosts for h in mine]
    pub = RawPublisher(port, f"bench-load-{cell}")
    cpu0 = time.process_time()
    records, messages, worst_lag = ba.publish_seconds(pub, payloads, due, seconds, start_ms)
    cpu = time.process_time() - cpu0
    acked = pub.wait_acked(120)
    pub.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"records": records, "messages": messages, "acked": acked, "lag_ms": worst_lag}
    print(json.dumps({**out, "hosts": len(mine), "cpu_s": cpu, "rss_mb": rss}))


@dataclass
class Usage:
    """One process's share over the load: CPU in per cent of one core over the measured
    span (the load's start to the last close everywhere), CPU seconds, peak RSS in MB."""

    cpu: float = float("nan")
    rss: float = float("nan")
    cpu_s: float = float("nan")


@dataclass
class CellResult:
    name: str
    hosts: int = 0
    agg: ba.Result = field(default_factory=ba.Result)
    usage: dict[str, Usage] = field(default_factory=dict)  # by role: aggregator, broker, ...

    @property
    def no_loss(self) -> bool:
        x = self.agg
        return (
            x.sent > 0
            and x.received == x.sent
            and x.late == 0
            and x.lost == 0
            and x.quanta_closed >= x.quanta_expected
        )

    @property
    def in_time(self) -> bool:
        """Every quantum closed within the lateness plus a second (the intake kept up)."""
        return self.agg.delay_p99 <= IN_TIME_S

    @property
    def exact(self) -> bool:
        x = self.agg
        return x.rows_expected > 0 and not (
            x.rows_missing or x.rows_extra or x.rows_twice or x.rows_differing
        )


@dataclass
class RunResult:
    cells: list[CellResult] = field(default_factory=list)
    summed_worst: float = float("nan")
    summed_compared: int = 0
    summed_missing: int = 0
    summed_expected: int = 0
    root: ba.Result | None = None
    usage: dict[str, Usage] = field(default_factory=dict)  # root, root broker, root scraper
    load: tuple[float, float] = (float("nan"), float("nan"))
    seconds: int = 0
    span_s: float = float("nan")  # measured: the load's start to the last close everywhere

    @property
    def summed_exact(self) -> bool:
        return self.summed_missing == 0 and self.summed_worst <= 1e-9

    @property
    def root_exact(self) -> bool:
        r = self.root
        return (
            r is not None
            and r.rows_expected > 0
            and not (r.rows_missing or r.rows_extra or r.rows_twice or r.rows_differing)
        )

    @property
    def ok(self) -> bool:
        return (
            all(c.no_loss and c.exact for c in self.cells)
            and self.summed_exact
            and (self.root is None or self.root_exact)
        )


class Procs:
    """Every process a run starts, stopped (SIGTERM, then kill) whatever happens."""

    def __init__(self) -> None:
        self.all: list[subprocess.Popen[bytes]] = []

    def add(self, p: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        self.all.append(p)
        return p

    def stop(self) -> None:
        for p in reversed(self.all):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.all):
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def _serving(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            scrape(port, timeout_s=2)
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{what} did not serve /metrics")


def _quantum_end_ms(port: int) -> float:
    try:
        return 1000 * ba.total(ba.metrics(port), "fiomon_quantum_end_timestamp_seconds")
    except OSError:
        return 0.0


def run(args: argparse.Namespace) -> RunResult:
    out = RunResult(seconds=args.seconds)
    here = Path(__file__).resolve()
    scraper_script = here.parent / "bench_aggregator.py"
    assigned = cell_hosts(args.hosts, args.cells)
    level = "false" if args.confidence_level is None else args.confidence_level
    max_hosts = max(args.max_hosts, args.hosts)
    procs = Procs()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        try:
            partials = ""
            root = root_broker = None
            rport = 0
            if args.root:
                (folder / "root").mkdir()
                root_broker, rbport = start_broker(folder / "root", ba.BROKER)
                procs.add(root_broker)
                rport = free_port()
                names = ", ".join(assigned)
                (folder / "root.yaml").write_text(
                    f"broker: {{port: {rbport}}}\ntopic_prefix: {ba.PREFIX}\n"
                    f"client_id: bench-root\nquantum: 1s\nlateness: {ROOT_LATENESS_S}s\n"
                    f"align: epoch\nlisten: 127.0.0.1:{rport}\nmax_hosts: {max_hosts}\n"
                    f"quanta_file: {folder / 'root' / 'quanta.jsonl'}\n"
                    f"state_dir: {folder / 'root' / 'state'}\nconfidence_level: {level}\n"
                    f"root: {{cells: [{names}], cell_timeout: 60s}}\n"
                )
                root = procs.add(
                    start_fiomon(
                        "root", folder / "root.yaml", folder / "root" / "root.log", args.log_level
                    )
                )
                partials = f"partials: {{broker: {{port: {rbport}}}, topic_prefix: {ba.PREFIX}}}\n"
            cells: dict[str, Cell] = {}
            for name in assigned:
                d = folder / name
                d.mkdir()
                broker, mport = start_broker(d, ba.BROKER)
                procs.add(broker)
                hport = free_port()
                (d / "aggregator.yaml").write_text(
                    f"broker: {{port: {mport}}}\ntopic_prefix: {ba.PREFIX}\n"
                    f"client_id: bench-{name}\ncell: {name}\nquantum: 1s\n"
                    f"lateness: {ba.LATENESS_S}s\nalign: epoch\nlisten: 127.0.0.1:{hport}\n"
                    f"max_hosts: {max_hosts}\nquanta_file: {d / 'quanta.jsonl'}\n"
                    f"state_dir: {d / 'state'}\nconfidence_level: {level}\n{partials}"
                )
                agg = procs.add(
                    start_fiomon(
                        "aggregator", d / "aggregator.yaml", d / "aggregator.log", args.log_level
                    )
                )
                cells[name] = Cell(name, d, broker, mport, hport, agg)
            for name, c in cells.items():
                _serving(c.http_port, c.agg, f"the aggregator of {name}")
            if root is not None:
                _serving(rport, root, "the root")
            start_ms = (int(time.time()) + 3) * 1000
            lasting = str(args.seconds + WAIT_S + 60)
            scrape_ports = [(name, c.http_port) for name, c in cells.items()]
            if root is not None:
                scrape_ports.append(("root", rport))
            scrapers = {
                name: procs.add(
                    subprocess.Popen(
                        [sys.executable, str(scraper_script), "_scrape", str(p), "0", lasting, "0"],
                        stdout=subprocess.PIPE,
                    )
                )
                for name, p in scrape_ports
            }
            pubs = {}
            for name, c in cells.items():
                pubs[name] = procs.add(
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(here),
                            "_publish",
                            str(c.mqtt_port),
                            str(args.hosts),
                            str(args.jobs),
                            str(args.seconds),
                            str(start_ms),
                            str(args.seed),
                            name,
                            str(args.cells),
                        ],
                        stdout=subprocess.PIPE,
                    )
                )
            # Everything measured over the load: from its first second to the last close.
            watched: dict[str, subprocess.Popen[bytes]] = {}
            for name, c in cells.items():
                watched[f"{name} aggregator"] = c.agg
                watched[f"{name} broker"] = c.broker
                watched[f"{name} scraper"] = scrapers[name]
            if root is not None and root_broker is not None:
                watched["root"] = root
                watched["root broker"] = root_broker
                watched["root scraper"] = scrapers["root"]
            time.sleep(max(0.0, start_ms / 1000 - time.time()))
            t0 = time.monotonic()
            metric_children = {
                k: children(p.pid) for k, p in watched.items() if k.endswith("aggregator")
            }
            if root is not None:
                metric_children["root"] = children(root.pid)
            c0 = {k: cpu_seconds(p.pid) for k, p in watched.items()}
            k0 = {k: sum(map(cpu_seconds, v)) for k, v in metric_children.items()}
            summaries = {}
            for name, pub in pubs.items():
                sout, _ = pub.communicate(timeout=args.seconds + 300)
                summaries[name] = json.loads(sout)
            last_end = start_ms + 1000 * args.seconds
            deadline = time.monotonic() + WAIT_S
            ports = [c.http_port for c in cells.values()] + ([rport] if root is not None else [])
            while time.monotonic() < deadline:
                if all(_quantum_end_ms(p) >= last_end for p in ports):
                    break
                time.sleep(0.2)
            t1 = time.monotonic()
            c1 = {k: cpu_seconds(p.pid) for k, p in watched.items()}
            k1 = {k: sum(map(cpu_seconds, v)) for k, v in metric_children.items()}
            usage = {
                k: Usage(100 * (c1[k] - c0[k]) / (t1 - t0), peak_rss_mb(p.pid), c1[k] - c0[k])
                for k, p in watched.items()
            }
            for k, v in metric_children.items():
                rss = max((peak_rss_mb(pid) for pid in v), default=float("nan"))
                usage[f"{k} /metrics child"] = Usage(
                    100 * (k1[k] - k0[k]) / (t1 - t0), rss, k1[k] - k0[k]
                )
            for name, s in summaries.items():
                usage[f"{name} publisher"] = Usage(
                    100 * s["cpu_s"] / (t1 - t0), s["rss_mb"], s["cpu_s"]
                )
            ms = {name: ba.metrics(c.http_port) for name, c in cells.items()}
            root_m = ba.metrics(rport) if root is not None else None
            scraped = {}
            for name, p in scrapers.items():
                p.send_signal(signal.SIGTERM)
                sout, _ = p.communicate(timeout=120)
                scraped[name] = json.loads(sout.splitlines()[-1])
            procs.stop()
            out.load = (load0, os.getloadavg()[0])
            out.span_s = t1 - t0
            for name in cells:
                cr = CellResult(name, hosts=summaries[name]["hosts"])
                cr.usage = {k.split(" ", 1)[1]: u for k, u in usage.items() if k.startswith(name)}
                _fill(cr.agg, ms[name], summaries[name], scraped[name], args.seconds)
                out.cells.append(cr)
            out.usage = {k: u for k, u in usage.items() if k.startswith("root")}
            if args.verify:
                for cr in out.cells:
                    truth = ba.expected_rows(
                        assigned[cr.name],
                        args.jobs,
                        args.seed,
                        start_ms,
                        max_hosts,
                        level=args.confidence_level,
                    )
                    ba.compare(
                        cells[cr.name].folder / "quanta.jsonl",
                        truth,
                        start_ms,
                        args.seconds,
                        cr.agg,
                    )
                every = ba.expected_rows(
                    args.hosts,
                    args.jobs,
                    args.seed,
                    start_ms,
                    max_hosts,
                    level=args.confidence_level,
                )
                whole = cluster_rows(every, args.seconds)
                out.summed_expected = len(whole)
                out.summed_worst, out.summed_compared, out.summed_missing = sum_cells(
                    [c.folder / "quanta.jsonl" for c in cells.values()], whole
                )
                if root_m is not None:
                    out.root = ba.Result()
                    _fill(out.root, root_m, None, scraped["root"], args.seconds)
                    ba.compare(
                        folder / "root" / "quanta.jsonl", every, start_ms, args.seconds, out.root
                    )
            if args.keep:
                import shutil  # noqa: PLC0415

                shutil.copytree(folder, args.keep, dirs_exist_ok=True)
        finally:
            procs.stop()
    return out


def _fill(
    r: ba.Result,
    m: dict[str, dict[tuple[tuple[str, str], ...], float]],
    published: dict[str, Any] | None,
    scraped: dict[str, Any],
    seconds: int,
) -> None:
    """A cell's (or the root's) counters from its last scrape into ``r``."""
    if published is not None:
        r.sent, r.publisher_lag_ms = published["records"], published["lag_ms"]
        r.offered = published["records"] / seconds
        if not published["acked"]:
            r.notes.append("the broker did not acknowledge every message")
    r.received = ba.total(m, "fiomon_records_total", result="received")
    r.late = ba.total(m, "fiomon_late_records_total")
    r.lost = ba.total(m, "fiomon_lost_records_total")
    r.duplicates = ba.total(m, "fiomon_records_total", result="duplicate")
    r.invalid = ba.total(m, "fiomon_invalid_messages_total")
    r.quanta_closed = ba.total(m, "fiomon_quanta_closed_total")
    r.quanta_expected = seconds
    delays = m.get("fiomon_quantum_close_delay_seconds_bucket", {})
    r.delay_p50 = ba.bucket_quantile(delays, 0.5)
    r.delay_p99 = ba.bucket_quantile(delays, 0.99)
    r.scrapes, r.scrape_failures = scraped["scrapes"], scraped["failures"]
    r.scrape_p50, r.scrape_p99 = scraped["p50"], scraped["p99"]
    r.metrics_kb = scraped["bytes"] / 1000
    if scraped["first_failure"]:
        r.notes.append(f"first scrape failure: {scraped['first_failure'][0]}")


# -- the summary -------------------------------------------------------------------------------


def _rows(x: ba.Result) -> str:
    return (
        f"{x.rows_equal:,}/{x.rows_expected:,} rows equal, {x.rows_missing} missing, "
        f"{x.rows_differing} differing, {x.rows_extra} extra, {x.rows_twice} twice"
    )


def report(args: argparse.Namespace, results: list[RunResult]) -> None:
    n = len(results)
    what = f"median of {n} runs" if n > 1 else "one run"
    offered = args.hosts * args.jobs * 2
    print(
        f"load: {args.hosts} hosts x {args.jobs} jobs x 2 records/s = {offered:,} records/s "
        f"for {args.seconds} s, in {args.cells} cell(s){' + root' if args.root else ''}, "
        f"1 scrape/s each, confidence_level {args.confidence_level or 'false'}; {what}"
    )
    for i, res in enumerate(results):
        print(
            f"  run {i + 1} (load average {res.load[0]:.2f} at the start, {res.load[1]:.2f} "
            f"at the end): {'ALL GOOD' if res.ok else 'NOT GOOD'}"
        )
        for c in res.cells:
            x = c.agg
            print(
                f"    {c.name}: {c.hosts} hosts, {x.offered:,.0f} records/s; sent {x.sent:,}, "
                f"received {x.received:,.0f}, late {x.late:,.0f}, lost {x.lost:,.0f}, "
                f"duplicates {x.duplicates:,.0f}, invalid {x.invalid:,.0f}; quanta closed "
                f"{x.quanta_closed:.0f}/{x.quanta_expected}: {'NO LOSS' if c.no_loss else 'LOSS'}"
                + (
                    f"; quanta file vs its hosts' truth: {_rows(x)}: "
                    f"{'EXACT' if c.exact else 'NOT EXACT'}"
                    if args.verify
                    else ""
                )
            )
            print(
                f"      close delay p50 <= {x.delay_p50:g} s, p99 <= {x.delay_p99:g} s "
                f"({'IN TIME' if c.in_time else f'BEHIND: over {IN_TIME_S} s'}); scrapes "
                f"{x.scrapes} (failed {x.scrape_failures}), p50 {1e3 * x.scrape_p50:.0f} ms, "
                f"p99 {1e3 * x.scrape_p99:.0f} ms; publisher lag <= {x.publisher_lag_ms:.0f} ms"
            )
            for note in x.notes:
                print(f"      {note}")
        if args.verify:
            print(
                f"    summed cluster rows vs all records' truth: {res.summed_compared}/"
                f"{res.summed_expected} quanta x directions, {res.summed_missing} missing, worst "
                f"relative difference {res.summed_worst:.3g}: "
                f"{'EXACT' if res.summed_exact else 'NOT EXACT'}"
            )
        if res.root is not None:
            x = res.root
            print(
                f"    root: quanta closed {x.quanta_closed:.0f}/{x.quanta_expected}, close delay "
                f"p99 <= {x.delay_p99:g} s; quanta file vs all records' truth: {_rows(x)}: "
                f"{'EXACT' if res.root_exact else 'NOT EXACT'}"
            )
            for note in x.notes:
                print(f"      {note}")
    _usage_table(results)


def _usage_table(results: list[RunResult]) -> None:
    """CPU (% of one core) and peak RSS per process, medians over the runs."""
    rows: dict[str, list[Usage]] = {}
    for res in results:
        for c in res.cells:
            for role, u in c.usage.items():
                rows.setdefault(f"{c.name} {role}", []).append(u)
        for k, u in res.usage.items():
            rows.setdefault(k, []).append(u)
    print(f"  {'process':<34} {'CPU % of a core':>16} {'peak RSS MB':>12}")
    cpu_total = 0.0
    for k, us in rows.items():
        cpu = statistics.median(u.cpu for u in us)
        rss = statistics.median(u.rss for u in us)
        cpu_total += cpu
        print(f"  {k:<34} {cpu:>16.1f} {rss:>12.0f}")
    print(f"  {'all of the above':<34} {cpu_total:>16.1f}")
    # Records per CPU-second of a cell process (aggregator + its /metrics child): what a
    # core sustains, whatever the share of the machine it got (a lagging cell catches up
    # after the load, so its records are all in, and so is the CPU they took).
    for c in results[0].cells:
        per = [next(x for x in r.cells if x.name == c.name) for r in results]
        rate = statistics.median(x.agg.offered for x in per)
        cpu_s = [
            x.usage["aggregator"].cpu_s + x.usage["aggregator /metrics child"].cpu_s for x in per
        ]
        per_core = statistics.median(x.agg.received / s for x, s in zip(per, cpu_s, strict=True))
        print(
            f"  {c.name}: {rate:,.0f} records/s offered; {per_core:,.0f} records per CPU-second "
            "of its aggregator (and /metrics child)"
        )
    span = statistics.median(r.span_s for r in results)
    print(f"  measured over {span:.0f} s (the load and the wait for the last close)")
    good = sum(r.ok for r in results)
    timely = sum(r.ok and all(c.in_time for c in r.cells) for r in results)
    print(
        f"  verdict: {good} of {len(results)} runs NO LOSS and EXACT everywhere, {timely} of "
        f"them also IN TIME (every cell's close delay p99 <= {IN_TIME_S} s)"
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_publish":
        publish(sys.argv[2:10])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=int, choices=[1, 2, 3, 4], default=2)
    ap.add_argument("--hosts", type=int, default=1000, help="hosts in all cells together")
    ap.add_argument("--jobs", type=int, default=25, help="fio jobs per host (2 records/s each)")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--max-hosts", type=int, default=1000, help="each aggregator's max_hosts")
    ap.add_argument("--root", action="store_true", help="also a root fed by the cells' partials")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-verify", dest="verify", action="store_false")
    ap.add_argument("--keep", type=Path, default=None, help="copy the run's folder here")
    ap.add_argument("--log-level", default="warning", help="the aggregators' --log-level")
    ap.add_argument(
        "--confidence-level",
        type=lambda t: None if t == "false" else float(t),
        default=0.95,
        help="the aggregators' confidence_level ('false': no intervals)",
    )
    args = ap.parse_args()
    results = [run(args) for _ in range(args.repeat)]
    report(args, results)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
