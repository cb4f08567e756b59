"""A TCP proxy that can be cut into a black hole: connections stay open, bytes stop flowing
both ways, new connections are accepted and never answered. What a network partition looks
like to the process behind it (no RST, no FIN: only silence until its deadlines pass). The
chaos proxy (txbroker/chaos/proxy.py) resets and truncates; a partition needs silence."""

from __future__ import annotations

import asyncio
import contextlib


class Blackhole:
    """``async with Blackhole(target_port) as proxy``: ``proxy.port`` forwards to
    127.0.0.1:``target_port`` until :meth:`cut`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.is_cut = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Blackhole:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.transport.abort()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def cut(self) -> None:
        self.is_cut = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if self.is_cut:  # accepted, then silence: nothing is forwarded or answered
            await self._drain_forever(reader)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.add(up_writer)
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        await asyncio.gather(*pumps, return_exceptions=True)
        for w in (writer, up_writer):
            w.transport.abort()

    async def _drain_forever(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(65536):
                if self.is_cut:
                    continue  # dropped on the floor, as a partitioned network would
                dst.write(data)
                await dst.drain()
