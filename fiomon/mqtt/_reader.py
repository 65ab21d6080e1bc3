"""A buffered reader for paho's incoming packets: the services' intake, cheaper per message.

Private to :mod:`fiomon.mqtt`: :class:`~fiomon.mqtt.MqttSession` installs it
(``bulk_read=True``) and acknowledges batches with :func:`ack_many`. (Formerly
``fiomon.aggregator.mqttread``.)

paho-mqtt 2.2 reads each packet with at least three ``recv`` calls (the command byte, each
byte of the remaining length, then the rest, appended to a bytes object chunk by chunk),
and for every MQTT 5 PUBLISH builds a :class:`paho.mqtt.properties.Properties` (a dict of
27 names, then ``clear()`` probing each with ``hasattr``), copies the payload three more
times while slicing off the topic and packet id, and formats a debug line. Profiled at
1000 messages/s of 50 records (``benchmarks/bench_aggregator.py --hosts 1000 --jobs 25``)
that was a third of the aggregator's time, as much as decoding and merging the records.

:func:`install` replaces one method on one paho client instance (not on the class):

* ``_packet_read``: one ``recv`` of up to :data:`RECV_BYTES` into a buffer, then every
  complete packet in the buffer is handled; a partial packet waits for the next read. The
  buffer belongs to one socket: a new connection starts with an empty one.
* PUBLISH packets without properties and with QoS 0 or 1 (what agents send) are parsed in
  place: topic, packet id and payload are sliced once from the buffer, and the message
  goes through paho's own ``_handle_on_message`` (callbacks, filters) and, unless manual
  acknowledgement is on, ``_send_puback``, as paho does. Every other packet, and a
  PUBLISH with properties, QoS 2 or anything odd, goes to paho's own handlers unchanged.

Semantics are paho's: the same callbacks in the same order, QoS 1 acknowledged the same
way (the aggregator acknowledges by hand after journaling), keep-alive fed by each read,
the connection dropped on a malformed length. MQTT 5 messages without properties share
one empty ``Properties`` object (read-only by contract).

This reaches into paho's private methods: :func:`install` checks that they exist (paho
2.x as tested) and otherwise leaves the client alone and returns None, so another paho
version still works, only slower.
"""

from __future__ import annotations

import logging
import ssl
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.exception import MalformedPacket
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

log = logging.getLogger("fiomon.mqtt")

RECV_BYTES = 1 << 18  # one recv: many messages of a few kB, or a quarter of a large one
_PUBLISH = 0x30
_PUBACK = 0x40
_PUBACK_PACKET = struct.Struct("!BBH")  # PUBACK, remaining length 2, packet id
_NEEDS = (
    "_sock_recv",
    "_packet_handle",
    "_handle_on_message",
    "_send_puback",
    "_msgtime_mutex",
    "_manual_ack",
    "_protocol",
    "_in_packet",
    "_packet_read",
    "_easy_log",
    "_sock",
    "_last_bytes_received",
    "_packet_queue",
    "_call_socket_register_write",
)


class BulkReader:
    """The replacement ``_packet_read`` of one paho client (see the module docstring)."""

    def __init__(self, client: paho.Client, hold: Callable[[], bool] | None = None) -> None:
        self.client = client
        self.hold = hold
        self.held = False  # a hold stopped reading or handing on: resume() goes on
        self.buf = bytearray()
        # Reads land in one fixed chunk, then are appended to the buffer: no fresh 256 kB
        # bytes object per recv (then shrunk to what came) for the allocator to place.
        self.chunk = memoryview(bytearray(RECV_BYTES))
        self.view = memoryview(b"")  # the buffer while its packets are handled
        self.sock: object = None  # the socket the buffer's bytes came from
        self.v5 = client._protocol == MQTTProtocolVersion.MQTTv5
        self.empty: Properties | None = (
            Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            if self.v5
            else None
        )
        # paho's clock for keep-alive (monotonic where available, as paho's time_func).
        self.clock = getattr(paho, "time_func", time.monotonic)
        self.packets = 0  # handled, for tests
        self.fast = 0  # of which PUBLISH parsed here

    def read(self) -> MQTTErrorCode:
        """Read once, handle every complete packet; paho's ``_packet_read`` contract.

        Returns ``MQTT_ERR_AGAIN`` when the socket had nothing (paho's loop stops asking),
        an error code when the connection is lost or a packet is bad, else success.
        """
        c = self.client
        if c._sock is not self.sock:  # a new connection: bytes of the old one are void
            self.sock = c._sock
            self.buf.clear()
        if self.hold is not None and self.hold():
            # The consumer is behind: leave the rest in the kernel and the broker (TCP
            # pushes back) until it calls :meth:`resume`.
            self.held = True
            return self._handle_buffered(MQTTErrorCode.MQTT_ERR_AGAIN)
        try:
            n = self._recv()
        except BlockingIOError:
            return self._handle_buffered(MQTTErrorCode.MQTT_ERR_AGAIN)
        except OSError as err:  # TimeoutError and ConnectionError included
            c._easy_log(paho.MQTT_LOG_ERR, "failed to receive on socket: %s", err)
            return MQTTErrorCode.MQTT_ERR_CONN_LOST
        if not n:
            return MQTTErrorCode.MQTT_ERR_CONN_LOST
        self.buf += self.chunk[:n]
        with c._msgtime_mutex:
            c._last_bytes_received = self.clock()
        return self._handle_buffered(MQTTErrorCode.MQTT_ERR_SUCCESS)

    def resume(self) -> None:
        """After the consumer drained messages: go on where a hold stopped.

        The socket may not become readable again (the broker sent everything already), so
        the event loop would not call us: read now through paho's ``loop_read``, which
        handles what the buffer holds (a read that finds nothing is not an error) and
        any error as a read from the event loop would.
        """
        if self.held and self.client._sock is not None:
            self.held = False
            self.client.loop_read()

    def _recv(self) -> int:
        """Read into :attr:`chunk`; bytes read (0: closed). paho's ``_sock_recv`` errors.

        Raises:
            BlockingIOError: nothing to read now (TLS: also a record still incomplete).
            OSError: the connection failed.
        """
        c = self.client
        recv_into = getattr(c._sock, "recv_into", None)
        if recv_into is None:  # paho's websocket wrapper, or no socket: paho's own recv
            data = c._sock_recv(RECV_BYTES)
            self.chunk[: len(data)] = data
            return len(data)
        try:
            n: int = recv_into(self.chunk)
        except ssl.SSLWantReadError as err:
            raise BlockingIOError from err
        except ssl.SSLWantWriteError as err:
            c._call_socket_register_write()
            raise BlockingIOError from err
        return n

    def _handle_buffered(self, ok: MQTTErrorCode) -> MQTTErrorCode:
        """Handle the complete packets at the buffer's start; keep a partial one."""
        buf = self.buf
        n = len(buf)
        pos = 0
        rc = ok
        self.view = memoryview(buf)  # copies out of it without a temporary bytearray
        try:
            while n - pos >= 2:
                header = buf[pos]
                length = 0
                mult = 1
                i = pos + 1
                while True:
                    if i >= n:
                        return rc  # the length itself is incomplete (finally trims)
                    byte = buf[i]
                    i += 1
                    length += (byte & 127) * mult
                    if not byte & 128:
                        break
                    mult *= 128
                    if i - pos > 4:  # at most 4 length bytes (MQTT 2.2.3)
                        return MQTTErrorCode.MQTT_ERR_PROTOCOL
                end = i + length
                if end > n:
                    return rc
                publish = header & 0xF0 == _PUBLISH
                if publish and self.hold is not None and self.hold():
                    self.held = True
                    return rc  # held: this message waits in the buffer (finally keeps it)
                pos = end
                self.packets += 1
                if publish:
                    got = self._publish(header, i, end)
                else:
                    got = self._paho(header, bytes(self.view[i:end]))
                if got != MQTTErrorCode.MQTT_ERR_SUCCESS:
                    return got
            return rc
        finally:
            self.view.release()  # the buffer can be resized again
            del buf[:pos]

    def _paho(self, header: int, packet: bytes) -> MQTTErrorCode:
        """Hand one packet to paho's own dispatch, as its reader would."""
        c = self.client
        c._in_packet = {
            "command": header,
            "have_remaining": 1,
            "remaining_count": [],
            "remaining_mult": 1,
            "remaining_length": len(packet),
            "packet": bytearray(packet),
            "to_process": 0,
            "pos": 0,
        }
        try:
            return c._packet_handle()
        except MalformedPacket as exc:
            c._easy_log(paho.MQTT_LOG_DEBUG, "Received malformed packet: %s", exc)
            return MQTTErrorCode.MQTT_ERR_PROTOCOL

    def _publish(self, header: int, start: int, end: int) -> MQTTErrorCode:
        """A PUBLISH in ``buf[start:end]``: parsed here when plain, else by paho."""
        buf = self.buf
        qos = (header >> 1) & 3
        p = start + 2
        if p > end or qos == 3:
            return self._paho(header, bytes(self.view[start:end]))
        slen = (buf[start] << 8) | buf[start + 1]
        topic_end = p + slen
        p = topic_end + (2 if qos else 0) + (1 if self.v5 else 0)
        if (
            slen == 0  # v3: an error; v5: a topic alias (paho resolves those)
            or qos == 2
            or p > end
            or (self.v5 and buf[p - 1] != 0)  # properties present
        ):
            return self._paho(header, bytes(self.view[start:end]))
        mid = (buf[topic_end] << 8) | buf[topic_end + 1] if qos else 0
        msg = paho.MQTTMessage(mid, bytes(self.view[start + 2 : topic_end]))
        msg.dup = bool(header & 0x08)
        msg.qos = qos
        msg.retain = bool(header & 0x01)
        msg.properties = self.empty
        msg.payload = bytes(self.view[p:end])
        msg.timestamp = self.clock()
        self.fast += 1
        c = self.client
        c._handle_on_message(msg)
        if qos == 1 and not c._manual_ack:
            return c._send_puback(mid)
        return MQTTErrorCode.MQTT_ERR_SUCCESS


def install(client: paho.Client, hold: Callable[[], bool] | None = None) -> BulkReader | None:
    """Give ``client`` the buffered reader (before it connects); None if paho differs.

    Args:
        client: a paho client that has not connected yet (aiomqtt's ``_client``).
        hold: while it returns True, no PUBLISH is handed on and the socket is not read
            (backpressure: the messages wait in the kernel's buffers and the broker's
            queue); whoever drains the messages calls :meth:`BulkReader.resume` after.

    Returns:
        The reader (its counters are for tests), or None when this paho lacks a method
        the reader relies on: the client then keeps paho's own reader.
    """
    missing = [name for name in _NEEDS if not hasattr(client, name)]
    if missing:
        log.warning(
            "paho-mqtt %s lacks %s: MQTT is read with paho's own (slower) reader",
            getattr(paho, "__version__", "?"),
            ", ".join(missing),
        )
        return None
    reader = BulkReader(client, hold)
    target: Any = client
    target._packet_read = reader.read
    return reader


def ack_many(client: paho.Client, messages: Sequence[tuple[int, int]]) -> None:
    """Acknowledge ``(mid, qos)`` messages (manual acknowledgement) with one socket write.

    paho's ``ack`` queues one 4-byte PUBACK per message and writes each with its own
    ``send`` (and event-loop round); this queues the same PUBACK packets, in the same
    order, as one write. QoS 2 (never subscribed by the aggregator) and a paho without
    the queue method go through paho's ``ack`` one by one.
    """
    if not hasattr(client, "_packet_queue"):
        for mid, qos in messages:
            client.ack(mid, qos)
        return
    blob = b"".join([_PUBACK_PACKET.pack(_PUBACK, 2, mid) for mid, qos in messages if qos == 1])
    if blob:
        client._packet_queue(_PUBACK, blob, 0, 1)
    for mid, qos in messages:
        if qos == 2:
            client.ack(mid, qos)
