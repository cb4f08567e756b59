"""What a service developer meets in the first hour, made to fail fast and say what to do: a
broker address that does not answer (each retry logged, a deadline), a handler with the wrong
signature (refused when decorated), and a subscriber whose broker is gone (it still stops
within its grace on SIGTERM)."""

from __future__ import annotations

import logging
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tests.conftest import ROOT, BrokerProcess
from tests.sdk.subscriber_child import GRACE_S
from txbroker_sdk import Client, ConsumedMessage, Subscribers, TxbService
from txbroker_sdk.connection import DEFAULT_CONNECT_DEADLINE_S
from txbroker_sdk.database import create_engine
from txbroker_sdk.errors import BrokerUnreachable, InvalidArgument


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when this returns: nothing listens


async def test_connect_retries_are_logged_and_bounded_by_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = _closed_port()
    caplog.set_level(logging.WARNING, logger="txbroker_sdk.connection")
    started = time.monotonic()
    with pytest.raises(BrokerUnreachable, match=rf"127\.0\.0\.1:{port} within 1 s"):
        await Client.connect(f"txb://127.0.0.1:{port}", connect_deadline_s=1.0)
    took = time.monotonic() - started
    assert 0.9 <= took < 4.0
    retries = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(retries) >= 3
    # each names the address, the attempt, the error and the pause before the next one
    assert retries[0].startswith(f"broker 127.0.0.1:{port}: attempt 1 failed (")
    assert re.search(r"\(\[Errno \d+\] .+\); retrying in 0\.05 s$", retries[0]), retries[0]
    assert f"attempt {len(retries)} failed" in retries[-1]


async def test_the_deadline_is_a_setting_of_the_client(caplog: pytest.LogCaptureFixture) -> None:
    port = _closed_port()
    address = f"txb://127.0.0.1:{port}"
    assert Client(address).connect_deadline_s == DEFAULT_CONNECT_DEADLINE_S == 10.0
    started = time.monotonic()
    with pytest.raises(BrokerUnreachable, match=f"cannot connect to 127.0.0.1:{port}: "):
        await Client.connect(address, connect_deadline_s=0)  # one attempt
    assert time.monotonic() - started < 5.0  # not the default deadline's 10 s
    # A client that connects on first use keeps to its connect deadline, not to the longer
    # reconnect window of a connection that dropped.
    caplog.set_level(logging.WARNING, logger="txbroker_sdk.connection")
    client = Client(address, connect_deadline_s=0.5, reconnect_s=60)
    started = time.monotonic()
    with pytest.raises(BrokerUnreachable, match=r"within 0\.5 s"):
        await client.ping()
    assert time.monotonic() - started < 3.0
    assert any("retrying in" in r.getMessage() for r in caplog.records)
    assert client.reconnects == 0  # a first connection is not a reconnect
    with pytest.raises(InvalidArgument, match="connect_deadline_s"):
        Client(address, connect_deadline_s=-1)


def _subscribers(sqlite_url: str) -> Subscribers:
    client = Client("txb://127.0.0.1:1")  # never used: decorating needs no connection
    return Subscribers(client, async_sessionmaker(create_engine(sqlite_url)))


@pytest.mark.parametrize("service", ["Subscribers", "TxbService"])
def test_a_handler_with_the_wrong_signature_is_refused_when_decorated(
    sqlite_url: str, service: str
) -> None:
    if service == "Subscribers":
        subscriber = _subscribers(sqlite_url).subscriber
    else:
        subscriber = TxbService(broker="txb://127.0.0.1:1", database=sqlite_url).subscriber

    def not_async(session: AsyncSession, msg: ConsumedMessage) -> None:
        pass

    async def one_argument(msg: ConsumedMessage) -> None:
        pass

    async def three(session: AsyncSession, msg: ConsumedMessage, extra: int) -> None:
        pass

    with pytest.raises(TypeError, match=r"not_async must be `async def handler\(session, msg\)`"):
        subscriber("orders", group="g1")(not_async)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"one_argument must take \(session"):
        subscriber("orders", group="g2")(one_argument)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="missing a required argument: 'extra'"):
        subscriber("orders", group="g3")(three)  # type: ignore[arg-type]

    async def fine(session: AsyncSession, msg: ConsumedMessage, *, note: str = "") -> None:
        pass

    assert subscriber("orders", group="g4")(fine) is fine


def _await_in_log(log: Path, text: str, proc: subprocess.Popen[str], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while text not in log.read_text():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"no {text!r} in: {log.read_text()}"
        time.sleep(0.02)  # watching another process's log: there is no event to await


def _await_line(proc: subprocess.Popen[str], within_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], within_s)
    assert ready, f"no line from the child within {within_s} s"
    return proc.stdout.readline().strip()


@pytest.mark.parametrize("mode", ["idle", "stuck"])
def test_a_subscriber_stops_within_its_grace_after_its_broker_is_gone(
    broker: BrokerProcess, sqlite_url: str, tmp_path: Path, mode: str
) -> None:
    """The broker is killed and the subscriber is retrying (its reconnect would go on for
    30 s): SIGTERM still ends it within its grace, a handler in flight cancelled at the end
    of the grace (``stuck``), and the commit of offsets given up within the grace."""
    log = tmp_path / "subscriber.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.sdk.subscriber_child", sqlite_url, broker.url, mode],
            stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
        )  # fmt: skip
    try:
        assert _await_line(proc, 60) == "READY", log.read_text()
        broker.kill()
        _await_in_log(log, "attempt 1 failed", proc, 30)  # reconnecting to nothing
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, log.read_text()
    # Well under the 30 s the reconnect would take, with room for the interpreter's exit on a
    # loaded 2-core machine (4.3 s was seen against a 2 s grace).
    assert took < GRACE_S + 8.0, (took, log.read_text())
    if mode == "stuck":
        assert out.split() == ["CANCELLED"]  # after the grace, not before
        assert took >= GRACE_S - 0.1, took
        assert "1 handler(s) still running after 2.0 s: cancelled" in log.read_text()
