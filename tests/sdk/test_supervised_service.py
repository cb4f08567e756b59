"""A service's background loops under supervision, with real processes: a broker process
killed and started again with a token under a running service process (uvicorn, its settings
from TXB_* variables), whose subscriber must then say it is blocked and why (``/txb/ready``:
503), stay alive (``/txb/live``), log the cause once however often it retries, and consume
again once the token is given; the same with the token fixed at the broker while the service
runs; and a service that exits instead (``exit_when_blocked``), for a supervisor to restart.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import BrokerProcess, free_port
from tests.serviceproc import ServiceProcess
from txbroker_sdk import Client
from txbroker_sdk.web import EXIT_BLOCKED, LIVE_PATH, READY_PATH

TOPIC, GROUP = "events", "child"  # supervised_child.py's (importing it would start it)
TOKEN = "token-of-the-day"
OTHER = "rotated-token"
LOOP = f"subscriber {TOPIC} (group {GROUP})"
BLOCKED_RETRY_S = 0.5  # the service's slow retry, short: several retries within a test
WITHIN_S = 30.0


class Child(ServiceProcess):
    """``uvicorn tests.sdk.supervised_child:app`` as a process, on a SQLite file."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.db = tmp_path / "child.db"
        super().__init__(
            "tests.sdk.supervised_child:app",
            {
                **os.environ,
                "CHILD_DB": f"sqlite:///{self.db}",
                "CHILD_BLOCKED_RETRY_S": str(BLOCKED_RETRY_S),
                **env,
            },
            tmp_path / "child.log",
            name="the service",
        )

    def seen(self) -> list[str]:
        with sqlite3.connect(self.db) as conn:
            return [body for (body,) in conn.execute("SELECT body FROM seen ORDER BY rowid")]

    async def probe(self, path: str = READY_PATH) -> tuple[int, dict[str, Any]]:
        async with httpx.AsyncClient(timeout=10) as http:
            res = await http.get(self.url + path)
        return res.status_code, res.json()


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child]:
    c = Child(tmp_path)
    yield c
    c.stop()


class Broker:
    """A broker process on a port of its own, started again on it with other flags."""

    def __init__(self, tmp_path: Path) -> None:
        self.data_dir = tmp_path / "broker"
        self.port = str(free_port())
        self.proc: BrokerProcess | None = None

    def start(self, *extra: str) -> BrokerProcess:
        self.proc = BrokerProcess(self.data_dir, "--port", self.port, *extra).start()
        return self.proc

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path)
    yield b
    b.stop()


async def _until(check: Callable[[], Awaitable[bool]], what: str, child: Child) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not await check():
        assert time.monotonic() < deadline, f"not within {WITHIN_S} s: {what}\n{child.log()}"
        await asyncio.sleep(0.1)  # asking another process over HTTP, not a synchronisation


async def _ready(child: Child) -> None:
    async def ready() -> bool:
        return (await child.probe())[0] == 200

    await _until(ready, "the service reports ready", child)


async def _blocked(child: Child, *, retries: int) -> dict[str, Any]:
    """The loop's entry in /txb/ready once it is blocked and has been retried ``retries``
    times."""
    answer: dict[str, Any] = {}

    async def blocked() -> bool:
        status, body = await child.probe()
        [loop] = body["loops"]
        answer.update(loop)
        return status == 503 and loop["state"] == "blocked" and loop["failures"] > retries

    await _until(blocked, f"the subscriber blocked and retried {retries} times", child)
    return answer


async def _send(url: str, body: str, token: str | None = None) -> None:
    async with await Client.connect(url, auth_token=token) as client:
        await client.send(TOPIC, body.encode())


async def _seen(child: Child, body: str) -> None:
    async def applied() -> bool:
        return body in child.seen()

    await _until(applied, f"{body!r} applied", child)


async def test_a_broker_restarted_with_a_token_blocks_the_subscriber_until_it_has_it(
    broker: Broker, child: Child
) -> None:
    url = broker.start().url
    child.start(TXB_SERVER=url)
    await _ready(child)
    log = child.log()
    assert f"connected to the broker at {url} (txbroker " in log, log
    assert "without an auth token" in log
    assert f"subscribed: group {GROUP}, topic {TOPIC}, queues 0,1,2,3" in log, log
    await _send(url, "before")
    await _seen(child, "before")

    broker.kill()
    broker.start("--auth-token", TOKEN)
    loop = await _blocked(child, retries=3)
    assert loop["name"] == LOOP and loop["ready"] is False
    assert loop["last_error"].startswith("Unauthenticated: "), loop
    assert "TXB_AUTH_TOKEN" in loop["action"], loop
    assert 0 <= loop["retry_in_s"] <= BLOCKED_RETRY_S
    assert await child.probe(LIVE_PATH) == (200, {"live": True})  # alive: no restart needed
    # Retried every half second, the cause logged once, with what to do.
    failed = [ln for ln in child.log().splitlines() if f"{LOOP} failed: Unauthenticated" in ln]
    assert len(failed) == 1, child.log()
    assert "ERROR" in failed[0] and "TXB_AUTH_TOKEN" in failed[0]
    assert child.proc is not None and child.proc.poll() is None

    await _send(url, "while blocked", TOKEN)
    assert child.seen() == ["before"]  # not consumed: the service holds no token
    assert child.stop() in (0, -signal.SIGTERM)  # it still stops cleanly
    assert "Application shutdown complete" in child.log()

    child.start(TXB_SERVER=url, TXB_AUTH_TOKEN=TOKEN)  # the token given, by the environment
    await _ready(child)
    assert "with an auth token" in child.log()
    await _seen(child, "while blocked")
    assert child.seen() == ["before", "while blocked"]


async def test_a_token_fixed_at_the_broker_is_taken_up_without_a_restart(
    broker: Broker, child: Child
) -> None:
    url = broker.start("--auth-token", TOKEN).url
    child.start(TXB_SERVER=url, TXB_AUTH_TOKEN=TOKEN)
    await _ready(child)

    broker.kill()
    broker.start("--auth-token", OTHER)  # rotated, the service not told
    await _blocked(child, retries=1)
    broker.kill()
    broker.start("--auth-token", TOKEN)  # rotated back
    await _ready(child)  # the slow retry found the broker taking the token again
    await _send(url, "after", TOKEN)
    await _seen(child, "after")
    log = child.log()
    assert f"{LOOP}: working again" in log, log
    assert log.count(f"{LOOP} failed: Unauthenticated") == 1


async def test_exit_when_blocked_exits_for_a_supervisor_to_restart_it(
    broker: Broker, child: Child
) -> None:
    url = broker.start().url
    child.start(TXB_SERVER=url, CHILD_EXIT="1")
    await _ready(child)
    async with await Client.connect(url) as client:
        await client.delete_topic(TOPIC)  # a cause that needs a person: the topic is gone
    assert child.proc is not None
    status = await asyncio.to_thread(child.proc.wait, WITHIN_S)
    assert status == EXIT_BLOCKED, child.log()
    log = child.log()
    assert f"{LOOP} failed: NotFound" in log and "txbroker topic create" in log, log
    assert f"exiting with status {EXIT_BLOCKED} (exit_when_blocked)" in log, log
