"""A TCP proxy that injects network faults between the services and the broker (asyncio, in
the campaign's process, loopback only), after asyncpg's ``TCPFuzzingProxy``: latency, resets
and truncated chunks (:class:`FaultProxy`). New connections are accepted throughout (a client
reconnects through the proxy); faults apply to the connections open when they are injected,
latency to all until it is set back to 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from typing import Final

__all__ = ["FaultProxy"]

CHUNK_BYTES: Final = 64 * 1024
_LINGER_RST: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a RST


class _Pair:
    """One proxied connection: the client's side and the broker's."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.cut_next = False
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self, *, rst: bool) -> None:
        for w in (self.client, self.upstream):
            sock = w.get_extra_info("socket")
            if rst and sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
            w.transport.abort()


class FaultProxy:
    """``async with FaultProxy(target_port) as proxy``: ``proxy.port`` forwards to
    127.0.0.1:``target_port``. Counters: ``connections``, ``resets``, ``truncations``.

    - **latency**: every chunk, both ways, waits ``latency_s`` before it is forwarded;
    - **reset**: every open connection is aborted with a TCP RST (``SO_LINGER`` 0), both sides;
    - **truncation**: the next chunk of each open connection is cut at a random byte, the part
      before the cut forwarded, then both sides closed: a frame broken off mid-way, in
      whichever direction the next bytes happened to travel.
    """

    def __init__(self, target_port: int, rng: random.Random | None = None) -> None:
        self.target_port = target_port
        self.rng = rng or random.Random()
        self.latency_s = 0.0
        self.port = 0
        self.connections = 0
        self.resets = 0
        self.truncations = 0
        self._pairs: set[_Pair] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for pair in list(self._pairs):
            pair.abort(rst=False)
        tasks = [t for p in self._pairs for t in p.tasks]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"txb://127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._pairs)

    def reset(self) -> int:
        """Abort every open connection with a RST; returns how many."""
        pairs = list(self._pairs)
        for pair in pairs:
            pair.abort(rst=True)
        self.resets += len(pairs)
        return len(pairs)

    def truncate(self) -> int:
        """Cut the next chunk of every open connection; returns how many were armed."""
        for pair in self._pairs:
            pair.cut_next = True
        return len(self._pairs)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()  # the broker is not there: neither is the proxy
            return
        self.connections += 1
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        pair.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, pair)),
            asyncio.create_task(self._pump(up_reader, writer, pair)),
        ]
        try:
            await asyncio.gather(*pair.tasks, return_exceptions=True)
        finally:
            self._pairs.discard(pair)
            pair.abort(rst=False)

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, pair: _Pair
    ) -> None:
        try:
            while data := await src.read(CHUNK_BYTES):
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)  # the injected latency itself
                if pair.cut_next:
                    pair.cut_next = False
                    dst.write(data[: self.rng.randrange(len(data))])
                    with contextlib.suppress(OSError):
                        await dst.drain()
                    self.truncations += 1
                    pair.abort(rst=False)
                    return
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # One side ended: end the other, as a TCP proxy does when either half closes.
            for t in pair.tasks:
                if t is not asyncio.current_task():
                    t.cancel()
