"""A cell's partials outbox: closed quanta on disk until the root has journaled them.

The core appends a close's partials (:mod:`fiomon.partials`) here *before* it
hands the close to the quanta writer, so whatever the state file says was published is
already in the outbox: a cell ``kill -9``-ed between closing and sending sends on restart.
The publisher (:func:`publish_partials`, its own task and MQTT connection to the root's
broker) sends from its send position on, which advances on each PUBACK (so sending does
not wait for the root); a message leaves the outbox only once the *root* acknowledged it
(issue 24): the root publishes, retained on ``<prefix>/v1/_partials_ack/<cell>``, the
``next_seq`` below which it has journaled every message of this cell
(:mod:`fiomon.root.delivery`). A broker that PUBACKs and then loses the messages (killed
before it saved its sessions, or with no subscriber yet) loses nothing: the cell rewinds
its send position to the root-acknowledged one and resends when the acknowledgement names
a ``gap``, when it made no progress for a while although messages were sent
(:data:`RESEND_FIRST_S`, doubling to :data:`RESEND_MAX_S`, reset on progress), and on
every reconnection. Repeats are harmless: the root merges each ``(cell, quantum, scope,
host, direction)`` once. While the root has not acknowledged, at most
:data:`WINDOW_BYTES` are sent ahead of its position (a resend costs no more than that).

Until a root has acknowledged this outbox once (a root of an earlier version never does),
or while its acknowledgements say more than this outbox ever numbered (the cell's state
was lost, or two cells share a name: warned once), the broker's PUBACK trims, as before.

File ``<state_dir>/partials.outbox``: records of ``u32 length + payload``;
``partials.acked``: ``<byte offset> <next seq> [root]`` of the first message not
acknowledged (``root``: by the root), replaced atomically (at most every
:data:`ACK_EVERY_S`, and at close). The outbox is emptied when everything in it is
acknowledged and it has grown past :data:`COMPACT_BYTES`. Single-threaded: the core and
the publisher share one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

import aiomqtt

from fiomon.bins import BinLayout
from fiomon.config import PartialsConfig
from fiomon.model import LatencyKind
from fiomon.mqtt import Backoff, MqttSession, PublishRefusedError, Topics
from fiomon.partials import PartialRow, encode, split
from fiomon.runtime import GRACE_S, cancel_and_wait, wait_event

log = logging.getLogger("fiomon.aggregator")

COMPACT_BYTES = 4 * 1024 * 1024
ACK_EVERY_S = 1.0
MAX_BACKLOG_BYTES = 1 << 30  # beyond this the oldest unacknowledged partials are dropped
WINDOW_BYTES = 8 * 1024 * 1024  # sent ahead of the root's acknowledgement, at most
RESEND_FIRST_S = 3.0  # no acknowledgement progress this long after sending: resend
RESEND_MAX_S = 60.0  # (doubling up to this)
_LEN = struct.Struct("<I")


def parse_ack(payload: bytes) -> tuple[int, tuple[int, int] | None] | None:
    """``(next_seq, gap)`` of the root's acknowledgement, or None if it is not one."""
    try:
        d = json.loads(payload)
        n = d["next_seq"]
        gap = d.get("gap")
        if type(n) is not int or n < 0:
            return None
        if gap is None:
            return n, None
        lo, hi = gap
        if type(lo) is not int or type(hi) is not int or not n <= lo <= hi:
            return None
        return n, (lo, hi)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None


class Outbox:
    """Partials waiting for the root, durable in ``folder``.

    Args:
        folder: the aggregator's state directory.
        cell: this cell's name.
        max_message_bytes: a close bigger than this is split into several messages.
        problems: called with ``(kind, text)`` for disk problems (counted by the core).
        clock: monotonic seconds (the resend timer; injected by tests).
        latency: the latency kind of the rows (the aggregator's ``latency``), in every
            message.
    """

    def __init__(
        self,
        folder: Path,
        cell: str,
        max_message_bytes: int,
        problems: Callable[[str, str], None],
        clock: Callable[[], float] = time.monotonic,
        *,
        latency: LatencyKind = "clat",
    ) -> None:
        self.cell = cell
        self.latency: LatencyKind = latency
        self.max_message_bytes = max_message_bytes
        self.problems = problems
        self.clock = clock
        self.path = folder / "partials.outbox"
        self.ack_path = folder / "partials.acked"
        self.wake = asyncio.Event()
        self.dropped = 0  # messages dropped unacknowledged (backlog bound)
        self.sent = 0
        self.resent = 0  # messages sent again (after a rewind)
        self.refused = 0  # publishes the root's broker acknowledged as not delivered (ACL)
        self.rewinds = 0
        self._acked_at = 0
        self._next_seq = 0
        self._ack_written = 0.0
        self.root_acks = False  # a root acknowledged this outbox (persisted)
        self._foreign = False  # the root's acknowledgement is beyond our numbers
        self._resend_s = RESEND_FIRST_S
        self._progress_at = clock()  # last acknowledgement progress, rewind or first send
        self._gap_done: int | None = None  # the gap a rewind answered already
        self._read_ack()
        self._file = self.path.open("ab+")
        self._end = self._recover()
        self._send_at = self._acked_at  # the publisher's position (from acked on)
        self._send_seq = self._acked_seq
        self._sent_top = self._acked_seq  # numbers below this were sent in this run
        if self._end > self._acked_at:
            log.info(
                "partials outbox: %d bytes not acknowledged by the root: resending",
                self._end - self._acked_at,
            )
            self.wake.set()

    def _read_ack(self) -> None:
        self._acked_seq = 0
        try:
            at, seq, *mode = self.ack_path.read_text().split()
            self._acked_at, self._acked_seq = int(at), int(seq)
            self.root_acks = mode == ["root"]
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

    @property
    def broker_trims(self) -> bool:
        """The broker's PUBACK trims (no root acknowledged yet, or its word is foreign)."""
        return not self.root_acks or self._foreign

    def add(self, layout: BinLayout, closed_through_ms: int, rows: list[PartialRow]) -> None:
        """Append one close's rows (and the closed marker) as one or more messages."""
        msgs = split(
            cell=self.cell,
            first_seq=self._next_seq,
            layout=layout,
            closed_through_ms=closed_through_ms,
            rows=rows,
            max_bytes=self.max_message_bytes,
            latency=self.latency,
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
        if self._end - self._acked_at > MAX_BACKLOG_BYTES:
            self._drop_oldest()
        self.wake.set()

    def _drop_oldest(self) -> None:
        """Drop unacknowledged messages until the backlog fits (the root is long gone)."""
        at, seq = self._acked_at, self._acked_seq
        while self._end - at > MAX_BACKLOG_BYTES // 2 and at < self._end:
            at = self._record_end(at)
            seq += 1
            self.dropped += 1
        log.error(
            "partials outbox over %d bytes not acknowledged by the root: dropped the oldest "
            "(%d messages so far)",
            MAX_BACKLOG_BYTES,
            self.dropped,
        )
        self._set_acked(at, seq)

    def _record_end(self, at: int) -> int:
        """The offset after the record starting at ``at``."""
        self._file.seek(at)
        n: int = _LEN.unpack(self._file.read(_LEN.size))[0]
        return at + _LEN.size + n

    def peek(self) -> tuple[int, bytes] | None:
        """The next message to send as ``(offset after it, payload)``, or None.

        None too while :data:`WINDOW_BYTES` are sent and not acknowledged by the root.
        """
        if self._send_at >= self._end:
            return None
        if not self.broker_trims and self._send_at - self._acked_at >= WINDOW_BYTES:
            return None
        self._file.seek(self._send_at)
        (n,) = _LEN.unpack(self._file.read(_LEN.size))
        return self._send_at + _LEN.size + n, self._file.read(n)

    def ack(self, after: int) -> None:
        """The message ending at ``after`` reached the root's broker (its PUBACK).

        The send position moves past it; with :attr:`broker_trims` the message leaves the
        outbox too. A PUBACK of a message not at the send position (dropped, acknowledged
        by the root, or rewound over while its publish was in flight) is ignored.
        """
        if after <= self._send_at or self._record_end(self._send_at) != after:
            return
        if self._send_seq == self._acked_seq:
            self._progress_at = self.clock()  # the resend timer runs from the first send
        self._send_at = after
        self._send_seq += 1
        if self._send_seq <= self._sent_top:
            self.resent += 1
        else:
            self.sent += 1
            self._sent_top = self._send_seq
        if self.broker_trims:
            self._set_acked(self._send_at, self._send_seq)

    def root_ack(self, next_seq: int, gap: tuple[int, int] | None) -> None:
        """The root journaled every message numbered below ``next_seq``; ``gap``: resend."""
        if next_seq > self._next_seq:
            if not self._foreign:
                log.warning(
                    "partials: the root acknowledges messages up to %d, but this outbox "
                    "numbered only %d: this cell's state was lost, or another cell sends "
                    "as %r; the broker's acknowledgements trim the outbox until the root's "
                    "make sense again",
                    next_seq,
                    self._next_seq,
                    self.cell,
                )
                self._foreign = True
            return
        if self._foreign:
            log.info("partials: the root's acknowledgements make sense again (%d)", next_seq)
            self._foreign = False
        if not self.root_acks:
            self.root_acks = True
            self._ack_written = 0.0  # say so on disk at once
        if next_seq > self._acked_seq:
            at, seq = self._acked_at, self._acked_seq
            while seq < next_seq and at < self._end:
                at = self._record_end(at)
                seq += 1
            self._resend_s = RESEND_FIRST_S
            self._progress_at = self.clock()
            self._set_acked(at, seq)
            self.wake.set()  # the window moved
        elif self._ack_written == 0.0:
            self._write_ack()
            self._ack_written = time.monotonic()
        if gap is not None and gap[0] != self._gap_done and self._send_seq > next_seq:
            self._gap_done = gap[0]
            log.info("partials: the root misses messages %d..%d: resending", *gap)
            self.rewind()

    def _set_acked(self, at: int, seq: int) -> None:
        """Move the acknowledged position (messages before it leave the outbox)."""
        self._acked_at, self._acked_seq = at, seq
        if self._send_at < at:
            self._send_at, self._send_seq = at, seq
        if at >= self._end and self._end > COMPACT_BYTES:
            # The position first: dying between the two resends what was acknowledged
            # (harmless), never points past the file.
            self._acked_at = self._send_at = 0
            self._write_ack()
            self._file.truncate(0)
            self._end = 0
        now = time.monotonic()
        if self._acked_at == 0 or now - self._ack_written >= ACK_EVERY_S:
            self._write_ack()
            self._ack_written = now

    def rewind(self) -> None:
        """Send again from the root-acknowledged position (no-op while the broker trims)."""
        if self.broker_trims or self._send_at == self._acked_at:
            return
        self._send_at, self._send_seq = self._acked_at, self._acked_seq
        self._progress_at = self.clock()
        self.rewinds += 1
        self.wake.set()

    def check(self) -> None:
        """Resend if sent messages saw no acknowledgement progress for a while."""
        if self.broker_trims or self._send_seq == self._acked_seq:
            return
        if self.clock() - self._progress_at < self._resend_s:
            return
        log.info(
            "partials: no acknowledgement from the root for %.0f s (%d messages sent since "
            "%d): resending",
            self._resend_s,
            self._send_seq - self._acked_seq,
            self._acked_seq,
        )
        self._resend_s = min(RESEND_MAX_S, 2 * self._resend_s)
        self.rewind()

    def _write_ack(self) -> None:
        tmp = self.ack_path.with_suffix(".tmp")
        mode = " root" if self.root_acks else ""
        try:
            tmp.write_text(f"{self._acked_at} {self._acked_seq}{mode}\n")
            tmp.replace(self.ack_path)
        except OSError as exc:
            self.problems("partials-ack", f"{self.ack_path}: {exc}")

    @property
    def backlog_bytes(self) -> int:
        """Bytes in the outbox not yet acknowledged (by the root, once it does)."""
        return self._end - self._acked_at

    @property
    def backlog_messages(self) -> int:
        """Messages in the outbox not yet acknowledged (by the root, once it does)."""
        return self._next_seq - self._acked_seq

    @property
    def unsent_bytes(self) -> int:
        """Bytes not yet sent (PUBACKed) since the last rewind."""
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
    topics = Topics(cfg.topic_prefix)
    topic = topics.partials(cfg.cell)
    ack_topic = topics.partials_ack(cfg.cell)
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

    async def read_acks() -> None:
        """The root's acknowledgements (retained: the last one comes on subscribing)."""
        bad = 0
        async for batch in session.batches(asyncio.Event()):
            for m in batch:
                got = parse_ack(bytes(m.payload))
                if got is None:
                    bad += 1
                    say = log.warning if bad % 100 == 1 else log.debug
                    say("partials: not an acknowledgement on %s: %r", ack_topic, m.payload)
                    continue
                outbox.root_ack(*got)

    async def connected() -> None:
        log.info("partials: connected to %s:%d", cfg.broker.host, cfg.broker.port)
        await session.subscribe(ack_topic)
        # What the last connection sent may be lost with the root's broker: from the
        # root's word on (its retained acknowledgement may move it on at once).
        outbox.rewind()
        reader = asyncio.create_task(read_acks(), name="fiomon.partials.acks")
        try:
            while not finished():
                if reader.done():
                    reader.result()  # the connection ended (raises), or a bug
                    return
                outbox.check()
                nxt = outbox.peek()
                if nxt is None:
                    outbox.wake.clear()
                    await wait_event(outbox.wake, 0.2)
                    continue
                after, payload = nxt
                await session.publish_checked(topic, payload)  # returns on a successful PUBACK
                outbox.ack(after)
        finally:
            await cancel_and_wait(reader)

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
            "partials: %d bytes not acknowledged by the root: they go again at the next start",
            outbox.backlog_bytes,
        )
