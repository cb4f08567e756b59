"""Two-phase messages over HTTP on a real broker: prepare, commit or roll back, the same
decision again, the opposite one refused with the state it is in; the traceparent travels."""

from __future__ import annotations

import httpx

from tests.conftest import BrokerProcess
from tests.http.conftest import (
    DEAD_CHECK_URL,
    GROUP,
    consume_all,
    make_topic,
    problem,
    stored_count,
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _prepare(topic: str, body: str, **extra: object) -> dict[str, object]:
    return {
        "topic": topic,
        "body": body,
        "producer_group": GROUP,
        "check_url": DEAD_CHECK_URL,
        "timeout_ms": 600_000,  # no back-check during the test
        **extra,
    }


async def test_prepare_then_commit_delivers_once(
    api_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    await make_topic(api_broker, "tx-commit", queues=1)
    r = await http.post(
        "/v1/transactions",
        json=_prepare("tx-commit", "order 7", key="order-7", headers={"h": "v"}),
        headers={"traceparent": TRACEPARENT},
    )
    assert r.status_code == 201, r.text
    tx = r.json()
    assert tx.keys() == {"tx_id", "message_id"}
    assert await stored_count(api_broker, "tx-commit") == 0  # a half message: not visible
    shown = (await http.get(f"/v1/transactions/{tx['tx_id']}")).json()
    assert shown["state"] == "prepared" and shown["producer_group"] == GROUP

    r = await http.post(f"/v1/transactions/{tx['tx_id']}/commit")
    assert r.status_code == 200, r.text
    assert r.json()["tx_id"] == tx["tx_id"] and r.json()["state"] == "committed"
    assert r.json()["resolved_by"] == "producer"
    again = await http.post(f"/v1/transactions/{tx['tx_id']}/commit")
    assert again.status_code == 200 and again.json()["state"] == "committed"
    p = problem(await http.post(f"/v1/transactions/{tx['tx_id']}/rollback"), 409)
    assert p["code"] == "TRANSACTION_CONFLICT" and p["state"] == "committed"
    shown = (await http.get(f"/v1/transactions/{tx['tx_id']}")).json()  # as the broker keeps it
    assert (shown["state"], shown["resolved_by"], shown["key"]) == (
        "committed",
        "producer",
        "order-7",
    )
    assert shown["message_id"] == tx["message_id"] and shown["producer_group"] == GROUP

    [m] = await consume_all(api_broker, "tx-commit", "g", 1)
    assert (m.body, m.key, m.message_id) == (b"order 7", "order-7", tx["message_id"])
    assert m.headers == {"h": "v", "traceparent": TRACEPARENT}


async def test_prepare_then_rollback_delivers_nothing(
    api_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    await make_topic(api_broker, "tx-rollback", queues=1)
    r = await http.post(
        "/v1/transactions",
        json=_prepare("tx-rollback", "AAEC", encoding="base64", tx_id="0" * 32),
        headers={"traceparent": "not a traceparent"},  # ignored, as W3C says
    )
    assert r.status_code == 201 and r.json()["tx_id"] == "0" * 32, r.text
    for _ in range(2):
        r = await http.post(f"/v1/transactions/{'0' * 32}/rollback")
        assert r.status_code == 200 and r.json()["state"] == "rolled_back", r.text
    p = problem(await http.post(f"/v1/transactions/{'0' * 32}/commit"), 409)
    assert p["state"] == "rolled_back"
    # The same tx_id cannot be prepared again once it ended.
    r = await http.post("/v1/transactions", json=_prepare("tx-rollback", "x", tx_id="0" * 32))
    problem(r, 409, "TRANSACTION_CONFLICT")
    assert await stored_count(api_broker, "tx-rollback") == 0


async def test_a_repeated_prepare_answers_the_same_half(
    api_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    await make_topic(api_broker, "tx-retry", queues=1)
    body = _prepare("tx-retry", "x", tx_id="1" * 32)
    first = await http.post("/v1/transactions", json=body)
    again = await http.post("/v1/transactions", json=body)
    assert first.status_code == again.status_code == 201
    assert first.json() == again.json()
    assert (await http.post(f"/v1/transactions/{'1' * 32}/commit")).status_code == 200
