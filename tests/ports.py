"""A free loopback port: for the tests' brokers and servers, and the benchmarks'.

The one home of :func:`free_port`. It needs nothing but the standard library (not pytest,
not a fixture), so the benchmark scripts, which run outside pytest, import it too
(``benchmarks/_support.py``).
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
