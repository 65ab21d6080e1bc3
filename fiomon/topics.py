"""Every MQTT topic fiomon uses, built and parsed in one place (``docs/wire-format.md``).

Under a configured prefix ``<p>`` (one or more levels) and the wire level ``v1``:

============  ===========================================  =====  ========
kind          topic                                        QoS    retained
============  ===========================================  =====  ========
records       ``<p>/v1/<host>/records``                    1      no
status        ``<p>/v1/<host>/status`` (Will: offline)     1      yes
alerts        ``<p>/v1/_aggregator/alerts`` (the default)  1      yes
presence      ``<p>/v1/_aggregator/<client_id>/instance``  1      yes
conflict      ``<p>/v1/_aggregator/<client_id>/conflict``  1      no
partials      ``<p>/v1/_partials/<cell>`` (root's prefix)  1      no
partials_ack  ``<p>/v1/_partials_ack/<cell>`` (the root's) 1      yes
============  ===========================================  =====  ========

``partials_ack`` is the root's word to a cell: its messages numbered below ``next_seq``
are journaled at the root (:mod:`fiomon.root.delivery`); the cell keeps them until then.

``_aggregator``, ``_partials`` and ``_partials_ack`` are fiomon's own namespaces:
:meth:`Topics.parse` never reads them as a host (a host of that name would collide with
them on the wire anyway).

Pure string work: importing this module loads no MQTT client (the configuration uses it
for the alert topic's default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

WIRE_LEVEL = "v1"

TopicKind = Literal[
    "records", "status", "alerts", "presence", "conflict", "partials", "partials_ack"
]

_AGGREGATOR = "_aggregator"  # the aggregators' namespace (alerts, presence, conflict)
_PARTIALS = "_partials"  # the cells' partials, on the root's broker
_PARTIALS_ACK = "_partials_ack"  # the root's acknowledgements to the cells, there too
# Never a host (the configuration refuses them).
RESERVED_NAMES = frozenset({_AGGREGATOR, _PARTIALS, _PARTIALS_ACK})


@dataclass(frozen=True, slots=True)
class Topics:
    """The topic names and subscription filters under one prefix, and their parser.

    Names (hosts, cells, client ids) are used as given: the configuration checks them
    (hosts and cells are one level of letters, digits, ``_``, ``.``, ``-``).

    Args:
        prefix: the configured ``topic_prefix`` (the root's, for partials).
    """

    prefix: str
    _base: str = field(init=False, repr=False, compare=False)  # "<prefix>/v1"
    _head: str = field(init=False, repr=False, compare=False)  # "<prefix>/v1/"

    def __post_init__(self) -> None:
        object.__setattr__(self, "_base", f"{self.prefix}/{WIRE_LEVEL}")
        object.__setattr__(self, "_head", f"{self.prefix}/{WIRE_LEVEL}/")

    # -- an agent's topics ---------------------------------------------------------------

    def records(self, host: str) -> str:
        """Where ``host``'s agent publishes records (QoS 1)."""
        return f"{self._base}/{host}/records"

    def status(self, host: str) -> str:
        """``host``'s agent status (QoS 1, retained; the Will says ``offline``)."""
        return f"{self._base}/{host}/status"

    @property
    def all_records(self) -> str:
        """Subscription filter for every agent's records."""
        return f"{self._base}/+/records"

    @property
    def all_status(self) -> str:
        """Subscription filter for every agent's status."""
        return f"{self._base}/+/status"

    # -- an aggregator's topics ----------------------------------------------------------

    @property
    def alerts(self) -> str:
        """The default alert-state topic (retained; ``alert_topic`` may name another)."""
        return f"{self._base}/{_AGGREGATOR}/alerts"

    def presence(self, client_id: str) -> str:
        """Where an aggregator with ``client_id`` announces its instance (retained)."""
        return f"{self._base}/{_AGGREGATOR}/{client_id}/instance"

    def conflict(self, client_id: str) -> str:
        """Where an aggregator tells the one that took its ``client_id``'s session."""
        return f"{self._base}/{_AGGREGATOR}/{client_id}/conflict"

    # -- the cells' topics (on the root's broker) ----------------------------------------

    def partials(self, cell: str) -> str:
        """Where cell ``cell`` publishes its partials (QoS 1)."""
        return f"{self._base}/{_PARTIALS}/{cell}"

    @property
    def all_partials(self) -> str:
        """Subscription filter for every cell's partials (the root's)."""
        return f"{self._base}/{_PARTIALS}/+"

    def partials_ack(self, cell: str) -> str:
        """Where the root acknowledges cell ``cell``'s journaled partials (QoS 1, retained)."""
        return f"{self._base}/{_PARTIALS_ACK}/{cell}"

    # -- parsing -------------------------------------------------------------------------

    def parse(self, topic: str) -> tuple[TopicKind, str] | None:
        """What ``topic`` is, as ``(kind, name)``; None when it is not one of ours.

        ``name`` is the host (records, status), the cell (partials, partials_ack), the client id
        (presence, conflict; it may span levels) or ``""`` (alerts). Refused (None): another
        prefix or wire level, an unknown kind, an empty level, a wildcard, or a host named
        like one of fiomon's namespaces (``_aggregator``, ``_partials``, ``_partials_ack``).
        Called for every message the aggregator receives: string operations only, about a
        microsecond.
        """
        head = self._head
        if not topic.startswith(head) or "+" in topic or "#" in topic:
            return None
        levels = topic[len(head) :].split("/")
        if "" in levels:
            return None
        first, last = levels[0], levels[-1]
        if len(levels) == 2 and first not in RESERVED_NAMES:
            if last == "records":
                return "records", first
            if last == "status":
                return "status", first
            return None
        if first == _PARTIALS:
            return ("partials", last) if len(levels) == 2 else None
        if first == _PARTIALS_ACK:
            return ("partials_ack", last) if len(levels) == 2 else None
        if first != _AGGREGATOR:
            return None
        if len(levels) == 2:
            return ("alerts", "") if last == "alerts" else None
        client_id = "/".join(levels[1:-1])
        if last == "instance":
            return "presence", client_id
        if last == "conflict":
            return "conflict", client_id
        return None
