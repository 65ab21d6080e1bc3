"""Deprecated: the bulk reader moved into :mod:`fiomon.mqtt` (``MqttSession(bulk_read=True)``).

Re-exports for ``fiomon/aggregator/service.py`` until it reads through
:class:`~fiomon.mqtt.MqttSession` (``batches`` and ``ack``); then delete this module.
"""

from fiomon.mqtt._reader import RECV_BYTES, BulkReader, ack_many, install

__all__ = ["RECV_BYTES", "BulkReader", "ack_many", "install"]
