"""The HTTP API with the TCP port's tokens, roles and TLS: 401 without a valid token, 403 for a
role that may not publish or receive (or not on that topic), and HTTPS when the broker serves
TLS."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import BrokerProcess
from tests.http.conftest import DEAD_CHECK_URL, GROUP, problem
from tests.server.test_tls import Pki, _tls_flags, pki  # noqa: F401  # pki: the fixture
from txbroker_sdk import Client

ADMIN = "http-api-admin-0c1f"
PRODUCER = "http-api-orders-producer-77aa"
CONSUMER = "http-api-consumer-31bd"
READER = "http-api-reader-9e02"
TOKENS = f"""
[[tokens]]
name = "ops"
token = "{ADMIN}"
roles = ["admin"]

[[tokens]]
name = "svc-orders"
token = "{PRODUCER}"
roles = ["produce"]
topics = ["orders*"]

[[tokens]]
name = "billing"
token = "{CONSUMER}"
roles = ["consume"]

[[tokens]]
name = "dashboard"
token = "{READER}"
roles = ["read"]
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("http-access")
    (root / "broker.toml").write_text(TOKENS)
    b = BrokerProcess(
        root / "broker", "--config", str(root / "broker.toml"), "--tx-secret", f"{GROUP}=s"
    ).start()
    yield b
    assert b.stop() == 0
    log = b.log_path.read_text()
    for token in (ADMIN, PRODUCER, CONSUMER, READER):
        assert token not in log


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_publishing_needs_a_valid_token(secured: BrokerProcess) -> None:
    async with await Client.connect(secured.url, auth_token=ADMIN) as c:
        await c.create_topic("orders", queues=1, exist_ok=True)
    async with httpx.AsyncClient(base_url=secured.http) as h:
        for headers in ({}, _bearer("wrong"), {"Authorization": f"Basic {PRODUCER}"}):
            r = await h.post("/v1/topics/orders/messages", json={"body": "x"}, headers=headers)
            problem(r, 401, "UNAUTHENTICATED")
            assert r.headers["www-authenticate"].startswith("Bearer")
        r = await h.post("/v1/transactions/x/commit")
        problem(r, 401, "UNAUTHENTICATED")
        # The API's description is public, like any service's: a generator needs no token.
        assert (await h.get("/v1/openapi.json")).status_code == 200


async def test_publishing_needs_the_produce_role_on_the_topic(secured: BrokerProcess) -> None:
    async with await Client.connect(secured.url, auth_token=ADMIN) as c:
        for topic in ("orders", "audit"):
            await c.create_topic(topic, queues=1, exist_ok=True)
    async with httpx.AsyncClient(base_url=secured.http) as h:
        url = "/v1/topics/orders/messages"
        for token in (CONSUMER, READER):
            p = problem(await h.post(url, json={"body": "x"}, headers=_bearer(token)), 403)
            assert "produce role on topic 'orders'" in str(p["detail"]), p
            # Refused before the body is read: what it holds does not matter.
            bad = {**_bearer(token), "content-type": "application/json"}
            problem(await h.post(url, content=b"{", headers=bad), 403, "FORBIDDEN")
        p = problem(
            await h.post(
                "/v1/topics/audit/messages", json={"body": "x"}, headers=_bearer(PRODUCER)
            ),
            403,
            "FORBIDDEN",
        )
        assert "token 'svc-orders'" in str(p["detail"])
        r = await h.post(url, json={"body": "x"}, headers=_bearer(PRODUCER))
        assert r.status_code == 201, r.text
        r = await h.post(url, json={"messages": [{"body": "x"}]}, headers=_bearer(ADMIN))
        assert r.status_code == 201, r.text

        prepare = {
            "topic": "audit",
            "body": "x",
            "producer_group": GROUP,
            "check_url": DEAD_CHECK_URL,
            "timeout_ms": 600_000,
        }
        problem(await h.post("/v1/transactions", json=prepare, headers=_bearer(PRODUCER)), 403)
        r = await h.post(
            "/v1/transactions", json={**prepare, "topic": "orders"}, headers=_bearer(PRODUCER)
        )
        assert r.status_code == 201, r.text
        tx_id = r.json()["tx_id"]
        for token in (CONSUMER, READER):
            r = await h.post(f"/v1/transactions/{tx_id}/commit", headers=_bearer(token))
            problem(r, 403, "FORBIDDEN")
        r = await h.post(f"/v1/transactions/{tx_id}/commit", headers=_bearer(PRODUCER))
        assert r.status_code == 200 and r.json()["state"] == "committed"


async def test_receiving_needs_the_consume_role_on_the_topic(secured: BrokerProcess) -> None:
    async with await Client.connect(secured.url, auth_token=ADMIN) as c:
        await c.create_topic("orders", queues=1, exist_ok=True)
    bodies = {
        "receive": {"max": 1, "wait_ms": 0, "invisible_ms": 1000},
        "ack": {"receipts": ["m.0.0.0123456789abcdef"]},
        "nack": {"receipts": ["m.0.0.0123456789abcdef"]},
        "extend": {"receipts": ["m.0.0.0123456789abcdef"], "invisible_ms": 1000},
    }
    async with httpx.AsyncClient(base_url=secured.http) as h:
        for action, body in bodies.items():
            url = f"/v1/groups/billing/topics/orders/{action}"
            problem(await h.post(url, json=body), 401, "UNAUTHENTICATED")
            for token in (PRODUCER, READER):
                p = problem(await h.post(url, json=body, headers=_bearer(token)), 403, "FORBIDDEN")
                assert "consume role on topic 'orders'" in str(p["detail"]), p
            r = await h.post(url, json=body, headers=_bearer(CONSUMER))
            assert r.status_code == 200, r.text


async def test_the_api_is_served_over_tls_when_the_broker_is(
    pki: Pki,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    b = BrokerProcess(tmp_path_factory.mktemp("http-tls") / "broker", *_tls_flags(pki)).start()
    try:
        assert b.http.startswith("https://")
        async with await Client.connect(b.url, tls_ca=pki.ca) as c:
            await c.create_topic("secure", queues=1)
        async with httpx.AsyncClient(
            base_url=b.http, verify=ssl.create_default_context(cafile=pki.ca)
        ) as h:
            r = await h.post("/v1/topics/secure/messages", json={"body": "over https"})
            assert r.status_code == 201, r.text
        plain = b.http.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            async with httpx.AsyncClient(base_url=plain) as h:
                await h.post("/v1/topics/secure/messages", json={"body": "in clear"})
    finally:
        assert b.stop() == 0
