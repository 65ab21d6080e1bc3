"""A cell's partials outbox: closed quanta on disk before they count as published.

The core appends a close's partials (:mod:`fiomon.partials`) here *before* it
hands the close to the quanta writer, so whatever the state file says was published is
already in the outbox: a cell ``kill -9``-ed between closing and sending sends on restart.
The publisher (:func:`publish_partials`, its own task and MQTT connection to the root's
broker) sends from the last acknowledged message on; a message counts as acknowledged
once the root's broker returned its PUBACK. Repeats after a restart are harmless: the
root merges each ``(cell, quantum, scope, host, direction)`` once.

File ``<state_dir>/partials.outbox``: records of ``u32 length + payload``;
``partials.acked``: ``<byte offset> <next seq>`` of the first unacknowledged message,
replaced atomically (at most every :data:`ACK_EVERY_S`, and at close). The outbox is
emptied when everything in it is acknowledged and it has grown past
:data:`COMPACT_BYTES`. Single-threaded: the core and the publisher share one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

import aiomqtt

from fiomon.bins import BinLayout
from fiomon.config import PartialsConfig
from fiomon.mqtt import Backoff, MqttSession, PublishRefusedError, Topics
from fiomon.partials import PartialRow, encode, split
from fiomon.runtime import GRACE_S, wait_event

log = logging.getLogger("fiomon.aggregator")

COMPACT_BYTES = 4 * 1024 * 1024
ACK_EVERY_S = 1.0
MAX_BACKLOG_BYTES = 1 << 30  # beyond this the oldest unsent partials are dropped (counted)
_LEN = struct.Struct("<I")


class Outbox:
    """Partials waiting for the root's broker, durable in ``folder``.

    Args:
        folder: the aggregator's state directory.
        cell: this cell's name.
        max_message_bytes: a close bigger than this is split into several messages.
        problems: called with ``(kind, text)`` for disk problems (counted by the core).
    """

    def __init__(
        self,
        folder: Path,
        cell: str,
        max_message_bytes: int,
        problems: Callable[[str, str], None],
    ) -> None:
        self.cell = cell
        self.max_message_bytes = max_message_bytes
        self.problems = problems
        self.path = folder / "partials.outbox"
        self.ack_path = folder / "partials.acked"
        self.wake = asyncio.Event()
        self.dropped = 0  # messages dropped unsent (backlog bound)
        self.sent = 0
        self.refused = 0  # publishes the root's broker acknowledged as not delivered (ACL)
        self._acked_at = 0
        self._next_seq = 0
        self._ack_written = 0.0
        self._read_ack()
        self._file = self.path.open("ab+")
        self._end = self._recover()
        self._send_at = self._acked_at  # the publisher's position (from acked on)
        self._send_seq = self._acked_seq
        if self._end > self._acked_at:
            log.info(
                "partials outbox: %d bytes not acknowledged by the root's broker: resending",
                self._end - self._acked_at,
            )
            self.wake.set()

    def _read_ack(self) -> None:
        self._acked_seq = 0
        try:
            at, seq = self.ack_path.read_text().split()
            self._acked_at, self._acked_seq = int(at), int(seq)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # Resending from the start is safe (the root drops repeats).
            self.problems("partials-ack", f"{self.ack_path}: {exc}; resending the outbox")
            self._acked_at = 0

    def _recover(self) -> int:
        """Walk the records after the acked offset; cut a torn last one; count seqs."""
        self._file.seek(0, os.SEEK_END)
        size = self._file.tell()
        if self._acked_at > size:
            self.problems("partials-ack", f"{self.ack_path} points past the outbox: resending")
            self._acked_at = 0
        at = self._acked_at
        seq = self._acked_seq
        self._file.seek(at)
        while at + _LEN.size <= size:
            (n,) = _LEN.unpack(self._file.read(_LEN.size))
            if at + _LEN.size + n > size:
                break
            self._file.seek(n, os.SEEK_CUR)
            at += _LEN.size + n
            seq += 1
        if at < size:
            log.warning("partials outbox: cut a torn last record (%d bytes)", size - at)
            self._file.truncate(at)
        self._next_seq = seq
        return at

    def add(self, layout: BinLayout, closed_through_ms: int, rows: list[PartialRow]) -> None:
        """Append one close's rows (and the closed marker) as one or more messages."""
        msgs = split(
            cell=self.cell,
            first_seq=self._next_seq,
            layout=layout,
            closed_through_ms=closed_through_ms,
            rows=rows,
            max_bytes=self.max_message_bytes,
        )
        blob = b"".join(_LEN.pack(len(p)) + p for p in map(encode, msgs))
        try:
            self._file.seek(0, os.SEEK_END)
            self._file.write(blob)
            self._file.flush()
        except OSError as exc:
            self.problems("partials-outbox", f"{self.path}: {exc}")
            return
        self._end += len(blob)
        self._next_seq += len(msgs)
        if self._end - self._send_at > MAX_BACKLOG_BYTES:
            self._drop_oldest()
        self.wake.set()

    def _drop_oldest(self) -> None:
        """Skip unsent messages until the backlog fits (the root's broker is long gone)."""
        while self._end - self._send_at > MAX_BACKLOG_BYTES // 2:
            nxt = self.peek()
            if nxt is None:
                break
            self._advance(nxt[0])
            self.dropped += 1
        log.error("partials outbox over %d bytes: dropped the oldest", MAX_BACKLOG_BYTES)

    def peek(self) -> tuple[int, bytes] | None:
        """The next message to send as ``(offset after it, payload)``, or None."""
        if self._send_at >= self._end:
            return None
        self._file.seek(self._send_at)
        (n,) = _LEN.unpack(self._file.read(_LEN.size))
        return self._send_at + _LEN.size + n, self._file.read(n)

    def ack(self, after: int) -> None:
        """The message ending at ``after`` reached the root's broker.

        An acknowledgement of a message already skipped (dropped while its publish was in
        flight) is ignored: the position never moves back.
        """
        if after <= self._send_at:
            return
        self._advance(after)
        self.sent += 1

    def _advance(self, after: int) -> None:
        """Move the send position past the message ending at ``after`` (sent or dropped)."""
        self._send_at = after
        self._send_seq += 1
        if self._send_at >= self._end and self._end > COMPACT_BYTES:
            # The position first: dying between the two resends what was acknowledged
            # (harmless), never points past the file.
            self._send_at = 0
            self._write_ack()
            self._file.truncate(0)
            self._end = 0
        now = time.monotonic()
        if self._send_at == 0 or now - self._ack_written >= ACK_EVERY_S:
            self._write_ack()
            self._ack_written = now

    def _write_ack(self) -> None:
        tmp = self.ack_path.with_suffix(".tmp")
        try:
            tmp.write_text(f"{self._send_at} {self._send_seq}\n")
            tmp.replace(self.ack_path)
        except OSError as exc:
            self.problems("partials-ack", f"{self.ack_path}: {exc}")

    @property
    def backlog_bytes(self) -> int:
        """Bytes in the outbox not yet acknowledged."""
        return self._end - self._send_at

    def close(self) -> None:
        """Save the acknowledged position and close the file."""
        self._write_ack()
        with contextlib.suppress(OSError):
            self._file.close()


async def publish_partials(
    cfg: PartialsConfig,
    outbox: Outbox,
    stop: asyncio.Event,
    *,
    closed: asyncio.Event | None = None,
    grace_s: float = GRACE_S,
) -> None:
    """Send the outbox to the root's broker until ``stop``; reconnect on errors.

    ``closed``: after ``stop``, wait for it (the final close is in the outbox) and send
    what is left, for at most ``grace_s``; without it, stop at once (the rest waits in
    the outbox for the next start).
    """
    topic = Topics(cfg.topic_prefix).partials(cfg.cell)
    # MQTT 5: a broker's ACL denial comes back as a PUBACK reason code, not a silent ack;
    # a refusing broker is retried at the backoff's growing delays (MqttSession.run).
    session = MqttSession(
        cfg.broker,
        identifier=cfg.client_id,
        logger=log,
        label="partials: ",
        mqtt5=True,
        backoff=Backoff(base_s=0.25, cap_s=5.0),
    )
    loop = asyncio.get_running_loop()
    deadline: float | None = None

    def finished() -> bool:
        nonlocal deadline
        if not stop.is_set():
            return False
        if closed is None:
            return True
        if deadline is None:
            deadline = loop.time() + grace_s
        return loop.time() > deadline or (closed.is_set() and outbox.peek() is None)

    async def connected() -> None:
        log.info("partials: connected to %s:%d", cfg.broker.host, cfg.broker.port)
        while not finished():
            nxt = outbox.peek()
            if nxt is None:
                outbox.wake.clear()
                await wait_event(outbox.wake, 0.2)
                continue
            after, payload = nxt
            await session.publish_checked(topic, payload)  # returns on a successful PUBACK
            outbox.ack(after)

    def failed(exc: aiomqtt.MqttError) -> None:
        if not isinstance(exc, PublishRefusedError):
            return  # logged by the session
        # Kept in the outbox and retried: an ACL fixed on the root's broker lets it go.
        outbox.refused += 1
        say = log.error if outbox.refused % 60 == 1 else log.debug
        say(
            "partials: %s:%d refused the partials (%s): the root's broker must let user "
            "%s publish on %s (deploy/README.md, section 7); kept in the outbox, retrying",
            cfg.broker.host,
            cfg.broker.port,
            exc.reason,
            cfg.broker.username or "(anonymous)",
            topic,
        )

    await session.run(connected, until=finished, failed=failed)
    if outbox.backlog_bytes:
        log.warning(
            "partials: %d bytes not sent to the root's broker: they go at the next start",
            outbox.backlog_bytes,
        )
