"""Benchmark: the aggregator's MQTT intake alone, in CPU per message, paho's reader vs ours.

A real Mosquitto queues ``--messages`` QoS 1 messages of ``--bytes`` for a persistent MQTT 5
session (as agents' records wait for an aggregator); then the aggregator's client (the
service's :class:`fiomon.mqtt.MqttSession`, manual acknowledgement) connects and drains
them the way the service does: a batch is whatever waits in the queue, then the batch is
acknowledged. Measured with ``time.process_time`` of this process over the drain (the
broker is another process), so other load on the machine disturbs it little. Modes:

* ``paho``: paho's own reader, one PUBACK write per message (the aggregator before the
  bulk reader);
* ``reader``: the session's bulk reader (``bulk_read``), one PUBACK write per message;
* ``ackmany``: the bulk reader and one PUBACK write per batch (the aggregator now).

Usage::

    python benchmarks/bench_intake.py --messages 20000 --bytes 14000 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path

import paho.mqtt.client as pm
from _support import start_broker
from paho.mqtt.enums import CallbackAPIVersion

from fiomon.config import BrokerConfig
from fiomon.mqtt import MqttSession

MODES = ("paho", "reader", "ackmany")
BROKER = "max_queued_messages 1000000\nmax_queued_bytes 0\nmax_inflight_messages 0\n"


def publish(port: int, n: int, size: int) -> None:
    """Queue ``n`` QoS 1 messages of ``size`` bytes (1000 hosts' record topics)."""
    c = pm.Client(CallbackAPIVersion.VERSION2, client_id="bench-intake-pub")
    c.max_inflight_messages_set(1000)
    c.connect("127.0.0.1", port)
    c.loop_start()
    body = os.urandom(size)
    infos = [c.publish(f"bench/v1/h{k % 1000}/records", body, qos=1) for k in range(n)]
    for info in infos:
        info.wait_for_publish(120)
    c.loop_stop()
    c.disconnect()


async def drain(port: int, mode: str, n: int, size: int, ident: str) -> float:
    """CPU seconds to take ``n`` queued messages in batches and acknowledge them."""
    session = MqttSession(
        BrokerConfig("127.0.0.1", port),
        identifier=ident,
        logger=logging.getLogger("bench"),
        persistent_session_s=600,
        manual_ack=True,
        bulk_read=mode != "paho",
    )
    if mode != "paho" and session.reader is None:
        msg = "this paho lacks what the bulk reader needs"
        raise SystemExit(msg)
    async with session.client:  # the session and its subscription, then the backlog
        await session.subscribe("bench/v1/+/records")
    await asyncio.to_thread(publish, port, n, size)
    t0 = time.process_time()
    got = 0
    async with session.client:
        async for batch in session.batches(asyncio.Event(), max_messages=n):
            if mode == "ackmany":
                session.ack(batch)
            else:
                for m in batch:
                    session.ack([m])
            got += len(batch)
            if got >= n:
                break
    return time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--bytes", type=int, default=14000, help="payload (14000: 25 jobs)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        broker, port = start_broker(Path(tmp), BROKER)
        try:
            for r in range(args.repeat):
                for mode in MODES:  # alternating, so a change of load hits every mode
                    ident = f"bench-intake-{mode}-{r}"
                    cpu[mode].append(
                        asyncio.run(drain(port, mode, args.messages, args.bytes, ident))
                    )
        finally:
            broker.terminate()
            broker.wait()
    print(f"{args.messages} messages x {args.bytes} B, median of {args.repeat} (all runs):")
    for mode in MODES:
        us = [1e6 * c / args.messages for c in cpu[mode]]
        runs = ", ".join(f"{u:.0f}" for u in us)
        print(f"  {mode:8s} {statistics.median(us):6.0f} us CPU per message ({runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
