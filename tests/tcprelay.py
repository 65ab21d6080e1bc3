"""A TCP relay on loopback that a test can cut and restore: a network partition.

Between a client and a real broker: while cut, every relayed connection is aborted (both
sides see a reset) and the port refuses new ones, as a link down would; restored, it
listens again on the same port. No protocol is looked at: the bytes go as they come.
"""

from __future__ import annotations

import asyncio
import contextlib

from tests.ports import free_port


class Relay:
    """Relays ``127.0.0.1:<port>`` to ``127.0.0.1:<target_port>``.

    Args:
        target_port: where the relayed connections go (a broker).
    """

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target_port = target_port
        self.cuts = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        """Listen (again) on :attr:`port`."""
        self._server = await asyncio.start_server(
            self._relay, "127.0.0.1", self.port, reuse_address=True
        )

    async def cut(self) -> None:
        """Abort every relayed connection and stop listening (new ones are refused)."""
        self.cuts += 1
        if self._server is not None:
            self._server.close()
        for w in list(self._open):
            w.transport.abort()
        self._open.clear()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def close(self) -> None:
        """Stop for good."""
        await self.cut()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._open |= {writer, up_w}
        try:
            await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
        finally:
            self._open -= {writer, up_w}


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy until either side ends; then end the other direction too."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    dst.transport.abort()
