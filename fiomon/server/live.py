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

Revisions (late records merged into a quantum that already closed, within the
aggregator's ``revise_within``) arrive as rows with ``revised_at`` set: the row of a key
(``end_ms``, ``scope``, ``host``, ``direction``) with the next ``revision``, or a key first
published late. The feed encodes them one by one and sends them apart from the first
publications (:attr:`LiveView.revised`); the store puts each in place of its key's row
in the stored quantum, keeping the highest revision (equal revisions: the later one),
so the API serves one object per key, its latest revision. Each revision the store takes
for a quantum counts once (``revised``, a number that only grows while the child lives):
``?since=MS&revised=N`` also answers every quantum revised after the N-th, however old,
so a page that polls with the last answer's ``revised`` redraws a revised quantum. A
revision is rare, so the store pays for it then: it splits the quantum's stored JSON into
rows (about 5 ms for a quantum of 256 hosts' rows) and joins it again.

Why a short tail of quanta on every snapshot rather than each quantum once: the feeding
thread sends only the newest snapshot (at least every 250 ms while they change), so one
can be skipped; with the last 5 s of quanta on each, a skip loses nothing unless the
child stops reading for that long. The tail is what each snapshot costs to pickle: about
0.5 MB per quantum for 256 hosts (the cap below) x 4 directions, a few kB for a small
cluster. A store that starts (the aggregator's start, or a restarted child) fills its
ring from the quanta file, once, on a thread of its own (:func:`read_history`: the page's
window, bounded by time and bytes), so an aggregator restart does not empty the page.

``GET /api/v1/quanta`` answers::

    {"meta": {"percentiles": ["50", ...], "sla_ns": [...], "quantum_ms": 1000,
              "window_s": 900, "host_window_s": 120, "relative": false,
              "sla": [{"rule", "direction", "percentile", "threshold_ns", "scope",
                       "label": "SLA p99 write 5 ms"}],
              "colours": {"99": "#e69f00", ...}},
     "status": {"time_ms", "hosts_up", "records_received", "late_records",
                "lost_records", "host_rows_cap", "silent_hosts", "silent_count",
                "sla": [{"rule", "direction", "percentile", "threshold_ns", "host",
                "state", "value_ns", "more"?}]},
     "quanta": [closed-quantum objects ending after since (or revised after the
                revised given), oldest first, one per key: its latest revision],
     "revised": N}

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
import logging
import re
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fiomon.bins import BinLayout
from fiomon.closed import ClosedQuantum
from fiomon.config import SlaRule
from fiomon.heat import heat_counts
from fiomon.histogram import pct_key
from fiomon.model import LatencyKind
from fiomon.palette import percentile_colours
from fiomon.server.quantafile import raw_lines_backwards
from fiomon.units import format_latency_ns

log = logging.getLogger("fiomon.aggregator")

RECENT_MS = 5000  # each snapshot carries the quanta that closed over about this long
MAX_RECENT = 16
MAX_LIVE_HOSTS = 64  # host rows per quantum on the live page
DEFAULT_HOST_WINDOW_S = 120
MAX_STORE_BYTES = 64 << 20  # the child's ring, whatever the window
DEFAULT_WINDOW_S = 900

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder()

RowKey = tuple[str, str, str]  # a row's (scope, host or "", direction) within its quantum
# A revised row as the feed sends it: its key, revision, and its JSON object.
Revised = tuple[RowKey, int, bytes]


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
        revised: ``(end_ms, rows)`` of the newest publications after a first close
            (revisions and keys first published late), each row on its own.
        history: the quanta file and its rotated ones, newest first (empty: none): the
            store reads the page's window from them once, when it starts.
    """

    recent: tuple[tuple[int, bytes, bytes], ...]
    meta: bytes
    status: bytes
    window_s: int = DEFAULT_WINDOW_S
    host_window_s: int = DEFAULT_HOST_WINDOW_S
    revised: tuple[tuple[int, tuple[Revised, ...]], ...] = ()
    history: tuple[str, ...] = ()


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
        "revision": r.revision,
    }
    if r.revised_at is not None:
        obj["revised_at"] = r.revised_at
    obj["complete"] = r.complete
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
        latency: the latency kind the aggregator merges; SLA labels and the latency
            charts' titles name it unless it is ``clat``.
    """

    def __init__(
        self,
        percentiles: Sequence[float],
        rules: Sequence[SlaRule],
        quantum_ms: int,
        window_s: int = DEFAULT_WINDOW_S,
        host_window_s: int = DEFAULT_HOST_WINDOW_S,
        *,
        latency: LatencyKind = "clat",
    ) -> None:
        self.latency: LatencyKind = latency
        self.window_s = window_s
        self.host_window_s = min(host_window_s, window_s)
        self.percentiles = tuple(percentiles)
        self.quantum_ms = quantum_ms
        keep = min(MAX_RECENT, max(2, -(-RECENT_MS // max(1, quantum_ms))))
        self._recent: deque[tuple[int, bytes, bytes]] = deque(maxlen=keep)
        self._tuple: tuple[tuple[int, bytes, bytes], ...] = ()
        # Publications after a first close, one entry per quantum and call, as many calls'
        # worth as first closes are kept (each view repeats them: a skipped view loses none).
        self._revised: deque[tuple[int, tuple[Revised, ...]]] = deque()
        self._revised_calls: deque[int] = deque(maxlen=keep)
        self._revised_tuple: tuple[tuple[int, tuple[Revised, ...]], ...] = ()
        # The quanta file and its rotated ones (set once the aggregator opened it): a
        # store that starts (the /metrics child, after an aggregator restart or its own)
        # fills the page's window from them.
        self.history: tuple[str, ...] = ()
        self.set_rules(rules)

    def set_rules(self, rules: Sequence[SlaRule]) -> None:
        """Take new SLA rules (a reload): their thresholds are drawn, their states listed."""
        self.rules = tuple(rules)
        self.meta = _ENCODER.encode(
            {
                "percentiles": [pct_key(q) for q in self.percentiles],
                "sla_ns": sorted({r.threshold_ns for r in self.rules}),
                "sla": [sla_line(r, self.latency) for r in self.rules],
                "latency": self.latency,
                "colours": percentile_colours(self.percentiles),
                "quantum_ms": self.quantum_ms,
                "window_s": self.window_s,
                "host_window_s": self.host_window_s,
                "relative": False,
            }
        ).encode()

    def add(self, rows: Sequence[ClosedQuantum], layout: BinLayout | None) -> None:
        """Encode newly published rows, one entry per quantum end.

        Rows with ``revised_at`` (revisions, keys first published late) go apart, each
        row on its own, so the store can put them in place of their keys' rows.
        """
        by_end: dict[int, list[ClosedQuantum]] = {}
        later: dict[int, list[ClosedQuantum]] = {}
        for r in rows:
            (by_end if r.revised_at is None else later).setdefault(r.end_ms, []).append(r)
        for end in sorted(by_end):
            self._recent.append((end, *encode_rows(by_end[end], layout)))
        self._tuple = tuple(self._recent)
        if later:
            # Host rows the store would not serve are not encoded: past the host window,
            # or beyond the host cap (the first hosts by name, as encode_rows keeps them).
            newest = self._recent[-1][0] if self._recent else max(later)
            host_cut = newest - self.host_window_s * 1000
            for end, rs in later.items():
                kept = set(sorted({r.host for r in rs if r.host is not None})[:MAX_LIVE_HOSTS])
                later[end] = [
                    r for r in rs if r.host is None or (end > host_cut and r.host in kept)
                ]
            entries = [(end, _encode_revised(later[end], layout)) for end in sorted(later)]
            if len(self._revised_calls) == self._revised_calls.maxlen:
                for _ in range(self._revised_calls[0]):
                    self._revised.popleft()
            self._revised_calls.append(len(entries))
            self._revised.extend(entries)
            self._revised_tuple = tuple(self._revised)

    def view(self, status: dict[str, Any]) -> LiveView:
        """The view for a snapshot (``status``: the ``status`` object)."""
        status_bytes = _ENCODER.encode(status).encode()
        return LiveView(
            self._tuple,
            self.meta,
            status_bytes,
            self.window_s,
            self.host_window_s,
            self._revised_tuple,
            self.history,
        )


def sla_line(rule: SlaRule, latency: LatencyKind = "clat") -> dict[str, object]:
    """How the page draws a rule: on its direction's chart, labelled "SLA p99 write 5 ms".

    An aggregator of another latency kind than clat names it: "SLA p99 lat write 5 ms".
    """
    limit = format_latency_ns(rule.threshold_ns)
    kind = "" if latency == "clat" else f" {latency}"
    label = f"SLA p{pct_key(rule.percentile)}{kind} {rule.direction} {limit}"
    return {
        "rule": rule.name,
        "direction": rule.direction,
        "percentile": pct_key(rule.percentile),
        "threshold_ns": rule.threshold_ns,
        "scope": rule.scope,
        "label": label + (" (each host)" if rule.scope == "host" else ""),
    }


def _encode_revised(rows: Sequence[ClosedQuantum], layout: BinLayout | None) -> tuple[Revised, ...]:
    """One quantum's later publications, each row as its key, revision and JSON object."""
    out: list[Revised] = []
    for r in rows:
        if r.host is None:
            obj = r.to_json()
            if r.hist is not None and layout is not None:
                obj["heat"] = heat_counts(r.hist, layout)
            text = _ENCODER.encode(obj)
        else:
            text = _host_json(r)
        out.append(((r.scope, r.host or "", r.direction), r.revision, text.encode()))
    return tuple(out)


_ORDER = {"firing": 0, "pending": 1}  # loud states, worst first
MAX_SLA_LINES = 20  # per-host states listed per rule


def status_of(
    *,
    now_ms: int,
    hosts_up: int,
    received: int,
    late: int,
    lost: int,
    rules: Sequence[SlaRule],
    alerts: Sequence[dict[str, object]],
    silent: Sequence[str] = (),
) -> dict[str, Any]:
    """The ``status`` object: counters, every rule's state, the newest quantum's silent hosts.

    ``silent_hosts``: the hosts the newest quantum closed without (``silent``).

    A cluster rule is one line (``host`` null). A per-host rule lists its loud hosts
    (firing, then pending; the highest value first; at most :data:`MAX_SLA_LINES`, with
    ``more`` counting the rest), or, when none is loud, one line with ``host`` null:
    a quiet rule is about every host, so it names none (``resolved`` if a host's alert
    resolved, else ``inactive``).
    """
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
        seen = by_rule.get(rule.name, [])
        loud = sorted(
            (a for a in seen if a.get("state") in _ORDER),
            key=lambda a: (_ORDER[str(a["state"])], -_value(a.get("value_ns"))),
        )
        if loud:
            for a in loud[:MAX_SLA_LINES]:
                line = {**common, "host": a.get("host"), "state": a["state"]}
                sla.append({**line, "value_ns": a.get("value_ns"), **_extra(a)})
            if len(loud) > MAX_SLA_LINES:
                sla[-1]["more"] = len(loud) - MAX_SLA_LINES
            continue
        if rule.scope != "host" and seen:
            a = seen[0]
            line = {**common, "host": None, "state": a["state"], "value_ns": a["value_ns"]}
            sla.append({**line, **_extra(a)})
            continue
        resolved = [a for a in seen if a.get("state") == "resolved"]
        state = "resolved" if resolved else "inactive"
        line = {**common, "host": None, "state": state, "value_ns": None}
        if resolved:
            line["ended"] = all(bool(a.get("ended")) for a in resolved)
        sla.append(line)
    return {
        "time_ms": now_ms,
        "hosts_up": hosts_up,
        "records_received": received,
        "late_records": late,
        "lost_records": lost,
        "host_rows_cap": MAX_LIVE_HOSTS,
        "silent_hosts": sorted(silent)[:MAX_SLA_LINES],
        "silent_count": len(silent),
        "sla": sla,
    }


def _extra(alert: dict[str, object]) -> dict[str, object]:
    """What the alert adds when it has it: ``worst_hosts`` and ``ended``.

    ``worst_hosts``: a cluster rule's hosts and their share of the tail
    (``[[host, share], ...]``, from the alerts); ``ended``: a resolved alert whose
    benchmark stopped, not recovered.
    """
    return {k: alert[k] for k in ("worst_hosts", "ended") if k in alert}


def _value(v: object) -> float:
    return float(v) if isinstance(v, int | float) else float("-inf")


@dataclass(slots=True)
class _Quantum:
    """One stored quantum: what the API serves of it, and its revisions once it has any.

    ``cluster`` and ``host`` are the served rows (comma-joined JSON objects). Until a
    revision comes they are the first publication as the feed sent it; from then on
    ``base`` keeps that first publication and ``revised`` the latest publication of each
    key after it, and the served rows are made from both (:meth:`LiveStore._rebuild`).
    """

    cluster: bytes
    host: bytes
    base: tuple[bytes, bytes] | None = None
    revised: dict[RowKey, tuple[int, bytes]] = field(default_factory=dict)
    revised_no: int = 0  # the store's revision count when this quantum last changed
    hosts_dropped: bool = False  # past the host window: host rows are no longer served


class LiveStore:
    """The child's side: a ring of encoded quanta, bounded by time and bytes.

    Args:
        max_bytes: the most JSON held (served rows; a revised quantum's first publication
            is kept beside them and not counted).
    """

    def __init__(self, max_bytes: int = MAX_STORE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._ends: list[int] = []
        self._rows: dict[int, _Quantum] = {}
        self._bytes = 0
        self._host_from = 0  # index of the oldest quantum that still has host rows
        self._view: LiveView | None = None
        self.revised = 0  # revisions taken, ever (the API's ``revised``)
        # The window read back from the quanta file, once, on a thread of its own.
        self._history: list[tuple[int, bytes, bytes]] | None = None
        self._history_done = threading.Event()
        self._history_thread: threading.Thread | None = None
        self.restored = 0  # quanta taken from the quanta file

    def _start_history(self, view: LiveView) -> None:
        """Read the page's window from the quanta file, once, off this process's loop."""
        if self._history_thread is not None or not view.history:
            return

        def load() -> None:
            try:
                self._history = read_history(
                    view.history, view.window_s, view.host_window_s, self.max_bytes
                )
            except Exception:  # a bug in reading: the page starts empty, as before
                log.exception("cannot read the live page's window from the quanta file")
                self._history = []
            self._history_done.set()

        self._history_thread = threading.Thread(target=load, name="fiomon.history", daemon=True)
        self._history_thread.start()

    def wait_history(self, timeout_s: float) -> bool:
        """Wait until the quanta file was read (True), and take what it held."""
        ok = self._history_done.wait(timeout_s)
        self._take_history()
        return ok

    def _take_history(self) -> None:
        """Put the quanta read from the file where the store has none (views are newer)."""
        if self._history is None or not self._history_done.is_set():
            return
        got, self._history = self._history, None
        taken = False
        for end, cluster, host in got:
            if end in self._rows:
                continue
            if not taken:
                self.revised += 1  # a page that polls with ``revised`` asks for them
                taken = True
            q = _Quantum(cluster, host, revised_no=self.revised)
            self._insert(end, q)
            self.restored += 1
        if taken:
            self._trim()

    def merge(self, view: LiveView) -> None:
        """Take a view's newest quanta and revisions (replacing what was seen before), trim."""
        self._view = view
        self._start_history(view)
        for end, cluster, host in view.recent:
            q = self._rows.get(end)
            if q is None:
                self._insert(end, _Quantum(cluster, host))
            elif q.base is None:
                self._bytes -= len(q.cluster) + len(q.host)
                q.cluster, q.host = cluster, b"" if q.hosts_dropped else host
                self._bytes += len(q.cluster) + len(q.host)
            elif q.base != (cluster, host):
                # The same quantum again (views repeat the newest): its revisions stay.
                q.base = (cluster, host)
                self._rebuild(q)
        for end, rows in view.revised:
            self._revise(end, rows, view.window_s)
        self._take_history()
        self._trim()

    def _trim(self) -> None:
        """Drop host rows past the host window, then quanta past the window or the bytes."""
        view = self._view
        if not self._ends or view is None:
            return
        newest = self._ends[-1]
        host_cut = newest - view.host_window_s * 1000
        while self._host_from < len(self._ends) and self._ends[self._host_from] <= host_cut:
            q = self._rows[self._ends[self._host_from]]
            self._bytes -= len(q.host)
            q.host = b""
            q.hosts_dropped = True
            self._host_from += 1
        cut = newest - view.window_s * 1000
        while self._ends and (self._ends[0] <= cut or self._bytes > self.max_bytes):
            q = self._rows.pop(self._ends.pop(0))
            self._bytes -= len(q.cluster) + len(q.host)
            self._host_from = max(0, self._host_from - 1)

    def _insert(self, end: int, q: _Quantum) -> None:
        i = bisect.bisect_left(self._ends, end)
        self._ends.insert(i, end)
        self._host_from = min(self._host_from, i)
        self._rows[end] = q
        self._bytes += len(q.cluster) + len(q.host)

    def _revise(self, end: int, rows: tuple[Revised, ...], window_s: int) -> None:
        """Put later publications of ``end``'s rows in place (the highest revision wins)."""
        q = self._rows.get(end)
        if q is None:
            if self._ends and end <= self._ends[-1] - window_s * 1000:
                return  # older than the window: not served anyway
            q = _Quantum(b"", b"")
            self._insert(end, q)
        changed = False
        for key, revision, text in rows:
            old = q.revised.get(key)
            # Views repeat their revisions: the same row again changes nothing.
            if old is None or revision > old[0] or (revision == old[0] and text != old[1]):
                q.revised[key] = (revision, text)
                changed = True
        if changed:
            if q.base is None:
                q.base = (q.cluster, q.host)
            self.revised += 1
            q.revised_no = self.revised
            self._rebuild(q)

    def _rebuild(self, q: _Quantum) -> None:
        """The served rows of a revised quantum: each key's latest publication."""
        assert q.base is not None  # noqa: S101 -- only revised quanta are rebuilt
        used: set[RowKey] = set()
        parts: list[list[bytes]] = []
        for blob in q.base:
            rows = []
            for key, text in _split(blob):
                if q.hosts_dropped and key[0] == "host":
                    continue
                later = q.revised.get(key)
                rows.append(text if later is None else later[1])
                used.add(key)
            parts.append(rows)
        hosts = {k[1] for k in used if k[0] == "host"}
        for key, (_, text) in q.revised.items():
            if key in used:
                continue
            if key[0] == "cluster":
                parts[0].append(text)
            elif not q.hosts_dropped and (key[1] in hosts or len(hosts) < MAX_LIVE_HOSTS):
                hosts.add(key[1])
                parts[1].append(text)
        self._bytes -= len(q.cluster) + len(q.host)
        q.cluster, q.host = b",".join(parts[0]), b",".join(parts[1])
        self._bytes += len(q.cluster) + len(q.host)

    @property
    def quanta(self) -> int:
        """Quanta held."""
        return len(self._ends)

    @property
    def nbytes(self) -> int:
        """Bytes of JSON held."""
        return self._bytes

    def body(self, since_ms: int, revised: int | None = None) -> bytes:
        """The ``/api/v1/quanta`` answer for quanta ending after ``since_ms``.

        With ``revised`` (the ``revised`` of an earlier answer), also the quanta ending at
        or before ``since_ms`` that were revised since that answer.
        """
        self._take_history()
        view = self._view
        if view is None:
            meta, status = b"{}", b"{}"
        else:
            meta, status = view.meta, view.status
        i = bisect.bisect_right(self._ends, since_ms)
        ends = self._ends[i:]
        if revised is not None and revised < self.revised:
            ends = [e for e in self._ends[:i] if self._rows[e].revised_no > revised] + ends
        parts = (p for e in ends for p in (self._rows[e].cluster, self._rows[e].host))
        rows = b",".join(p for p in parts if p)
        return (
            b'{"meta":'
            + meta
            + b',"status":'
            + status
            + b',"quanta":['
            + rows
            + b'],"revised":'
            + str(self.revised).encode()
            + b"}"
        )


# The writer's lines open alike (ClosedQuantum.to_json): their end and scope are read
# without parsing the line (host rows past the host window are most of a big file).
_HEAD = re.compile(rb'\{"start_ms":-?\d+,"end_ms":(-?\d+),"scope":"(cluster|host)"')


def read_history(
    paths: Sequence[str],
    window_s: int,
    host_window_s: int,
    max_bytes: int = MAX_STORE_BYTES,
) -> list[tuple[int, bytes, bytes]]:
    """The page's window of a quanta file: ``(end_ms, cluster rows, host rows)``, oldest first.

    ``paths`` are the file and its rotated ones, newest first
    (:meth:`fiomon.server.quantafile.QuantaFile.files`). Read backwards from the newest
    quantum first published, down to ``window_s`` before it (host rows: ``host_window_s``,
    at most :data:`MAX_LIVE_HOSTS` hosts per quantum by name) or ``max_bytes`` of rows,
    and stopped at the first publication of a quantum older than that: revisions come
    after their quantum's first publication, so nothing older is needed. Each key's
    highest revision wins (equal revisions: the later line), as
    :mod:`fiomon.offline.quantafiles` resolves them. The rows are the file's lines as they
    are (cluster rows carry no ``heat``: the file holds no histograms).
    """
    newest: int | None = None
    best: dict[tuple[int, RowKey], tuple[int, bytes]] = {}
    total = 0
    for path in paths:
        for line in raw_lines_backwards(Path(path)):
            m = _HEAD.match(line)
            try:
                obj: dict[str, Any] | None = None
                if m is None:  # not the writer's layout (a hand edit): parse it whole
                    obj = json.loads(line)
                    assert isinstance(obj, dict)  # noqa: S101 -- caught below
                    end, scope = int(obj["end_ms"]), str(obj["scope"])
                    first = obj.get("revised_at") is None
                else:
                    end, scope = int(m[1]), m[2].decode()
                    first = b'"revised_at":' not in line
                if newest is None and first:
                    newest = end
                if newest is not None and end <= newest - window_s * 1000:
                    if first:  # older first publications only: nothing more to read
                        return _history_rows(best, newest, window_s, host_window_s)
                    continue
                if scope == "host" and newest is not None and end <= newest - host_window_s * 1000:
                    continue
                if obj is None:
                    obj = json.loads(line)
                    assert isinstance(obj, dict)  # noqa: S101 -- caught below
                key = (end, (scope, str(obj.get("host") or ""), str(obj["direction"])))
                revision = int(obj.get("revision", 0))
            except (ValueError, KeyError, TypeError, AssertionError, RecursionError):
                continue  # not a row: says nothing about the window
            old = best.get(key)
            # Backwards: a later line of an equal revision was seen first and stays.
            if old is None or revision > old[0]:
                total += len(line) - (0 if old is None else len(old[1]))
                best[key] = (revision, line)
                if total > max_bytes:
                    return _history_rows(best, newest, window_s, host_window_s)
    return _history_rows(best, newest, window_s, host_window_s)


def _history_rows(
    best: dict[tuple[int, RowKey], tuple[int, bytes]],
    newest: int | None,
    window_s: int,
    host_window_s: int,
) -> list[tuple[int, bytes, bytes]]:
    if newest is None:
        return []
    cut, host_cut = newest - window_s * 1000, newest - host_window_s * 1000
    by_end: dict[int, tuple[list[bytes], dict[str, list[bytes]]]] = {}
    for (end, (scope, host, _)), (_, line) in sorted(best.items()):
        if end <= cut or (scope == "host" and end <= host_cut):
            continue
        cluster, hosts = by_end.setdefault(end, ([], {}))
        if scope == "cluster":
            cluster.append(line)
        else:
            hosts.setdefault(host, []).append(line)
    out = []
    for end in sorted(by_end):
        cluster, hosts = by_end[end]
        kept = [line for h in sorted(hosts)[:MAX_LIVE_HOSTS] for line in hosts[h]]
        out.append((end, b",".join(cluster), b",".join(kept)))
    return out


def _split(blob: bytes) -> list[tuple[RowKey, bytes]]:
    """Comma-joined JSON objects as ``(key, object text)``, the text as it was."""
    text = blob.decode()  # ASCII: the encoder escapes every other character
    out: list[tuple[RowKey, bytes]] = []
    pos = 0
    while pos < len(text):
        obj, stop = _DECODER.raw_decode(text, pos)
        key = (str(obj["scope"]), str(obj.get("host") or ""), str(obj["direction"]))
        out.append((key, blob[pos:stop]))
        pos = stop + 1  # past the comma
    return out
