"""One broken service does not delay another's recovery: with 10,000 half messages whose
check-back endpoint accepts connections and never answers, a healthy service's transaction is
checked well before one hanging check could have ended (HANG_S), as it is with no such
neighbour. The hanging endpoint's breaker
opens and shows in the admin API."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.tx.conftest import GROUP, CheckServer, tx_broker
from txbroker_checkback import CheckStatus
from txbroker_sdk import Client

HALVES = 10_000
TIMEOUT_MS = 200  # the first back-check this long after PREPARE
# A hanging check holds its lane this long. A healthy check that had to wait for a lane would
# come this late: long, so that the bound on a healthy check (HEALTHY_S) can be loose enough for
# a machine busy with other tests (a check due in 200 ms took 0.8 s there) and still tell.
HANG_S = 10
HEALTHY_S = HANG_S / 2
BASE = f"""
tx_timeout_ms = {TIMEOUT_MS}
check_backoff_base_ms = 60000
check_timeout_ms = {HANG_S * 1000}
check_deadline_ms = {HANG_S * 1000}
"""
# Fairness alone: the breaker never opens, so the hanging endpoint keeps its lanes busy.
NO_BREAKER = BASE + "check_breaker_failures = 1000000\n"
BREAKER = BASE + "check_breaker_failures = 3\ncheck_breaker_base_ms = 60000\n"


TCP_ESTABLISHED = 1  # tcpi_state, linux/tcp_states.h: the peer has not closed its side


def established(writer: asyncio.StreamWriter) -> bool:
    """The kernel's view, which knows of a close the event loop may not have read yet."""
    sock = writer.get_extra_info("socket")
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_ESTABLISHED)


@dataclass
class Hanging:
    """An HTTP port that accepts every connection, reads, and never answers."""

    url: str
    accepted: list[float] = field(default_factory=list)
    # Connections open at once, counted at each accept: a lane closes its timed-out connection
    # before its next check connects, so the count is the checks in flight, however many
    # rounds of timeouts a slow run goes through.
    peak: int = 0
    first_closed: asyncio.Event = field(default_factory=asyncio.Event)  # lanes busy for real


@asynccontextmanager
async def hanging_endpoint() -> AsyncIterator[Hanging]:
    writers: list[asyncio.StreamWriter] = []
    endpoint = Hanging("")

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        endpoint.accepted.append(time.monotonic())
        writers.append(writer)
        endpoint.peak = max(endpoint.peak, sum(established(w) for w in writers))
        while await reader.read(65536):
            pass
        endpoint.first_closed.set()

    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    endpoint.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/check"
    try:
        yield endpoint
    finally:
        server.close()
        for w in writers:
            w.close()
        await server.wait_closed()


async def checked_after(c: Client, checks: CheckServer) -> float:
    """Seconds from a PREPARE to its first back-check reaching the healthy service."""
    t0 = time.monotonic()
    tx = await c.prepare(
        "orders", b"healthy", producer_group=GROUP, check_url=checks.url, timeout_ms=TIMEOUT_MS
    )
    checks.answers[tx.tx_id] = CheckStatus.COMMIT
    deadline = t0 + 30  # far beyond the goal: a failure shows as a number, not a hang
    while not checks.checks_for(tx.tx_id):
        assert time.monotonic() < deadline, "the healthy service was never checked"
        await asyncio.sleep(0.01)  # polling what the service saw: the condition under test
    return time.monotonic() - t0


async def prepare_many(c: Client, url: str, n: int) -> None:
    sem = asyncio.Semaphore(256)

    async def prepare() -> None:
        async with sem:
            await c.prepare("orders", b"x", producer_group=GROUP, check_url=url, timeout_ms=100)

    await asyncio.gather(*(prepare() for _ in range(n)))


@pytest.mark.slow
async def test_a_hanging_endpoint_does_not_delay_a_healthy_ones_check(
    tmp_path: Path, checks: CheckServer
) -> None:
    b = tx_broker(tmp_path / "fair", settings=NO_BREAKER).start()
    try:
        async with hanging_endpoint() as sick, await Client.connect(b.url) as c:
            await c.create_topic("orders", queues=4)
            alone = await checked_after(c, checks)
            await prepare_many(c, sick.url, HALVES)
            async with asyncio.timeout(3 * HANG_S):
                await sick.first_closed.wait()  # HANG_S of hanging checks: a backlog
            beside = await checked_after(c, checks)
    finally:
        b.stop()
    print(f"checked after {alone:.3f} s alone, {beside:.3f} s beside {HALVES} hanging halves")
    assert beside - alone < HEALTHY_S, (alone, beside)
    # The hanging endpoint holds its own lanes (8 by default), never the broker's 64.
    assert sick.peak == 8, sick.peak


async def test_an_endpoint_that_keeps_timing_out_is_backed_off(
    tmp_path: Path, checks: CheckServer
) -> None:
    b = tx_broker(tmp_path / "breaker", settings=BREAKER).start()
    try:
        async with (
            hanging_endpoint() as hanging,
            await Client.connect(b.url) as c,
            httpx.AsyncClient(base_url=b.http) as h,
        ):
            await c.create_topic("orders", queues=1)
            sick = hanging.url
            await prepare_many(c, sick, 200)
            deadline = time.monotonic() + 6 * HANG_S  # three timeouts open it: after HANG_S
            while True:
                endpoints = (await h.get("/v1/checks/endpoints")).json()["endpoints"]
                (sick_info,) = [e for e in endpoints if sick.startswith(e["endpoint"])] or [None]
                if sick_info is not None and sick_info["breaker"] == "open":
                    break
                assert time.monotonic() < deadline, f"the breaker never opened: {endpoints}"
                await asyncio.sleep(0.05)  # polling the broker's state: the condition under test
            # Open for a minute: a healthy endpoint is still checked at once meanwhile.
            assert await checked_after(c, checks) < HEALTHY_S
            metrics = (await h.get("/metrics")).text
            connections = len(hanging.accepted)
    finally:
        b.stop()
    assert sick_info["failures"] >= 3 and sick_info["opened"] == 1
    assert 50_000 < sick_info["retry_in_ms"] <= 60_000
    assert sick_info["queued"] + sick_info["inflight"] >= 200 - 8
    # The first lanes' worth and one per timeout before the third, then nothing while open.
    assert connections <= 8 + 2, connections
    assert re.search(r"^txbroker_tx_check_endpoints_open(\{[^}]*\})? 1\.0$", metrics, re.M), metrics
