"""YAML configuration into frozen dataclasses, with every problem reported at once.

``load_agent_config(path)`` reads the agent's file (config/agent.example.yaml).
Each bad key, wrong type, bad unit or unknown key becomes one message naming its path
(``broker.port: expected an integer, got 'x'``); :class:`~fiomon.errors.ConfigError`
carries them all. Durations carry units (``1s``, ``250ms``), sizes too (``64MiB``).
Nothing is read from the environment: the command line gathers its overrides (flag >
environment > file) into an :class:`Overrides`, and :func:`load` applies them over the
file at start and again at every reload, so a reload never takes them for a change.

Every default is written once, on its dataclass. Each section of a file is one table,
YAML key -> (dataclass field, converter): the table is the set of keys the section knows,
and the loader passes only the keys a file sets, so an absent key takes the dataclass's
default.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import urllib.parse
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fiomon.align import Align, parse_align
from fiomon.cells import assign_cell
from fiomon.errors import ConfigError
from fiomon.model import DEFAULT_PERCENTILES, DIRECTIONS, LATENCY_KINDS, LatencyKind
from fiomon.topics import RESERVED_NAMES, Topics
from fiomon.units import parse_duration_ms, parse_latency_ns, parse_size

DEFAULT_LISTEN = "127.0.0.1:10027"  # above 9100-9999: Prometheus' port wiki is full there
LOG_LEVELS = ("debug", "info", "warning", "error")
MQTT_PORT = 1883  # the broker's port by convention, plain TCP
MQTTS_PORT = 8883  # and with TLS: the default port once ``broker.tls`` is set


def _default_host() -> str:
    """The machine's short host name, made safe as a topic level."""
    name = socket.gethostname().split(".", 1)[0] or "localhost"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:128]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS to the broker.

    Args:
        ca_file: CA bundle that signed the broker's certificate (None: system CAs).
        cert_file: client certificate, for brokers that require one.
        key_file: its private key.
        insecure: skip hostname verification (testing only).
    """

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure: bool = False


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Where the MQTT broker is and how to log in.

    Args:
        host: broker host name or address.
        port: TCP port (1883 plain, 8883 TLS by convention).
        tls: TLS settings, or None for plain TCP.
        username: MQTT user name (the agent's ACL identity), or None.
        password_file: file whose first line is the password (kept out of the YAML).
        client_id: MQTT client id; None derives a stable one from the host name.
        keepalive_s: MQTT keepalive; the broker publishes the Will about 1.5x this after
            a silent network loss.
    """

    host: str = "127.0.0.1"
    port: int = MQTT_PORT
    tls: TlsConfig | None = None
    username: str | None = None
    password_file: Path | None = None
    client_id: str | None = None
    keepalive_s: int = 30


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The agent's configuration (``fiomon agent --config FILE``).

    Args:
        broker: the MQTT broker.
        topic_prefix: first topic level; the agent publishes under
            ``<prefix>/v1/<host>/...``.
        host: this client host's name in every record (default: the machine's).
        watch: glob patterns of fio json+ status files and hist logs to follow.
        state_dir: read positions and the spool live here.
        flush_interval_ms: how often new data is read and published.
        poll_interval_ms: how often the globs are re-expanded for new files.
        spool_bytes: on-disk spool for when the broker is unreachable; when full, the
            oldest messages are dropped and counted.
        max_message_bytes: cap on one MQTT message (many records each).
        heartbeat_interval_ms: how often the counters are published on the status topic.
        log_hist_msec: ``log_hist_msec`` of the hist logs (None: inferred from spacing).
        max_open_files: files held open at most; quiet ones are closed (and reopened when
            they change) to stay under it, and under the process's descriptor limit.
        max_line_bytes: a longer hist-log line is skipped and counted.
        max_document_bytes: a larger json+ document is skipped and counted.
        rename_grace_ms: a file renamed to a name ``watch`` does not match is still
            followed until it has been quiet this long.
        cell: the cell this host publishes to, when the file lists ``cells`` (named by
            ``cell:`` or picked by :func:`fiomon.cells.assign_cell`); ``broker`` and
            ``topic_prefix`` are then that cell's. None: no cells listed.
        run: the run label of every record (rows and metrics name the runs they hold);
            ``{dir}`` in it is the followed file's folder name, ``{dir:N}`` the folder N
            levels above that (harness trees: ``{dir:2}``) (``run: "{dir}"`` with
            ``watch: [results/**/*.json]`` labels each run folder's records). None: no
            label (messages exactly as before run labels existed).
        latency: which latency fio measured that the agent publishes: ``clat``
            (completion, the default), ``lat`` (total: submission + completion) or
            ``slat`` (submission), from the json+ ``clat_ns`` / ``lat_ns`` / ``slat_ns``
            bins (``lat`` and ``slat`` need fio's ``lat_percentiles=1`` /
            ``slat_percentiles=1``). Hist logs hold clat only: with another kind they are
            refused (logged, counted in ``files_refused``). Every message says its kind
            (wire flag bits 2-3); the aggregator merges only its own ``latency``.
        log_level: ``debug``, ``info``, ``warning`` or ``error``; None: the command line's
            (``--log-level``, ``FIOMON_LOG_LEVEL``, which win over it). SIGHUP reloads it.
        metrics_listen: ``host:port`` of the agent's own ``/metrics`` (``process_*``,
            ``fiomon_build_info``, ``/-/healthy``, ``/-/ready``); None: none (the default).
    """

    watch: tuple[str, ...]
    state_dir: Path
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    topic_prefix: str = "fiomon"
    host: str = field(default_factory=_default_host)
    flush_interval_ms: int = 1000
    poll_interval_ms: int = 500
    spool_bytes: int = 64 * 1024**2
    max_message_bytes: int = 256 * 1024
    heartbeat_interval_ms: int = 10_000
    log_hist_msec: int | None = None
    max_open_files: int = 256
    max_line_bytes: int = 1024**2
    max_document_bytes: int = 32 * 1024**2
    rename_grace_ms: int = 60_000
    cell: str | None = None
    run: str | None = None
    latency: LatencyKind = "clat"
    log_level: str | None = None
    metrics_listen: str | None = None


@dataclass(frozen=True, slots=True)
class CellConfig:
    """One cell of a multi-cell deployment: its broker and topic prefix.

    Args:
        name: the cell's name (a label value: letters, digits, ``_ . -``).
        broker: its broker (the agent's top-level ``broker`` keys, overridden key by key
            by the cell's own).
        topic_prefix: its topic prefix (default: the agent's ``topic_prefix``).
    """

    name: str
    broker: BrokerConfig
    topic_prefix: str


# What an SLA rule does with a row that says ``complete: false``: hold its state, or
# evaluate the row like any other.
SLA_INCOMPLETE = ("hold", "evaluate")


@dataclass(frozen=True, slots=True)
class SlaRule:
    """One SLA rule: "p99 read above 5 ms for 3 quanta".

    Args:
        name: rule name (a label value: letters, digits, ``_ . -``).
        direction: ``read``, ``write``, ``trim``, ``mixed`` (fio's ``unified_rw_reporting``)
            or ``all``.
        percentile: which percentile, in (0, 100]; must be one the aggregator computes.
        threshold_ns: the limit, in ns (configured with units: ``5ms``).
        scope: ``cluster`` (one state) or ``host`` (one state per host).
        for_quanta: consecutive breaching quanta before it fires.
        min_samples: quanta with fewer I/Os are no evidence either way.
        clear_ns: it clears below this (hysteresis), default 90 % of the threshold, or
            the threshold itself with ``confidence`` (the interval is the hysteresis).
        clear_for: consecutive clear quanta before it resolves (default ``for_quanta``).
        confidence: weigh the evidence at this level (the aggregator's
            ``confidence_level``): a quantum breaches only when the percentile's lower
            confidence bound is above the threshold and is clear only when its upper
            bound is below ``clear_ns``. None: the percentile's value decides.
        incomplete: what a row with ``complete: false`` (a host or cell missing from
            the quantum) does to the rule: ``hold`` (default) leaves its state and its
            ``for``/``clear_for`` counts as they are (no evidence either way);
            ``evaluate`` takes the row like any other.
    """

    name: str
    direction: str
    percentile: float
    threshold_ns: float
    scope: str = "cluster"
    for_quanta: int = 3
    min_samples: int = 100
    clear_ns: float = 0.0
    clear_for: int = 0
    confidence: float | None = None
    incomplete: str = "hold"

    def __post_init__(self) -> None:
        if self.incomplete not in SLA_INCOMPLETE:
            msg = f"incomplete must be one of {', '.join(SLA_INCOMPLETE)}, got {self.incomplete!r}"
            raise ValueError(msg)
        if self.confidence is not None and not 0.0 < self.confidence < 1.0:
            msg = f"confidence must be in (0, 1), got {self.confidence}"
            raise ValueError(msg)
        if self.clear_ns <= 0:
            clear = 1.0 if self.confidence is not None else 0.9
            object.__setattr__(self, "clear_ns", clear * self.threshold_ns)
        if self.clear_for <= 0:
            object.__setattr__(self, "clear_for", self.for_quanta)


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Alertmanager v2 endpoint (``POST <url>/api/v2/alerts``).

    Args:
        url: Alertmanager base URL, ``http://`` or ``https://`` with a host, e.g.
            ``http://127.0.0.1:9093``.
        timeout_ms: per request, 100 ms to 30 s (a hanging receiver holds the sender no
            longer than this; it never holds closing).
        resend_ms: firing alerts are re-sent this often (Alertmanager expects it); longer
            than the timeout.
        labels: added to every alert's labels, as Prometheus' ``external_labels`` are
            (e.g. ``{cluster: bench}``), so Alertmanager groups and routes both paths'
            alerts alike (``instance`` too, if the page should name the aggregator).
        runbook: where the runbook is (``docs/runbook.md``; alerts link ``<runbook>#<alert>``);
            default: where the wheel installs it under ``/opt/fiomon`` (deploy/README.md).
    """

    url: str
    timeout_ms: int = 5000
    resend_ms: int = 60_000
    labels: tuple[tuple[str, str], ...] = ()
    runbook: str = "file:///opt/fiomon/share/fiomon/docs/runbook.md"


@dataclass(frozen=True, slots=True)
class PartialsConfig:
    """A cell's link to the exact root (the aggregator's ``partials`` section).

    Args:
        cell: this cell's name, unique among the root's cells (a topic level); default:
            the aggregator's top-level ``cell``.
        broker: the root's broker.
        topic_prefix: the root's topic prefix (partials go to
            ``<prefix>/v1/_partials/<cell>``).
        client_id: MQTT client id of the cell's connection to the root's broker.
        max_message_bytes: a close bigger than this is split into several messages.
        host_rows: also send host-scope rows (False: cluster rows only, for a root
            without host scope: a small fraction of the bytes and of the root's work).
    """

    cell: str
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    topic_prefix: str = "fiomon"
    client_id: str = ""
    max_message_bytes: int = 1024**2
    host_rows: bool = True

    def __post_init__(self) -> None:
        if not self.client_id:
            object.__setattr__(self, "client_id", f"fiomon-cell-{self.cell}")


@dataclass(frozen=True, slots=True)
class RootConfig:
    """The exact root's own settings (the aggregator's ``root`` section).

    Args:
        cells: the membership: the cells whose partials the root merges (their
            ``partials.cell`` names; required by ``fiomon root``). Any other cell is
            refused, counted and logged; each listed cell is waited for from the start, and
            a closed quantum names the listed cells missing from it (``cells_missing``).
        cell_timeout_ms: a cell with no message for this long is gone: reported, and not
            waited for (its quanta close on the cells' marks without it); at least the
            root's ``lateness``.
        max_skew_ms: a cell's closed mark further ahead of the root's clock is ignored
            (counted as ``future-mark``): a clock ahead, or a forged message.
        cells_lateness_ms: the cells' ``lateness``; the root's must be above it.
    """

    cells: tuple[str, ...] = ()
    cell_timeout_ms: int = 30_000
    max_skew_ms: int = 5000
    cells_lateness_ms: int = 5000


@dataclass(frozen=True, slots=True)
class ExportConfig:
    """The exported bucket histogram (``fiomon_cluster_io_latency_seconds``).

    Args:
        buckets_per_octave: ``le`` edges per doubling of latency, from 1 us to fio's cap
            (plus every SLA threshold, exactly). ``histogram_quantile`` interpolates
            linearly inside a bucket, so its worst relative error is one bucket's width,
            about ``2 ** (1 / buckets_per_octave) - 1``: 19.7 % at 4, 4.6 % at 16 (with
            the rounding of the labels). fio's range is 24 octaves above 1 us: each bucket
            per octave adds 24 series per direction (97 edges at 4, 385 at 16, plus one per
            SLA threshold).
    """

    buckets_per_octave: int = 4


@dataclass(frozen=True, slots=True)
class AggregatorConfig:
    """The aggregator's configuration (``fiomon aggregator --config FILE``).

    Args:
        broker: the MQTT broker.
        topic_prefix: subscribes to ``<prefix>/v1/+/records`` and ``.../status``.
        client_id: fixed MQTT client id of the persistent session.
        session_expiry_ms: how long the broker keeps queuing for us while we are away.
        max_inflight: messages waiting unprocessed in the aggregator at most: asked of the
            broker (MQTT 5 Receive Maximum; acknowledged after journaling) and enforced by
            not reading the socket beyond it (Mosquitto 2.0.11 sends a resumed session's
            whole backlog once anything was acknowledged). Bounds the intake's memory when a
            backlog arrives at once (after a restart) to about ``max_inflight`` x the
            message size; the rest stays queued in the broker.
        quantum_ms: quantum length.
        lateness_ms: a quantum closes at the latest this long after its end.
        revise_within_ms: the revision horizon: a record reaching a closed quantum that
            ended at most this long before the newest close is merged into a new revision
            of its rows; older ones are late (counted, not merged). 0: no revisions (every
            record reaching a closed quantum is late). Closed quanta's histograms and the
            journal are kept this long.
        revise_memory_bytes: the kept closed quanta's memory at most; past it the oldest
            are forgotten before the horizon (logged and counted).
        align: ``epoch``, ``auto`` or a fixed offset in ms.
        percentiles: percentiles computed and exported.
        confidence_level: level of each percentile's distribution-free confidence
            interval (``percentiles_ci_ns`` in the quanta file; SLA rules with
            ``confidence``); None (``false`` in the file): no intervals.
        per_host: also keep host scope (metrics and quanta file rows).
        listen: ``host:port`` of ``/metrics``.
        tls_cert: certificate for HTTPS on ``listen`` (with ``tls_key``).
        tls_key: its key.
        quanta_file: closed quanta as JSON lines, or None.
        quanta_file_max_bytes: rotate past this size.
        quanta_file_keep: rotated files kept.
        max_hosts: hosts with their own scope and series; more are counted and merged
            into cluster scope only.
        max_streams: streams tracked for dedup; more are refused and counted.
        max_open_quanta: quanta held open at once; more close the oldest early.
        max_message_bytes: larger payloads are refused.
        state_dir: where the journal of unclosed records lives (None: no journal).
        sla: SLA rules.
        alert_topic: retained MQTT topic with the alert states (default
            ``<prefix>/v1/_aggregator/alerts``).
        webhook: Alertmanager to notify, or None.
        fit_tail: fit each closed quantum's cluster histogram (normal head + power-law
            tail) and export the tail share and exponent (costs ~0.1 s per direction).
        host_timeout_ms: a host counts in ``fiomon_hosts_up`` while it sent records or a
            fresh online status within this long.
        log_level: ``debug``, ``info``, ``warning`` or ``error``; None: the command line's
            ``--log-level`` (default info). Reloaded on SIGHUP, with the SLA rules and the
            webhook.
        cell: the name of the cell this aggregator serves (``fiomon_cell_info``), or None.
        export: the exported bucket histogram's resolution.
        partials: this aggregator is a cell and sends its closed quanta to a root (needs
            ``state_dir``: the outbox lives there), or None.
        root: settings of ``fiomon root`` (ignored by ``fiomon aggregator``), or None.
        latency: the latency kind it merges (``clat``, ``lat`` or ``slat``; the label
            ``latency`` of every percentile and SLA series): records of another kind are
            refused, counted (``fiomon_records_total{result="wrong_latency"}``) and logged
            once per agent.
    """

    broker: BrokerConfig = field(default_factory=BrokerConfig)
    topic_prefix: str = "fiomon"
    client_id: str = "fiomon-aggregator"
    session_expiry_ms: int = 3_600_000
    max_inflight: int = 1000
    quantum_ms: int = 1000
    lateness_ms: int = 5000
    revise_within_ms: int = 600_000
    revise_memory_bytes: int = 1 << 30
    align: Align = "auto"
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    confidence_level: float | None = 0.95
    per_host: bool = True
    listen: str = DEFAULT_LISTEN
    tls_cert: Path | None = None
    tls_key: Path | None = None
    quanta_file: Path | None = None
    quanta_file_max_bytes: int = 64 * 1024**2
    quanta_file_keep: int = 5
    max_hosts: int = 1000
    max_streams: int = 100_000
    max_open_quanta: int = 600
    max_message_bytes: int = 1024**2
    state_dir: Path | None = None
    sla: tuple[SlaRule, ...] = ()
    alert_topic: str = ""
    webhook: WebhookConfig | None = None
    fit_tail: bool = False
    host_timeout_ms: int = 30_000
    log_level: str | None = None
    cell: str | None = None
    export: ExportConfig = field(default_factory=ExportConfig)
    partials: PartialsConfig | None = None
    root: RootConfig | None = None
    latency: LatencyKind = "clat"

    def __post_init__(self) -> None:
        if not self.alert_topic:  # the one place its default is written: it follows the prefix
            object.__setattr__(self, "alert_topic", Topics(self.topic_prefix).alerts)

    @property
    def listen_addr(self) -> tuple[str, int]:
        """``listen`` split into address and port."""
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 -- only if asked


# An aggregator's settings the root has no use for: field -> key in the file. The root
# neither notifies Alertmanager nor publishes an alert state (alert from Prometheus on
# fiomon_sla_breach), is no cell, fits no tails and has cells, not hosts, to time out.
ROOT_IGNORED = {
    "webhook": "webhook",
    "alert_topic": "alert_topic",
    "partials": "partials",
    "fit_tail": "fit_tail",
    "host_timeout_ms": "host_timeout",
}


def root_ignored_keys(cfg: AggregatorConfig) -> list[str]:
    """The keys of :data:`ROOT_IGNORED` that ``cfg`` sets to other than their default."""
    base = AggregatorConfig(topic_prefix=cfg.topic_prefix)  # alert_topic follows the prefix
    return [key for f, key in ROOT_IGNORED.items() if getattr(cfg, f) != getattr(base, f)]


# -- reading: sections, tables and converters ---------------------------------------------

Convert = Callable[[object, str], Any]
"""Converts one YAML value found at a key path (the second argument), or raises
:class:`ConfigError` with one message that starts with that path."""

Table = dict[str, tuple[str, Convert]]
"""One section's keys: YAML key -> (dataclass field, converter)."""


class _Reader:
    """Reads typed values out of nested mappings, collecting problems with their paths."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def section(self, data: object, path: str, known: Collection[str]) -> dict[str, Any]:
        """``data`` as a mapping (empty if absent); each key not in ``known`` is a problem."""
        if data is None:
            return {}
        if not isinstance(data, dict):
            self.problems.append(f"{path or 'top level'}: expected a mapping, got {data!r}")
            return {}
        for key in data:
            if key not in known:
                where = f"{path}.{key}" if path else str(key)
                hint = ", ".join(sorted(known))
                self.problems.append(f"{where}: unknown key (known here: {hint})")
        return data

    def fields(self, data: dict[str, Any], path: str, table: Table) -> dict[str, Any]:
        """The converted values of the keys of ``table`` that ``data`` sets, by field name.

        An absent or null key is left out, so the dataclass default applies; a bad value
        is a problem and left out too.
        """
        out: dict[str, Any] = {}
        for key, (name, convert) in table.items():
            if data.get(key) is None:
                continue
            where = f"{path}.{key}" if path else key
            try:
                out[name] = convert(data[key], where)
            except ConfigError as exc:
                self.problems.extend(exc.problems)
        return out

    def require(self, data: dict[str, Any], path: str, key: str) -> None:
        if data.get(key) is None:
            where = f"{path}.{key}" if path else key
            self.problems.append(f"{where}: required")


def _str(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        msg = f"{where}: expected a non-empty string, got {value!r}"
        raise ConfigError([msg])
    return value


def _int_in(lo: int, hi: int) -> Callable[[object, str], int]:
    def conv(value: object, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            msg = f"{where}: expected an integer in [{lo}, {hi}], got {value!r}"
            raise ConfigError([msg])
        return value

    return conv


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        msg = f"{where}: expected true or false, got {value!r}"
        raise ConfigError([msg])
    return value


def _path(value: object, where: str) -> Path:
    return Path(_str(value, where)).expanduser()


def _duration_ms(minimum: int) -> Callable[[object, str], int]:
    def conv(value: object, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            msg = f"{where}: expected a duration such as 1s or 250ms, got {value!r}"
            raise ConfigError([msg])
        ms = parse_duration_ms(str(value), what=where)
        if ms < minimum:
            msg = f"{where}: must be at least {minimum} ms, got {value!r}"
            raise ConfigError([msg])
        return ms

    return conv


def _whole_seconds(minimum_ms: int) -> Convert:
    """A duration (``30s``) in whole seconds, for fields kept in seconds."""
    conv = _duration_ms(minimum_ms)

    def seconds(value: object, where: str) -> int:
        return conv(value, where) // 1000

    return seconds


def _duration_between(lo: int, hi: int) -> Callable[[object, str], int]:
    conv = _duration_ms(lo)

    def between(value: object, where: str) -> int:
        ms = conv(value, where)
        if ms > hi:
            msg = f"{where}: must be at most {hi} ms, got {value!r}"
            raise ConfigError([msg])
        return ms

    return between


def _size(minimum: int) -> Callable[[object, str], int]:
    def conv(value: object, where: str) -> int:
        n = parse_size(value, what=where)
        if n < minimum:
            msg = f"{where}: must be at least {minimum} bytes, got {value!r}"
            raise ConfigError([msg])
        return n

    return conv


def _latency_ns(value: object, where: str) -> float:
    return parse_latency_ns(value, what=where)


def _globs(value: object, where: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        msg = f"{where}: expected a list of glob patterns, got {value!r}"
        raise ConfigError([msg])
    bad = [i for i, g in enumerate(items) if not isinstance(g, str) or not g.strip()]
    if bad:
        msg = f"{where}[{bad[0]}]: expected a glob pattern string, got {items[bad[0]]!r}"
        raise ConfigError([msg])
    return tuple(str(Path(g).expanduser()) for g in items)


RUN_DIR = re.compile(r"\{dir(?::(1[0-6]|[0-9]))?\}")
"""A run label's placeholders: ``{dir}`` (= ``{dir:0}``) and ``{dir:N}``, N in 0..16."""


def _run_label(value: object, where: str) -> str:
    text = _str(value, where)
    rest = RUN_DIR.sub("", text)
    if not text.strip() or len(text.encode("utf-8")) > 512 or "{" in rest or "}" in rest:
        msg = (
            f"{where}: expected a run label of 1..512 bytes (the only placeholders are "
            f"{{dir}}, the followed file's folder name, and {{dir:N}}, the folder N levels "
            f"above it), got {value!r}"
        )
        raise ConfigError([msg])
    if has_control(text):  # a newline would split the table's "# run:" line and CSV rows
        msg = f"{where}: a run label has no control characters (newline, tab, ...), got {value!r}"
        raise ConfigError([msg])
    return text


def has_control(text: str) -> bool:
    """Whether ``text`` holds a C0 control character or DEL (newline, tab, escape, ...)."""
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


_TOPIC_RE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
_HOST_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def _matching(pattern: re.Pattern[str], rule: str) -> Callable[[object, str], str]:
    def conv(value: object, where: str) -> str:
        text = _str(value, where)
        if not pattern.match(text):
            msg = f"{where}: {text!r} must be {rule}"
            raise ConfigError([msg])
        return text

    return conv


_topic_prefix = _matching(_TOPIC_RE, "topic levels of letters, digits, '_', '.', '-'")
_host_level = _matching(_HOST_RE, "1-128 letters, digits, '_', '.', '-' (a topic level)")


def _host(value: object, where: str) -> str:
    """A host name: a topic level that is not one of fiomon's own namespaces."""
    text = _host_level(value, where)
    if text in RESERVED_NAMES:
        msg = f"{where}: {text!r} is reserved for fiomon's own topics; choose another name"
        raise ConfigError([msg])
    return text


_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_rule_name = _matching(_NAME_RE, "1-64 letters, digits, '_', '.', '-'")


def _percentile_list(value: object, where: str) -> tuple[float, ...]:
    items = value if isinstance(value, list) else None
    if not items or not all(
        isinstance(q, (int, float)) and not isinstance(q, bool) and 0 < q <= 100 for q in items
    ):
        msg = f"{where}: expected a list of percentiles in (0, 100], got {value!r}"
        raise ConfigError([msg])
    return tuple(sorted({float(q) for q in items}))


def _percentile_one(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 100:
        msg = f"{where}: expected a percentile in (0, 100], got {value!r}"
        raise ConfigError([msg])
    return float(value)


def _level(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        msg = f"{where}: expected a confidence level in (0, 1) such as 0.95, got {value!r}"
        raise ConfigError([msg])
    return float(value)


def _level_or_off(value: object, where: str) -> float | None:
    return None if value is False else _level(value, where)


def _align(value: object, where: str) -> Align:
    try:
        return parse_align(str(value))
    except ConfigError as exc:
        raise ConfigError([f"{where}: {p}" for p in exc.problems]) from None


def _listen(value: object, where: str) -> str:
    text = _str(value, where)
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        msg = f"{where}: expected host:port (e.g. {DEFAULT_LISTEN}), got {value!r}"
        raise ConfigError([msg])
    del host
    return text


def _choice(*options: str) -> Callable[[object, str], str]:
    def conv(value: object, where: str) -> str:
        if value not in options:
            msg = f"{where}: expected one of {', '.join(options)}, got {value!r}"
            raise ConfigError([msg])
        return str(value)

    return conv


def _http_url(value: object, where: str) -> str:
    text = _str(value, where).strip()
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        msg = f"{where}: expected an http:// or https:// URL with a host, got {value!r}"
        raise ConfigError([msg])
    try:
        parts.port  # noqa: B018 -- raises ValueError for a bad port
    except ValueError:
        msg = f"{where}: bad port in {value!r}"
        raise ConfigError([msg]) from None
    return text


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def _label_map(value: object, where: str) -> tuple[tuple[str, str], ...]:
    """Alert labels: a mapping of Prometheus label names to non-empty strings."""
    if not isinstance(value, dict):
        msg = f"{where}: expected a mapping of label names to strings, got {value!r}"
        raise ConfigError([msg])
    problems = []
    for k, v in value.items():
        if not isinstance(k, str) or not _LABEL_NAME.match(k) or k.startswith("__"):
            problems.append(f"{where}: {k!r} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)")
        elif k in ("alertname", "rule", "direction", "percentile", "host", "severity"):
            problems.append(f"{where}.{k}: set by fiomon itself")
        elif not isinstance(v, str) or not v:
            problems.append(f"{where}.{k}: expected a non-empty string, got {v!r}")
    if problems:
        raise ConfigError(problems)
    return tuple(sorted((str(k), str(v)) for k, v in value.items()))


def _url(value: object, where: str) -> str:
    text = _str(value, where).strip()
    if not urllib.parse.urlsplit(text).scheme:
        msg = f"{where}: expected a URL (https://..., file:///...), got {value!r}"
        raise ConfigError([msg])
    return text


# -- the sections ------------------------------------------------------------------------

_TLS_KEYS: Table = {
    "ca_file": ("ca_file", _path),
    "cert_file": ("cert_file", _path),
    "key_file": ("key_file", _path),
    "insecure": ("insecure", _bool),
}

_BROKER_KEYS: Table = {
    "host": ("host", _str),
    "port": ("port", _int_in(1, 65535)),
    "username": ("username", _str),
    "password_file": ("password_file", _path),
    "client_id": ("client_id", _str),
    "keepalive": ("keepalive_s", _whole_seconds(1000)),
}
_BROKER_SECTIONS = ("tls",)

_AGENT_KEYS: Table = {
    "watch": ("watch", _globs),
    "state_dir": ("state_dir", _path),
    "topic_prefix": ("topic_prefix", _topic_prefix),
    "host": ("host", _host),
    "flush_interval": ("flush_interval_ms", _duration_ms(10)),
    "poll_interval": ("poll_interval_ms", _duration_ms(10)),
    "spool_size": ("spool_bytes", _size(1024**2)),
    "max_message_size": ("max_message_bytes", _size(16 * 1024)),
    "heartbeat_interval": ("heartbeat_interval_ms", _duration_ms(100)),
    "log_hist_msec": ("log_hist_msec", _int_in(1, 3_600_000)),
    "max_open_files": ("max_open_files", _int_in(4, 1_000_000)),
    "max_line_size": ("max_line_bytes", _size(64 * 1024)),
    "max_document_size": ("max_document_bytes", _size(1024**2)),
    "rename_grace": ("rename_grace_ms", _duration_ms(0)),
    "cell": ("cell", _rule_name),
    "run": ("run", _run_label),
    "latency": ("latency", _choice(*LATENCY_KINDS)),
    "log_level": ("log_level", _choice(*LOG_LEVELS)),
    "metrics_listen": ("metrics_listen", _listen),
}
_AGENT_SECTIONS = ("broker", "cells")

_CELL_KEYS: Table = {
    "name": ("name", _rule_name),
    "topic_prefix": ("topic_prefix", _topic_prefix),
}
_CELL_SECTIONS = ("broker",)

_SLA_KEYS: Table = {
    "name": ("name", _rule_name),
    # Offered as a user knows them: fio's directions (mixed: unified_rw_reporting), then all.
    "direction": ("direction", _choice(*sorted(DIRECTIONS, key=lambda d: d == "all"))),
    "percentile": ("percentile", _percentile_one),
    "threshold": ("threshold_ns", _latency_ns),
    "scope": ("scope", _choice("cluster", "host")),
    "for": ("for_quanta", _int_in(1, 100_000)),
    "min_samples": ("min_samples", _int_in(0, 10**12)),
    "clear_below": ("clear_ns", _latency_ns),
    "clear_for": ("clear_for", _int_in(1, 100_000)),
    "confidence": ("confidence", _level),
    "incomplete": ("incomplete", _choice(*SLA_INCOMPLETE)),
}
_SLA_REQUIRED = ("name", "direction", "percentile", "threshold")

_WEBHOOK_KEYS: Table = {
    "url": ("url", _http_url),
    "timeout": ("timeout_ms", _duration_between(100, 30_000)),
    "resend": ("resend_ms", _duration_ms(1000)),
    "labels": ("labels", _label_map),
    "runbook": ("runbook", _url),
}

_AGGREGATOR_KEYS: Table = {
    "topic_prefix": ("topic_prefix", _topic_prefix),
    "client_id": ("client_id", _str),
    "session_expiry": ("session_expiry_ms", _duration_ms(1000)),
    "max_inflight": ("max_inflight", _int_in(1, 65_535)),
    "quantum": ("quantum_ms", _duration_ms(1)),
    "lateness": ("lateness_ms", _duration_ms(0)),
    "revise_within": ("revise_within_ms", _duration_between(0, 24 * 3_600_000)),
    "revise_memory": ("revise_memory_bytes", _size(1024 * 1024)),
    "align": ("align", _align),
    "percentiles": ("percentiles", _percentile_list),
    "confidence_level": ("confidence_level", _level_or_off),
    "per_host": ("per_host", _bool),
    "listen": ("listen", _listen),
    "tls_cert": ("tls_cert", _path),
    "tls_key": ("tls_key", _path),
    "quanta_file": ("quanta_file", _path),
    "quanta_file_max_size": ("quanta_file_max_bytes", _size(4096)),
    "quanta_file_keep": ("quanta_file_keep", _int_in(0, 1000)),
    "max_hosts": ("max_hosts", _int_in(1, 10**6)),
    "max_streams": ("max_streams", _int_in(1, 10**8)),
    "max_open_quanta": ("max_open_quanta", _int_in(2, 10**6)),
    "max_message_size": ("max_message_bytes", _size(1024)),
    "state_dir": ("state_dir", _path),
    "alert_topic": ("alert_topic", _topic_prefix),
    "fit_tail": ("fit_tail", _bool),
    "host_timeout": ("host_timeout_ms", _duration_ms(1000)),
    "log_level": ("log_level", _choice(*LOG_LEVELS)),
    "cell": ("cell", _rule_name),
    "latency": ("latency", _choice(*LATENCY_KINDS)),
}
_AGGREGATOR_SECTIONS = ("broker", "sla", "webhook", "export", "partials", "root")

_PARTIALS_KEYS: Table = {
    "cell": ("cell", _rule_name),
    "topic_prefix": ("topic_prefix", _topic_prefix),
    "client_id": ("client_id", _str),
    "max_message_size": ("max_message_bytes", _size(4096)),
    "host_rows": ("host_rows", _bool),
}
_PARTIALS_SECTIONS = ("broker",)


def _cell_names(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        msg = f"{where}: expected a list of cell names, got {value!r}"
        raise ConfigError([msg])
    names = tuple(_rule_name(c, f"{where}[{i}]") for i, c in enumerate(value))
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        msg = f"{where}: each cell once, got {', '.join(twice)} more than once"
        raise ConfigError([msg])
    return names


_ROOT_KEYS: Table = {
    "cells": ("cells", _cell_names),
    "cell_timeout": ("cell_timeout_ms", _duration_ms(1000)),
    "max_skew": ("max_skew_ms", _duration_between(0, 600_000)),
    "cells_lateness": ("cells_lateness_ms", _duration_ms(0)),
}

_EXPORT_KEYS: Table = {
    "buckets_per_octave": ("buckets_per_octave", _int_in(1, 32)),
}


def _broker(
    r: _Reader, data: object, *, client_id: bool = True, id_key: str = "client_id"
) -> BrokerConfig:
    """The ``broker`` section; ``client_id=False`` where the id is set elsewhere.

    ``id_key`` names that other place in the problem when the section sets one anyway.
    """
    keys = _BROKER_KEYS
    if not client_id:
        keys = {k: v for k, v in _BROKER_KEYS.items() if k != "client_id"}
        if isinstance(data, dict) and "client_id" in data:
            # The aggregator's persistent session is named by its top-level client_id.
            data = {k: v for k, v in data.items() if k != "client_id"}
            r.problems.append(
                "broker.client_id: the aggregator's id is the top-level client_id"
                if id_key == "client_id"
                else f"broker.client_id: this connection's id is {id_key}"
            )
    b = r.section(data, "broker", {*keys, *_BROKER_SECTIONS})
    tls: TlsConfig | None = None
    if b.get("tls") not in (None, False):
        t = {} if b["tls"] is True else r.section(b["tls"], "broker.tls", _TLS_KEYS)
        tls = TlsConfig(**r.fields(t, "broker.tls", _TLS_KEYS))
        if (tls.cert_file is None) != (tls.key_file is None):
            r.problems.append("broker.tls: cert_file and key_file go together")
    values = r.fields(b, "broker", keys)
    if tls is not None:
        values.setdefault("port", MQTTS_PORT)
    return BrokerConfig(tls=tls, **values)


def _broker_under(
    r: _Reader, path: str, data: object, *, client_id: bool = True, id_key: str = "client_id"
) -> BrokerConfig:
    """A ``broker`` section nested at ``path`` (a cell's, the root's).

    Its problems are reported under that path (``cells[1].broker.port: ...``).
    """
    sub = _Reader()
    broker = _broker(sub, data, client_id=client_id, id_key=id_key)
    r.problems += [f"{path}.{p}" for p in sub.problems]
    return broker


def _default(cls: type, name: str) -> Any:
    """The plain default of dataclass ``cls``'s field ``name`` (the one place it is written)."""
    (f,) = (f for f in dataclasses.fields(cls) if f.name == name)
    return f.default


def _cells(r: _Reader, top: dict[str, Any], prefix: str) -> tuple[CellConfig, ...]:
    """The ``cells`` list: each ``{name, broker, topic_prefix}`` over the top-level keys."""
    data = top.get("cells")
    if data is None:
        return ()
    if not isinstance(data, list) or not data:
        r.problems.append(f"cells: expected a list of {{name, broker, topic_prefix}}, got {data!r}")
        return ()
    given = top.get("broker")
    base: dict[str, Any] = given if isinstance(given, dict) else {}
    cells: list[CellConfig] = []
    for i, item in enumerate(data):
        path = f"cells[{i}]"
        c = r.section(item, path, {*_CELL_KEYS, *_CELL_SECTIONS})
        r.require(c, path, "name")
        values: dict[str, Any] = {"name": "", "topic_prefix": prefix}
        values.update(r.fields(c, path, _CELL_KEYS))
        if values["name"] in (x.name for x in cells):
            r.problems.append(f"{path}.name: duplicate cell name {values['name']!r}")
        own = c.get("broker")
        if own is not None and not isinstance(own, dict):
            r.problems.append(f"{path}.broker: expected a mapping, got {own!r}")
            own = None
        broker = _broker_under(r, path, {**base, **(own or {})})
        cells.append(CellConfig(broker=broker, **values))
    return tuple(cells)


def agent_config_from(data: object, *, source: str = "config") -> AgentConfig:
    """Validate a parsed YAML document as the agent's configuration.

    Raises:
        ConfigError: listing every problem, each with its key path.
    """
    cfg, problems, _ = _agent_config(data)
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    return cfg


def _agent_config(data: object) -> tuple[AgentConfig, list[str], bool]:
    """The agent's configuration as far as it is valid, its problems, and its state_dir's.

    A bad or missing key takes a stand-in or its default; the flag says whether
    ``state_dir`` is the file's own (not the stand-in).
    """
    r = _Reader()
    top = r.section(data, "", {*_AGENT_KEYS, *_AGENT_SECTIONS})
    r.require(top, "", "watch")
    r.require(top, "", "state_dir")
    broker = _broker(r, top.get("broker"))
    # Stand-ins for a missing watch or state_dir (already a problem), so the checks below run.
    values_given = r.fields(top, "", _AGENT_KEYS)
    values: dict[str, Any] = {"watch": (), "state_dir": Path(), **values_given}
    cells = _cells(r, top, values.get("topic_prefix", _default(AgentConfig, "topic_prefix")))
    cell = values.get("cell")
    if cell is not None and not cells:
        r.problems.append("cell: names a cell, but no cells are listed")
    if cells:
        names = [c.name for c in cells]
        if cell is None:
            cell = values["cell"] = assign_cell(values.get("host") or _default_host(), names)
        elif cell not in names:
            r.problems.append(f"cell: {cell!r} is not among the cells ({', '.join(names)})")
        chosen = next((c for c in cells if c.name == cell), None)
        if chosen is not None:
            broker, values["topic_prefix"] = chosen.broker, chosen.topic_prefix
    cfg = AgentConfig(broker=broker, **values)
    if cfg.max_message_bytes > cfg.spool_bytes:
        r.problems.append("max_message_size: must not exceed spool_size")
    return cfg, r.problems, "state_dir" in values_given


def _sla_rules(
    r: _Reader, data: object, percentiles: tuple[float, ...], level: float | None
) -> tuple[SlaRule, ...]:
    """The ``sla`` list; ``percentiles`` and ``level`` are what the aggregator computes."""
    if data is None:
        return ()
    if not isinstance(data, list):
        r.problems.append(f"sla: expected a list of rules, got {data!r}")
        return ()
    rules: list[SlaRule] = []
    names: set[str] = set()
    for i, item in enumerate(data):
        path = f"sla[{i}]"
        d = r.section(item, path, _SLA_KEYS)
        before = len(r.problems)
        for key in _SLA_REQUIRED:
            r.require(d, path, key)
        values = r.fields(d, path, _SLA_KEYS)
        pct = values.get("percentile")
        if pct is not None and pct not in percentiles:
            r.problems.append(
                f"{path}.percentile: {pct:g} is not among the computed percentiles "
                f"{', '.join(f'{q:g}' for q in percentiles)}"
            )
        name = values.get("name", "")
        if name in names:
            r.problems.append(f"{path}.name: duplicate rule name {name!r}")
        names.add(name)
        conf = values.get("confidence")
        if conf is not None and conf != level:
            # One level per quantum: the bounds are computed once, at confidence_level.
            r.problems.append(
                f"{path}.confidence: {conf:g} differs from confidence_level "
                f"({'false' if level is None else f'{level:g}'}); the bounds are computed "
                "at confidence_level, so set both to the same level"
            )
        if len(r.problems) == before:
            rule = SlaRule(**values)
            if rule.clear_ns > rule.threshold_ns:
                r.problems.append(f"{path}.clear_below: must not exceed the threshold")
            rules.append(rule)
    return tuple(rules)


def _webhook(r: _Reader, data: object) -> WebhookConfig | None:
    """The ``webhook`` section, or None if the file has none."""
    if data is None:
        return None
    w = r.section(data, "webhook", _WEBHOOK_KEYS)
    r.require(w, "webhook", "url")
    # A stand-in for a missing url (already a problem), so the check below runs.
    values: dict[str, Any] = {"url": "", **r.fields(w, "webhook", _WEBHOOK_KEYS)}
    webhook = WebhookConfig(**values)
    if webhook.resend_ms <= webhook.timeout_ms:
        r.problems.append("webhook.resend: must be longer than webhook.timeout")
    return webhook


def _partials(r: _Reader, data: object, cell: str | None) -> PartialsConfig | None:
    """The ``partials`` section (a cell's link to the root), or None when absent.

    ``cell`` is the aggregator's top-level ``cell``: the default name of this cell.
    """
    if data is None:
        return None
    p = r.section(data, "partials", {*_PARTIALS_KEYS, *_PARTIALS_SECTIONS})
    values = r.fields(p, "partials", _PARTIALS_KEYS)
    if "cell" not in values:
        if cell is None and p.get("cell") is None:
            r.problems.append("partials.cell: required (or the top-level cell)")
        values["cell"] = cell or "cell"  # a stand-in after a problem, so the checks run
    elif cell is not None and values["cell"] != cell:
        # fiomon_cell_info would name one cell and the root another.
        r.problems.append(
            f"partials.cell: {values['cell']!r} differs from the top-level cell {cell!r} "
            "(leave it out: it defaults to the top-level cell)"
        )
    broker = _broker_under(
        r, "partials", p.get("broker"), client_id=False, id_key="partials.client_id"
    )
    return PartialsConfig(broker=broker, **values)


def _root(r: _Reader, data: object) -> RootConfig | None:
    """The ``root`` section (``fiomon root``'s cells and cell timeout), or None."""
    if data is None:
        return None
    s = r.section(data, "root", _ROOT_KEYS)
    return RootConfig(**r.fields(s, "root", _ROOT_KEYS))


def aggregator_config_from(data: object, *, source: str = "config") -> AggregatorConfig:
    """Validate a parsed YAML document as the aggregator's configuration.

    Raises:
        ConfigError: listing every problem, each with its key path.
    """
    cfg, problems = _aggregator_config(data)
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    return cfg


def _aggregator_config(data: object) -> tuple[AggregatorConfig, list[str]]:
    """The aggregator's configuration as far as it is valid, and its problems."""
    r = _Reader()
    top = r.section(data, "", {*_AGGREGATOR_KEYS, *_AGGREGATOR_SECTIONS})
    values = r.fields(top, "", _AGGREGATOR_KEYS)
    cfg = AggregatorConfig(
        broker=_broker(r, top.get("broker"), client_id=False),
        webhook=_webhook(r, top.get("webhook")),
        export=ExportConfig(
            **r.fields(r.section(top.get("export"), "export", _EXPORT_KEYS), "export", _EXPORT_KEYS)
        ),
        partials=_partials(r, top.get("partials"), values.get("cell")),
        root=_root(r, top.get("root")),
        **values,
    )
    # The rules are checked against the percentiles and the level the file ends up with.
    cfg = replace(cfg, sla=_sla_rules(r, top.get("sla"), cfg.percentiles, cfg.confidence_level))
    if cfg.partials is not None and cfg.state_dir is None:
        r.problems.append("partials: needs state_dir (the outbox of unsent partials)")
    if cfg.partials is not None and cfg.align == "auto":
        # Each cell would pick its own phase; the root merges only quanta on one grid.
        r.problems.append("partials/root: need align epoch or a fixed offset, not auto")
    if cfg.root is not None:
        # (align: auto is named once, above, on a cell that has a root section too)
        skip = "align:" if cfg.partials is not None else "\0"
        r.problems.extend(p for p in root_problems(cfg) if not p.startswith(skip))
    if (cfg.tls_cert is None) != (cfg.tls_key is None):
        r.problems.append("tls_cert and tls_key go together")
    return cfg, r.problems


def root_problems(cfg: AggregatorConfig) -> list[str]:
    """Why ``cfg`` cannot run ``fiomon root`` (empty if it can).

    Checked by :func:`aggregator_config_from` for a file with a ``root`` section (so by
    ``fiomon check-config``) and by ``fiomon root`` at start, with or without one.
    """
    rc = cfg.root or RootConfig()
    out = []
    if not rc.cells:
        out.append(
            "root.cells: required by fiomon root: the cells whose partials it merges (each "
            "cell's partials.cell); partials of any other cell are refused"
        )
    if cfg.align == "auto":
        out.append(
            "align: the root needs epoch or a fixed offset, not auto: its quanta are its own "
            "grid, and a cell off it is refused (give the cells the same align)"
        )
    if cfg.lateness_ms <= rc.cells_lateness_ms:
        out.append(
            f"lateness: the root's ({cfg.lateness_ms} ms) must be above root.cells_lateness "
            f"({rc.cells_lateness_ms} ms, the cells' lateness): a cell closes a quantum up to "
            "its lateness after the end (plus clock skew and the trip to the root), and the "
            "root would close it first without that cell's rows"
        )
    if rc.cell_timeout_ms < cfg.lateness_ms:
        out.append(
            f"root.cell_timeout ({rc.cell_timeout_ms} ms) must be at least lateness "
            f"({cfg.lateness_ms} ms): a silent cell would stop being waited for before its "
            "quanta's lateness ends, and they would close early without it"
        )
    return out


def aggregator_files(cfg: AggregatorConfig) -> list[str]:
    """Problems with the files an aggregator's configuration names.

    Its broker's password and TLS files, on a cell those of the root's broker, and the
    certificate and key of HTTPS on ``listen``.
    """
    problems = readable_files(cfg.broker)
    if cfg.partials is not None:
        problems += [f"partials.{p}" for p in readable_files(cfg.partials.broker)]
    named = [("tls_cert", cfg.tls_cert), ("tls_key", cfg.tls_key)]
    unreadable = _unreadable(named)
    problems += unreadable
    if not unreadable and cfg.tls_cert is not None and cfg.tls_key is not None:
        problems += _cert_pair_problems("tls_cert/tls_key", cfg.tls_cert, cfg.tls_key)
    return problems


def check_agent(data: object) -> tuple[AgentConfig, list[str]]:
    """Every problem of an agent's configuration in one pass: its keys and its files.

    The files (password, TLS, the state directory) are checked even when keys are bad,
    so one run of ``fiomon check-config`` lists all there is to fix. The configuration
    returned is as far as it is valid (a bad key takes its default); use it only when
    the list is empty.
    """
    cfg, problems, has_state_dir = _agent_config(data)
    problems += readable_files(cfg.broker)
    if has_state_dir:
        problems += state_dir_problems(cfg.state_dir, strict=False)
    return cfg, problems


def check_aggregator(data: object) -> tuple[AggregatorConfig, list[str]]:
    """Every problem of an aggregator's (or root's) configuration: keys and files at once.

    As :func:`check_agent`: the configuration returned is as far as it is valid.
    """
    cfg, problems = _aggregator_config(data)
    return cfg, problems + aggregator_files(cfg)


def load_aggregator_config(path: Path) -> AggregatorConfig:
    """Read and validate the aggregator's YAML file, and the files it names.

    Raises:
        ConfigError: unreadable, not YAML, any key invalid, or a password or TLS file
            unreadable (all listed at once).
    """
    cfg, problems = check_aggregator(read_yaml(path))
    if problems:
        raise ConfigError([f"{path}: {p}" for p in problems])
    return cfg


@dataclass(frozen=True, slots=True)
class Overrides:
    """Settings the command line (or the environment) puts over a service's file.

    Carried as data into the service, so the one loader (:func:`load`) applies them at
    start and at every SIGHUP alike. Values are the text given; they are checked when
    applied.

    Args:
        broker: ``HOST[:PORT]`` over ``broker.host`` (and ``broker.port`` if a port is
            given); None: the file's.
        listen: ``HOST:PORT`` over ``listen`` (aggregator and root); None: the file's.
        log_level: over ``log_level``; None: the file's.
        broker_from: the flag or variable ``broker`` came from, for messages.
        listen_from: the flag or variable ``listen`` came from, for messages.
    """

    broker: str | None = None
    listen: str | None = None
    log_level: str | None = None
    broker_from: str = "--broker"
    listen_from: str = "--listen"

    def apply_agent(self, cfg: AgentConfig) -> AgentConfig:
        """``cfg`` with the broker and log level overrides (an agent has no ``listen``).

        Raises:
            ConfigError: a bad address, naming the flag or variable it came from.
        """
        if self.log_level is not None:
            cfg = replace(cfg, log_level=self.log_level)
        if self.broker is None:
            return cfg
        return replace(cfg, broker=with_broker(cfg.broker, self.broker, what=self.broker_from))

    def apply(self, cfg: AggregatorConfig) -> AggregatorConfig:
        """``cfg`` with every override put over it.

        Raises:
            ConfigError: a bad address, naming the flag or variable it came from.
        """
        if self.broker is not None:
            cfg = replace(cfg, broker=with_broker(cfg.broker, self.broker, what=self.broker_from))
        if self.listen is not None:
            cfg = replace(cfg, listen=check_listen(self.listen, what=self.listen_from))
        if self.log_level is not None:
            cfg = replace(cfg, log_level=self.log_level)
        return cfg

    def notes(self, broker: BrokerConfig) -> list[str]:
        """What was overridden, for the start-up log (``broker`` as applied)."""
        out = []
        if self.broker is not None:
            out.append(f"broker {broker.host}:{broker.port} (from {self.broker_from})")
        if self.listen is not None:
            out.append(f"/metrics on {self.listen} (from {self.listen_from})")
        return out


def load(path: Path, overrides: Overrides | None = None) -> AggregatorConfig:
    """The aggregator's (or root's) configuration: the file, then ``overrides`` over it.

    The one loader of a running service: used at start and at every SIGHUP, so what the
    command line set is never reported as a change of the file.

    Raises:
        ConfigError: as :func:`load_aggregator_config`, or a bad override.
    """
    cfg = load_aggregator_config(path)
    return cfg if overrides is None else overrides.apply(cfg)


def load_agent_config(path: Path) -> AgentConfig:
    """Read and validate the agent's YAML file, and the files it names.

    Raises:
        ConfigError: unreadable, not YAML, any key invalid, a password or TLS file
            unreadable, or a state directory that cannot be one (all listed at once).
    """
    cfg, problems = check_agent(read_yaml(path))
    if problems:
        raise ConfigError([f"{path}: {p}" for p in problems])
    return cfg


# -- the files a configuration names ----------------------------------------------------


MAX_CONFIG_BYTES = 1 << 20  # a configuration is a few kB; anything this large is a mistake


def read_yaml(path: Path) -> object:
    """The YAML document in ``path`` (see :func:`fiomon.yamlfile.read_yaml`).

    PyYAML is imported only here, when a file is read: the dataclasses above (SLA rules,
    configurations) are used by modules that never read YAML.

    Raises:
        ConfigError: unreadable, not text, too large, not YAML, or a key given twice.
    """
    from fiomon.yamlfile import read_yaml as read  # noqa: PLC0415

    return read(path, MAX_CONFIG_BYTES)


def readable_files(broker: BrokerConfig, section: str = "broker") -> list[str]:
    """Problems with the files the broker settings name (password, TLS), each with its key.

    Checked at start by the services and by ``fiomon check-config``, so a missing or
    unreadable file, a password that is not UTF-8 text, or a file that holds no
    certificate or key, is a clear error there rather than a traceback (or endless
    reconnecting) at the first connect. Each file is checked on its own: one bad file
    does not hide another's problem.
    """
    problems = []
    if broker.password_file is not None:
        key = f"{section}.password_file"
        unreadable = _unreadable([(key, broker.password_file)])
        if not unreadable:
            try:
                broker.password_file.read_bytes().decode("utf-8")
            except UnicodeDecodeError as exc:
                unreadable = [f"{key}: {broker.password_file} is not UTF-8 text ({exc.reason})"]
            except OSError as exc:  # gone in between
                unreadable = [f"{key}: cannot read {broker.password_file} ({exc.strerror})"]
        problems += unreadable
    tls = broker.tls
    if tls is None:
        return problems
    if tls.ca_file is not None:
        key = f"{section}.tls.ca_file"
        unreadable = _unreadable([(key, tls.ca_file)])
        problems += unreadable or _ca_problems(key, tls.ca_file)
    if tls.cert_file is not None and tls.key_file is not None:
        pair = [
            (f"{section}.tls.cert_file", tls.cert_file),
            (f"{section}.tls.key_file", tls.key_file),
        ]
        unreadable = _unreadable(pair)
        problems += unreadable or _cert_pair_problems(
            f"{section}.tls.cert_file/key_file", tls.cert_file, tls.key_file
        )
    else:  # one without the other is a key problem; its file is still checked
        problems += _unreadable(
            [(f"{section}.tls.cert_file", tls.cert_file), (f"{section}.tls.key_file", tls.key_file)]
        )
    return problems


def _unreadable(named: Sequence[tuple[str, Path | None]]) -> list[str]:
    """``key: cannot read PATH (why)`` for each named file that cannot be opened and read."""
    problems = []
    for key, path in named:
        if path is None:
            continue
        try:
            with path.open("rb") as fh:
                fh.read(1)
        except OSError as exc:
            problems.append(f"{key}: cannot read {path} ({exc.strerror or exc})")
    return problems


def _ca_problems(key: str, ca_file: Path) -> list[str]:
    """Whether the CA bundle loads as TLS expects."""
    import ssl  # noqa: PLC0415 -- only TLS configurations need it

    try:
        ssl.create_default_context().load_verify_locations(cafile=str(ca_file))
    except (ssl.SSLError, ValueError) as exc:
        return [f"{key}: {ca_file} holds no CA certificate ({exc})"]
    return []


def _cert_pair_problems(key: str, cert_file: Path, key_file: Path) -> list[str]:
    """Whether a certificate and its private key load together as TLS expects."""
    import ssl  # noqa: PLC0415 -- only TLS configurations need it

    try:
        ssl.create_default_context().load_cert_chain(str(cert_file), str(key_file))
    except (ssl.SSLError, ValueError) as exc:
        return [f"{key}: {cert_file} and {key_file} are not a certificate and its key ({exc})"]
    return []


def state_dir_problems(path: Path, key: str = "state_dir", *, strict: bool = True) -> list[str]:
    """Why the service could not use ``path`` as its state directory (empty if it can).

    It must be a directory, or a path one can be created at, on a writable file system
    that holds files. With ``strict``, this user must also be able to write it (false
    for ``check-config``, which is often run by another user than the service's).
    """
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe == path and not path.is_dir():
        return [f"{key}: {path} exists and is not a directory"]
    if not probe.is_dir():
        return [f"{key}: {probe} is not a directory, so {path} cannot be created"]
    writable = os.access(probe, os.W_OK | os.X_OK)
    try:
        readonly = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
    except OSError:
        readonly = False
    kernel = _kernel_fs(probe)
    if (strict and not writable) or readonly or kernel:
        what = (
            f"is on a {kernel} file system (not for files)"
            if kernel
            else "is read-only"
            if readonly
            else "is not writable by this user"
        )
        where = path if probe == path else f"{probe} (to create {path})"
        return [f"{key}: {where} {what}"]
    return []


_KERNEL_FS = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs", "securityfs"}


def _kernel_fs(path: Path) -> str | None:
    """The type of the kernel file system ``path`` is on (proc, sysfs, ...), or None."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    best, kind = "", None
    target = str(path.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind if kind in _KERNEL_FS else None


_PRIVATE_TMPS = ("/tmp", "/var/tmp")  # what systemd's PrivateTmp=yes replaces  # noqa: S108


def private_tmp(mountinfo: Path = Path("/proc/self/mountinfo")) -> bool:
    """Whether this process sees a private ``/tmp`` (systemd's ``PrivateTmp=yes``).

    systemd bind-mounts ``/tmp/systemd-private-<boot>-<unit>-<rand>/tmp`` over ``/tmp``
    in the unit's mount namespace; ``mountinfo``'s root field of ``/tmp`` shows it.
    """
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) > 4 and fields[4] in _PRIVATE_TMPS and "/systemd-private-" in fields[3]:
            return True
    return False


def _under_tmp(pattern: str) -> bool:
    return any(pattern == d or pattern.startswith(d + "/") for d in _PRIVATE_TMPS)


def watch_warnings(cfg: AgentConfig, *, unit_note: bool = False) -> list[str]:
    """Watch patterns that match nothing as written (not errors: fio may create them later).

    Also a state directory this user cannot write (the service's user may differ), and
    patterns under ``/tmp`` or ``/var/tmp`` when this process has a private ``/tmp``
    (systemd's ``PrivateTmp=yes``: fio's files there are invisible to it), or always
    with ``unit_note`` (``check-config``, run outside the unit, warns of what the
    shipped unit will not see).
    """
    out = [
        f"{p} (fine if the service runs as a user who can)"
        for p in state_dir_problems(cfg.state_dir, strict=True)
        if not state_dir_problems(cfg.state_dir, strict=False)
    ]
    private = private_tmp()
    for i, pattern in enumerate(cfg.watch):
        if _under_tmp(pattern) and (private or unit_note):
            seen = (
                "this agent runs with a private /tmp (systemd PrivateTmp=yes) and does not "
                "see fio's files there"
                if private
                else "the shipped fiomon-agent.service has PrivateTmp=yes: the agent it "
                "runs sees its own empty /tmp, not fio's"
            )
            out.append(
                f"watch[{i}]: {pattern!r} is under /tmp or /var/tmp; {seen}. Have fio write "
                "elsewhere (e.g. /var/lib/fio/results) or set PrivateTmp=no in a drop-in "
                "(deploy/README.md)"
            )
            if private:
                continue
        if Path(pattern).is_dir():
            out.append(
                f"watch[{i}]: {pattern!r} is a folder; patterns name files, e.g. "
                f"'{pattern.rstrip('/')}/*.json'"
            )
            continue
        folder = _fixed_folder(pattern)  # the leading folders without wildcards
        if not folder.is_dir():
            out.append(
                f"watch[{i}]: folder {folder} does not exist (yet): {pattern!r} matches nothing"
            )
        elif "**" in pattern.split("/") and folder in (Path("/"), Path("/home"), Path("/var")):
            out.append(
                f"watch[{i}]: {pattern!r} scans every folder under {folder} (the first 100 000 "
                "a scan): point ** at the results folder (agents/README.md, section 2)"
            )
        if cfg.latency != "clat" and "_hist" in Path(pattern).name:
            out.append(
                f"watch[{i}]: {pattern!r} names hist logs, which hold clat only: with latency "
                f"{cfg.latency} the agent refuses them (logged, files_refused); watch fio's "
                f"json+ output written with {cfg.latency}_percentiles=1 instead"
            )
    return out


def _fixed_folder(pattern: str) -> Path:
    """The folder a watch pattern starts from: its leading components without wildcards."""
    comps = pattern.split("/")[:-1]
    fixed = []
    for c in comps:
        if any(m in c for m in "*?["):
            break
        fixed.append(c)
    joined = "/".join(fixed)
    return Path(joined or ("/" if pattern.startswith("/") else "."))


# -- overrides from flags and the environment ---------------------------------------------
# The command line reads them (flag > environment > file) and hands the strings here;
# nothing in this module reads the environment.


def parse_broker_address(text: str, *, what: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``: the host, and the port if given.

    A bare IPv6 address (more than one colon, no brackets) is all host.

    Raises:
        ConfigError: no host, or a port that is not a number in 1..65535.
    """
    text = text.strip()
    port_text = ""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            msg = f"{what}: expected [IPv6] or [IPv6]:PORT, got {text!r}"
            raise ConfigError([msg])
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host = text
    if not host:
        msg = f"{what}: expected HOST or HOST:PORT, got {text!r}"
        raise ConfigError([msg])
    if not port_text:
        return host, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        msg = f"{what}: port must be a number in 1..65535, got {port_text!r}"
        raise ConfigError([msg])
    return host, int(port_text)


def with_broker(broker: BrokerConfig, address: str, *, what: str) -> BrokerConfig:
    """``broker`` with the host (and the port, if ``address`` has one) of ``address``.

    Raises:
        ConfigError: a bad address, naming ``what`` (the flag or variable it came from).
    """
    host, port = parse_broker_address(address, what=what)
    return replace(broker, host=host, port=broker.port if port is None else port)


def check_listen(address: str, *, what: str) -> str:
    """``address`` if it is a ``host:port`` that ``listen`` accepts.

    Raises:
        ConfigError: not ``host:port``, naming ``what``.
    """
    return _listen(address, what)
