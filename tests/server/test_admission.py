"""Connection limits (admission.py) on real broker processes over real TCP: idle sockets that
never say HELLO cannot lock a real client out, handshakes and idle connections have deadlines
(held long polls and pinging SDK clients excepted), a frame flood is cut with a clear error,
and every refusal is counted on /metrics and /healthz."""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import BrokerProcess
from tests.server.rawclient import RawClient, open_idle_sockets
from tests.server.test_metrics import parse
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import Empty, HeartbeatRequest, Hello, PullRequest
from txbroker.runtime import brokerproc
from txbroker_sdk import Client
from txbroker_sdk.errors import BrokerUnreachable

IDLE_SOCKETS = 1_000


@pytest.fixture
def own_files() -> Iterator[None]:
    """This process holds a thousand sockets: its soft open-file limit up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < IDLE_SOCKETS + 200:
        pytest.skip(f"the hard open-file limit {hard} is too low for {IDLE_SOCKETS} sockets")
    # "Unlimited" still stops at fs.nr_open for this limit; what the test needs is plenty.
    wanted = hard if hard != resource.RLIM_INFINITY else 4 * IDLE_SOCKETS
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class _Retries(logging.Handler):
    """Set when the SDK logs a failed connection attempt."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = asyncio.Event()
        self.message = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.message = record.getMessage()
        self.seen.set()


def start(tmp_path: Path, *flags: str) -> BrokerProcess:
    return BrokerProcess(tmp_path / "broker", *flags).start()


async def health(b: brokerproc.BrokerProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=b.http) as h:
        connections: dict[str, Any] = (await h.get("/healthz")).json()["connections"]
        return connections


async def refused(b: brokerproc.BrokerProcess, token: str | None = None) -> dict[str, float]:
    """txbroker.connections.refused by reason, from /metrics."""
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=b.http, headers=auth) as h:
        samples = parse((await h.get("/metrics")).text)
    return {
        dict(labels)["txbroker_connection_reason"]: v
        for (name, labels), v in samples.items()
        if name == "txbroker_connections_refused_total"
    }


async def test_a_thousand_idle_sockets_do_not_lock_out_a_client(
    tmp_path: Path, own_files: None
) -> None:
    # The broker starts as on a system whose open-file limit is low (soft 256, hard 512): before,
    # idle sockets used every descriptor and the event loop dropped each new connection.
    b = brokerproc.BrokerProcess(
        tmp_path / "broker",
        "--segment-mib",
        "8",
        env={"TXB_INDEX_CAPACITY": "65536"},
        nofile=(256, 512),
    ).start()
    try:
        socks = await asyncio.to_thread(open_idle_sockets, b.url, IDLE_SOCKETS)
        try:
            async with await Client.connect(b.url, connect_deadline_s=10) as c:
                await c.create_topic("orders", queues=1)
                receipt = await c.send("orders", b"through the flood")
                assert receipt.queue_offset == 0
                conns = await health(b)
        finally:
            for s in socks:
                s.close()
        # Lowered to what 512 descriptors allow, a tenth of it reserved for authenticated ones.
        assert 2 <= conns["max"] < 512 and conns["reserved"] >= 1
        handshake_slots = conns["max"] - conns["reserved"]
        assert conns["handshaking"] <= handshake_slots and conns["authenticated"] == 1
        assert conns["refused"]["handshake_evicted"] >= IDLE_SOCKETS - handshake_slots
        assert (await refused(b))["handshake_evicted"] >= IDLE_SOCKETS - handshake_slots
    finally:
        b.stop()
    log = b.log_path.read_text()
    assert "open files: soft limit raised from 256 to 512 (the hard limit)" in log
    assert "max_connections 10000 lowered to" in log


async def test_sockets_without_hello_are_closed_at_the_deadline(tmp_path: Path) -> None:
    b = start(tmp_path, "--handshake-timeout-ms", "500", "--auth-token", "t0ken")
    try:
        silent = [await RawClient.open(b.url) for _ in range(20)]
        greeted = await RawClient.open(b.url)
        await greeted.hello("t0ken")
        t0 = time.monotonic()
        ends = await asyncio.gather(*(s.ended_with(timeout_s=10) for s in silent))
        assert time.monotonic() - t0 < 5
        assert {(e.code, e.retriable) for e in ends if e is not None} == {
            ("HANDSHAKE_TIMEOUT", True)
        }
        assert all(e is not None and "no HELLO within 0.5 s" in e.message for e in ends)
        # The one that said HELLO is still served.
        assert (await greeted.request(Opcode.PING, Empty())).opcode == Opcode.PING
        # A wrong token is refused and counted too.
        wrong = await RawClient.open(b.url)
        wrong.send(Opcode.HELLO, Hello("raw-test", "nope"))
        end = await wrong.ended_with()
        assert end is not None and end.code == "UNAUTHENTICATED"
        counts = await refused(b, "t0ken")
        assert counts["handshake_timeout"] == 20 and counts["unauthenticated"] == 1
        assert (await health(b))["authenticated"] == 1
        for c in (*silent, greeted, wrong):
            await c.close()
    finally:
        b.stop()


async def test_a_frame_flood_is_cut_with_a_clear_error(tmp_path: Path) -> None:
    b = start(tmp_path, "--max-frames-per-s", "1000")
    try:
        flood = await RawClient.open(b.url)
        await flood.hello()
        flood.send(Opcode.PING, Empty(), times=5_000)  # the bucket holds 2,000
        end = await flood.ended_with()
        assert end is not None and (end.code, end.retriable) == ("RATE_LIMITED", True)
        assert "over 1000 frames a second" in end.message
        await flood.close()
        # Everyone else is served as before.
        async with await Client.connect(b.url) as c:
            await c.create_topic("orders", queues=1)
            await c.send("orders", b"after the flood")
        assert (await refused(b))["frame_rate"] == 1
    finally:
        b.stop()


async def test_idle_connections_are_closed_but_long_polls_and_pinging_clients_are_not(
    tmp_path: Path,
) -> None:
    b = start(tmp_path, "--idle-timeout-ms", "1000")
    try:
        async with (
            await Client.connect(b.url, keepalive_s=0.2) as pinging,
            await Client.connect(b.url, keepalive_s=0) as polling,
        ):
            await pinging.create_topic("orders", queues=1)
            hb = await polling.request(Opcode.HEARTBEAT, HeartbeatRequest("g", "orders", "m1"))
            pull = PullRequest("g", "orders", "m1", hb.generation, hold_ms=4_000)
            held = asyncio.create_task(polling.request(Opcode.PULL, pull, timeout_s=10))
            silent = await RawClient.open(b.url)
            await silent.hello()
            end = await silent.ended_with()
            assert end is not None and (end.code, end.retriable) == ("IDLE_TIMEOUT", True)
            # Both SDK connections have been silent longer than the raw one: the pings and the
            # held pull kept them.
            conns = await health(b)
            assert conns["authenticated"] == 2 and conns["refused"]["idle_timeout"] == 1
            assert not held.done() and (await held).messages == []
            assert pinging.connected and pinging.reconnects == 0
            # A client that does not ping is closed once idle; its next request reconnects.
            assert polling._wire is not None
            async with asyncio.timeout(10):
                await polling._wire.lost
            await polling.request(Opcode.PING, Empty())
            assert polling.reconnects == 1
            await pinging.send("orders", b"still here")
            await silent.close()
    finally:
        b.stop()


async def test_reserved_slots_and_refusal_when_all_are_authenticated(tmp_path: Path) -> None:
    b = start(tmp_path, "--max-connections", "4", "--reserved-connections", "2")
    clients: list[Client] = []
    try:
        # Two slots for connections without HELLO: a third pushes the oldest out.
        first, second = await RawClient.open(b.url), await RawClient.open(b.url)
        third = await RawClient.open(b.url)
        end = await first.ended_with()
        assert end is not None and end.code == "HANDSHAKE_TIMEOUT"
        assert "make room for newer connections" in end.message
        # Authenticated clients take every slot, pushing the silent ones out.
        for _ in range(4):
            clients.append(await Client.connect(b.url, connect_deadline_s=0))
        for evicted in (second, third):
            end = await evicted.ended_with()
            assert end is not None and end.code == "HANDSHAKE_TIMEOUT"
        # Now a new connection is refused, with the reason.
        fifth = await RawClient.open(b.url)
        end = await fifth.ended_with()
        assert end is not None and (end.code, end.retriable) == ("TOO_MANY_CONNECTIONS", True)
        with pytest.raises(BrokerUnreachable):
            await Client.connect(b.url, connect_deadline_s=0)
        # A client that keeps trying gets in once a slot frees.
        refusals = _Retries()
        logging.getLogger("txbroker_sdk.connection").addHandler(refusals)
        try:
            waiting = asyncio.create_task(Client.connect(b.url, connect_deadline_s=20))
            async with asyncio.timeout(10):
                await refusals.seen.wait()  # refused at least once
        finally:
            logging.getLogger("txbroker_sdk.connection").removeHandler(refusals)
        assert "TOO_MANY_CONNECTIONS" in refusals.message
        await clients.pop().close()
        async with asyncio.timeout(10):
            clients.append(await waiting)
        await clients[-1].ping()
        counts = await refused(b)
        assert counts["max_connections"] >= 3 and counts["handshake_evicted"] == 3
        for raw in (first, second, third, fifth):
            await raw.close()
    finally:
        for c in clients:
            await c.close()
        b.stop()
