"""MQTT for agent, aggregator and root: topics, and the one session to the broker.

* :class:`~fiomon.topics.Topics` (re-exported here; it lives in :mod:`fiomon.topics`,
  which loads no MQTT client): every topic name and filter, and their parser.
* :class:`MqttSession`: one aiomqtt client kept connected by one reconnect loop
  (:meth:`~MqttSession.run`, :class:`Backoff`), messages in batches read in bulk,
  manual acknowledgement of a batch, checked publishes (:class:`PublishRefusedError`).
  It is the only code in fiomon that reaches into aiomqtt's or paho's privates
  (``fiomon/mqtt/_session.py``, ``fiomon/mqtt/_reader.py``).
"""

from fiomon.mqtt._session import (
    BATCH_MESSAGES,
    SUBSCRIBE_TIMEOUT_S,
    Backoff,
    MqttSession,
    PublishRefusedError,
    read_password,
)
from fiomon.topics import WIRE_LEVEL, TopicKind, Topics

__all__ = [
    "BATCH_MESSAGES",
    "SUBSCRIBE_TIMEOUT_S",
    "WIRE_LEVEL",
    "Backoff",
    "MqttSession",
    "PublishRefusedError",
    "TopicKind",
    "Topics",
    "read_password",
]
