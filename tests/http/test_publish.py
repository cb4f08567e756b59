"""POST /v1/topics/{topic}/messages on a real broker: single and batch, text and base64,
durable before 201, delivered to TCP consumers; Idempotency-Key by the IETF draft's rules."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import httpx
import pytest

from tests.conftest import BrokerProcess
from tests.http.conftest import consume_all, make_topic, problem, stored_count
from txbroker_sdk.errors import ReplicationTimeout


async def test_a_message_is_stored_and_delivered_like_a_tcp_send(
    api_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    await make_topic(api_broker, "pub-single")
    r = await http.post(
        "/v1/topics/pub-single/messages",
        json={"body": '{"order": 1}', "key": "order-1", "tags": "new", "headers": {"h": "v"}},
    )
    assert r.status_code == 201, r.text
    receipt = r.json()
    assert receipt["topic"] == "pub-single" and receipt["offset"] == 0
    assert receipt["duplicate"] is False and len(receipt["message_id"]) == 32
    [m] = await consume_all(api_broker, "pub-single", "g", 1)
    assert (m.body, m.key, m.tags, m.headers) == (b'{"order": 1}', "order-1", "new", {"h": "v"})
    assert (m.message_id, m.queue_id) == (receipt["message_id"], receipt["queue"])


async def test_a_batch_is_stored_whole_and_base64_carries_bytes(
    api_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    await make_topic(api_broker, "pub-batch", queues=1)
    raw = bytes(range(256))
    r = await http.post(
        "/v1/topics/pub-batch/messages",
        json={
            "messages": [
                {"body": "first"},
                {"body": base64.b64encode(raw).decode(), "encoding": "base64"},
            ]
        },
    )
    assert r.status_code == 201, r.text
    receipts = r.json()["receipts"]
    assert [x["offset"] for x in receipts] == [0, 1]
    got = await consume_all(api_broker, "pub-batch", "g", 2)
    assert [m.body for m in got] == [b"first", raw]


async def test_an_idempotency_key_replays_the_first_answer(
    api_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    await make_topic(api_broker, "pub-idem")
    url = "/v1/topics/pub-idem/messages"
    first = await http.post(url, json={"body": "pay 10"}, headers={"Idempotency-Key": '"pay-1"'})
    again = await http.post(url, json={"body": "pay 10"}, headers={"Idempotency-Key": "pay-1"})
    assert first.status_code == again.status_code == 201
    assert again.json() == {**first.json(), "duplicate": True}
    # The same key with another body is a client bug: 422, and nothing stored.
    other = await http.post(url, json={"body": "pay 99"}, headers={"Idempotency-Key": "pay-1"})
    problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
    # In a batch, each message carries its own key; a replayed one is marked duplicate.
    r = await http.post(
        url,
        json={
            "messages": [
                {"body": "pay 10", "idempotency_key": "pay-1"},
                {"body": "pay 20", "idempotency_key": "pay-2"},
            ]
        },
    )
    assert r.status_code == 201, r.text
    assert [x["duplicate"] for x in r.json()["receipts"]] == [True, False]
    assert await stored_count(api_broker, "pub-idem") == 2


async def test_a_batch_with_a_reused_key_stores_nothing(
    api_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    await make_topic(api_broker, "pub-idem-batch")
    url = "/v1/topics/pub-idem-batch/messages"
    r = await http.post(url, json={"body": "a"}, headers={"Idempotency-Key": "k1"})
    assert r.status_code == 201
    batch = {"messages": [{"body": "new"}, {"body": "not a", "idempotency_key": "k1"}]}
    problem(await http.post(url, json=batch), 422, "IDEMPOTENCY_KEY_REUSED")
    twice = {
        "messages": [{"body": "x", "idempotency_key": "k2"}, {"body": "y", "idempotency_key": "k2"}]
    }
    problem(await http.post(url, json=twice), 422, "IDEMPOTENCY_KEY_REUSED")
    assert await stored_count(api_broker, "pub-idem-batch") == 1


async def test_concurrent_requests_with_one_key_store_it_once(
    api_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    """While the first is in flight the others get 409 (retry later) or, once it is answered,
    its receipt: never a second message."""
    await make_topic(api_broker, "pub-race")
    url = "/v1/topics/pub-race/messages"
    answers = await asyncio.gather(
        *(
            http.post(url, json={"body": "once"}, headers={"Idempotency-Key": "race"})
            for _ in range(20)
        )
    )
    assert {r.status_code for r in answers} <= {201, 409}
    ids = {r.json()["message_id"] for r in answers if r.status_code == 201}
    assert len(ids) == 1
    for r in answers:
        if r.status_code == 409:
            problem(r, 409, "IDEMPOTENCY_KEY_IN_FLIGHT")
    assert await stored_count(api_broker, "pub-race") == 1


async def test_a_delayed_message_answers_offset_minus_one(
    api_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    import time

    await make_topic(api_broker, "pub-delay")
    at = time.time_ns() // 1_000_000 + 60_000
    r = await http.post(
        "/v1/topics/pub-delay/messages", json={"body": "later", "deliver_at_ms": at}
    )
    assert r.status_code == 201 and r.json()["offset"] == -1, r.text


async def test_a_key_still_in_flight_is_409_and_a_slow_write_is_503(tmp_path: Path) -> None:
    """A master with sync replication and no slave holds every write until the replication
    timeout: meanwhile the same key is 409; then the first is 503 (stored on the master
    only, so retry with the key), and so is the retry: the message is still on no slave, and a
    duplicate's receipt is an acknowledgement too."""
    b = BrokerProcess(
        tmp_path / "b", "--replication", "sync", "--replication-timeout-ms", "2000"
    ).start()
    try:
        # The topic is made on the master; its answer waits for a slave to hold it too.
        with pytest.raises(ReplicationTimeout):
            await make_topic(b, "pub-held")
        url = "/v1/topics/pub-held/messages"
        async with httpx.AsyncClient(base_url=b.http, timeout=30) as h:
            key = {"Idempotency-Key": "held-1"}
            first = asyncio.create_task(h.post(url, json={"body": "held"}, headers=key))
            await asyncio.sleep(0.5)
            second = await h.post(url, json={"body": "held"}, headers=key)
            problem(second, 409, "IDEMPOTENCY_KEY_IN_FLIGHT")
            r = problem(await first, 503, "REPLICATION_TIMEOUT")
            assert "idempotency key" in str(r["detail"])
            retry = await h.post(url, json={"body": "held"}, headers=key)
            problem(retry, 503, "REPLICATION_TIMEOUT")
    finally:
        assert b.stop() == 0
