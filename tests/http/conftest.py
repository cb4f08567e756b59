"""A real broker for the HTTP API's tests, reached over real HTTP; topics made with the SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.conftest import BrokerProcess
from txbroker.protocol.messages import PulledMessage
from txbroker_sdk import Client, Consumer

GROUP = "orders-svc"
SECRET = "http-api-test-secret"
DEAD_CHECK_URL = "http://127.0.0.1:9/check"  # nothing listens: back-checks fail, harmlessly


@pytest.fixture(scope="module")
def api_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for a module (each test uses its own topics): a start costs a second."""
    b = BrokerProcess(
        tmp_path_factory.mktemp("http-api") / "broker", "--tx-secret", f"{GROUP}={SECRET}"
    ).start()
    yield b
    assert b.stop() == 0
    log = b.log_path.read_text()
    # Bad input is answered 4xx: nothing reaches the log as an unexpected exception.
    assert "Traceback" not in log and " failed\n" not in log, log[-4000:]


@pytest.fixture
async def http(api_broker: BrokerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api_broker.http, timeout=30) as h:
        yield h


async def make_topic(broker: BrokerProcess, topic: str, queues: int = 2) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic(topic, queues=queues)


async def stored_count(broker: BrokerProcess, topic: str) -> int:
    async with httpx.AsyncClient(base_url=broker.http) as h:
        [t] = [t for t in (await h.get("/v1/topics")).json()["topics"] if t["topic"] == topic]
    return sum(q["max_offset"] for q in t["queues"])


async def consume_all(broker: BrokerProcess, topic: str, group: str, n: int) -> list[PulledMessage]:
    """The first ``n`` messages a fresh group of the topic gets (SDK consumer, over TCP)."""
    got: list[PulledMessage] = []
    async with await Client.connect(broker.url) as c, Consumer(c, group, topic) as consumer:
        for _ in range(50):
            for m in await consumer.fetch(timeout_ms=200):
                got.append(m.msg)
                m.ack()
            if len(got) >= n:
                break
    return got


def problem(r: httpx.Response, status: int, code: str | None = None) -> dict[str, object]:
    """Assert ``r`` is an RFC 9457 problem with ``status`` (and ``code``); return its body."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json", r.headers
    body: dict[str, object] = r.json()
    assert {"type", "title", "status", "detail"} <= body.keys(), body
    assert body["status"] == status and str(body["type"]).startswith("urn:txbroker:error:")
    if code is not None:
        assert body["code"] == code, body
    return body


__all__ = [
    "DEAD_CHECK_URL",
    "GROUP",
    "consume_all",
    "make_topic",
    "problem",
    "stored_count",
]
