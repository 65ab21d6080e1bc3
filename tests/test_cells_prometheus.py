"""Cells on loopback, summed by a real Prometheus with the shipped multi-cell config.

Two cells (a Mosquitto and aggregators each), four hosts running real fio whose agents
pick their cell by the rendezvous hash of their host names, and a third broker that
bridges both cells' topics to one more aggregator, "single", fed every record. Checks:

- exact: each cell's bucket counters, summed, equal the single aggregator's, bucket by
  bucket, and count every I/O ``fiomon report`` counts in the hosts' json+ streams;
- accurate: from two Prometheus servers scraping the cells at 4 and at 16 buckets per
  octave, ``histogram_quantile`` of the summed buckets is within the stated bound (one
  bucket's width: 19.7 % and 4.6 %) of the exact cluster percentiles of ``fiomon report
  --format jsonl`` over all the streams, and the shipped recording rules (over
  ``rate()``, which weighs the cells by their own extrapolation factors) within that
  bound of the exact percentiles at the rank the measured factors can shift it to
  (deploy/README.md, "How accurate"); the errors are printed (the README quotes them);
- complete: both cells report, the completeness and label alerts stay quiet.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from fiomon.cells import assign_cell
from fiomon.config import agent_config_from
from fiomon.model import DIRECTIONS
from fiomon.offline.sources import FileSource, SourceOptions
from tests.conftest import DEADLINE_S, Mosquitto, free_port
from tests.metricskit import query, scrape, total

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
CELLS = ("cell-a", "cell-b")  # as deploy/prometheus/prometheus-cells.yml names them
COUNT = "fiomon_cluster_io_latency_seconds_count"
# histogram_quantile's bound (docs/metrics.md): one bucket's width, with label rounding.
BOUND = {4: 0.197, 16: 0.046}
PERCENTILES = {"50": "p50", "90": "p90", "99": "p99"}
# Page-cache I/O of two kinds on each cell (the n-th host of each cell runs the n-th),
# as a hash spreads a cluster's hosts: the cells are alike, not identical.
WORKLOADS = (
    ["--rw=randrw", "--rwmixread=70", "--bs=8k"],
    ["--rw=randread", "--bs=64k"],
)


def split_hosts(per_cell: int) -> dict[str, str]:
    """The first ``per_cell`` host names of each cell by the hash: host -> cell."""
    out: dict[str, str] = {}
    for i in range(1, 1000):
        host = f"client-{i:02d}"
        cell = assign_cell(host, CELLS)
        if sum(c == cell for c in out.values()) < per_cell:
            out[host] = cell
        if len(out) == per_cell * len(CELLS):
            return out
    msg = "the hash put no host in some cell"
    raise AssertionError(msg)


def scalar(port: int, expr: str, at: float | None = None) -> float | None:
    rows = query(port, expr, at)
    return float(rows[0]["value"][1]) if rows else None


def buckets(port: int) -> dict[tuple[str, str, str], float]:
    """``(series, direction, le) -> value`` of an aggregator's latency histogram."""
    return {
        (name, d["direction"], d.get("le", "")): v
        for (name, labels), v in scrape(port).items()
        if name.startswith("fiomon_cluster_io_latency_seconds")
        for d in [dict(labels)]
    }


def metric(port: int, name: str, **labels: str) -> float:
    return total(scrape(port), name, **labels)


async def poll(predicate: Any, what: str) -> None:
    """Until ``predicate()`` (run in a thread: it does HTTP) is true, or fail."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while True:
        try:
            if await asyncio.to_thread(predicate):
                return
        except OSError:
            pass  # not listening yet
        if loop.time() > deadline:
            pytest.fail(f"not within {DEADLINE_S:g} s: {what}")
        await asyncio.sleep(0.2)


def stream_records(streams: list[Path]) -> int:
    total = 0
    for stream in streams:
        src = FileSource(stream, stream.parent.name, SourceOptions())
        try:
            total += sum(len(b) for b in src.batches())
        finally:
            src.close()
    return total


def prometheus_config(folder: Path, ports: dict[str, int]) -> Path:
    """The shipped multi-cell config and rules, with the cells' addresses rewritten."""
    folder.mkdir()
    for name in ("fiomon.rules.yml", "fiomon-cells.rules.yml"):
        shutil.copy(DEPLOY / "prometheus" / name, folder / name)
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus-cells.yml").read_text())
    cfg["global"]["evaluation_interval"] = "1s"
    del cfg["alerting"]  # no Alertmanager here; the alerts are read from Prometheus
    cfg["rule_files"] = [str(folder / f) for f in cfg["rule_files"]]
    (job,) = cfg["scrape_configs"]
    for target in job["static_configs"]:
        target["targets"] = [f"127.0.0.1:{ports[target['labels']['cell']]}"]
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.fio
async def test_cells_sum_exactly_and_prometheus_percentiles_are_within_the_bound(
    mosquitto_bin: str, tmp_path: Path, fio_bin: str
) -> None:
    del fio_bin  # required installed; `fiomon fio` finds it on PATH
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus is missing: run .ci/run or apt-get install prometheus")
    hosts = split_hosts(2)
    brokers = {c: Mosquitto(mosquitto_bin, tmp_path / f"mqtt-{c}") for c in CELLS}
    # The single aggregator's broker bridges both cells' topics in (QoS 1).
    single = Mosquitto(mosquitto_bin, tmp_path / "mqtt-single")
    with single.conf.open("a") as fh:
        for c in CELLS:
            fh.write(
                f"connection cell-{c}\naddress 127.0.0.1:{brokers[c].port}\n"
                f"remote_clientid bridge-single-{c}\ntopic fiomon/# in 1\n"
            )
    procs: list[asyncio.subprocess.Process] = []
    cell_procs: dict[str, asyncio.subprocess.Process] = {}

    async def start(*cmd: str) -> None:
        procs.append(
            await asyncio.create_subprocess_exec(
                *cmd, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
            )
        )

    def aggregator(name: str, port: int, k: int, cell: str | None) -> Path:
        cfg = tmp_path / f"aggregator-{name}.yaml"
        cfg.write_text(
            f"broker: {{port: {port}}}\nclient_id: fiomon-aggregator-{name}\n"
            f"quantum: 1s\nlateness: 2s\nlisten: 127.0.0.1:{metrics[name]}\n"
            f"export: {{buckets_per_octave: {k}}}\n" + (f"cell: {cell}\n" if cell else "")
        )
        return cfg

    # Each cell has an aggregator at 4 and one at 16 buckets per octave (one Prometheus
    # for each resolution: le labels of both in one sum would be nonsense).
    names = [f"{c}-{k}" for k in BOUND for c in CELLS]
    metrics = {n: free_port() for n in [*names, "single"]}
    prom = {k: free_port() for k in BOUND}
    for b in [*brokers.values(), single]:
        b.start()
    try:
        for k in BOUND:
            for c in CELLS:
                await start(
                    sys.executable,
                    "-m",
                    "fiomon",
                    "aggregator",
                    "--config",
                    str(aggregator(f"{c}-{k}", brokers[c].port, k, c)),
                    "--final",
                )
                cell_procs[f"{c}-{k}"] = procs[-1]
        await start(
            sys.executable,
            "-m",
            "fiomon",
            "aggregator",
            "--config",
            str(aggregator("single", single.port, 16, None)),
            "--final",
        )
        for k in BOUND:
            cfg = prometheus_config(tmp_path / f"prom{k}", {c: metrics[f"{c}-{k}"] for c in CELLS})
            await start(
                prometheus,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={tmp_path / f'tsdb{k}'}",
                f"--web.listen-address=127.0.0.1:{prom[k]}",
            )
        # Agents: the cells listed, no `cell:`, so each picks its cell by the hash.
        cells_yaml = "".join(
            f"  - {{name: {c}, broker: {{port: {brokers[c].port}}}}}\n" for c in CELLS
        )
        for host in hosts:
            text = (
                f"host: {host}\nwatch: ['{tmp_path}/data/{host}/*.json']\n"
                f"state_dir: {tmp_path}/s-{host}\nflush_interval: 200ms\n"
                f"heartbeat_interval: 1s\ncells:\n{cells_yaml}"
            )
            assert agent_config_from(yaml.safe_load(text)).cell == hosts[host]
            (tmp_path / f"agent-{host}.yaml").write_text(text)
            await start(
                sys.executable,
                "-m",
                "fiomon",
                "agent",
                "--config",
                str(tmp_path / f"agent-{host}.yaml"),
            )
        # Every subscriber is in place before fio starts: the aggregators and the bridge
        # on each cell's broker, each agent on its own cell's broker (and on no other).
        for c, b in brokers.items():
            for k in BOUND:
                await b.wait_for_log(f"fiomon-aggregator-{c}-{k} 1 fiomon/v1/+/records")
            await b.wait_for_log(f"bridge-single-{c} 1 fiomon/#")
            for host, cell in hosts.items():
                if cell == c:
                    await b.wait_for_log(f" as fiomon-agent-{host} (")
        await single.wait_for_log("fiomon-aggregator-single 1 fiomon/v1/+/records")
        # Prometheus scrapes both cells, and has their histograms at 0 (exported from
        # the start: rate() then counts the first quantum too).
        for k in BOUND:
            await poll(
                lambda k=k: (
                    scalar(
                        prom[k],
                        'count(fiomon_cluster_io_latency_seconds_count{direction="all"} == 0)',
                    )
                    == 2
                ),
                f"Prometheus ({k}/octave) scraping both cells' zero histograms",
            )
        # The host's rank in its cell picks its workload.
        rank = {h: [x for x in hosts if hosts[x] == hosts[h]].index(h) for h in hosts}
        for i, host in enumerate(hosts):
            (tmp_path / f"{host}.dat").write_bytes(np.random.default_rng(i).bytes(16 * 1024**2))
        fios = []
        for host in hosts:
            out = tmp_path / "data" / host
            out.mkdir(parents=True)
            fios.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "fiomon",
                    "fio",
                    "--output-dir",
                    str(out),
                    "--",
                    "--name=job",
                    "--ioengine=psync",
                    f"--filename={tmp_path / f'{host}.dat'}",
                    "--size=16M",
                    "--time_based",
                    "--runtime=6",
                    "--rate_iops=400",
                    "--invalidate=0",
                    *WORKLOADS[rank[host]],
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
            )
        assert [await f.wait() for f in fios] == [0] * len(hosts)
        streams = sorted((tmp_path / "data").glob("*/*.json"))
        assert len(streams) == len(hosts)
        records = stream_records(streams)
        # The exact cluster percentiles: every stream in one quantum of an hour that
        # starts 10 minutes before the run.
        start_ms = int((time.time() - 600) * 1000)
        cmd = [
            sys.executable, "-m", "fiomon", "report", "--format", "jsonl", "--quantum", "1h",
            "--align", f"{start_ms % 3_600_000}ms", "--percentiles", "50,90,99",
            *map(str, streams),
        ]  # fmt: skip
        done = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        report = done.stdout
        rows = [json.loads(line) for line in report.splitlines()]
        exact = {r["direction"]: r for r in rows if r["scope"] == "cluster"}
        assert len({(r["start_ms"], r["end_ms"]) for r in rows}) == 1, "one quantum"
        io_total = float(exact["all"]["samples"])

        # Every record reached its cell and the single aggregator, every quantum closed
        # (the histograms count every I/O), and both Prometheus servers scraped that.
        def counted(name: str) -> float:
            return metric(metrics[name], "fiomon_records_total", result="received")

        await poll(lambda: counted("single") >= records, f"single receives {records} records")
        for k in BOUND:
            await poll(
                lambda k=k: sum(counted(f"{c}-{k}") for c in CELLS) >= records,
                f"the cells ({k}/octave) receive {records} records",
            )
        ios = f'{COUNT}{{direction="all"}}'

        def settled() -> bool:
            """Every aggregator's histogram, or each resolution's cells summed, counts all."""
            n = {name: metric(port, COUNT, direction="all") for name, port in metrics.items()}
            totals = [n["single"]] + [sum(n[f"{c}-{k}"] for c in CELLS) for k in BOUND]
            return all(abs(t - io_total) <= 1e-9 * io_total for t in totals)

        await poll(settled, f"every aggregator's histogram counts all {io_total:g} I/Os")
        seen: dict[int, float] = {}
        for k in BOUND:
            await poll(
                lambda k=k: (
                    abs((scalar(prom[k], f"sum({ios})") or 0) - io_total) <= 1e-9 * io_total
                ),
                f"Prometheus ({k}/octave) scrapes the final counts",
            )
            seen[k] = time.time()
        # The recording rules evaluated after that (every second here).
        # (both groups: the cells' rules and the shipped single-aggregator rule)
        p99 = "(cluster_)?direction:fiomon_cluster_io_latency_seconds:p99_rate1m"
        for k in BOUND:
            await poll(
                lambda k=k: (
                    (scalar(prom[k], f"min(timestamp({{__name__=~'{p99}'}}))") or 0) > seen[k] + 1
                ),
                f"Prometheus ({k}/octave) evaluates the rules on the final counts",
            )
        got: dict[int, dict[tuple[str, str], float]] = {}
        # Per resolution and kind of figure (the cells' rules, the shipped rule, the
        # buckets alone): the largest rank shift rate() can have given it (see below).
        shift: dict[int, dict[str, float]] = {}
        cells_p = "cluster_direction:fiomon_cluster_io_latency_seconds:{}_rate1m"
        shipped_p99 = "direction:fiomon_cluster_io_latency_seconds:p99_rate1m"
        for k in BOUND:
            at = time.time()  # every query of this resolution sees the same samples
            # rate() saw both cells from 0 (the run fits the rule's 1m window).
            window = f"min_over_time({ios}[59s]) == 0"
            assert scalar(prom[k], f"count({window})", at) == 2, "the run outlasted rate()'s window"
            got[k] = {
                (pct, d): float(r["value"][1])
                for pct, name in PERCENTILES.items()
                for r in query(prom[k], cells_p.format(name), at)
                for d in [r["metric"]["direction"]]
            }
            # The shipped single-aggregator rule, evaluated by another group (at other
            # times, so other rate() extrapolations), sums the cells the same way.
            got[k] |= {
                ("99", "shipped " + r["metric"]["direction"]): float(r["value"][1])
                for r in query(prom[k], shipped_p99, at)
            }
            # The buckets' own resolution, without rate(): the cumulative counts summed.
            got[k] |= {
                (pct, "buckets " + r["metric"]["direction"]): float(r["value"][1])
                for pct in PERCENTILES
                for r in query(
                    prom[k],
                    f"histogram_quantile({float(pct) / 100}, sum by (le, direction)"
                    " (fiomon_cluster_io_latency_seconds_bucket))",
                    at,
                )
            }
            # rate() extrapolates each cell's counters over that cell's own scrape times:
            # every series of a cell (same scrapes, all from 0) by one factor, the cells by
            # different ones, so the rules weigh one cell's I/Os by up to a few per cent
            # more than the other's. That moves the rank a percentile is read at, by at
            # most |r - 1| / (4 min(1, r)) with r the ratio of the two factors (the
            # mixture's CDF moves by p (1 - p) (r - 1) (F_b - F_a) / (p + (1 - p) r)).
            # The factors are read at each rule's own evaluation time.
            shift[k] = {"buckets": 0.0}
            for kind, rule in (("", cells_p.format("p99")), ("shipped", shipped_p99)):
                evaluated = scalar(prom[k], f"max(timestamp({rule}))", at)
                assert evaluated is not None, rule
                # (and one scrape earlier: a scrape still in flight at the evaluation is
                # in the data now, not in what the rule saw)
                ratios = []
                for when in (evaluated, evaluated - 1):
                    factors = [
                        float(r["value"][1])
                        for r in query(prom[k], f"rate({ios}[1m]) * 60 / {ios}", when)
                    ]
                    assert len(factors) == 2, factors
                    ratios.append(max(factors) / min(factors))
                shift[k][kind] = math.ceil((max(ratios) - 1) / 4 * 1e5) / 1e5  # up, to 0.001 %
            # Complete: both cells configured and reporting, no alert of the cells' rules.
            assert scalar(prom[k], "cluster:fiomon_cells_configured:count") == 2
            assert scalar(prom[k], "cluster:fiomon_cells_reporting:count") == 2
            assert not query(prom[k], 'ALERTS{alertname=~"FiomonCell.*"}')
            assert scalar(prom[k], "count(fiomon_cell_info)") == 2
        exact_buckets = {n: buckets(metrics[n]) for n in ("cell-a-16", "cell-b-16", "single")}

        # A cell that goes down, and one that is up but cut off from its broker, leave the
        # sums partial, and say so: the completeness alert goes pending at once (it fires
        # after its `for: 1m`, which fiomon-cells.rules_test.yml checks).
        def missing(k: int) -> bool:
            pending = query(prom[k], 'ALERTS{alertname="FiomonCellsMissing"}')
            return scalar(prom[k], "cluster:fiomon_cells_reporting:count") == 1 and bool(pending)

        cell_procs["cell-b-16"].terminate()
        await cell_procs["cell-b-16"].wait()
        await poll(lambda: missing(16), "FiomonCellsMissing once cell-b's aggregator is down")
        assert scalar(prom[4], "cluster:fiomon_cells_reporting:count") == 2
        brokers["cell-a"].stop()  # cell-a's aggregators keep running, disconnected
        await poll(lambda: missing(4), "FiomonCellsMissing once cell-a's broker is down")
        assert scalar(prom[4], 'up{cell="cell-a"}') == 1
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
                await p.wait()
        for b in [*brokers.values(), single]:
            b.stop()

    # Exact: the cells' counters add up to the single aggregator's, bucket by bucket.
    one = exact_buckets["single"]
    # every direction (read, write, trim, all, mixed) x (le edges, +Inf, count and sum)
    assert len(one) == len(DIRECTIONS) * (385 + 1 + 2)
    summed = {key: exact_buckets["cell-a-16"][key] + exact_buckets["cell-b-16"][key] for key in one}
    worst = max(abs(summed[key] - v) / max(v, 1.0) for key, v in one.items())
    assert worst <= 1e-9, f"cells summed differ from one aggregator by {worst:.2e}"
    assert one[(COUNT, "all", "")] == pytest.approx(io_total, rel=1e-9)

    # Accurate: within one bucket's width of the exact cluster percentile, read at the
    # rank rate()'s weighting can have moved it to (none for the buckets alone): the
    # exact percentiles at q -+ that shift, from `fiomon report` on the same streams.
    def shifted(q: str, by: float) -> float:
        return round(min(100.0, max(0.0, float(q) + 100 * by)), 3)

    wanted = sorted(
        {shifted(q, sign * by) for by in (s for m in shift.values() for s in m.values())
         for q in PERCENTILES for sign in (-1, 1)} - {0.0}
    )  # fmt: skip
    band_cmd = list(cmd)
    band_cmd[band_cmd.index("--percentiles") + 1] = ",".join(f"{q:.3f}" for q in wanted)
    done = await asyncio.to_thread(subprocess.run, band_cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    band_rows = [json.loads(line) for line in done.stdout.splitlines()]
    at_rank = {
        (r["direction"], round(float(key), 3)): float(v) / 1e9
        for r in band_rows
        if r["scope"] == "cluster"
        for key, v in r["percentiles_ns"].items()
    }
    lines = []
    for k, bound in BOUND.items():
        errors = {}
        for (pct, label), value in got[k].items():
            d = label.split()[-1]
            if d in exact and exact[d]["samples"] > 0:  # trim: no I/O, NaN
                ref = float(exact[d]["percentiles_ns"][pct]) / 1e9
                errors[(pct, label)] = abs(value - ref) / ref
                by = shift[k][label.split()[0] if " " in label else ""]
                lo = at_rank.get((d, round(shifted(pct, -by), 3)), 0.0) * (1 - bound)
                hi = at_rank[(d, round(shifted(pct, by), 3))] * (1 + bound)
                assert lo <= value <= hi, (
                    f"{k}/octave p{pct} {label}: {value * 1e6:.2f} us outside "
                    f"[{lo * 1e6:.2f}, {hi * 1e6:.2f}] us (exact {ref * 1e6:.2f} us, "
                    f"rank shift {by:.4f})"
                )
        worst_key = max(errors, key=errors.__getitem__)
        lines.append(
            f"{k}/octave: worst {errors[worst_key]:.2%} (p{worst_key[0]} {worst_key[1]}), "
            f"rate() rank shift {shift[k]['']:.4f} (cells' rules), "
            f"{shift[k]['shipped']:.4f} (shipped), "
            + ", ".join(f"p{p} {d} {e:.2%}" for (p, d), e in sorted(errors.items()))
        )
        # The buckets alone carry no rate() weighting: one bucket's width, plainly.
        buckets_worst = max(e for (_, label), e in errors.items() if label.startswith("buckets"))
        assert buckets_worst <= bound, lines[-1]
    directions = [d for d in ("read", "write", "all") if d in exact and exact[d]["samples"] > 0]
    exact_us = {
        d: [round(exact[d]["percentiles_ns"][p] / 1e3, 1) for p in PERCENTILES] for d in directions
    }
    print(
        f"\ncells: {records} records, {io_total:.0f} I/Os of {len(hosts)} hosts {hosts}; "
        f"exact p50/p90/p99 (us) {exact_us}; summed buckets vs one aggregator {worst:.1e}\n"
        + "\n".join(lines)
    )
