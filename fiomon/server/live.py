"""The live page's data: recent closed quanta as JSON, kept apart from intake.

Two halves, one per process:

* :class:`LiveFeed` lives in the aggregator. When quanta close it encodes their rows
  once (the closed-quantum JSON object, plus ``heat`` of :mod:`fiomon.heat` on cluster
  rows) and keeps the newest quanta (5 s of them, 2 to 16) as bytes; :meth:`LiveFeed.view` puts
  those, the SLA state and the counters into the :class:`LiveView` that rides on each
  metrics snapshot to the ``/metrics`` child process.
* :class:`LiveStore` lives in that child. It merges each view's recent quanta into a
  ring bounded by time (``window_s``, default 15 min, for cluster rows;
  ``host_window_s``, 2 min, for host rows) and by bytes (:data:`MAX_STORE_BYTES`), and
  answers ``GET /api/v1/quanta?since=MS`` by joining the
  stored bytes of every quantum that ends after ``since``. A page view therefore costs
  the aggregator nothing: no encoding, no lock, no work on its event loop.

Why a short tail of quanta on every snapshot rather than each quantum once: the feeding
thread sends only the newest snapshot (at least every 250 ms while they change), so one
can be skipped; with the last 5 s of quanta on each, a skip loses nothing unless the
child stops reading for that long. The tail is what each snapshot costs to pickle: about
0.5 MB per quantum for 256 hosts (the cap below) x 4 directions, a few kB for a small
cluster. A restarted child
starts with an empty ring (the page then shows history from that moment on).

``GET /api/v1/quanta`` answers::

    {"meta": {"percentiles": ["50", ...], "sla_ns": [...], "quantum_ms": 1000,
              "window_s": 900, "host_window_s": 120, "relative": false},
     "status": {"time_ms", "hosts_up", "records_received", "late_records",
                "lost_records", "host_rows_cap", "sla": [{"rule", "direction",
                "percentile", "threshold_ns", "host", "state", "value_ns"}]},
     "quanta": [closed-quantum objects ending after since, oldest first]}

Every row carries ``complete`` (false: a host the aggregator expected sent nothing for the
quantum) and, where its producer names missing cells (a root's rows), ``cells_missing``;
the page draws incomplete quanta as hollow points and names what is missing in its
status bar.

Host rows are kept for at most :data:`MAX_LIVE_HOSTS` hosts per quantum (by name) and
for the last 2 minutes only: the page's host heatmap is for spotting one slow host among
tens right now, and a browser should not have to hold 15 minutes x hosts x directions of
rows (the quanta file and ``fiomon plot`` have the whole run). This bounds the encoding
on the aggregator, each snapshot's size and the page's first fetch on clusters of a
thousand hosts.
"""

from __future__ import annotations

import bisect
import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.config import SlaRule
from fiomon.heat import heat_counts
from fiomon.histogram import pct_key

RECENT_MS = 5000  # each snapshot carries the quanta that closed over about this long
MAX_RECENT = 16
MAX_LIVE_HOSTS = 64  # host rows per quantum on the live page
DEFAULT_HOST_WINDOW_S = 120
MAX_STORE_BYTES = 64 << 20  # the child's ring, whatever the window
DEFAULT_WINDOW_S = 900

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True, slots=True)
class LiveView:
    """What the live page shows, as of one snapshot (immutable; pickled to the child).

    Args:
        recent: ``(end_ms, cluster rows, host rows)`` of the newest quanta, each as
            comma-joined JSON objects.
        meta: the ``meta`` JSON object (bytes).
        status: the ``status`` JSON object (bytes).
        window_s: how much history of cluster rows the child keeps.
        host_window_s: the same for host rows.
    """

    recent: tuple[tuple[int, bytes, bytes], ...]
    meta: bytes
    status: bytes
    window_s: int = DEFAULT_WINDOW_S
    host_window_s: int = DEFAULT_HOST_WINDOW_S


def encode_rows(rows: Sequence[ClosedQuantum], layout: BinLayout | None) -> tuple[bytes, bytes]:
    """One quantum's cluster rows and host rows (capped by name), as comma-joined JSON."""
    hosts = sorted({r.host for r in rows if r.host is not None})
    kept = set(hosts[:MAX_LIVE_HOSTS])
    cluster, host = [], []
    for r in rows:
        if r.host is None:
            obj = r.to_json()
            if r.hist is not None and layout is not None:
                obj["heat"] = heat_counts(r.hist, layout)
            cluster.append(_ENCODER.encode(obj))
        elif r.host in kept:
            host.append(_host_json(r))
    return ",".join(cluster).encode(), ",".join(host).encode()


def _host_json(r: ClosedQuantum) -> str:
    """A host row's closed-quantum object, its floats as Python writes them.

    Exact, and about half the cost of :meth:`ClosedQuantum.to_json`'s 12-digit rounding,
    which would be paid per host per quantum on the aggregator's event loop.
    """
    s = r.stats
    obj: dict[str, object] = {
        "start_ms": r.start_ms,
        "end_ms": r.end_ms,
        "scope": r.scope,
        "host": r.host,
        "direction": r.direction,
        "samples": s.samples,
        "min_ns": s.min_ns,
        "mean_ns": s.mean_ns,
        "max_ns": s.max_ns,
        "percentiles_ns": s.percentiles_ns,
        "saturated": s.saturated,
        "iops": r.iops,
        "bytes_per_second": r.bytes_per_second,
        "streams": r.streams,
        "late_records": r.late_records,
        "complete": r.complete,
    }
    if r.cells_missing is not None:
        obj["cells_missing"] = list(r.cells_missing)
    try:
        return _ENCODER.encode(obj)
    except ValueError:  # a NaN or infinity: the rounding path writes null for those
        return _ENCODER.encode(r.to_json())


class LiveFeed:
    """The aggregator's side: encodes closed quanta once, keeps the newest few.

    Args:
        percentiles: the aggregator's percentiles.
        rules: the SLA rules (their thresholds are drawn).
        quantum_ms: the quantum.
        window_s: history the page keeps (cluster rows).
        host_window_s: the same for host rows.
    """

    def __init__(
        self,
        percentiles: Sequence[float],
        rules: Sequence[SlaRule],
        quantum_ms: int,
        window_s: int = DEFAULT_WINDOW_S,
        host_window_s: int = DEFAULT_HOST_WINDOW_S,
    ) -> None:
        self.window_s = window_s
        self.host_window_s = min(host_window_s, window_s)
        self.percentiles = tuple(percentiles)
        self.quantum_ms = quantum_ms
        keep = min(MAX_RECENT, max(2, -(-RECENT_MS // max(1, quantum_ms))))
        self._recent: deque[tuple[int, bytes, bytes]] = deque(maxlen=keep)
        self._tuple: tuple[tuple[int, bytes, bytes], ...] = ()
        self.set_rules(rules)

    def set_rules(self, rules: Sequence[SlaRule]) -> None:
        """Take new SLA rules (a reload): their thresholds are drawn, their states listed."""
        self.rules = tuple(rules)
        self.meta = _ENCODER.encode(
            {
                "percentiles": [pct_key(q) for q in self.percentiles],
                "sla_ns": sorted({r.threshold_ns for r in self.rules}),
                "quantum_ms": self.quantum_ms,
                "window_s": self.window_s,
                "host_window_s": self.host_window_s,
                "relative": False,
            }
        ).encode()

    def add(self, rows: Sequence[ClosedQuantum], layout: BinLayout | None) -> None:
        """Encode newly closed rows, one entry per quantum end."""
        by_end: dict[int, list[ClosedQuantum]] = {}
        for r in rows:
            by_end.setdefault(r.end_ms, []).append(r)
        for end in sorted(by_end):
            self._recent.append((end, *encode_rows(by_end[end], layout)))
        self._tuple = tuple(self._recent)

    def view(self, status: dict[str, Any]) -> LiveView:
        """The view for a snapshot (``status``: the ``status`` object)."""
        status_bytes = _ENCODER.encode(status).encode()
        return LiveView(self._tuple, self.meta, status_bytes, self.window_s, self.host_window_s)


def status_of(
    *,
    now_ms: int,
    hosts_up: int,
    received: int,
    late: int,
    lost: int,
    rules: Sequence[SlaRule],
    alerts: Sequence[dict[str, object]],
) -> dict[str, Any]:
    """The ``status`` object: counters and every rule's state (``inactive`` if unseen)."""
    by_rule: dict[str, list[dict[str, object]]] = {}
    for a in alerts:
        by_rule.setdefault(str(a["rule"]), []).append(a)
    sla: list[dict[str, object]] = []
    for rule in rules:
        common = {
            "rule": rule.name,
            "direction": rule.direction,
            "percentile": pct_key(rule.percentile),
            "threshold_ns": rule.threshold_ns,
        }
        seen = by_rule.get(rule.name) or [{"host": None, "state": "inactive", "value_ns": None}]
        # Per-host rules: the page lists the hosts that are not quiet, else one line.
        loud = [a for a in seen if a.get("state") not in ("inactive", "resolved")]
        for a in (loud or seen[:1])[:20]:
            sla.append(
                {**common, "host": a.get("host"), "state": a["state"], "value_ns": a["value_ns"]}
            )
    return {
        "time_ms": now_ms,
        "hosts_up": hosts_up,
        "records_received": received,
        "late_records": late,
        "lost_records": lost,
        "host_rows_cap": MAX_LIVE_HOSTS,
        "sla": sla,
    }


class LiveStore:
    """The child's side: a ring of encoded quanta, bounded by time and bytes."""

    def __init__(self, max_bytes: int = MAX_STORE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._ends: list[int] = []
        self._rows: dict[int, list[bytes]] = {}  # end -> [cluster rows, host rows]
        self._bytes = 0
        self._host_from = 0  # index of the oldest quantum that still has host rows
        self._view: LiveView | None = None

    def merge(self, view: LiveView) -> None:
        """Take a view's newest quanta (replacing a quantum seen before) and trim."""
        self._view = view
        for end, cluster, host in view.recent:
            old = self._rows.get(end)
            if old is None:
                i = bisect.bisect_left(self._ends, end)
                self._ends.insert(i, end)
                self._host_from = min(self._host_from, i)
            else:
                self._bytes -= len(old[0]) + len(old[1])
            self._rows[end] = [cluster, host]
            self._bytes += len(cluster) + len(host)
        if not self._ends:
            return
        newest = self._ends[-1]
        host_cut = newest - view.host_window_s * 1000
        while self._host_from < len(self._ends) and self._ends[self._host_from] <= host_cut:
            pair = self._rows[self._ends[self._host_from]]
            self._bytes -= len(pair[1])
            pair[1] = b""
            self._host_from += 1
        cut = newest - view.window_s * 1000
        while self._ends and (self._ends[0] <= cut or self._bytes > self.max_bytes):
            pair = self._rows.pop(self._ends.pop(0))
            self._bytes -= len(pair[0]) + len(pair[1])
            self._host_from = max(0, self._host_from - 1)

    @property
    def quanta(self) -> int:
        """Quanta held."""
        return len(self._ends)

    @property
    def nbytes(self) -> int:
        """Bytes of JSON held."""
        return self._bytes

    def body(self, since_ms: int) -> bytes:
        """The ``/api/v1/quanta`` answer for quanta ending after ``since_ms``."""
        view = self._view
        if view is None:
            meta, status = b"{}", b"{}"
        else:
            meta, status = view.meta, view.status
        i = bisect.bisect_right(self._ends, since_ms)
        rows = b",".join(b for e in self._ends[i:] for b in self._rows[e] if b)
        return b'{"meta":' + meta + b',"status":' + status + b',"quanta":[' + rows + b"]}"
