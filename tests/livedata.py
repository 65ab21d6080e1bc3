"""Test data for the live path: json+ status streams near the wall clock."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from tests.conftest import FIXTURES


def template_job() -> dict[str, Any]:
    """The first job of a real fio 3.33 json+ status document."""
    doc, _ = json.JSONDecoder().raw_decode((FIXTURES / "fio333_randrw_status.json").read_text())
    job: dict[str, Any] = doc["jobs"][0]
    return job


def json_document(job: dict[str, Any], jobs: int, tick: int, ts_ms: int) -> str:
    """One status dump of ``jobs`` jobs whose cumulative bins grow with ``tick``."""
    entries = []
    for j in range(jobs):
        e = copy.deepcopy(job)
        e["jobname"] = f"job{j}"
        e["job_runtime"] = 1000 * (tick + 1)
        for d in ("read", "write"):
            sec = e[d]
            bins = sec["clat_ns"]["bins"]
            sec["clat_ns"]["bins"] = {k: v * (tick + 1) + j for k, v in bins.items()}
            sec["io_bytes"] = sec["io_bytes"] * (tick + 1)
        entries.append(e)
    doc: dict[str, Any] = {"fio version": "fio-3.33", "timestamp": ts_ms // 1000}
    doc["timestamp_ms"] = ts_ms
    doc["jobs"] = entries
    return json.dumps(doc, indent=2) + "\n"


def write_json_stream(path: Path, *, jobs: int, start_ms: int, seconds: int, phase_ms: int) -> None:
    """A whole json+ stream: one dump per second, the first ``phase_ms`` after ``start_ms``."""
    job = template_job()
    with path.open("w") as fh:
        for t in range(seconds):
            fh.write(json_document(job, jobs, t, start_ms + 1000 * (t + 1) + phase_ms))
