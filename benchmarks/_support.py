"""What the benchmarks share: a free port, a throwaway Mosquitto, CPU and RSS, a raw publisher.

:class:`RawPublisher` speaks just enough MQTT 3.1.1 to publish QoS 1 messages in bulk and
count the broker's acknowledgements. A load generator built on aiomqtt costs about
50-100 us of Python per publish; offering 5,000 messages a second that way would take a
core of the same 2-core machine the aggregator runs on.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for tests.ports

from tests.ports import free_port

__all__ = ["RawPublisher", "cpu_seconds", "free_port", "peak_rss_mb", "scrape", "start_broker"]

TICKS = os.sysconf("SC_CLK_TCK")


def start_broker(folder: Path, extra: str = "") -> tuple[subprocess.Popen[bytes], int]:
    """A real Mosquitto on a free loopback port (``extra``: more config lines)."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(f"user root\nlistener {port} 127.0.0.1\nallow_anonymous true\n{extra}")
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    for _ in range(200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.05)
    proc.kill()
    sys.exit("mosquitto did not start")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident memory (VmHWM) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


class RawPublisher:
    """An MQTT 3.1.1 client that only publishes at QoS 1 (clean session, no keepalive).

    Args:
        port: the broker's port on 127.0.0.1.
        client_id: the MQTT client id.
    """

    def __init__(self, port: int, client_id: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cid = client_id.encode()
        var = b"\x00\x04MQTT\x04\x02\x00\x00"  # level 4, clean session, keepalive 0
        body = var + struct.pack(">H", len(cid)) + cid
        self.sock.sendall(b"\x10" + _varint(len(body)) + body)
        ack = self._read_exact(4)
        if ack[0] != 0x20 or ack[3] != 0:
            msg = f"CONNACK refused: {ack!r}"
            raise ConnectionError(msg)
        self._mid = 0
        self.sent = 0
        self.acked = 0
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_acks, daemon=True)
        self._reader.start()

    def _read_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                msg = "broker closed the connection"
                raise ConnectionError(msg)
            buf += chunk
        return buf

    def _read_acks(self) -> None:
        buf = b""
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            acks = pos = 0
            while len(buf) - pos >= 2:
                kind, length = buf[pos], buf[pos + 1]  # every packet we get is short
                if len(buf) - pos < 2 + length:
                    break
                if kind == 0x40:
                    acks += 1
                pos += 2 + length
            buf = buf[pos:]
            with self._lock:
                self.acked += acks

    def packet(self, topic: bytes, payload: bytes) -> bytes:
        """One PUBLISH (QoS 1) packet."""
        self._mid = self._mid % 65535 + 1
        var = struct.pack(">H", len(topic)) + topic + struct.pack(">H", self._mid)
        return b"\x32" + _varint(len(var) + len(payload)) + var + payload

    def send(self, packets: list[bytes]) -> None:
        """Write packets in one go."""
        self.sock.sendall(b"".join(packets))
        self.sent += len(packets)

    def wait_acked(self, timeout_s: float) -> bool:
        """Wait until every sent message is acknowledged."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self.acked >= self.sent:
                    return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        """DISCONNECT and close."""
        try:
            self.sock.sendall(b"\xe0\x00")
        finally:
            self.sock.close()


def scrape(port: int, *, gzipped: bool = True, timeout_s: float = 30.0) -> tuple[float, int]:
    """GET /metrics as Prometheus does (gzip); returns (seconds, body bytes).

    Raises:
        OSError: no answer, or not 200.
    """
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"} if gzipped else {})
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            msg = f"HTTP {resp.status}"
            raise OSError(msg)
    except http.client.HTTPException as exc:
        raise OSError(str(exc)) from exc
    finally:
        conn.close()
    return time.perf_counter() - t0, len(body)
