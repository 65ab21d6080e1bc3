"""Helpers for tests of :class:`fiomon.mqtt.MqttSession` against a real broker."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiomqtt

from fiomon.mqtt import MqttSession
from tests.conftest import DEADLINE_S


async def once(session: MqttSession, body: Callable[[], Awaitable[object]]) -> None:
    """One connection of ``session`` running ``body``; a connection error fails the test."""

    async def run() -> bool:
        await body()
        return True

    def fail(exc: aiomqtt.MqttError) -> None:
        raise exc

    async with asyncio.timeout(DEADLINE_S):
        await session.run(run, failed=fail)


async def take(session: MqttSession, n: int) -> list[aiomqtt.Message]:
    """The next ``n`` messages, in batches of what waits (nothing acknowledged)."""
    got: list[aiomqtt.Message] = []
    never = asyncio.Event()
    async with asyncio.timeout(DEADLINE_S):
        while len(got) < n:
            batches = session.batches(never, max_messages=n - len(got))
            got += await anext(batches)
            await batches.aclose()
    return got


async def publish(port: int, topic: str, payloads: list[bytes]) -> None:
    """Publish ``payloads`` on ``topic`` with QoS 1, from a client of its own."""
    async with aiomqtt.Client("127.0.0.1", port) as pub:
        for payload in payloads:
            await pub.publish(topic, payload, qos=1)
