"""Synthetic fio output: hist logs that follow fio's format and record semantics.

Used by ``fiomon demo``, the benchmarks and the tests. Latencies are drawn from a normal
head plus a power-law (Pareto) tail, the shape measured on production parallel file
systems; a *slow window* multiplies the latencies of chosen hosts, like a failing storage
node. Each job writes end-stamped records per direction every ``interval_ms`` at its own
phase, in epoch ms (``log_unix_epoch=1``), exactly as fio's ``write_hist_log`` would.

The exact per-I/O latencies are binned with fio's own ``plat_val_to_idx``, so a test can
keep them as ground truth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from fiomon.bins import BinLayout, plat_val_to_idx


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Normal head plus Pareto tail, in ns.

    Args:
        head_mean_ns: mean of the normal head.
        head_sd_ns: standard deviation of the head.
        tail_share: fraction of I/Os in the tail (0..1).
        tail_alpha: Pareto exponent of the tail (smaller = heavier).
    """

    head_mean_ns: float = 400_000.0
    head_sd_ns: float = 60_000.0
    tail_share: float = 0.03
    tail_alpha: float = 2.5

    def sample(self, rng: np.random.Generator, n: int, scale: float = 1.0) -> npt.NDArray[np.int64]:
        """``n`` latencies in integer ns, multiplied by ``scale``."""
        head = rng.normal(self.head_mean_ns, self.head_sd_ns, n)
        xm = self.head_mean_ns + 2 * self.head_sd_ns
        tail = xm * (1.0 + rng.pareto(self.tail_alpha, n))
        vals = np.where(rng.random(n) < self.tail_share, tail, head) * scale
        return np.clip(vals, 1000, 2**40).astype(np.int64)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One simulated fio job.

    Args:
        host: host name (also the folder of its log).
        job: 1-based job number (the N of ``_clat_hist.N.log``).
        iops: I/Os per second per direction.
        phase_ms: offset of its record stamps within the interval.
        directions: fio directions it does (0 read, 1 write).
    """

    host: str
    job: int
    iops: float
    phase_ms: int
    directions: tuple[int, ...] = (0, 1)


def records(
    spec: JobSpec,
    *,
    start_ms: int,
    seconds: int,
    interval_ms: int,
    model: LatencyModel,
    rng: np.random.Generator,
    slow: tuple[int, int, float] | None = None,
    keep_truth: bool = False,
    factor_at: Callable[[int], float] | None = None,
) -> Iterator[tuple[int, int, npt.NDArray[np.int64], npt.NDArray[np.int64] | None]]:
    """Per record: ``(end_ms, direction, fine-bin counts, exact latencies or None)``.

    Args:
        spec: the job.
        start_ms: epoch ms when the job starts.
        seconds: how long it runs.
        interval_ms: ``log_hist_msec``.
        model: latency model.
        rng: random source.
        slow: ``(from_ms, to_ms, factor)``: records ending in that window are slower.
        keep_truth: also return the exact latencies.
        factor_at: latency factor of a record ending at a given ms (overrides ``slow``).
    """
    layout = BinLayout()
    n_rec = seconds * 1000 // interval_ms
    for k in range(1, n_rec + 1):
        end = start_ms + spec.phase_ms + k * interval_ms
        for d in spec.directions:
            n = int(rng.poisson(spec.iops * interval_ms / 1000))
            if factor_at is not None:
                factor = factor_at(end)
            else:
                factor = slow[2] if slow and slow[0] <= end < slow[1] else 1.0
            lat = model.sample(rng, n, factor)
            counts = np.bincount(plat_val_to_idx(lat, layout.group_nr), minlength=layout.nbins)
            yield end + (7 if d else 0), d, counts, (lat if keep_truth else None)


def format_line(
    end_ms: int, direction: int, bs: int, counts: npt.NDArray[np.int64], coarseness: int = 0
) -> str:
    """One hist-log line as fio writes it (``", "`` separated, coarse bins summed)."""
    if coarseness:
        counts = counts.reshape(-1, 1 << coarseness).sum(axis=1)
    return f"{end_ms}, {direction}, {bs}, " + ", ".join(map(str, counts.tolist())) + "\n"


def write_cluster(
    out_dir: Path,
    *,
    hosts: int = 8,
    jobs_per_host: int = 4,
    seconds: int = 60,
    interval_ms: int = 1000,
    iops: float = 500.0,
    start_ms: int = 1_795_000_000_000,
    slow_hosts: int = 0,
    slow_window_s: tuple[int, int] = (0, 0),
    slow_factor: float = 10.0,
    model: LatencyModel | None = None,
    seed: int = 1,
) -> list[Path]:
    """Write ``hosts`` folders of hist logs; returns the files written.

    Jobs on one host share a phase within a few ms (fio starts them together); hosts differ.
    """
    rng = np.random.default_rng(seed)
    model = model or LatencyModel()
    paths = []
    for h in range(hosts):
        host = f"client-{h + 1:02d}"
        host_dir = out_dir / host
        host_dir.mkdir(parents=True, exist_ok=True)
        host_phase = int(rng.integers(0, interval_ms))
        slow = None
        if h < slow_hosts:
            slow = (
                start_ms + slow_window_s[0] * 1000,
                start_ms + slow_window_s[1] * 1000,
                slow_factor,
            )
        for j in range(jobs_per_host):
            spec = JobSpec(host, j + 1, iops, (host_phase + 3 * j) % interval_ms)
            path = host_dir / f"job_clat_hist.{j + 1}.log"
            with path.open("w") as fh:
                for end, d, counts, _ in records(
                    spec,
                    start_ms=start_ms,
                    seconds=seconds,
                    interval_ms=interval_ms,
                    model=model,
                    rng=rng,
                    slow=slow,
                ):
                    fh.write(format_line(end, d, 4096, counts))
            paths.append(path)
    return paths
