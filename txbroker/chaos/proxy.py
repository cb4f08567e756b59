"""A TCP proxy that injects network faults into the connections through it (asyncio, in the
caller's process), after asyncpg's ``TCPFuzzingProxy``: latency, loss, resets and truncated
chunks (:class:`FaultProxy`). New connections are accepted throughout (a client reconnects
through the proxy); resets and truncations apply to the connections open when they are
injected, latency and loss to every chunk forwarded until they are set back to 0.

The kernel here has no netem, so a link's latency and loss are this proxy's: each direction of
a connection is a delay line (a chunk read at ``t`` is forwarded at ``t + latency_s``, in order,
so chunks in flight overlap as on a real link rather than queueing behind each other's delay).
Loss on a TCP stream is not a missing byte but a stall: the sender retransmits the lost segment
after its retransmission timeout, and everything behind it waits (head-of-line blocking). So a
chunk holding a lost segment (each of its ``SEGMENT_BYTES`` lost with probability ``loss``) is
held ``LOSS_STALL_S`` more, Linux's minimum retransmission timeout, and the chunks after it wait
behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from typing import Final

__all__ = ["LOSS_STALL_S", "FaultProxy"]

CHUNK_BYTES: Final = 64 * 1024
SEGMENT_BYTES: Final = 1448  # a TCP segment's payload on a 1,500-byte Ethernet MTU
LOSS_STALL_S: Final = 0.2  # TCP_RTO_MIN: the soonest Linux retransmits a lost segment
QUEUED_CHUNKS: Final = 256  # per direction: a slow reader holds the sender back past this
_LINGER_RST: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a RST


class _Pair:
    """One proxied connection: the client's side and the upstream's."""

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

    def end(self) -> None:
        """One side ended: end the other, as a TCP proxy does when either half closes."""
        for t in self.tasks:
            if t is not asyncio.current_task():
                t.cancel()


class FaultProxy:
    """``async with FaultProxy(target_port) as proxy``: ``proxy.port`` (on ``listen_host``)
    forwards to ``target_host``:``target_port``. Counters: ``connections``, ``resets``,
    ``truncations``, ``degraded`` (chunks forwarded under latency or loss) and ``stalls`` (of
    those, held as lost).

    - **latency**: every chunk, both ways, is forwarded ``latency_s`` after it arrived;
    - **loss**: each segment's worth of a chunk is lost with probability ``loss``; a chunk with
      a lost segment is held ``LOSS_STALL_S`` more (a retransmission), the ones behind it too;
    - **reset**: every open connection is aborted with a TCP RST (``SO_LINGER`` 0), both sides;
    - **truncation**: the next chunk of each open connection is cut at a random byte, the part
      before the cut forwarded, then both sides closed: a frame broken off mid-way, in
      whichever direction the next bytes happened to travel.
    """

    def __init__(
        self,
        target_port: int,
        rng: random.Random | None = None,
        *,
        target_host: str = "127.0.0.1",
        listen_host: str = "127.0.0.1",
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self.rng = rng or random.Random()
        self.latency_s = 0.0
        self.loss = 0.0
        self.port = 0
        self.connections = 0
        self.resets = 0
        self.truncations = 0
        self.degraded = 0
        self.stalls = 0
        self._pairs: set[_Pair] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
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
        return f"txb://{self.listen_host}:{self.port}"

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
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.transport.abort()  # the target is not there: neither is the proxy
            return
        self.connections += 1
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        up: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(QUEUED_CHUNKS)
        down: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(QUEUED_CHUNKS)
        pair.tasks = [
            asyncio.create_task(self._read(reader, up, pair)),
            asyncio.create_task(self._write(up, up_writer, pair)),
            asyncio.create_task(self._read(up_reader, down, pair)),
            asyncio.create_task(self._write(down, writer, pair)),
        ]
        try:
            await asyncio.gather(*pair.tasks, return_exceptions=True)
        finally:
            self._pairs.discard(pair)
            pair.abort(rst=False)

    def _due(self, now: float, size: int, last_due: float) -> float:
        """When a chunk of ``size`` bytes read at ``now`` is forwarded: after the latency, a
        stall if a segment of it is lost, and never before the chunk ahead of it."""
        due = now + self.latency_s
        if self.latency_s or self.loss:
            self.degraded += 1
        if self.loss:
            segments = -(-size // SEGMENT_BYTES)
            if self.rng.random() < 1 - (1 - self.loss) ** segments:
                due += LOSS_STALL_S
                self.stalls += 1
        return max(due, last_due)

    async def _read(
        self,
        src: asyncio.StreamReader,
        line: asyncio.Queue[tuple[float, bytes] | None],
        pair: _Pair,
    ) -> None:
        loop = asyncio.get_running_loop()
        last_due = 0.0
        try:
            while data := await src.read(CHUNK_BYTES):
                last_due = self._due(loop.time(), len(data), last_due)
                await line.put((last_due, data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        await line.put(None)  # what was read is still forwarded, then this direction ends

    async def _write(
        self,
        line: asyncio.Queue[tuple[float, bytes] | None],
        dst: asyncio.StreamWriter,
        pair: _Pair,
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (item := await line.get()) is not None:
                due, data = item
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)  # the injected latency or stall itself
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
        except OSError:
            pass
        finally:
            pair.end()
