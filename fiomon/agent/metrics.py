"""The agent's own ``/metrics``, opt-in (``metrics_listen: host:port``; off by default).

An agent is one small process per client host; most sites watch it through the
aggregator (its retained status and ``fiomon_host_last_seen_timestamp_seconds``). Where
the agent itself is to be scraped, this serves, from the agent's event loop::

    # TYPE process_cpu_seconds_total counter     (and the other process_* families)
    # TYPE fiomon_build_info gauge
    fiomon_build_info{python="3.11.7",revision="0d14cae...",version="0.1.0"} 1.0
    # TYPE fiomon_agent_broker_connected gauge
    # TYPE fiomon_agent_records_sent_total counter
    # TYPE fiomon_agent_spooled_messages gauge

``GET /-/healthy`` is 200 while the agent runs; ``GET /-/ready`` is 200 while it is
connected to the broker, else 503 with the reason. One request per connection (HTTP/1.0
style), small bodies: a scrape every few seconds costs the agent nothing measurable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fiomon import __version__
from fiomon.build import build_labels
from fiomon.procstats import ServiceProcessCollector

log = logging.getLogger("fiomon.agent")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REQUEST_BYTES = 16 * 1024
REQUEST_TIMEOUT_S = 10.0


class AgentView(Protocol):
    """What the collector reads of the agent (on the event loop's thread)."""

    @property
    def connected(self) -> bool:
        """Connected to the broker now."""
        ...

    def metrics_counts(self) -> tuple[int, int]:
        """(records sent since the start, messages waiting in the spool)."""
        ...


class AgentCollector(Collector):
    """Fresh families at each scrape: build info, connection, records sent, spool.

    Args:
        agent: the running agent.
    """

    def __init__(self, agent: AgentView) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        """The agent's families (``prometheus_client`` calls it per scrape)."""
        info = GaugeMetricFamily(
            "fiomon_build_info",
            "Always 1; the labels say which fiomon (version, git revision) and Python run.",
            labels=["version", "revision", "python"],
        )
        info.add_metric(list(build_labels()), 1.0)
        yield info
        yield GaugeMetricFamily(
            "fiomon_agent_broker_connected",
            "1 while the agent is connected to its MQTT broker.",
            value=float(self.agent.connected),
        )
        sent, spooled = self.agent.metrics_counts()
        yield CounterMetricFamily(
            "fiomon_agent_records_sent",
            "Records the broker acknowledged since the agent started.",
            value=float(sent),
        )
        yield GaugeMetricFamily(
            "fiomon_agent_spooled_messages",
            "Messages waiting in the agent's spool (the broker has not acknowledged them).",
            value=float(spooled),
        )


async def serve_metrics(
    agent: AgentView, addr: str, port: int, stopping: Callable[[], bool]
) -> asyncio.Server:
    """Listen on ``addr:port`` for ``/metrics``, ``/-/healthy`` and ``/-/ready``.

    Raises:
        OSError: the address cannot be bound (the agent does not start).
    """
    registry = CollectorRegistry(auto_describe=False)
    ServiceProcessCollector(registry=registry)
    registry.register(AgentCollector(agent))

    def answer(path: str) -> tuple[int, str, bytes]:
        text = "text/plain; charset=utf-8"
        if path == "/metrics":
            return 200, CONTENT_TYPE, generate_latest(registry)
        if path == "/-/healthy":
            return 200, text, b"fiomon is healthy.\n"
        if path == "/-/ready":
            if stopping():
                return 503, text, b"fiomon is not ready: stopping\n"
            if not agent.connected:
                return 503, text, b"fiomon is not ready: not connected to the MQTT broker\n"
            return 200, text, b"fiomon is ready.\n"
        return 404, text, b"only /metrics, /-/healthy and /-/ready here\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(parts) != 3 or parts[0] != "GET":  # method, target, version
                code, ctype, body = 400, "text/plain", b"only GET\n"
            else:
                code, ctype, body = answer(parts[1].partition("?")[0])
            reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(code, "Unavailable")
            writer.write(
                f"HTTP/1.1 {code} {reason}\r\nServer: fiomon/{__version__}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a slow, broken or oversized request: the connection only
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, addr, port, limit=MAX_REQUEST_BYTES)
    log.info("/metrics on %s:%d", addr, port)
    return server
