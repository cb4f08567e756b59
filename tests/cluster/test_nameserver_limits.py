"""A NameServer keeps the broker's connection limits (server/admission.py): sockets that never
say HELLO are closed at the handshake deadline and a frame flood is cut, while a client that
said HELLO is served. A real NameServer process on a real etcd, over real TCP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import EtcdServer
from tests.cluster.groups import NameServerProcess
from tests.conftest import run_cli
from tests.server.rawclient import RawClient
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import Empty, RouteRequest

TOKEN = "ns-t0ken"


@pytest.fixture
def nameserver(etcd: EtcdServer, tmp_path: Path) -> Iterator[NameServerProcess]:
    ns = NameServerProcess(
        etcd.url,
        tmp_path / "ns.log",
        extra=(
            *("--auth-token", TOKEN, "--handshake-timeout-ms", "500"),
            *("--max-frames-per-s", "50"),
        ),
    )
    try:
        yield ns.start()
    finally:
        ns.stop()


async def test_sockets_without_hello_are_closed_and_a_flood_is_cut(
    nameserver: NameServerProcess,
) -> None:
    url = f"txb://{nameserver.address}"  # the raw client speaks to it as to a broker
    silent = [await RawClient.open(url) for _ in range(20)]
    greeted = await RawClient.open(url)
    await greeted.hello(TOKEN)
    t0 = time.monotonic()
    ends = await asyncio.gather(*(s.ended_with(timeout_s=10) for s in silent))
    assert time.monotonic() - t0 < 5
    assert {(e.code, e.retriable) for e in ends if e is not None} == {("HANDSHAKE_TIMEOUT", True)}
    assert all(e is not None and "no HELLO within 0.5 s" in e.message for e in ends)
    # The one that said HELLO is served: a route it asks for (none registered: an answer).
    assert (await greeted.request(Opcode.PING, Empty())).opcode == Opcode.PING
    assert (await greeted.request(Opcode.ROUTE, RouteRequest("orders"))).opcode == Opcode.ROUTE
    # Far more frames than 50 a second (bursts of 100): cut with a clear error.
    flood = await RawClient.open(url)
    await flood.hello(TOKEN)
    flood.send(Opcode.PING, Empty(), times=1_000)
    end = await flood.ended_with()
    assert end is not None and end.code == "RATE_LIMITED"
    for c in (*silent, greeted, flood):
        await c.close()


def test_a_bad_limit_is_refused_with_the_setting_named(etcd: EtcdServer) -> None:
    done = run_cli("nameserver", "--coordinator", etcd.url, "--idle-timeout-ms", "10")
    assert done.returncode != 0
    assert "idle_timeout_ms must be 0 (never) or at least 1000, got 10" in done.stderr
