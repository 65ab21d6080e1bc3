"""The MQTT session: one aiomqtt client and all fiomon does with it beyond aiomqtt's API.

aiomqtt 2.5's client is reusable, not re-entrant, and must be created inside the running
loop; each ``async with`` connects once. It has no public manual
acknowledgement (aiomqtt #345), ignores an MQTT 5 PUBACK's reason code, keeps its
incoming queue private and leaves reconnecting to the caller. :class:`MqttSession` adds
those, and is the one place that reaches past aiomqtt's public API (each reach carries
its why-comment); aiomqtt 3 makes the acknowledgement public (``Client.puback``) and
raises ``NegativeAckError`` itself, and only this package would change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from fiomon.config import BrokerConfig
from fiomon.errors import ConfigError
from fiomon.mqtt._reader import BulkReader, ack_many, install
from fiomon.runtime import wait_event

# How long a persistent-session subscriber (aggregator, root) waits for its SUBACK.
# Mosquitto 2.0.11, resuming a session whose previous connection acknowledged messages,
# sends the whole queued backlog at once (measured: 4,000 of 4,000 queued messages with
# max_inflight_messages 100; a session never acknowledged gets 100). Our SUBACK comes
# after it, and paho read one packet per loop turn (before the bulk reader): with a
# minute of backlog (hundreds of MB) the default 10 s timeout expired, the aggregator
# reconnected, the broker sent it all again, and a restarted aggregator retried for two
# minutes (4.8 GB of RSS). So wait that long.
SUBSCRIBE_TIMEOUT_S = 120.0

BATCH_MESSAGES = 2000  # the most messages one batch takes from the queue
SESSION_TAKEN_OVER = 0x8E  # MQTT 5 DISCONNECT reason: another client took our client id


def read_password(broker: BrokerConfig) -> str | None:
    """The first line of the password file, or None.

    Raises:
        ConfigError: the file cannot be read.
    """
    if broker.password_file is None:
        return None
    try:
        text = broker.password_file.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"broker.password_file: cannot read {broker.password_file} ({exc.strerror or exc})"
        raise ConfigError([msg]) from exc
    return text.splitlines()[0] if text else ""


def new_client(
    broker: BrokerConfig,
    *,
    identifier: str,
    will: aiomqtt.Will | None = None,
    timeout_s: float = 10.0,
    persistent_session_s: int | None = None,
    receive_maximum: int | None = None,
    queue_type: type[asyncio.Queue[aiomqtt.Message]] | None = None,
    mqtt5: bool = False,
) -> aiomqtt.Client:
    """A client for ``broker`` (call inside the running event loop); see :class:`MqttSession`.

    Args:
        broker: where and how to connect.
        identifier: the MQTT client id.
        will: the Last Will, if any.
        timeout_s: connect/publish/subscribe timeout, seconds.
        persistent_session_s: ask for a persistent MQTT 5 session kept this long (seconds)
            while we are away (``clean_start=False`` plus a session expiry: aiomqtt's
            default clean-start option would discard the session on every reconnect).
        receive_maximum: with ``persistent_session_s``, the most QoS 1 messages the broker
            may send us unacknowledged (MQTT 5 Receive Maximum; the protocol's default is
            65,535: a broker without its own in-flight cap would send a resumed session's
            whole backlog at once).
        queue_type: the class of aiomqtt's incoming queue (aiomqtt makes one, once).
        mqtt5: speak MQTT 5 with a clean start (implied by ``persistent_session_s``): only
            MQTT 5 acknowledgements carry a reason code (:meth:`MqttSession.publish_checked`).

    Raises:
        ConfigError: the password file cannot be read.
    """
    extra: dict[str, Any] = {}
    if mqtt5:
        extra = {"protocol": aiomqtt.ProtocolVersion.V5}
    if persistent_session_s is not None:
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = persistent_session_s
        if receive_maximum is not None:
            props.ReceiveMaximum = receive_maximum
        extra = {
            "protocol": aiomqtt.ProtocolVersion.V5,
            "clean_start": False,
            "properties": props,
        }
    tls = None
    if broker.tls is not None:
        tls = aiomqtt.TLSParameters(
            ca_certs=str(broker.tls.ca_file) if broker.tls.ca_file else None,
            certfile=str(broker.tls.cert_file) if broker.tls.cert_file else None,
            keyfile=str(broker.tls.key_file) if broker.tls.key_file else None,
        )
    return aiomqtt.Client(
        broker.host,
        broker.port,
        identifier=identifier,
        username=broker.username,
        password=read_password(broker),
        will=will,
        keepalive=broker.keepalive_s,
        timeout=timeout_s,
        tls_params=tls,
        tls_insecure=broker.tls.insecure if broker.tls is not None else None,
        queue_type=queue_type,
        **extra,
    )


def guard_sockets(client: aiomqtt.Client) -> None:
    """Register paho's socket with the event loop only while the socket is still open.

    aiomqtt 2.5 hands every registration to the loop through ``call_soon_threadsafe``,
    even from the loop's own thread, and forgets the writer when the socket closes. So a
    packet queued (say the PUBACK of a message, or a publish) in the same loop turn in
    which paho then closes the socket (the broker hung up: a takeover of our client id,
    its shutdown) registered a writer for a descriptor already closed one callback
    later: epoll refuses it and asyncio logs ``OSError: [Errno 9] Bad file descriptor``
    with a traceback. Here a registration from the loop's thread takes effect at once
    (paho's order of register and unregister is kept), one from another thread (paho's
    connect runs in an executor) is dropped if the socket was closed meanwhile, and a
    closing socket leaves neither reader nor writer behind. The callbacks the loop runs
    are aiomqtt's own (``loop_read``/``loop_write``; an error ends the connection).
    """
    paho = client._client
    loop: asyncio.AbstractEventLoop = client._loop
    inner_close = paho.on_socket_close  # aiomqtt's: removes the reader, ends keep-alive

    def fail(exc: Exception) -> None:
        if not client._disconnected.done():
            client._disconnected.set_exception(exc)

    def read() -> None:
        try:
            while True:
                paho.loop_read()
                pending = getattr(paho._sock, "pending", None)  # TLS: decoded, not read
                if pending is None or pending() <= 0:
                    break
        except Exception as exc:  # aiomqtt's rule: the connection broke
            fail(exc)

    def write() -> None:
        try:
            paho.loop_write()
        except Exception as exc:
            fail(exc)

    def on_loop() -> bool:
        try:
            return asyncio.get_running_loop() is loop
        except RuntimeError:
            return False

    def soon(fn: Callable[[], None]) -> None:
        if on_loop():
            fn()
        else:
            loop.call_soon_threadsafe(fn)

    def on_open(c: object, userdata: object, sock: Any) -> None:
        del c, userdata

        def add() -> None:
            fd: int = sock.fileno()
            if fd >= 0 and paho._sock is sock:
                loop.add_reader(fd, read)
                # aiomqtt's keep-alive task (paho's loop_misc once a second)
                client._misc_task = loop.create_task(client._misc_loop())

        soon(add)

    def on_register_write(c: object, userdata: object, sock: Any) -> None:
        del c, userdata

        def add() -> None:
            fd: int = sock.fileno()
            if fd >= 0 and paho._sock is sock and paho._registered_write:
                loop.add_writer(fd, write)

        soon(add)

    def on_close(c: Any, userdata: Any, sock: Any) -> None:
        fd: int = sock.fileno()
        if fd >= 0:
            loop.remove_writer(fd)
        if inner_close is not None:
            inner_close(c, userdata, sock)

    paho.on_socket_open = on_open
    paho.on_socket_register_write = on_register_write
    paho.on_socket_close = on_close


def drop_stale(queue: asyncio.Queue[aiomqtt.Message], logger: logging.Logger) -> int:
    """Forget messages a previous connection left unhandled, before connecting again.

    Their packet ids belong to that connection: acknowledging one on the next connection
    (manual PUBACK) would acknowledge whichever message the broker sent there under the
    same id, one we may not have journaled yet. Never acknowledged, they are the broker's
    to redeliver (persistent session), so dropping them here loses nothing.

    Returns:
        how many were dropped (logged at info when any).
    """
    n = 0
    with contextlib.suppress(asyncio.QueueEmpty):
        while True:
            queue.get_nowait()
            n += 1
    if n:
        logger.info("%d messages of the previous connection left for the broker to redeliver", n)
    return n


class Backoff:
    """Capped exponential backoff with jitter (seconds), so agents do not reconnect in step.

    Args:
        base_s: first delay's upper bound, seconds.
        cap_s: largest delay, seconds.
        rng: random source (injected for tests).
    """

    def __init__(self, base_s: float = 0.5, cap_s: float = 30.0, rng: random.Random | None = None):
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0
        self._rng = rng or random.Random()  # noqa: S311 -- jitter, not cryptography

    def reset(self) -> None:
        """After a success: start from the base again."""
        self.attempt = 0

    def next(self) -> float:
        """The next delay, seconds: uniform in [b/2, b], b = min(cap, base * 2**attempt)."""
        bound = min(self.cap_s, self.base_s * 2**self.attempt)
        self.attempt = min(self.attempt + 1, 30)
        return self._rng.uniform(bound / 2, bound)


class PublishRefusedError(aiomqtt.MqttError):
    """The broker acknowledged a QoS 1 publish with a failure reason code (not delivered).

    Args:
        topic: the topic of the refused message.
        reason: the PUBACK's reason code, e.g. "Not authorized" (an ACL denial).
    """

    def __init__(self, topic: str, reason: str) -> None:
        super().__init__(f"the broker refused a publish on {topic}: {reason}")
        self.topic = topic
        self.reason = reason


class PubackCodes:
    """QoS 1 publishes that fail when the broker's PUBACK says they were not delivered.

    Mosquitto acknowledges a publish its ACL denies like any other; only an MQTT 5 PUBACK
    says so, with a reason code (0x87 "Not authorized"), and aiomqtt 2.5 ignores it (its
    ``publish`` neither returns the packet id nor looks at the code). This wraps the
    client's paho ``publish`` (to learn the packet id of each publish made through
    :meth:`publish`) and ``on_publish`` (to keep those ids' reason codes until read);
    other publishes on the client pass through untouched and leave nothing behind.

    The packet id is taken in the same synchronous step that starts the publish: aiomqtt's
    ``publish`` calls paho's before its first ``await`` (it would not if the client were
    made with ``max_concurrent_outgoing_calls``; fiomon never sets it), so publishes from
    several tasks cannot swap ids. Over MQTT 3.1.1 every PUBACK is a success.

    Args:
        client: the aiomqtt client (connected or not), wrapped once.
    """

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self._capture: list[int] | None = None  # the next paho publish's id goes here
        self._awaiting: set[int] = set()  # ids whose PUBACK code we keep
        self._codes: dict[int, ReasonCode] = {}
        paho = client._client
        inner_on_publish: Callable[..., None] | None = paho.on_publish  # aiomqtt's
        inner_publish: Callable[..., Any] = paho.publish

        def on_publish(c: object, u: object, mid: int, rc: ReasonCode, props: object) -> None:
            if mid in self._awaiting:
                self._codes[mid] = rc  # before aiomqtt wakes the publisher
            if inner_on_publish is not None:
                inner_on_publish(c, u, mid, rc, props)

        def publish(*args: Any, **kwargs: Any) -> Any:
            info = inner_publish(*args, **kwargs)
            if self._capture is not None:
                self._capture.append(info.mid)
                self._awaiting.add(info.mid)
                self._capture = None
            return info

        paho.on_publish = on_publish
        setattr(paho, "publish", publish)  # noqa: B010 -- an instance override of a method

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Publish with QoS 1 (``retain``: retained); returns once the broker took delivery.

        Raises:
            PublishRefusedError: the broker's PUBACK carried a failure reason code.
            aiomqtt.MqttError: the connection failed.
        """
        mids: list[int] = []
        self._capture = mids
        try:
            await self.client.publish(topic, payload, qos=1, retain=retain)
        finally:
            self._capture = None
            codes = [self._codes.pop(mid, None) for mid in mids]
            self._awaiting.difference_update(mids)
        rc = codes[0] if codes else None
        if rc is not None and rc.is_failure:
            raise PublishRefusedError(topic, str(rc))


def _never() -> bool:
    return False


class MqttSession:
    """One MQTT client, kept connected, with batches, manual ack and checked publish.

    Every publish and subscription is QoS 1. What the options add to aiomqtt's client:

    * ``manual_ack``: messages are acknowledged only by :meth:`ack` (the services journal
      first); before each connection the messages the previous one left unread are
      dropped, for the broker to redeliver (:func:`drop_stale`).
    * ``bulk_read``: paho reads through the bulk reader (``fiomon.mqtt._reader``: one
      ``recv`` for many packets; a third of the aggregator's CPU at 1000 messages/s).
    * ``max_unread``: while :meth:`batches` is consumed, reading pauses once this many
      (less one) messages wait unread (TCP pushes back on the broker): Mosquitto 2.0.11
      sends a resumed session's whole backlog regardless of Receive Maximum once we have
      acknowledged a message, which would otherwise all land in memory. Only while
      consumed: earlier, a pause would also hold the SUBACKs behind the messages.

    Made inside the running event loop. One task runs :meth:`run`; the others use the
    connection it keeps (publish, batches) while it is up.

    Args:
        broker: where and how to connect.
        identifier: the MQTT client id.
        logger: where connection errors are logged (at warning).
        label: prefix of those log lines (e.g. ``"partials: "``).
        will: the Last Will, if any.
        timeout_s: connect/publish/subscribe timeout, seconds.
        persistent_session_s: a persistent MQTT 5 session kept this long while we are
            away, seconds (the services: a restart receives what was queued meanwhile).
        receive_maximum: with ``persistent_session_s``, the most unacknowledged QoS 1
            messages the broker may send us (MQTT 5 Receive Maximum).
        mqtt5: MQTT 5 with a clean start (for :meth:`publish_checked`'s reason codes).
        manual_ack: acknowledge received messages only through :meth:`ack`.
        bulk_read: read through the bulk reader (``None`` from its install, on a paho
            without the privates it needs, falls back to paho's reader, logged).
        max_unread: see above; None: never pause reading.
        backoff: the reconnect delays (default: :class:`Backoff` ``(0.5, 30)``).

    Raises:
        ConfigError: the password file cannot be read.
    """

    def __init__(
        self,
        broker: BrokerConfig,
        *,
        identifier: str,
        logger: logging.Logger,
        label: str = "",
        will: aiomqtt.Will | None = None,
        timeout_s: float = 10.0,
        persistent_session_s: int | None = None,
        receive_maximum: int | None = None,
        mqtt5: bool = False,
        manual_ack: bool = False,
        bulk_read: bool = False,
        max_unread: int | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.broker = broker
        self.log = logger
        self.label = label
        self.identifier = identifier
        # The broker ended our last connection because another client connected with our
        # client id (MQTT 5 DISCONNECT, reason 0x8E "Session taken over"; over MQTT 3.1.1
        # the broker only closes the socket and nothing tells us why).
        self.taken_over = False
        self.takeovers = 0
        self.manual_ack = manual_ack
        self.backoff = backoff or Backoff()
        self.connected = False  # a connection is up (between CONNACK and its end)
        self._persistent = persistent_session_s is not None
        self._pubacks: PubackCodes | None = None  # made by the first checked publish
        self._refused = False  # the broker refused the last checked publish
        self._consumer: object = None  # the batches() being consumed, if any
        # aiomqtt 2.5 keeps its incoming queue private (Client._queue) but makes it, once,
        # from the class we pass: a class local to this session hands it to us. (It was a
        # class-level registry read as IncomingQueue.made[-1], right after make_client.)
        made: list[asyncio.Queue[aiomqtt.Message]] = []

        class _Queue(asyncio.Queue[aiomqtt.Message]):
            def __init__(self, maxsize: int = 0) -> None:
                super().__init__(maxsize)
                made.append(self)

        self.client = new_client(
            broker,
            identifier=identifier,
            will=will,
            timeout_s=timeout_s,
            persistent_session_s=persistent_session_s,
            receive_maximum=receive_maximum,
            queue_type=_Queue,
            mqtt5=mqtt5,
        )
        (self._queue,) = made
        guard_sockets(self.client)
        paho = self.client._client
        inner_disconnect: Any = paho.on_disconnect  # aiomqtt's
        inner_handle: Callable[[], Any] | None = getattr(paho, "_handle_disconnect", None)
        said: list[int] = []  # the reason of the broker's DISCONNECT on this connection

        def handle_disconnect() -> Any:
            # paho 2.2 reads a DISCONNECT's reason code only when properties follow it
            # (remaining length > 2); Mosquitto's takeover notice is the code alone.
            pkt = paho._in_packet
            if pkt.get("remaining_length", 0) >= 1:
                said.append(pkt["packet"][0])
            assert inner_handle is not None  # noqa: S101 -- installed only when present
            return inner_handle()

        def on_disconnect(c: Any, u: Any, flags: Any, rc: Any, props: Any = None) -> None:
            if SESSION_TAKEN_OVER in (getattr(rc, "value", None), *said):
                self.taken_over = True
                self.takeovers += 1
            said.clear()
            if inner_disconnect is not None:
                inner_disconnect(c, u, flags, rc, props)

        paho.on_disconnect = on_disconnect
        if inner_handle is not None:
            target: Any = paho
            target._handle_disconnect = handle_disconnect
        if manual_ack:
            # aiomqtt 2.5 has no manual-ack API (aiomqtt #345): paho's own
            # switch on its client (a public paho method on aiomqtt's private client).
            paho.manual_ack_set(True)
        self._hold_at = max(1, max_unread - 1) if max_unread is not None else 0
        # (one less: the consumer may be taking one out of the queue as the reader reads)
        self.reader: BulkReader | None = None  # its counters are for tests
        if bulk_read:
            self.reader = install(paho, hold=self._hold if max_unread is not None else None)

    # -- the connection ------------------------------------------------------------------

    async def run(
        self,
        body: Callable[[], Awaitable[bool | None]],
        *,
        until: Callable[[], bool] = _never,
        wake: asyncio.Event | None = None,
        failed: Callable[[aiomqtt.MqttError], None] | None = None,
        down: Callable[[], None] | None = None,
    ) -> None:
        """Connect and run ``body`` on the connection; after an error, reconnect (backoff).

        Each round: (manual ack) the previous connection's unread messages are dropped;
        the client connects; the backoff restarts from its base, unless the broker
        refused the last checked publish (a refusing broker is retried at the growing
        delays, up to the cap); ``body()`` runs; the connection closes. An
        :class:`aiomqtt.MqttError` (connecting, or from ``body``) ends the round: logged
        at warning (a :class:`PublishRefusedError` is not: the caller knows what it
        refused) and passed to ``failed``. ``down()`` runs after every round, connected
        or not. Other exceptions propagate (without ``down``).

        Returns when ``until()`` is true before or after a round, or when ``body``
        returns True (its work is done). Otherwise it waits ``backoff.next()`` seconds,
        cut short when ``wake`` is set (one already set does not cut it: a loop that
        goes on after ``stop`` still paces its attempts), and goes again.
        """
        while not until():
            if self.manual_ack:
                self.drop_stale()
            done = False
            was_taken = self.taken_over
            self.taken_over = False
            try:
                async with self.client:
                    self.connected = True
                    if not (self._refused or was_taken):
                        # (two clients taking one id from each other would otherwise
                        # take turns at the base delay, forever)
                        self.backoff.reset()
                    done = bool(await body())
            except aiomqtt.MqttError as exc:
                b = self.broker
                if self.taken_over:
                    self.log.warning(
                        "%sbroker %s:%d: our MQTT client id %r is in use by another "
                        "connection: the broker handed our session to it (MQTT 5 'Session "
                        "taken over', %d times so far); reconnecting takes it back, so "
                        "the two take turns: give each client its own client id",
                        self.label,
                        b.host,
                        b.port,
                        self.identifier,
                        self.takeovers,
                    )
                elif not isinstance(exc, PublishRefusedError):
                    self.log.warning("%sbroker %s:%d: %s", self.label, b.host, b.port, exc)
                if failed is not None:
                    failed(exc)
            finally:
                self.connected = False
                self._consumer = None  # a batches() left unfinished holds nothing back
            if down is not None:
                down()
            if done or until():
                return
            delay = self.backoff.next()
            if wake is None or wake.is_set():
                await asyncio.sleep(delay)
            else:
                await wait_event(wake, delay)

    async def subscribe(self, topic_filter: str, *, timeout_s: float | None = None) -> None:
        """Subscribe with QoS 1 (on the connection :meth:`run` keeps).

        Args:
            topic_filter: e.g. :attr:`fiomon.topics.Topics.all_records`.
            timeout_s: for the SUBACK, seconds; None: :data:`SUBSCRIBE_TIMEOUT_S` on a
                persistent session (a resumed backlog comes first), else the client's.

        Raises:
            aiomqtt.MqttError: no SUBACK in time, or the connection failed.
        """
        if timeout_s is None and self._persistent:
            timeout_s = SUBSCRIBE_TIMEOUT_S
        await self.client.subscribe(topic_filter, qos=1, timeout=timeout_s)

    # -- sending -------------------------------------------------------------------------

    async def publish(
        self, topic: str, payload: bytes, *, retain: bool = False, timeout_s: float | None = None
    ) -> None:
        """Publish with QoS 1; returns once the broker acknowledged it (any reason code).

        Args:
            topic: where.
            payload: what.
            retain: ask the broker to retain it.
            timeout_s: for the PUBACK, seconds; None: the client's timeout.

        Raises:
            aiomqtt.MqttError: the connection failed or the PUBACK did not come in time.
        """
        await self.client.publish(topic, payload, qos=1, retain=retain, timeout=timeout_s)

    async def publish_checked(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """Publish with QoS 1 (``retain``: retained); returns once the broker took *delivery*.

        Needs an MQTT 5 session (``mqtt5`` or ``persistent_session_s``) for the broker to
        say no; over MQTT 3.1.1 it is :meth:`publish`.

        Raises:
            PublishRefusedError: the PUBACK carried a failure reason code (e.g. an ACL
                denial, "Not authorized"); :meth:`run` then keeps the backoff growing.
            aiomqtt.MqttError: the connection failed.
        """
        if self._pubacks is None:
            self._pubacks = PubackCodes(self.client)
        try:
            await self._pubacks.publish(topic, payload, retain=retain)
        except PublishRefusedError:
            self._refused = True
            raise
        self._refused = False

    # -- receiving -----------------------------------------------------------------------

    @property
    def unread(self) -> int:
        """Messages received and not yet taken by :meth:`batches`."""
        return self._queue.qsize()

    async def batches(
        self, stop: asyncio.Event, *, max_messages: int = BATCH_MESSAGES
    ) -> AsyncGenerator[list[aiomqtt.Message], None]:
        """Received messages in batches: one awaited, then whatever else already waits.

        Ends when ``stop`` is set. With ``manual_ack`` nothing is acknowledged until
        :meth:`ack`: at most ``receive_maximum`` messages wait unacknowledged.

        Args:
            stop: ends the iteration (the message being awaited stays queued).
            max_messages: the most messages in one batch.

        Raises:
            aiomqtt.MqttError: the connection was lost (:meth:`run` reconnects).
        """
        token = object()
        self._consumer = token
        it = self.client.messages.__aiter__()
        stopper = asyncio.ensure_future(stop.wait())
        nxt: asyncio.Future[aiomqtt.Message] | None = None
        try:
            while True:
                nxt = asyncio.ensure_future(it.__anext__())
                done, _ = await asyncio.wait({nxt, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if nxt not in done:
                    nxt.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await nxt
                    return
                batch = [nxt.result()]
                with contextlib.suppress(asyncio.QueueEmpty):
                    while len(batch) < max_messages:
                        batch.append(self._queue.get_nowait())
                yield batch
        finally:
            # (the consumer stays set until the round ends, in run(): the stop sequence
            # keeps the connection up a while, and the reader must stay held meanwhile)
            stopper.cancel()
            if nxt is not None:
                # The consumer was cancelled while waiting: nothing is left reading (a
                # message it got is never acknowledged: the broker's to redeliver), and a
                # lost connection's error is not left unretrieved.
                nxt.cancel()
                if nxt.done() and not nxt.cancelled():
                    nxt.exception()

    def ack(self, batch: Sequence[aiomqtt.Message]) -> None:
        """Acknowledge ``batch`` (its QoS 1 messages, in order) with one socket write.

        Call it once what the batch carries is durable (journaled), on the connection it
        came from: the broker then forgets exactly these messages; anything not
        acknowledged comes again on the next connection of this persistent session.
        Reading goes on if ``max_unread`` had paused it.

        Raises:
            RuntimeError: the session was made without ``manual_ack`` (paho acknowledges
                itself; acknowledging again would acknowledge other messages).
        """
        if not self.manual_ack:
            msg = "MqttSession.ack needs manual_ack=True"
            raise RuntimeError(msg)
        ack_many(self.client._client, [(m.mid, m.qos) for m in batch if m.qos > 0])
        if self.reader is not None:
            self.reader.resume()

    def drop_stale(self) -> int:
        """Drop what the previous connection left unread (:func:`drop_stale`); how many.

        :meth:`run` calls it before each connection of a ``manual_ack`` session.
        """
        return drop_stale(self._queue, self.log)

    def _hold(self) -> bool:
        """The bulk reader's pause: consumed, and ``max_unread`` (less one) wait unread."""
        return self._consumer is not None and self._queue.qsize() >= self._hold_at
