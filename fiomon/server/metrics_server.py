"""``/metrics`` served by a child process, outside the aggregator's interpreter lock.

The aggregator binds the listening socket itself, so a bad address or a port in use fails
its start as before, and hands the socket to a child process (``python -m
fiomon.server.metrics_server``) together with one pipe. Each new snapshot goes down the pipe,
pickled (about 10 ms of C for 1000 hosts). The child renders each snapshot into the text
format once (about 150 ms of Python for 1000 hosts): as it arrives if the previous one
was scraped, else on the first scrape that asks; it gzips it once and serves those bytes
to every scrape until the next one. So rendering and every request's HTTP work (about
0.1 ms of Python each, with keep-alive) run in the child: a scrape storm costs the
aggregator's intake nothing but CPU the kernel may give elsewhere, and the child runs at
a lower priority (``nice`` 10), so when both want the CPU, intake wins.

The child lives and dies with the aggregator. It stops at the pipe's end of file (the
aggregator stopped or died, ``kill -9`` included) and on Linux the kernel also kills it
when its parent dies (``PR_SET_PDEATHSIG``); it ignores SIGTERM and SIGINT, which a
service manager or a terminal sends to the whole group, so that it outlives its parent's
orderly stop by a moment and is never taken for dead meanwhile. A child that dies is
restarted (after 1 s, backing off to 30 s while it keeps dying), counted in
``fiomon_metrics_server_restarts_total`` and logged; connections wait in the listen
backlog meanwhile, as they did while a scrape thread was busy.

HTTP: ``GET /metrics`` (or ``/``) gets the text format,
gzip-encoded when the request's ``Accept-Encoding`` names gzip. The service's own
``process_*`` families (CPU, resident and virtual memory, start time, open and maximum
descriptors: ``prometheus_client``'s :class:`~prometheus_client.ProcessCollector` read
from the aggregator's ``/proc/<pid>``, not this child's;
:class:`~fiomon.procstats.ServiceProcessCollector` keeps it working under the units'
``ProcSubset=pid``) are read at every scrape and
appended to the cached rendering (to its gzip stream too: the compressor's state after
the cached part is kept, so a scrape compresses only the few hundred bytes it adds).
``GET /-/healthy`` is 200 while this process serves and the aggregator lives;
``GET /-/ready`` is 200 once the aggregator (or root) has restored its state and is
connected and subscribed on the broker, else 503 with the reason in the body
(Prometheus' own conventions). The live page
(:mod:`fiomon.server.live`) is served here too, from bytes made once: ``/`` when the request
accepts ``text/html`` (a browser; scrapers and curl keep getting the metrics), and
``/live``; ``GET /api/v1/quanta?since=MS`` joins the stored JSON of recent quanta
(``&revised=N``: and of older quanta revised since; :mod:`fiomon.server.live`).
Keep-alive as HTTP/1.1 and 1.0 define it; other paths 404, other methods 501, malformed
requests 400. At most ``max_connections`` connections are open at once (more wait in the
listen backlog), each idle at most ``timeout_s``; with a certificate, TLS (the handshake
in the child).

Pipe frames: ``<u32 length, little-endian><pickle>`` of a :class:`Snapshot`, or of a
:class:`Readiness` whenever the service's readiness changes.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import email.utils
import gzip
import logging
import os
import pickle
import select
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from fiomon import __version__
from fiomon.procstats import ServiceProcessCollector
from fiomon.runtime import wait_event
from fiomon.server.exporter import CONTENT_TYPE, Snapshot, render
from fiomon.server.live import LiveStore
from fiomon.webpage import page_html

log = logging.getLogger("fiomon.aggregator")

_FRAME = struct.Struct("<I")
MAX_REQUEST_BYTES = 64 * 1024  # a scrape's request line and headers are a few hundred
WRITE_HIGH_WATER = 8 * 1024 * 1024  # unread response bytes per connection before pausing
NICE = 10  # the child's priority below the aggregator's
FIRST_SNAPSHOT_S = 10.0  # a scrape waits this long for the first snapshot, then 503
RESTART_MIN_S = 1.0
RESTART_MAX_S = 30.0
STABLE_S = 60.0  # a child that lived this long starts the backoff afresh
API_PATH = "/api/v1/quanta"
PAGE_PATHS = ("/index.html", "/live")
HEALTHY_PATH = "/-/healthy"
READY_PATH = "/-/ready"
STARTING = "starting: no snapshot from the service yet"


def since_ms(query: str) -> int:
    """The ``since`` of an API query string (0 when absent).

    Raises:
        ValueError: ``since`` is not an integer.
    """
    value = _query_int(query, "since", "epoch ms")
    return 0 if value is None else value


def revised_of(query: str) -> int | None:
    """The ``revised`` of an API query string (None when absent).

    Raises:
        ValueError: ``revised`` is not an integer.
    """
    return _query_int(query, "revised", "the revised of an earlier answer")


def _query_int(query: str, key: str, what: str) -> int | None:
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name == key:
            try:
                return int(value)
            except ValueError:
                msg = f"{key}={value!r} is not an integer ({what})"
                raise ValueError(msg) from None
    return None


STALE_S = 2.0  # a scrape may get a rendering this long after a newer snapshot came


@dataclass(frozen=True, slots=True)
class Readiness:
    """A pipe frame: why the service is not ready (``/-/ready``'s 503 body); None: ready."""

    not_ready: str | None


def _listen(addr: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket (IPv6 when ``addr`` has a colon), as ``http.server`` binds."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


class MetricsProcess:
    """The aggregator's side: the listening socket, the child, and the snapshots it gets.

    Args:
        addr: listen address.
        port: listen port (0: any free port; see :attr:`port`).
        current: returns the newest snapshot (called from this object's thread).
        certfile: serve HTTPS with this certificate (and ``keyfile``).
        keyfile: its key.
        max_connections: connections served at once; more wait in the listen backlog.
        backlog: listen backlog (the kernel caps it at ``net.core.somaxconn``).
        timeout_s: a connection idle this long is closed (and a TLS handshake's limit).
        on_restart: called (from this object's thread) each time a dead child is replaced.
        not_ready: why the service is not ready now (None: ready), for ``/-/ready``;
            called from this object's thread every 250 ms at most. None: always ready.

    Raises:
        OSError: the address cannot be bound.
        ssl.SSLError: the certificate or key does not load.
    """

    def __init__(
        self,
        addr: str,
        port: int,
        current: Callable[[], Snapshot],
        *,
        certfile: Path | None = None,
        keyfile: Path | None = None,
        max_connections: int = 256,
        backlog: int = 1024,
        timeout_s: float = 30.0,
        on_restart: Callable[[], None] | None = None,
        not_ready: Callable[[], str | None] | None = None,
    ) -> None:
        if certfile is not None:  # fail at start, not in the child
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(str(certfile), str(keyfile) if keyfile else None)
        self._sock = _listen(addr, port, backlog)
        self.port: int = self._sock.getsockname()[1]
        self._current = current
        self._certfile = certfile
        self._keyfile = keyfile
        self._max_connections = max_connections
        self._timeout_s = timeout_s
        self._on_restart = on_restart or (lambda: None)
        self._not_ready = not_ready or (lambda: None)
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe = -1
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fiomon.metrics", daemon=True)
        self.restarts = 0
        self.sent = 0  # snapshots handed to a child

    @property
    def pid(self) -> int | None:
        """The child's process id (None before it first started)."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start the child and the thread that keeps it fed and alive."""
        self._spawn()
        self._thread.start()

    def poke(self) -> None:
        """A new snapshot may exist: send it now rather than within 250 ms."""
        self._wake.set()

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the child (end of file on its pipe), then close the listening socket."""
        self._closing.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self._close_pipe()
        if self._proc is not None:
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._sock.close()

    # -- the feeding thread ---------------------------------------------------------------

    def _spawn(self) -> None:
        read, write = os.pipe()
        argv = [
            sys.executable,
            "-m",
            "fiomon.server.metrics_server",
            f"--listen-fd={self._sock.fileno()}",
            f"--pipe-fd={read}",
            f"--parent={os.getpid()}",
            f"--max-connections={self._max_connections}",
            f"--timeout={self._timeout_s}",
        ]
        if self._certfile is not None:
            argv.append(f"--cert={self._certfile}")
            if self._keyfile is not None:
                argv.append(f"--key={self._keyfile}")
        try:
            self._proc = subprocess.Popen(
                argv,
                pass_fds=(self._sock.fileno(), read),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        finally:
            os.close(read)
        os.set_blocking(write, False)
        self._pipe = write
        self._started = time.monotonic()

    def _close_pipe(self) -> None:
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _run(self) -> None:
        sent: Snapshot | None = None
        sent_reason: str | None = STARTING  # what the child assumes until told
        backoff = RESTART_MIN_S
        while not self._closing.is_set():
            if not self._alive():
                code = self._proc.returncode if self._proc is not None else None
                self._close_pipe()
                if time.monotonic() - self._started >= STABLE_S:
                    backoff = RESTART_MIN_S
                log.error(
                    "the /metrics server process exited (%s); starting another in %g s",
                    f"signal {-code}" if code is not None and code < 0 else f"code {code}",
                    backoff,
                )
                if self._closing.wait(backoff):
                    return
                backoff = min(RESTART_MAX_S, 2 * backoff)
                try:
                    self._spawn()
                except OSError as exc:
                    log.error("cannot start the /metrics server process: %s", exc)
                    continue
                self.restarts += 1
                self._on_restart()
                sent, sent_reason = None, STARTING
            snap = self._current()
            if snap is not sent and self._send(pickle.dumps(snap, protocol=5)):
                sent = snap
                self.sent += 1
            reason = self._not_ready()
            if reason != sent_reason and self._send(pickle.dumps(Readiness(reason))):
                sent_reason = reason
            self._wake.wait(0.25)
            self._wake.clear()

    def _send(self, data: bytes) -> bool:
        """Write one frame, waiting for the child to read; False if it died or we stop."""
        view = memoryview(_FRAME.pack(len(data)) + data)
        poller = select.poll()
        poller.register(self._pipe, select.POLLOUT)
        while view:
            if self._closing.is_set() or not self._alive():
                return False
            if not poller.poll(250):
                continue
            try:
                view = view[os.write(self._pipe, view) :]
            except BlockingIOError:
                continue
            except OSError:  # the child closed its end (it died)
                return False
        return True


# -- the child ----------------------------------------------------------------------------


class _Body:
    """The newest snapshot and its rendering, made at most once per snapshot.

    Rendering takes about 150 ms of Python for 1000 hosts, and seconds when this
    low-priority process competes for a busy CPU; so it runs on a worker thread, and
    while a newer snapshot is being rendered, scrapes get the previous rendering (one
    snapshot old) instead of waiting: a scrape costs sending bytes. A snapshot arriving
    after the previous one was scraped is rendered at once, so a regular scraper finds
    it ready; one nobody scrapes is rendered only when asked for (then that scrape waits
    for it, since the previous rendering may be old by then).
    """

    def __init__(self, parent: int | None = None) -> None:
        self.snapshot: Snapshot | None = None
        self.arrived = asyncio.Event()
        self.not_ready: str | None = STARTING  # the service's readiness (/-/ready)
        # snapshot, plain, gzip (flushed, not finished), the compressor's state after it
        self._ready: tuple[Snapshot, bytes, bytes, Any] | None = None
        self._process = CollectorRegistry(auto_describe=False)
        ServiceProcessCollector(pid=lambda: parent or "self", registry=self._process)
        self._prefixes: dict[str, dict[tuple[str, ...], str]] = {}
        self._scraped = False  # the newest rendering was served
        self.live = LiveStore()
        self._page: dict[bool, bytes] = {}
        self._rendering = False
        self._superseded: float | None = None  # when a newer snapshot than _ready came
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="render")

    def set(self, snap: Snapshot) -> None:
        if self._superseded is None and self._ready is not None:
            self._superseded = time.monotonic()  # the rendering became one snapshot old
        self.snapshot = snap
        self.arrived.set()
        if snap.live is not None:
            self.live.merge(snap.live)
        if self._scraped:
            self._kick()

    def _kick(self) -> None:
        """Render the newest snapshot on the worker thread (unless done or under way)."""
        snap = self.snapshot
        if self._rendering or snap is None or (self._ready and self._ready[0] is snap):
            return
        self._rendering = True
        self._scraped = False
        fut = asyncio.get_running_loop().run_in_executor(self._pool, self._render, snap)
        fut.add_done_callback(self._done)

    def _done(self, fut: asyncio.Future[tuple[Snapshot, bytes, bytes, Any]]) -> None:
        self._rendering = False
        try:
            self._ready = fut.result()
            self._superseded = None if self._ready[0] is self.snapshot else time.monotonic()
        except Exception:  # a bug in rendering: the next scrape renders and says so
            log.exception("cannot render /metrics")
        if self._scraped:
            self._kick()  # a newer snapshot came meanwhile and somebody is scraping

    def _render(self, snap: Snapshot) -> tuple[Snapshot, bytes, bytes, Any]:
        plain = render(snap, self._prefixes)
        # Level 1: a tenth of the size for a few ms, once per snapshot. The stream is
        # flushed, not finished: each scrape goes on from a copy of the compressor with
        # the process metrics and finishes its own copy (one gzip member, CRC and all).
        z = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: the gzip container
        head = z.compress(plain) + z.flush(zlib.Z_SYNC_FLUSH)
        return snap, plain, head, z

    def process_text(self) -> bytes:
        """The service process's ``process_*`` families, read now."""
        return generate_latest(self._process)

    def page(self, *, gzipped: bool) -> bytes:
        """The live page (built once: it holds no data, it fetches the API)."""
        if gzipped not in self._page:
            html = page_html(data=None, live=True, title="live").encode()
            self._page[False] = html
            self._page[True] = gzip.compress(html, compresslevel=6, mtime=0)
        return self._page[gzipped]

    def get(self, *, gzipped: bool) -> bytes:
        """The body for a scrape: the newest rendering.

        While the newest snapshot is being rendered, or came less than ``STALE_S`` ago,
        the previous rendering (and the newest is rendered on the worker thread); else
        (none yet, or only an old one: nobody scraped for a while) rendered now.
        """
        self._scraped = True
        ready = self._ready
        if ready is not None and ready[0] is not self.snapshot and not self._rendering:
            since = self._superseded
            if since is not None and time.monotonic() - since <= STALE_S:
                self._kick()
            else:
                ready = None
        if ready is None:
            assert self.snapshot is not None  # noqa: S101 -- callers wait for the first one
            ready = self._ready = self._render(self.snapshot)
            self._superseded = None
        extra = self.process_text()
        if not gzipped:
            return ready[1] + extra
        z = ready[3].copy()
        tail: bytes = z.compress(extra) + z.flush()
        return ready[2] + tail

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Date:
    """The ``Date`` header, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._text = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._text = email.utils.formatdate(now, usegmt=True).encode()
        return self._text


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


class _Http(asyncio.Protocol):
    """One connection: requests in, cached bodies out, in order."""

    def __init__(self, body: _Body, date: _Date, timeout_s: float, done: Callable[[], None]):
        self._body = body
        self._date = date
        self._timeout_s = timeout_s
        self._done = done
        self._buf = b""
        self._transport: asyncio.Transport | None = None
        self._paused = False  # the client is not reading our responses
        self._busy = False  # waiting for the first snapshot
        self._closing = False
        self._timer: asyncio.TimerHandle | None = None
        self._waiting: asyncio.Future[None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # noqa: S101 -- a stream socket
        self._transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self._touch()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None
        self._done()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        self._touch()
        self._serve()

    def eof_received(self) -> bool | None:
        return None  # close once the responses are written

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._serve()

    # requests

    def _touch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._timeout_s, self._idle)

    def _idle(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _serve(self) -> None:
        """Answer every complete request in the buffer (pipelining keeps the order)."""
        while self._transport is not None and not (self._paused or self._busy or self._closing):
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_REQUEST_BYTES:
                    self._error(400, "request too large")
                return
            head, rest = self._buf[:end], self._buf[end + 4 :]
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split()
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    self._error(400, "bad header line")
                    return
                headers[name.strip().lower()] = value.strip()
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                self._error(400, "bad request line")
                return
            try:
                skip = int(headers.get("content-length", "0"))
            except ValueError:
                self._error(400, "bad Content-Length")
                return
            if skip < 0 or len(rest) < skip:
                if skip < 0 or skip > MAX_REQUEST_BYTES:
                    self._error(400, "bad Content-Length")
                return  # the body is still coming
            self._buf = rest[skip:]
            method, target, version = parts
            conn = headers.get("connection", "").lower()
            keep = "keep-alive" in conn if version == "HTTP/1.0" else "close" not in conn
            if method != "GET":
                self._error(501, f"Unsupported method ({method!r})")
                return
            path, _, query = target.partition("?")
            if path in (HEALTHY_PATH, READY_PATH):
                self._probe(path, keep)
                continue
            if path in PAGE_PATHS or (path == "/" and "text/html" in headers.get("accept", "")):
                self._page(headers, keep)  # a browser at /: the live page (no snapshot needed)
                continue
            if path not in ("/metrics", "/", API_PATH):
                self._error(
                    404, "only /metrics, the live page (/), /api/v1/quanta and /-/ready here"
                )
                return
            if self._body.snapshot is None:
                self._busy = True
                self._waiting = asyncio.ensure_future(self._first(headers, keep, path, query))
                return
            self._route(headers, keep, path, query)

    def _probe(self, path: str, keep: bool) -> None:
        """``/-/healthy``: serving (the parent lives); ``/-/ready``: the service's readiness."""
        text = "text/plain; charset=utf-8"
        if path == HEALTHY_PATH:
            self._respond(200, text, b"fiomon is healthy.\n", keep=keep)
            return
        reason = self._body.not_ready
        if reason is None:
            self._respond(200, text, b"fiomon is ready.\n", keep=keep)
        else:
            self._respond(503, text, f"fiomon is not ready: {reason}\n".encode(), keep=keep)

    def _route(self, headers: dict[str, str], keep: bool, path: str, query: str) -> None:
        if path == API_PATH:
            self._api(headers, keep, query)
        else:
            self._ok(headers, keep)

    def _page(self, headers: dict[str, str], keep: bool) -> None:
        gz = "gzip" in headers.get("accept-encoding", "").lower()
        try:
            body = self._body.page(gzipped=gz)
        except Exception:  # a broken install (missing web assets): say so, keep serving
            log.exception("cannot build the live page")
            self._error(500, "cannot build the live page (see the aggregator's log)")
            return
        self._respond(200, "text/html; charset=utf-8", body, keep=keep, gzipped=gz)

    def _api(self, headers: dict[str, str], keep: bool, query: str) -> None:
        try:
            since = since_ms(query)
            revised = revised_of(query)
        except ValueError as exc:
            self._error(400, str(exc))
            return
        body = self._body.live.body(since, revised)
        gz = "gzip" in headers.get("accept-encoding", "").lower() and len(body) > 4096
        if gz:
            body = gzip.compress(body, compresslevel=1, mtime=0)
        self._respond(200, "application/json", body, keep=keep, gzipped=gz)

    async def _first(
        self, headers: dict[str, str], keep: bool, path: str = "/metrics", query: str = ""
    ) -> None:
        """Wait for the first snapshot (only right after the start)."""
        await wait_event(self._body.arrived, FIRST_SNAPSHOT_S)
        self._busy = False
        if self._transport is None:
            return
        if self._body.snapshot is None:
            self._error(503, "no metrics yet")
            return
        self._route(headers, keep, path, query)
        self._serve()

    def _ok(self, headers: dict[str, str], keep: bool) -> None:
        gz = "gzip" in headers.get("accept-encoding", "").lower()
        try:
            body = self._body.get(gzipped=gz)
        except Exception:  # a bug in rendering: say so, keep serving
            log.exception("cannot render /metrics")
            self._error(500, "cannot render the metrics (see the aggregator's log)")
            return
        self._respond(200, CONTENT_TYPE, body, keep=keep, gzipped=gz)

    def _error(self, code: int, text: str) -> None:
        self._respond(code, "text/plain; charset=utf-8", f"{text}\n".encode(), keep=False)

    def _respond(
        self, code: int, ctype: str, body: bytes, *, keep: bool, gzipped: bool = False
    ) -> None:
        t = self._transport
        if t is None:
            return
        head = [
            f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}".encode(),
            f"Server: fiomon/{__version__}".encode(),
            b"Date: " + self._date(),
            f"Content-Type: {ctype}".encode(),
        ]
        if gzipped:
            head.append(b"Content-Encoding: gzip")
        head.append(f"Content-Length: {len(body)}".encode())
        if not keep:
            head.append(b"Connection: close")
        t.write(b"\r\n".join(head) + b"\r\n\r\n")
        t.write(body)
        if not keep:
            self._closing = True
            t.close()


async def _serve(opts: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    lsock = socket.socket(fileno=opts.listen_fd)
    lsock.setblocking(False)
    context = None
    if opts.cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(opts.cert, opts.key)
    body = _Body(opts.parent)
    date = _Date()
    slots = asyncio.Semaphore(opts.max_connections)
    reader = asyncio.StreamReader(limit=1 << 30)
    pipe = os.fdopen(opts.pipe_fd, "rb", buffering=0)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)

    async def snapshots() -> None:
        """Until the end of file: the aggregator stopped or died."""
        with contextlib.suppress(asyncio.IncompleteReadError):
            while True:
                (n,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
                frame = pickle.loads(await reader.readexactly(n))  # noqa: S301 -- our parent
                if isinstance(frame, Snapshot):
                    body.set(frame)
                else:  # a Readiness (this module runs as __main__ here: not isinstance)
                    body.not_ready = frame.not_ready

    async def connection(conn: socket.socket) -> None:
        try:
            await loop.connect_accepted_socket(
                lambda: _Http(body, date, opts.timeout, slots.release),
                conn,
                ssl=context,
                ssl_handshake_timeout=opts.timeout if context is not None else None,
            )
        except Exception as exc:  # a failed TLS handshake; the connection only
            log.debug("connection failed before its first request: %s", exc)
            conn.close()
            slots.release()

    async def accept() -> None:
        tasks: set[asyncio.Task[None]] = set()
        while True:
            await slots.acquire()  # beyond the limit, connections wait in the backlog
            try:
                conn, _ = await loop.sock_accept(lsock)
            except OSError as exc:  # EMFILE and the like: wait, do not spin
                slots.release()
                log.warning("accept: %s", exc)
                await asyncio.sleep(0.5)
                continue
            conn.setblocking(False)
            task = asyncio.create_task(connection(conn))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    acceptor = asyncio.create_task(accept())
    try:
        await snapshots()
    finally:
        body.close()
        acceptor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await acceptor


def _die_with(parent: int) -> None:
    """Be killed when the parent dies (Linux), and exit now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes  # noqa: PLC0415 -- Linux only, in the child only

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    if os.getppid() != parent:
        sys.exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """The child process: serve ``/metrics`` until the pipe from the aggregator closes."""
    ap = argparse.ArgumentParser(prog="python -m fiomon.server.metrics_server")
    ap.add_argument("--listen-fd", type=int, required=True)
    ap.add_argument("--pipe-fd", type=int, required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--max-connections", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--cert", default=None)
    ap.add_argument("--key", default=None)
    opts = ap.parse_args(argv)
    _die_with(opts.parent)
    # The group's SIGTERM/SIGINT is for the aggregator; this process stops when it does.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(NICE)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s fiomon.metrics: %(message)s")
    asyncio.run(_serve(opts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
