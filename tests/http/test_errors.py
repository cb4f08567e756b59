"""Bad input of every kind is a 4xx problem a person can act on, and writes nothing: never a
5xx (the module's broker fixture also checks its log holds no traceback)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.conftest import BrokerProcess
from tests.http.conftest import make_topic, problem, stored_count
from txbroker.server.http.bodies import BODY_BYTES_MAX

TOPIC = "errs"
URL = f"/v1/topics/{TOPIC}/messages"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module", autouse=True)
def _topic(api_broker: BrokerProcess) -> None:
    asyncio.run(make_topic(api_broker, TOPIC))


@pytest.mark.parametrize(
    ("body", "status", "code", "says"),
    [
        (b'{"body": "x"', 400, "BAD_REQUEST", "not valid JSON"),
        (b"", 400, "BAD_REQUEST", "not valid JSON"),
        (b"[1, 2]", 400, "BAD_REQUEST", "JSON object"),
        (b'{"body": "x", "colour": "red"}', 400, "BAD_REQUEST", "unknown field `colour`"),
        (b'{"bdoy": "x"}', 400, "BAD_REQUEST", "unknown field `bdoy`"),
        (b'{"body": 7}', 400, "BAD_REQUEST", "Expected `str`"),
        (b'{"body": "x", "encoding": "latin-1"}', 400, "BAD_REQUEST", "$.encoding"),
        (b'{"body": "not base64!", "encoding": "base64"}', 400, "BAD_REQUEST", "base64"),
        (b'{"body": "x", "key": "two words"}', 422, "INVALID_ARGUMENT", "no spaces"),
        (b'{"messages": []}', 422, "INVALID_ARGUMENT", "a batch holds"),
        (b'{"messages": [{"body": "x", "extra": 1}]}', 400, "BAD_REQUEST", "messages[0]"),
    ],
)
async def test_a_bad_body_is_a_problem(
    http: httpx.AsyncClient, body: bytes, status: int, code: str, says: str
) -> None:
    p = problem(await http.post(URL, content=body, headers=JSON), status, code)
    assert says in str(p["detail"]), p


async def test_a_bad_message_in_a_batch_stores_none_of_it(
    api_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    before = await stored_count(api_broker, TOPIC)
    good = {"body": "fine"}
    for bad, status in [
        ({"body": "%%%", "encoding": "base64"}, 400),
        ({"body": "x", "key": "a b"}, 422),
        ({"body": "x" * (5 << 20)}, 413),  # over the store's 4 MiB body limit
        ({"body": "x", "headers": {"h": "v" * (64 << 10)}}, 413),  # properties over theirs
    ]:
        r = await http.post(URL, json={"messages": [good, good, bad, good]})
        problem(r, status)
    assert await stored_count(api_broker, TOPIC) == before


async def test_a_body_over_the_limit_is_413_without_reading_it_all(http: httpx.AsyncClient) -> None:
    r = await http.post(URL, content=b" " * (BODY_BYTES_MAX + 1), headers=JSON)
    problem(r, 413, "MESSAGE_TOO_LARGE")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it is read
        for _ in range(BODY_BYTES_MAX // (1 << 20) + 2):
            yield b" " * (1 << 20)

    r = await http.post(URL, content=chunks(), headers=JSON)
    problem(r, 413, "MESSAGE_TOO_LARGE")


async def test_a_single_message_over_the_body_limit_is_413(http: httpx.AsyncClient) -> None:
    problem(await http.post(URL, json={"body": "x" * (5 << 20)}), 413, "MESSAGE_TOO_LARGE")


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_that_is_not_json_is_415(
    http: httpx.AsyncClient, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    r = await http.post(URL, content=b'{"body": "x"}', headers=headers)
    problem(r, 415, "UNSUPPORTED_MEDIA_TYPE")


async def test_an_unknown_topic_is_404(http: httpx.AsyncClient) -> None:
    p = problem(await http.post("/v1/topics/nope/messages", json={"body": "x"}), 404, "NOT_FOUND")
    assert "'nope'" in str(p["detail"])
    r = await http.post("/v1/topics/nope/messages", json={"messages": [{"body": "x"}]})
    problem(r, 404, "NOT_FOUND")


async def test_an_internal_topic_is_refused(http: httpx.AsyncClient) -> None:
    problem(await http.post("/v1/topics/%25DLQ%25g/messages", json={"body": "x"}), 422)


async def test_the_header_key_belongs_to_a_single_message(http: httpx.AsyncClient) -> None:
    r = await http.post(URL, json={"messages": [{"body": "x"}]}, headers={"Idempotency-Key": "k"})
    problem(r, 400, "BAD_REQUEST")
    r = await http.post(
        URL, json={"body": "x", "idempotency_key": "a"}, headers={"Idempotency-Key": "b"}
    )
    problem(r, 400, "BAD_REQUEST")
    problem(await http.post(URL, json={"body": "x"}, headers={"Idempotency-Key": '""'}), 400)


async def test_transactions_refuse_bad_input(http: httpx.AsyncClient) -> None:
    base = {
        "topic": TOPIC,
        "body": "x",
        "producer_group": "orders-svc",
        "check_url": "http://127.0.0.1:9/c",
    }
    problem(await http.post("/v1/transactions", json={**base, "extra": 1}), 400, "BAD_REQUEST")
    problem(await http.post("/v1/transactions", json={"topic": TOPIC}), 400, "BAD_REQUEST")
    problem(await http.post("/v1/transactions", json={**base, "topic": "nope"}), 404)
    problem(await http.post("/v1/transactions", json={**base, "producer_group": "nobody"}), 422)
    problem(await http.post("/v1/transactions", json={**base, "check_url": "ftp://x"}), 422)
    problem(await http.post("/v1/transactions", json={**base, "timeout_ms": -5}), 422)
    problem(await http.post("/v1/transactions", json={**base, "tx_id": "not hex"}), 422)
    problem(await http.post("/v1/transactions/0123/commit"), 404, "TRANSACTION_NOT_FOUND")
    problem(await http.post("/v1/transactions/x/rollback"), 404, "TRANSACTION_NOT_FOUND")


async def test_unknown_paths_and_methods_are_problems(http: httpx.AsyncClient) -> None:
    problem(await http.post("/v1/topics/errs/message", json={}), 404, "NOT_FOUND")
    r = await http.get(URL)
    problem(r, 405, "METHOD_NOT_ALLOWED")
    assert r.headers["allow"] == "POST"
