"""The client at a wrong address, against real servers: the broker's HTTP port (named, with
the TCP port, and not retried), another HTTP server, a port that accepts and never answers (no
attempt outlasts the connect deadline), and an auth token a broker without tokens does not
check (one warning per client, not one per connection)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette

from tests.conftest import BrokerProcess
from txbroker.runtime.httpserve import serving
from txbroker_sdk import Client
from txbroker_sdk.errors import ProtocolError, RequestTimeout, WrongPort

TOKEN_WARNING = "an auth token was given, but the broker at"


@pytest.fixture(scope="module")
def idle_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker without tokens that closes a connection silent for a second."""
    data_dir = tmp_path_factory.mktemp("wrong-address") / "broker"
    b = BrokerProcess(data_dir, "--idle-timeout-ms", "1000").start()
    yield b
    b.stop()


async def test_the_brokers_http_port_is_named_with_its_tcp_port(idle_broker: BrokerProcess) -> None:
    http = idle_broker.http.removeprefix("http://")
    tcp = idle_broker.url.rsplit(":", 1)[1]
    started = time.monotonic()
    with pytest.raises(WrongPort) as caught:
        await Client.connect(f"txb://{http}")  # the default deadline: 10 s of retries
    # Not retried (it would answer the same) for the default deadline's 10 s.
    assert time.monotonic() - started < 5.0
    assert str(caught.value) == (
        f"{http} is the broker's HTTP port (it answered in HTTP: HTTP/1.1 400 Bad Request); "
        f"the TCP port is {tcp}: txb://127.0.0.1:{tcp}"
    )
    assert isinstance(caught.value, ProtocolError) and caught.value.code == "WRONG_PORT"
    # A client made before connecting says the same on its first request, and every one after.
    client = Client(f"txb://{http}")
    for _ in range(2):
        with pytest.raises(WrongPort, match=f"the TCP port is {tcp}"):
            await client.ping()
    await client.close()


async def test_another_http_server_is_named_as_an_http_port() -> None:
    async with serving(Starlette()) as base:
        address = base.removeprefix("http://")
        with pytest.raises(WrongPort) as caught:
            await Client.connect(f"txb://{address}", connect_deadline_s=5)
    assert str(caught.value) == (
        f"{address} answered in HTTP (HTTP/1.1 400 Bad Request): that is an HTTP port (the "
        "broker's HTTP port?), not a broker's TCP port; the TCP port is the broker's --port "
        "(9876 unless set)"
    )


async def test_no_attempt_outlasts_the_connect_deadline() -> None:
    # A port that accepts (the kernel completes the handshake) and never answers HELLO.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(RequestTimeout, match=r"HELLO got no answer within 1 s"):
            await Client.connect(f"txb://127.0.0.1:{port}", timeout_s=10, connect_deadline_s=1)
        took = time.monotonic() - started
    assert 1.0 <= took < 5.0, took  # not the 10 s of timeout_s


async def test_a_token_the_broker_does_not_check_is_warned_once_per_client(
    idle_broker: BrokerProcess, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.WARNING, logger="txbroker_sdk.connection")
    address = idle_broker.url.removeprefix("txb://")
    async with await Client.connect(idle_broker.url, auth_token="s3cret", keepalive_s=0) as c:
        # The broker closes the silent connection; the next request connects again (HELLO).
        assert c._wire is not None
        async with asyncio.timeout(10):
            await c._wire.lost
        await c.ping()
        assert c.reconnects == 1
    warned = [r for r in caplog.records if TOKEN_WARNING in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in warned] == [
        (
            logging.WARNING,
            f"an auth token was given, but the broker at {address} checks none (it has no "
            "tokens): the token is ignored, and the broker serves anyone who can reach it",
        )
    ]
    caplog.clear()
    async with await Client.connect(idle_broker.url):  # no token: nothing to say
        pass
    guarded = BrokerProcess(tmp_path / "guarded", "--auth-token", "s3cret").start()
    try:
        async with await Client.connect(guarded.url, auth_token="s3cret") as c:
            await c.ping()
    finally:
        guarded.stop()
    assert not [r for r in caplog.records if TOKEN_WARNING in r.getMessage()]
