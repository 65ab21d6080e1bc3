"""Benchmark: the aggregator under a site's load and faults, checked against ground truth.

A synthetic publisher (its own process, raw MQTT 3.1.1 QoS 1, the wire format) plays
``--hosts`` agents with ``--jobs`` fio jobs each: every second each host publishes one
message with a read and a write record per job (1 s records, about 40 non-zero bins each),
spread over the first 300 ms of the second as agents' flushes are. The counts change from
second to second (x1, x2, x3), so a record merged into the wrong quantum shows. A real
Mosquitto with the queue limits of ``deploy/mosquitto/fiomon.conf`` carries them to a real
``fiomon aggregator`` process (lateness 5 s, host scope, quanta file, journal), while a
scraper process pulls ``/metrics`` once per second as Prometheus does (gzip), or
``--scrapers N`` connections pull it back to back (keep-alive).

It prints the correctness counters next to the speed figures: records sent, received,
late, lost, duplicate and invalid; quanta closed against expected; the close delay
(from ``fiomon_quantum_close_delay_seconds``); scrape latency and failures; the
aggregator's CPU (per cent of one core, over the load) and peak RSS; and the quanta file
compared row by row with the rows the same engine gives offline for the records sent
(missing, differing, extra, written twice). "NO LOSS" means received = sent, late = 0,
lost = 0 and every quantum closed (with ``--restarts``, whose counters restart with each
process: that the quanta file is exact); "EXACT" means the quanta file equals the ground truth
(with ``wipe``: except the quanta whose records the deleted journal held, found by reading
that journal before deleting it; those rows are counted and printed apart).

Modes:
  --scrapers 200           200 concurrent scrapers (keep-alive connections), back to
                           back, during the load (--scrape-interval 1: each once a second)
  --webhook hang           an Alertmanager that accepts and never answers (a rule fires
                           every quantum, re-sent every 11 s, timeout 10 s)
  --restarts term,kill,wipe,...   during the load: SIGTERM / kill -9 / SIGTERM and delete
                           the state directory, each followed by a restart
  --page-views 1           a live-page viewer: loads /live, then polls /api/v1/quanta
                           once a second as the page does
  --late-share 0.1 --late-ms 8000   a tenth of the hosts (spread over the index range)
                           publish each second's message 8 s after the others, past the
                           lateness: their records revise published quanta. Prints the
                           revisions (revision rows, quanta revised, keys first published
                           by late records), late (beyond the horizon) and merged counts;
                           EXACT compares the latest revision per key with the truth
  --revise-within 0        the aggregator's revise_within (default: its own, 10m)
  --horizon-cost           run twice, with revise_within 0 and with --revise-within (its
                           default), and print the memory the revision horizon costs:
                           the peak RSS difference per host and minute of horizon held
  --baseline               with --late-share: also run without late hosts and print the
                           late run's CPU (seconds over the load) and peak RSS against it
  --repeat 3               run 3 times and print the medians
  --profile agg.prof       run the aggregator under cProfile (main thread; inflated CPU)

Usage::

    python benchmarks/bench_aggregator.py --hosts 1000 --jobs 25 --seconds 60 --repeat 3
    python benchmarks/bench_aggregator.py --hosts 5000 --jobs 10 --seconds 60
    python benchmarks/bench_aggregator.py --hosts 1000 --jobs 25 --seconds 60 \
        --late-share 0.1 --late-ms 8000 --baseline --horizon-cost
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import http.client
import json
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from _support import RawPublisher, cpu_seconds, free_port, peak_rss_mb, scrape, start_broker
from prometheus_client.parser import text_string_to_metric_families

from fiomon.bins import BinLayout
from fiomon.engine import QuantumEngine
from fiomon.model import DIRECTIONS, RecordBatch, StreamInfo
from fiomon.units import parse_duration_ms
from fiomon.wire import encode

PREFIX = "fiomonbench"
STREAM = "/var/lib/fio/run.json@1"
LATENESS_S = 5
SPREAD_MS = 300  # hosts publish over the first 300 ms after their records end
TEMPLATES = 16  # distinct histogram shapes, shared by hosts
FACTORS = 3  # counts are x1, x2, x3 in successive seconds
# deploy/mosquitto/fiomon.conf's limits (no TLS, no ACL, no persistence: a throwaway broker)
BROKER = (
    "max_packet_size 1048576\nmax_queued_messages 1000000\nmax_queued_bytes 1073741824\n"
    "max_inflight_messages 100\n"
)
_RECORD = np.dtype(
    [
        ("label", "<u2"),
        ("direction", "u1"),
        ("pad", "u1"),
        ("start_ms", "<i8"),
        ("end_ms", "<i8"),
        ("nbytes", "<u8"),
        ("nnz", "<u4"),
    ]
)


# -- the synthetic cluster ------------------------------------------------------------------


def template(jobs: int, rng: np.random.Generator) -> RecordBatch:
    """One second of ``jobs`` jobs (a read and a write record each), ~40 non-zero bins."""
    n = 2 * jobs
    rows = [np.unique(rng.choice(np.arange(600, 1100), size=40)) for _ in range(n)]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum([len(r) for r in rows], out=indptr[1:])
    bins = np.concatenate(rows).astype(np.int32)
    return RecordBatch(
        layout=BinLayout(),
        streams=tuple(StreamInfo("", f"/var/lib/fio/run.json:{j}:job{j}") for j in range(jobs)),
        stream_idx=np.repeat(np.arange(jobs, dtype=np.int32), 2),
        direction=np.tile(np.array([0, 1], np.int8), jobs),
        start_ms=np.zeros(n, np.int64),
        end_ms=np.full(n, 1000, np.int64),
        nbytes=np.full(n, 4096 * 100, np.int64),
        indptr=indptr,
        bins=bins,
        counts=rng.integers(1, 20, len(bins)).astype(np.int64),
    )


def templates(jobs: int, seed: int) -> list[RecordBatch]:
    rng = np.random.default_rng(seed)
    return [template(jobs, rng) for _ in range(TEMPLATES)]


def second(tpl: RecordBatch, end_ms: int, factor: int, host: str = "") -> RecordBatch:
    """The template's records ending at ``end_ms``, counts times ``factor``."""
    return RecordBatch(
        layout=tpl.layout,
        streams=tuple(StreamInfo(host, s.stream) for s in tpl.streams),
        stream_idx=tpl.stream_idx,
        direction=tpl.direction,
        start_ms=tpl.start_ms + end_ms - 1000,
        end_ms=tpl.end_ms + end_ms - 1000,
        nbytes=tpl.nbytes,
        indptr=tpl.indptr,
        bins=tpl.bins,
        counts=tpl.counts * factor,
    )


@dataclass
class HostPayload:
    """One host's message, patched in place each second (seq, times, counts)."""

    buf: bytearray
    rows: npt.NDArray[np.void]
    counts: npt.NDArray[np.uint32]
    base_counts: npt.NDArray[np.uint32]
    records: int
    topic: bytes

    @classmethod
    def make(cls, host: int, tpl: RecordBatch) -> HostPayload:
        agent = f"h{host}"
        buf = bytearray(encode(agent, STREAM, 0, second(tpl, 1000, 1)))
        n, nnz = len(tpl), len(tpl.counts)
        table_at = len(buf) - nnz * 6 - n * _RECORD.itemsize
        rows = np.frombuffer(buf, dtype=_RECORD, count=n, offset=table_at)
        counts = np.frombuffer(buf, dtype="<u4", count=nnz, offset=len(buf) - 4 * nnz)
        return cls(buf, rows, counts, counts.copy(), n, f"{PREFIX}/v1/{agent}/records".encode())

    def at(self, s: int, end_ms: int) -> bytes:
        struct.pack_into("<Q", self.buf, 18, s * self.records)
        self.rows["start_ms"] = end_ms - 1000
        self.rows["end_ms"] = end_ms
        self.counts[:] = self.base_counts * (1 + s % FACTORS)
        return bytes(self.buf)


def late_hosts(hosts: int, share: float) -> list[int]:
    """``share`` of the host indices, spread evenly over the range (0 among them)."""
    n = round(share * hosts)
    return sorted({h * hosts // n for h in range(n)}) if n else []


def publish_seconds(
    pub: RawPublisher, payloads: list[HostPayload], due: list[int], seconds: int, start_ms: int
) -> tuple[int, int, float]:
    """Each second, each host's message at its offset ``due`` (ms) after the second ends.

    Offsets may exceed a second (late hosts): the messages go out in time order, a late
    host's second s among the others' second s + 8, say.

    Returns records and messages sent, and the worst lag behind schedule (ms).
    """
    records = messages = 0
    worst_lag = 0.0
    n = len(payloads)
    hosts = sorted(range(n), key=lambda h: due[h])
    events = [(start_ms + 1000 * (s + 1) + due[h], s, h) for s in range(seconds) for h in hosts]
    if any(d >= 1000 for d in due):
        events.sort()
    i, m = 0, len(events)
    while i < m:
        now = time.time() * 1000
        if now < events[i][0]:
            time.sleep(min(0.01, (events[i][0] - now) / 1000))
            continue
        j = i
        while j < m and events[j][0] <= now:
            j += 1
        worst_lag = max(worst_lag, now - events[i][0])
        pub.send(
            [
                pub.packet(payloads[h].topic, payloads[h].at(s, start_ms + 1000 * (s + 1)))
                for _, s, h in events[i:j]
            ]
        )
        records += sum(payloads[h].records for _, _, h in events[i:j])
        messages += j - i
        i = j
    return records, messages, worst_lag


def publish(argv: list[str]) -> None:
    """The publisher process (port, hosts, jobs, seconds, start_ms, seed, late share,
    late ms): a JSON summary."""
    port, hosts, jobs, seconds, start_ms, seed = (int(a) for a in argv[:6])
    late_share, late_ms = float(argv[6]), int(argv[7])
    tpls = templates(jobs, seed)
    payloads = [HostPayload.make(h, tpls[h % TEMPLATES]) for h in range(hosts)]
    due = [h * SPREAD_MS // hosts for h in range(hosts)]
    for h in late_hosts(hosts, late_share):
        due[h] += late_ms
    pub = RawPublisher(port, "bench-load")
    records, messages, worst_lag = publish_seconds(pub, payloads, due, seconds, start_ms)
    acked = pub.wait_acked(120)
    pub.close()
    print(
        json.dumps({"records": records, "messages": messages, "acked": acked, "lag_ms": worst_lag})
    )


def expected_rows(
    hosts: int | Sequence[int],
    jobs: int,
    seed: int,
    start_ms: int,
    max_hosts: int,
    *,
    level: float | None = 0.95,
) -> list[list[dict[str, Any]]]:
    """Ground truth: the rows the engine gives offline for second 0, 1, 2 (then repeating)
    of hosts ``h0 .. h<hosts - 1>``, or of the host indices given (a cell's hosts)."""
    ids = range(hosts) if isinstance(hosts, int) else hosts
    tpls = templates(jobs, seed)
    out = []
    for s in range(FACTORS):
        end = start_ms + 1000 * (s + 1)
        batch = RecordBatch.concat([second(tpls[h % TEMPLATES], end, 1 + s, f"h{h}") for h in ids])
        engine = QuantumEngine(
            layout=BinLayout(),
            quantum_ms=1000,
            percentiles=(50, 90, 99, 99.9),
            directions=DIRECTIONS,
            per_host=True,
            max_hosts=max_hosts,
            confidence_level=level,
        )
        engine.add(batch)
        out.append([r.to_json() for r in engine.flush()])
    return out


# -- scraping and the fake Alertmanager ------------------------------------------------------


async def _storm(
    port: int, clients: int, stop: float, done: threading.Event, interval: float = 0.0
) -> tuple[list[float], list[str], int]:
    """``clients`` connections scraping with keep-alive as Prometheus does: back to back,
    or each every ``interval`` seconds (their phases spread over the interval, as
    Prometheus spreads its targets).

    Raw asyncio streams, not ``http.client`` in threads: that client spent more CPU per
    request (about 0.4 ms) than the server, on the same 2-core machine, so the load
    generator, not the aggregator, decided what was measured. Each response is checked
    (status, length; the first one of each connection gunzipped and parsed as text).
    """
    lat: list[float] = []
    fails: list[str] = []
    size = [0]
    request = b"GET /metrics HTTP/1.1\r\nHost: bench\r\nAccept-Encoding: gzip\r\n\r\n"

    async def client(phase: float) -> None:
        await asyncio.sleep(phase)
        while time.monotonic() < stop and not done.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError as exc:
                fails.append(str(exc))
                await asyncio.sleep(0.1)
                continue
            first = True
            try:
                while time.monotonic() < stop and not done.is_set():
                    t0 = time.perf_counter()
                    writer.write(request)
                    head = await reader.readuntil(b"\r\n\r\n")
                    status = int(head.split(b" ", 2)[1])
                    n = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                    body = await reader.readexactly(n)
                    lat.append(time.perf_counter() - t0)
                    if status != 200:
                        fails.append(f"HTTP {status}")
                    elif first:
                        if not gzip.decompress(body).startswith(b"# HELP"):
                            fails.append("not the text format")
                        first = False
                    size[0] = max(size[0], n)
                    if interval:
                        await asyncio.sleep(max(0.0, interval - (time.perf_counter() - t0)))
            except (OSError, ValueError, IndexError, asyncio.IncompleteReadError) as exc:
                fails.append(f"{type(exc).__name__}: {exc}")
            finally:
                writer.close()

    await asyncio.gather(*(client(interval * i / clients) for i in range(clients)))
    return lat, fails, size[0]


def scrapers(port: int, clients: int, seconds: float, interval: float = 0.0) -> None:
    """The scraper process: ``clients`` == 0: one, once a second (``http.client``, a new
    connection each time); else ``clients`` keep-alive connections, back to back or each
    every ``interval`` seconds."""
    lat: list[float] = []
    fails: list[str] = []
    size = 0
    done = threading.Event()  # SIGTERM: the run is over
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    stop = time.monotonic() + seconds
    if clients:
        lat, fails, size = asyncio.run(_storm(port, clients, stop, done, interval))
    else:
        while time.monotonic() < stop and not done.is_set():
            t0 = time.monotonic()
            try:
                dt, n = scrape(port)
                lat.append(dt)
                size = max(size, n)
            except OSError as exc:
                fails.append(str(exc))
            done.wait(max(0.0, 1.0 - (time.monotonic() - t0)))
    lat.sort()
    summary = {
        "scrapes": len(lat),
        "p50": lat[len(lat) // 2] if lat else float("nan"),
        "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan"),
        "failures": len(fails),
        "first_failure": fails[:1],
        "bytes": size,
    }
    # One short line: 200 back-to-back scrapers make ~10^5 latencies, too many to ship.
    sys.stdout.write(json.dumps(summary) + "\n")
    sys.stdout.flush()


def viewer(port: int, seconds: float, rate: float) -> None:
    """The live-page viewer process: loads the page once, then polls the API as the page
    does (``since`` = the newest quantum it has), ``rate`` times a second."""
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    stop = time.monotonic() + seconds
    lat: list[float] = []
    fails: list[str] = []
    since = 0
    size = 0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/live", headers={"Accept-Encoding": "gzip"})
    page = len(conn.getresponse().read())
    while time.monotonic() < stop and not done.is_set():
        t0 = time.monotonic()
        try:
            conn.request("GET", f"/api/v1/quanta?since={since}")
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                fails.append(f"HTTP {resp.status}")
            else:
                rows = json.loads(body)["quanta"]
                since = max([since, *(r["end_ms"] for r in rows)])
                size = max(size, len(body))
                lat.append(time.monotonic() - t0)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            fails.append(str(exc))
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        done.wait(max(0.0, 1.0 / rate - (time.monotonic() - t0)))
    lat.sort()
    out = {
        "views": len(lat),
        "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan"),
        "failures": len(fails),
        "page_bytes": page,
        "api_bytes": size,
    }
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


def hanging_webhook() -> tuple[int, list[socket.socket]]:
    """A TCP server that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(128)
    held: list[socket.socket] = [srv]

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    return int(srv.getsockname()[1]), held


# -- one run -----------------------------------------------------------------------------------


@dataclass
class Result:
    offered: float = 0.0
    sent: int = 0
    received: float = 0.0
    late: float = 0.0
    lost: float = 0.0
    duplicates: float = 0.0
    invalid: float = 0.0
    quanta_expected: int = 0
    quanta_closed: float = 0.0
    delay_p50: float = float("nan")
    delay_p99: float = float("nan")
    cpu: float = float("nan")
    rss: float = float("nan")
    scrape_p50: float = float("nan")
    scrape_p99: float = float("nan")
    scrapes: int = 0
    scrape_failures: int = 0
    views: int = 0
    view_p99: float = float("nan")
    view_failures: int = 0
    api_kb: float = 0.0
    metrics_kb: float = 0.0
    rows_expected: int = 0
    rows_equal: int = 0
    rows_missing: int = 0
    rows_differing: int = 0
    rows_extra: int = 0
    rows_twice: int = 0
    publisher_lag_ms: float = 0.0
    wiped: set[int] = field(default_factory=set)  # quanta (ends) the deleted journal held
    rows_wiped_differing: int = 0
    cpu_s: float = float("nan")  # the aggregator's CPU seconds over the load
    revision_rows: int = 0  # rows published after their quantum first closed
    quanta_revised: int = 0  # quanta (ends) with a revision >= 1
    max_revision: int = 0
    first_late: int = 0  # keys first published by late records (revision 0, revised_at)
    merged: float = 0.0  # late records merged into revisions (the aggregator's counter)
    merged_rows: int = 0  # the same from the quanta file (its revised cluster "all" rows)
    latest_incomplete: int = 0  # latest rows still marked incomplete
    notes: list[str] = field(default_factory=list)


def metrics(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    import urllib.request  # noqa: PLC0415

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            out.setdefault(smp.name, {})[tuple(sorted(smp.labels.items()))] = smp.value
    return out


def total(
    m: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str
) -> float:
    return sum(
        v for k, v in m.get(name, {}).items() if all(dict(k).get(a) == b for a, b in labels.items())
    )


def bucket_quantile(buckets: dict[tuple[tuple[str, str], ...], float], q: float) -> float:
    pairs = sorted((float(dict(k)["le"]), v) for k, v in buckets.items())
    if not pairs or pairs[-1][1] == 0:
        return float("nan")
    for le, c in pairs:
        if c >= q * pairs[-1][1]:
            return le
    return float("inf")


def wiped_quanta(state: Path, quanta: Path) -> set[int]:
    """The quanta (by end) whose records the state directory's journal holds, past the
    last quantum in the quanta file: deleting the directory loses those records (they
    were acknowledged to the broker), so those quanta may differ, as the README says.

    Read after the aggregator stopped and before the directory is deleted.
    """
    from fiomon.server.journal import Journal  # noqa: PLC0415
    from fiomon.wire import Decoder  # noqa: PLC0415

    lines = quanta.read_text().splitlines() if quanta.exists() else []
    published = json.loads(lines[-1])["end_ms"] if lines else 0
    payloads = [p for _, _, p in Journal(state / "journal").replay()]
    out: set[int] = set()
    for g in Decoder(max_bytes=1 << 30).decode_many(payloads).groups:
        lo = (g.batch.start_ms // 1000) * 1000 + 1000  # 1 s quanta on epoch seconds
        hi = -(-g.batch.end_ms // 1000) * 1000
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
            out.update(e for e in range(a, b + 1, 1000) if e > published)
    return out


def quanta_lines(quanta: Path) -> list[str]:
    """The quanta file's lines, the rotated files' first (oldest first).

    A minute of 1000 hosts' rows with confidence intervals is more than the default
    ``quanta_file_max_size`` (64 MiB): reading only the newest file missed most quanta.
    """
    rotated = sorted(
        (p for p in quanta.parent.glob(f"{quanta.name}.*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    return [line for p in [*rotated, quanta] if p.exists() for line in p.read_text().splitlines()]


def wait_revised(
    port: int, quanta: Path, sent: int, deadline: float
) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Until every record sent was received and the quanta file stopped growing (two
    looks 1.5 s apart: revisions go out on the aggregator's next tick); the last scrape."""
    m = metrics(port)
    while time.monotonic() < deadline:
        m = metrics(port)
        if total(m, "fiomon_records_total", result="received") >= sent:
            break
        time.sleep(0.2)
    size = -1
    while time.monotonic() < deadline:
        now = sum(p.stat().st_size for p in quanta.parent.glob(f"{quanta.name}*"))
        if now == size:
            break
        size = now
        time.sleep(1.5)
    return metrics(port)


# What a publication says about itself, not about the quantum: a revision's row differs from
# the truth's (an engine fed every record in time) in these only.
PUBLICATION = ("revision", "revised_at", "late_records", "complete")


def compare(
    quanta: Path, truth: list[list[dict[str, Any]]], start_ms: int, seconds: int, r: Result
) -> None:
    """The quanta file against the ground truth, row by row: the latest revision of each
    key (the highest; on equal revision the later line), as readers take it.

    Rows of quanta whose journaled records were deleted with the state directory
    (``r.wiped``) are counted apart (``rows_wiped_differing``): they may differ. A key
    written twice at one revision counts in ``rows_twice``. A row published after its
    quantum first closed (``revised_at``) is compared without :data:`PUBLICATION`; the
    latest rows still marked incomplete are counted apart (``latest_incomplete``).
    """

    def key(d: dict[str, Any]) -> tuple[Any, ...]:
        return (d["end_ms"], d["scope"], d["host"] or "", d["direction"])

    want: dict[tuple[Any, ...], dict[str, Any]] = {}
    for s in range(seconds):
        shift = 1000 * (s - s % FACTORS)
        for row in truth[s % FACTORS]:
            d = dict(row, start_ms=row["start_ms"] + shift, end_ms=row["end_ms"] + shift)
            want[key(d)] = d
    r.rows_expected = len(want)
    seen: set[tuple[Any, ...]] = set()
    bad_ends: set[int] = set()
    written: set[tuple[Any, ...]] = set()
    newest: dict[tuple[Any, ...], dict[str, Any]] = {}
    revised_ends: set[int] = set()
    for line in quanta_lines(quanta):
        d = json.loads(line)
        k = key(d)
        rev = int(d.get("revision", 0))
        if (k, rev) in written:
            r.rows_twice += 1
            bad_ends.add(d["end_ms"])
            continue
        written.add((k, rev))
        if "revised_at" in d:
            r.revision_rows += 1
            if d["scope"] == "cluster" and d["direction"] == "all":
                r.merged_rows += int(d["late_records"])
            r.max_revision = max(r.max_revision, rev)
            if rev:
                revised_ends.add(d["end_ms"])
            else:
                r.first_late += 1
        if k not in newest or rev >= int(newest[k].get("revision", 0)):
            newest[k] = d
    r.quanta_revised = len(revised_ends)
    for k, d in newest.items():
        seen.add(k)
        w = want.get(k)
        if not d.get("complete", True):
            r.latest_incomplete += 1
        if w is not None and "revised_at" in d:
            d = {f: v for f, v in d.items() if f not in PUBLICATION}  # noqa: PLW2901
            w = {f: v for f, v in w.items() if f not in PUBLICATION}
        if w is not None and _close(d, w):
            r.rows_equal += 1
        elif d["end_ms"] in r.wiped:
            r.rows_wiped_differing += 1
        elif w is None:
            r.rows_extra += 1
            bad_ends.add(d["end_ms"])
        else:
            r.rows_differing += 1
            bad_ends.add(d["end_ms"])
    missing = [k for k in want if k not in seen]
    r.rows_wiped_differing += sum(1 for k in missing if k[0] in r.wiped)
    missing = [k for k in missing if k[0] not in r.wiped]
    r.rows_missing = len(missing)
    bad_ends |= {k[0] for k in missing}

    def seconds_of(ends: list[int]) -> str:
        shown = ", ".join(str((e - start_ms) // 1000 - 1) for e in ends[:12])
        return f"{shown}{' ...' if len(ends) > 12 else ''}"

    if r.wiped:
        ends = sorted(r.wiped)
        r.notes.append(
            f"the deleted journal held records of {len(ends)} quanta not yet published "
            f"(seconds {seconds_of(ends)}): {r.rows_wiped_differing} of their rows differ "
            "(allowed: those records were lost with the state directory)"
        )
    if bad_ends:
        ends = sorted(bad_ends)
        r.notes.append(f"quanta not equal to the truth: {len(ends)} (seconds {seconds_of(ends)})")


def _close(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-300)
    return a == b


def run(args: argparse.Namespace) -> Result:
    r = Result()
    here = Path(__file__).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        broker, mport = start_broker(folder, BROKER)
        hport = free_port()
        state = folder / "state"
        quanta = folder / "quanta.jsonl"
        held: list[socket.socket] = []
        extra = ""
        if args.webhook == "hang":
            wport, held = hanging_webhook()
            extra = (
                f"webhook: {{url: 'http://127.0.0.1:{wport}', timeout: 10s, resend: 11s}}\n"
                "sla: [{name: always, direction: read, percentile: 50, threshold: 1us, "
                "for: 1, min_samples: 1}]\n"
            )
        level = "false" if args.confidence_level is None else args.confidence_level
        cfg = folder / "aggregator.yaml"
        cfg.write_text(
            f"broker: {{port: {mport}}}\ntopic_prefix: {PREFIX}\nclient_id: bench-aggregator\n"
            f"quantum: 1s\nlateness: {LATENESS_S}s\nalign: epoch\nlisten: 127.0.0.1:{hport}\n"
            f"max_hosts: {args.max_hosts}\nquanta_file: {quanta}\nstate_dir: {state}\n"
            f"confidence_level: {level}\n"
            + ("" if args.revise_within is None else f"revise_within: {args.revise_within}\n")
            + f"{extra}"
        )
        log = (folder / "aggregator.log").open("ab")

        def start() -> subprocess.Popen[bytes]:
            # --profile: the aggregator's main thread (intake, ticks) under cProfile, by
            # its own CPU time, written at its (graceful) stop; CPU figures are inflated.
            run = ["-m", "fiomon"]
            if args.profile:
                run = [str(here.parent / "_cprofile.py"), str(args.profile)]
            p = subprocess.Popen(
                [
                    sys.executable,
                    *run,
                    "aggregator",
                    "--config",
                    str(cfg),
                    "--log-level",
                    args.log_level,
                ],
                stderr=log,
            )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    scrape(hport, timeout_s=2)
                    return p
                except OSError:
                    time.sleep(0.1)
            sys.exit("the aggregator did not serve /metrics")

        agg = start()
        start_ms = (int(time.time()) + 3) * 1000
        scr = subprocess.Popen(
            [
                sys.executable,
                str(here),
                "_scrape",
                str(hport),
                str(args.scrapers),
                str(args.seconds + LATENESS_S + 60),
                str(args.scrape_interval),
            ],
            stdout=subprocess.PIPE,
        )
        view = None
        if args.page_views:
            view = subprocess.Popen(
                [
                    sys.executable,
                    str(here),
                    "_view",
                    str(hport),
                    str(args.seconds + LATENESS_S + 60),
                    str(args.page_views),
                ],
                stdout=subprocess.PIPE,
            )
        pub = subprocess.Popen(
            [
                sys.executable,
                str(here),
                "_publish",
                str(mport),
                str(args.hosts),
                str(args.jobs),
                str(args.seconds),
                str(start_ms),
                str(args.seed),
                str(args.late_share),
                str(args.late_ms),
            ],
            stdout=subprocess.PIPE,
        )
        time.sleep(max(0.0, start_ms / 1000 - time.time()))
        c0, t0 = cpu_seconds(agg.pid), time.monotonic()
        actions = [a for a in args.restarts.split(",") if a]
        before: list[dict[str, dict[tuple[tuple[str, str], ...], float]]] = []
        for i, action in enumerate(actions):
            at = start_ms / 1000 + (i + 1) * args.seconds / (len(actions) + 1)
            time.sleep(max(0.0, at - time.time()))
            before.append(metrics(hport))  # counters start from 0 in each process
            t_stop = time.monotonic()
            if action == "kill":
                agg.kill()
            else:
                agg.send_signal(signal.SIGTERM)
            code = agg.wait(60)
            if action == "wipe":
                r.wiped |= wiped_quanta(state, quanta)
                shutil.rmtree(state)
            agg = start()
            r.notes.append(
                f"{action} at second {int(at - start_ms / 1000)}: exit {code}, back serving in "
                f"{time.monotonic() - t_stop:.1f} s"
            )
        out, _ = pub.communicate(timeout=args.seconds + 300)
        summary = json.loads(out)
        r.sent, r.publisher_lag_ms = summary["records"], summary["lag_ms"]
        r.offered = summary["records"] / args.seconds
        if not summary["acked"]:
            r.notes.append("the broker did not acknowledge every message")
        last_end = start_ms + 1000 * args.seconds
        deadline = time.monotonic() + LATENESS_S + 120  # a lagging intake catches up
        m = metrics(hport)
        while time.monotonic() < deadline:
            m = metrics(hport)
            end = total(m, "fiomon_quantum_end_timestamp_seconds")
            if end * 1000 >= last_end:
                break
            time.sleep(0.2)
        if args.late_share:
            # The late hosts' last records come after the last quantum closed: wait until
            # every record was received and the revisions they make are written (the
            # quanta file stops growing).
            m = wait_revised(hport, quanta, r.sent, deadline)
        c1, t1 = cpu_seconds(agg.pid), time.monotonic()
        r.cpu_s = c1 - c0
        if not actions:
            r.cpu = 100 * (c1 - c0) / (t1 - t0)
        r.rss = peak_rss_mb(agg.pid)
        scr.send_signal(signal.SIGTERM)
        sout, _ = scr.communicate(timeout=120)
        if view is not None:
            view.send_signal(signal.SIGTERM)
            vout, _ = view.communicate(timeout=120)
            vs = json.loads(vout.splitlines()[-1])
            r.views, r.view_p99, r.view_failures = vs["views"], vs["p99"], vs["failures"]
            r.api_kb = vs["api_bytes"] / 1000
            r.notes.append(
                f"live page: {vs['page_bytes'] / 1000:.0f} kB (gzip), {r.views} API polls "
                f"(failed {r.view_failures}), p99 {1e3 * r.view_p99:.0f} ms, largest "
                f"{r.api_kb:.0f} kB"
            )
        agg.send_signal(signal.SIGTERM)
        agg.wait(60)
        for s in held:
            s.close()
        broker.terminate()
        broker.wait(10)
        sc = json.loads(sout.splitlines()[-1])
        r.scrapes, r.scrape_failures = sc["scrapes"], sc["failures"]
        if sc["first_failure"]:
            r.notes.append(f"first scrape failure: {sc['first_failure'][0]}")
        r.scrape_p50, r.scrape_p99 = sc["p50"], sc["p99"]
        r.metrics_kb = sc["bytes"] / 1000
        # Summed over the processes (a restart's counters start from 0; records it
        # re-formed from the journal count as "replayed", not again as "received").
        every = [*before, m]
        r.received = sum(total(x, "fiomon_records_total", result="received") for x in every)
        r.late = sum(total(x, "fiomon_late_records_total") for x in every)
        r.lost = sum(total(x, "fiomon_lost_records_total") for x in every)
        r.duplicates = sum(total(x, "fiomon_records_total", result="duplicate") for x in every)
        r.invalid = sum(total(x, "fiomon_invalid_messages_total") for x in every)
        r.quanta_closed = sum(total(x, "fiomon_quanta_closed_total") for x in every)
        r.merged = (
            sum(total(x, "fiomon_late_records_merged_total") for x in every)
            if any("fiomon_late_records_merged_total" in x for x in every)
            else float("nan")  # not exported (yet)
        )
        if before:
            r.notes.append(
                "counters summed over the processes; the scrape just before each stop misses "
                "what that process received after it (so received can fall short of sent)"
            )
            per = [
                f"{i + 1}: {total(x, 'fiomon_late_records_total'):,.0f}"
                for i, x in enumerate(every)
                if total(x, "fiomon_late_records_total")
            ]
            if per:
                r.notes.append(f"late records by process: {'; '.join(per)}")
        r.quanta_expected = args.seconds
        delays = m.get("fiomon_quantum_close_delay_seconds_bucket", {})
        r.delay_p50, r.delay_p99 = bucket_quantile(delays, 0.5), bucket_quantile(delays, 0.99)
        problems = {
            dict(k)["kind"]: v for k, v in m.get("fiomon_state_errors_total", {}).items() if v
        }
        if problems:
            r.notes.append(f"state errors in the last process: {problems}")
        webhook = {
            dict(k)["result"]: v
            for k, v in m.get("fiomon_alert_notifications_total", {}).items()
            if dict(k)["sink"] == "webhook" and v
        }
        if webhook:
            r.notes.append(f"webhook alerts: {webhook}")
        if args.verify:
            truth = expected_rows(
                args.hosts,
                args.jobs,
                args.seed,
                start_ms,
                args.max_hosts,
                level=args.confidence_level,
            )
            compare(quanta, truth, start_ms, args.seconds, r)
        if args.keep:
            shutil.copytree(folder, args.keep, dirs_exist_ok=True)
    return r


def verdict(args: argparse.Namespace, x: Result, exact: bool) -> str:
    """NO LOSS / LOSS for one run, from the counters, or with restarts from the quanta file.

    Counters start from 0 in each process and a ``kill -9`` takes what its process counted
    after the last scrape with it, so across restarts the summed counters are lower bounds
    and cannot say "lost": the quanta file, compared row by row with the truth, can (a
    record lost, late or counted twice changes its quantum's row).
    """
    if args.restarts:
        if not args.verify:
            return "loss unknown (across restarts only the quanta-file check can tell)"
        whole = exact and x.rows_expected > 0
        return f"{'NO LOSS' if whole else 'LOSS'} (from the quanta file; counters are per process)"
    nl = (
        x.received == x.sent
        and x.late == 0
        and x.lost == 0
        and x.quanta_closed >= x.quanta_expected
    )
    return "NO LOSS" if nl else "LOSS"


def report(args: argparse.Namespace, results: list[Result]) -> None:
    def med(name: str) -> float:
        vals = [getattr(x, name) for x in results]
        return float(statistics.median(vals))

    n = len(results)
    what = f"median of {n} runs" if n > 1 else "one run"
    load = f"{args.hosts} hosts x {args.jobs} jobs x 2 records/s for {args.seconds} s"
    mode = []
    if args.scrapers and args.scrape_interval:
        mode.append(f"{args.scrapers} scrapers, each every {args.scrape_interval:g} s")
    elif args.scrapers:
        mode.append(f"{args.scrapers} concurrent scrapers, back to back")
    else:
        mode.append("1 scrape/s")
    if args.webhook:
        mode.append(f"webhook {args.webhook}")
    if args.restarts:
        mode.append(f"restarts {args.restarts}")
    mode.append(f"confidence_level {args.confidence_level or 'false'}")
    if args.late_share:
        late = len(late_hosts(args.hosts, args.late_share))
        mode.append(f"{late} hosts {args.late_ms} ms late")
    if args.revise_within is not None:
        mode.append(f"revise_within {args.revise_within}")
    print(f"load: {load} ({med('offered'):,.0f} records/s offered), {', '.join(mode)}; {what}")
    for i, x in enumerate(results):
        exact = not (x.rows_missing or x.rows_extra or x.rows_twice or x.rows_differing)
        print(
            f"  run {i + 1}: sent {x.sent:,}, received {x.received:,.0f}, late {x.late:,.0f}, "
            f"lost {x.lost:,.0f}, duplicates {x.duplicates:,.0f}, invalid {x.invalid:,.0f}; "
            f"quanta closed {x.quanta_closed:.0f}/{x.quanta_expected}; {verdict(args, x, exact)}"
            + (
                f"; quanta file vs truth: {x.rows_equal}/{x.rows_expected} equal, "
                f"{x.rows_missing} missing, {x.rows_differing} differing, {x.rows_extra} extra, "
                f"{x.rows_twice} written twice"
                + (
                    f", {x.rows_wiped_differing} of the deleted journal's quanta differ"
                    if x.wiped
                    else ""
                )
                + f": {'EXACT' if exact else 'NOT EXACT'}"
                if args.verify
                else ""
            )
        )
        print(
            f"         close delay p50 <= {x.delay_p50:g} s, p99 <= {x.delay_p99:g} s; "
            f"CPU {x.cpu:.1f} % of a core ({x.cpu_s:.1f} s), peak RSS {x.rss:.0f} MB; "
            f"scrapes {x.scrapes} "
            f"(failed {x.scrape_failures}), p50 {1e3 * x.scrape_p50:.0f} ms, p99 "
            f"{1e3 * x.scrape_p99:.0f} ms, {x.metrics_kb:.0f} kB; publisher lag <= "
            f"{x.publisher_lag_ms:.0f} ms"
        )
        if args.late_share or x.revision_rows:
            print(
                f"         revisions: {x.revision_rows:,} revision rows, {x.quanta_revised} "
                f"quanta revised (highest revision {x.max_revision}), {x.first_late:,} keys "
                f"first published by late records; late records merged "
                f"{'n/a' if x.merged != x.merged else f'{x.merged:,.0f}'} (quanta file, "
                f"cluster rows: {x.merged_rows:,}), late beyond the horizon "
                f"{x.late:,.0f}; latest rows marked incomplete {x.latest_incomplete:,}"
            )
        for note in x.notes:
            print(f"         {note}")
    if n > 1:
        print(
            f"median: late {med('late'):.0f}, lost {med('lost'):.0f}, close delay p99 <= "
            f"{med('delay_p99'):g} s, CPU {med('cpu'):.0f} % ({med('cpu_s'):.1f} s), "
            f"RSS {med('rss'):.0f} MB, scrape p99 "
            f"{1e3 * med('scrape_p99'):.0f} ms"
        )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_publish":
        publish(sys.argv[2:10])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_view":
        viewer(int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_scrape":
        scrapers(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=25, help="fio jobs per host (2 records/s each)")
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--max-hosts", type=int, default=1000, help="the aggregator's max_hosts")
    ap.add_argument("--scrapers", type=int, default=0, help="concurrent back-to-back scrapers")
    ap.add_argument(
        "--scrape-interval",
        type=float,
        default=0.0,
        help="with --scrapers: each scrapes every this many seconds (0: back to back)",
    )
    ap.add_argument(
        "--page-views",
        type=float,
        default=0.0,
        metavar="R",
        help="a live-page viewer polling /api/v1/quanta R times a second (the page: 1)",
    )
    ap.add_argument("--webhook", choices=["hang"], default=None)
    ap.add_argument("--restarts", default="", help="comma list of term, kill, wipe")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-verify", dest="verify", action="store_false")
    ap.add_argument("--keep", type=Path, default=None, help="copy the run's folder here")
    ap.add_argument("--log-level", default="warning", help="the aggregator's --log-level")
    ap.add_argument(
        "--profile", type=Path, default=None, help="cProfile the aggregator into this file"
    )
    ap.add_argument(
        "--confidence-level",
        type=lambda t: None if t == "false" else float(t),
        default=0.95,
        help="the aggregator's confidence_level ('false': no intervals, to measure their cost)",
    )
    ap.add_argument(
        "--late-share",
        type=float,
        default=0.0,
        help="share of the hosts whose messages come --late-ms after the others' (0: none)",
    )
    ap.add_argument("--late-ms", type=int, default=8000, help="how late (default 8000)")
    ap.add_argument(
        "--revise-within",
        default=None,
        help="the aggregator's revise_within, e.g. 0 or 2m (default: its own)",
    )
    ap.add_argument(
        "--horizon-cost",
        action="store_true",
        help="also run with revise_within 0 and print the horizon's RSS per host-minute",
    )
    ap.add_argument(
        "--baseline",
        action="store_true",
        help="with --late-share: also run without late hosts and compare CPU and RSS",
    )
    args = ap.parse_args()
    base: list[Result] = []
    if args.baseline and args.late_share:
        on_time = argparse.Namespace(**{**vars(args), "late_share": 0.0})
        base = [run(on_time) for _ in range(args.repeat)]
        report(on_time, base)
    off: list[Result] = []
    if args.horizon_cost:
        without = argparse.Namespace(**{**vars(args), "revise_within": "0"})
        off = [run(without) for _ in range(args.repeat)]
        report(without, off)
    results = [run(args) for _ in range(args.repeat)]
    report(args, results)
    if base:
        cpu0 = statistics.median(x.cpu_s for x in base)
        cpu1 = statistics.median(x.cpu_s for x in results)
        rss0 = statistics.median(x.rss for x in base)
        rss1 = statistics.median(x.rss for x in results)
        print(
            f"late data vs none: CPU {cpu1:.1f} s vs {cpu0:.1f} s over the load "
            f"({100 * (cpu1 / cpu0 - 1):+.1f} %), peak RSS {rss1:.0f} MB vs {rss0:.0f} MB "
            f"({100 * (rss1 / rss0 - 1):+.1f} %)"
        )
    if off:
        horizon_cost(args, off, results)
    return 0


def horizon_cost(args: argparse.Namespace, off: list[Result], on: list[Result]) -> None:
    """The peak RSS the revision horizon adds, per host and minute of horizon held.

    Closed quanta's state is kept for the horizon: a run shorter than the horizon holds
    every closed quantum (its length), a longer one the horizon's worth.
    """
    horizon_ms = (
        600_000
        if args.revise_within is None
        else parse_duration_ms(args.revise_within, what="--revise-within")
    )
    held_min = min(horizon_ms, 1000 * args.seconds) / 60_000
    rss0 = statistics.median(x.rss for x in off)
    rss1 = statistics.median(x.rss for x in on)
    cpu0 = statistics.median(x.cpu_s for x in off)
    cpu1 = statistics.median(x.cpu_s for x in on)
    per = (rss1 - rss0) * 1024 / args.hosts / held_min if held_min else float("nan")
    print(
        f"revision horizon: peak RSS {rss0:.0f} MB with revise_within 0, {rss1:.0f} MB with "
        f"{args.revise_within or '10m (default)'} ({held_min:.2f} min of closed quanta held): "
        f"{per:.1f} kB per host and minute of horizon; CPU {cpu0:.1f} s vs {cpu1:.1f} s"
    )


if __name__ == "__main__":
    raise SystemExit(main())
