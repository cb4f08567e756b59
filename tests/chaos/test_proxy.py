"""The fault proxy's latency and loss (txbroker/chaos/proxy.py), timed at a real TCP sink on
loopback: latency is a floor on every chunk and chunks in flight overlap (a delay line, not a
queue that adds each chunk's delay to the next's); a lost segment stalls its chunk by a
retransmission timeout, and the chunks behind it wait."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import pytest

from txbroker.chaos.proxy import LOSS_STALL_S, FaultProxy

ARRIVAL_BOUND_S = 10.0  # a chunk that never arrives fails the test, not the suite


class Sink:
    """A TCP server that notes when each chunk arrives (one line per chunk)."""

    def __init__(self) -> None:
        self.arrived: asyncio.Queue[tuple[bytes, float]] = asyncio.Queue()
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            await self.arrived.put((line, time.monotonic()))
        writer.close()

    async def next(self) -> tuple[bytes, float]:
        async with asyncio.timeout(ARRIVAL_BOUND_S):
            return await self.arrived.get()


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    s = Sink()
    server = await asyncio.start_server(s._serve, "127.0.0.1", 0)
    s.port = server.sockets[0].getsockname()[1]
    async with server:
        yield s


async def test_latency_delays_every_chunk_and_chunks_in_flight_overlap(sink: Sink) -> None:
    latency, gap = 0.5, 0.2
    async with FaultProxy(sink.port) as proxy:
        proxy.latency_s = latency
        _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        sent = []
        for i in range(3):
            writer.write(b"chunk %d\n" % i)
            await writer.drain()
            sent.append(time.monotonic())
            await asyncio.sleep(gap)  # the sender's own pace: three chunks, not one
        arrived = [await sink.next() for _ in range(3)]
        writer.close()
    assert [line for line, _ in arrived] == [b"chunk 0\n", b"chunk 1\n", b"chunk 2\n"]
    for t_sent, (_, t_arrived) in zip(sent, arrived, strict=True):
        assert t_arrived - t_sent >= latency - 0.01
    # A delay line: the third chunk arrives about `latency` after it was sent (0.9 s after the
    # first was); a queue adding each chunk's delay to the next's would take 1.5 s.
    assert arrived[-1][1] - sent[0] < 1.25, [t - sent[0] for _, t in arrived]
    assert proxy.degraded == 3 and proxy.stalls == 0


class Scripted(random.Random):
    """Draws from a script: which chunks are lost is the test's choice."""

    def __init__(self, *draws: float) -> None:
        super().__init__()
        self.draws = list(draws)

    def random(self) -> float:
        return self.draws.pop(0)


async def test_a_lost_segment_stalls_its_chunk_and_the_ones_behind_it(sink: Sink) -> None:
    # The first chunk read under loss is lost, the second is not.
    async with FaultProxy(sink.port, Scripted(0.0, 0.99)) as proxy:
        _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"whole\n")
        await writer.drain()
        line, _ = await sink.next()
        assert line == b"whole\n"
        assert proxy.stalls == proxy.degraded == 0  # neither latency nor loss: none counted

        proxy.loss = 0.5
        writer.write(b"lost\n")
        await writer.drain()
        t1 = time.monotonic()
        await asyncio.sleep(0.05)  # the sender's pace: a second chunk, read after the first
        writer.write(b"behind\n")  # not lost itself, but it may not overtake the lost one
        await writer.drain()
        (line1, t_lost), (line2, t_behind) = await sink.next(), await sink.next()
        writer.close()
    assert (line1, line2) == (b"lost\n", b"behind\n")
    assert t_lost - t1 >= LOSS_STALL_S - 0.01, t_lost - t1
    assert t_behind >= t_lost
    assert proxy.stalls == 1
