"""The HTTP admin API of a real broker process."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import BrokerProcess
from txbroker_sdk import Client, Consumer


async def test_admin_endpoints(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c, httpx.AsyncClient(base_url=broker.http) as h:
        health = (await h.get("/healthz")).json()
        assert (health["status"], health["store"]) == ("ok", "open")
        assert health["connections"]["authenticated"] == 1  # this client
        await c.create_topic("orders", queues=2)
        r1 = await c.send("orders", b'{"n": 1}', key="order-1", headers={"h": "v"})
        await c.send("orders", b"\xff", key="order-2")
        topics = (await h.get("/v1/topics")).json()["topics"]
        assert topics[0]["topic"] == "orders"
        assert sum(q["max_offset"] for q in topics[0]["queues"]) == 2

        by_key = (await h.get("/v1/messages", params={"topic": "orders", "key": "order-1"})).json()
        [m] = by_key["messages"]
        assert (
            m["message_id"] == r1.message_id
            and m["body"] == '{"n": 1}'
            and m["headers"] == {"h": "v"}
        )
        binary = (await h.get("/v1/messages", params={"topic": "orders", "key": "order-2"})).json()
        assert binary["messages"][0]["encoding"] == "base64"
        by_id = (await h.get(f"/v1/messages/{r1.message_id}")).json()
        assert by_id["keys"] == ["order-1"]

        async with Consumer(c, "billing", "orders") as consumer:
            got = await consumer.fetch(timeout_ms=500)
            got[0].ack()
            await consumer.commit()
            groups = (await h.get("/v1/groups")).json()["groups"]
            [g] = [g for g in groups if g["group"] == "billing"]
            assert g["total_lag"] == 2 - 1 and g["members"] == [consumer.member_id]
            metrics = (await h.get("/metrics")).text
        # The values are checked in test_metrics.py; here the endpoint is part of the admin app.
        assert "messaging_client_sent_messages_total{" in metrics
        assert "txbroker_consumer_lag{" in metrics and "txbroker_server_connections{" in metrics


async def test_admin_errors_are_problems_with_status(broker: BrokerProcess) -> None:
    async with httpx.AsyncClient(base_url=broker.http) as h:
        r = await h.get("/v1/messages", params={"topic": "orders"})
        assert r.status_code == 400 and r.json()["code"] == "BAD_REQUEST"
        r = await h.get("/v1/messages", params={"topic": "nope", "key": "k"})
        assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND"
        r = await h.get("/v1/messages", params={"topic": "bad/name", "key": "k"})
        assert r.status_code == 422 and r.json()["code"] == "INVALID_NAME"
        r = await h.get("/v1/messages/0123")
        assert r.status_code == 404
        r = await h.get("/no/such/thing")
        assert r.status_code == 404 and "no such endpoint" in r.json()["detail"]


async def test_admin_requires_the_token_when_the_broker_has_one(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "auth", "--auth-token", "s3cret").start()
    try:
        async with httpx.AsyncClient(base_url=b.http) as h:
            assert (await h.get("/healthz")).status_code == 200  # liveness stays open
            r = await h.get("/v1/topics")
            assert r.status_code == 401 and r.json()["code"] == "UNAUTHENTICATED"
            r = await h.get("/v1/topics", headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401
            r = await h.get("/v1/topics", headers={"Authorization": "Bearer s3cret"})
            assert r.status_code == 200
    finally:
        b.stop()
