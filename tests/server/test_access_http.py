"""Access control over HTTP: the admin API and the console of a real broker with a token file, and
the warning of a broker that listens beyond loopback without a token."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import BrokerProcess
from txbroker_sdk import Client

ADMIN = "http-admin-token-41d8c2"
READER = "http-reader-token-7f03aa"
PRODUCER = "http-producer-token-c9e1"
ORDERS_READER = "http-orders-reader-2b77"
GROUP = "orders-svc"

TOKENS = f"""
[[tokens]]
name = "ops"
token = "{ADMIN}"
roles = ["admin"]

[[tokens]]
name = "dashboard"
token = "{READER}"
roles = ["read"]

[[tokens]]
name = "svc-orders"
token = "{PRODUCER}"
roles = ["produce"]

[[tokens]]
name = "orders-dashboard"
token = "{ORDERS_READER}"
roles = ["read"]
topics = ["orders*"]
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("access-http")
    (root / "broker.toml").write_text(TOKENS)
    b = BrokerProcess(
        root / "broker", "--config", str(root / "broker.toml"), "--tx-secret", f"{GROUP}=s"
    ).start()
    yield b
    assert b.stop() == 0


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_admin_api_reads_need_read_and_actions_need_admin(secured: BrokerProcess) -> None:
    async with await Client.connect(secured.url, auth_token=ADMIN) as c:
        for topic in ("orders", "audit"):
            await c.create_topic(topic, queues=1, exist_ok=True)
        tx = await c.prepare(
            "orders", b"{}", producer_group=GROUP, check_url="http://127.0.0.1:9/c",
            timeout_ms=600_000,
        )  # fmt: skip
    async with httpx.AsyncClient(base_url=secured.http) as h:
        assert (await h.get("/healthz")).status_code == 200
        assert (await h.get("/v1/topics")).status_code == 401
        r = await h.get("/v1/topics", headers=_bearer(PRODUCER))
        assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN"
        assert "read role" in r.json()["detail"]
        assert (await h.get("/metrics", headers=_bearer(PRODUCER))).status_code == 403
        r = await h.get("/v1/topics", headers=_bearer(READER))
        assert {t["topic"] for t in r.json()["topics"]} >= {"orders", "audit"}
        r = await h.get("/v1/topics", headers=_bearer(ORDERS_READER))
        assert [t["topic"] for t in r.json()["topics"]] == ["orders"]  # filtered
        r = await h.get("/v1/messages", params={"topic": "audit", "key": "k"},
                        headers=_bearer(ORDERS_READER))  # fmt: skip
        assert r.status_code == 403 and "'audit'" in r.json()["detail"]
        r = await h.get(f"/v1/transactions/{tx.tx_id}", headers=_bearer(READER))
        assert r.status_code == 200 and r.json()["topic"] == "orders"
        # Commit and rollback are the producer's decision: produce (or admin) on the topic;
        # resuming a parked transaction is the operator's: admin.
        r = await h.post(f"/v1/transactions/{tx.tx_id}/rollback", headers=_bearer(READER))
        assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN"
        r = await h.post(f"/v1/transactions/{tx.tx_id}/resume", headers=_bearer(PRODUCER))
        assert r.status_code == 403
        r = await h.post(f"/v1/transactions/{tx.tx_id}/rollback", headers=_bearer(PRODUCER))
        assert r.status_code == 200 and r.json()["state"] == "rolled_back"
        r = await h.post(f"/v1/transactions/{tx.tx_id}/rollback", headers=_bearer(ADMIN))
        assert r.status_code == 200 and r.json()["duplicate"] is True


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert m is not None, "no CSRF token in the page"
    return m.group(1)


async def test_the_console_signs_in_readers_and_lets_only_admins_act(
    secured: BrokerProcess,
) -> None:
    async with await Client.connect(secured.url, auth_token=ADMIN) as c:
        await c.create_topic("orders", queues=1, exist_ok=True)
        tx = await c.prepare(
            "orders", b"{}", producer_group=GROUP, check_url="http://127.0.0.1:9/c",
            timeout_ms=600_000,
        )  # fmt: skip
        act = f"/console/transactions/{tx.tx_id}/commit"
        same_origin = {"origin": secured.http, "sec-fetch-site": "same-origin"}
        async with httpx.AsyncClient(base_url=secured.http) as h:
            for token, why in ((PRODUCER, "needs the read or admin role on every topic"),
                               (ORDERS_READER, "on every topic")):  # fmt: skip
                r = await h.post("/console/login", data={"token": token})
                assert r.status_code == 403 and why in r.text and "set-cookie" not in r.headers
            r = await h.post("/console/login", data={"token": READER})
            assert r.status_code == 303
            page = await h.get("/console/transactions")
            assert page.status_code == 200 and tx.tx_id in page.text
            assert "signed in as dashboard" in page.text
            assert act not in page.text and "read-only" in page.text  # no buttons to press
            r = await h.post(act, data={"csrf": _csrf(page.text)}, headers=same_origin)
            assert r.status_code == 403 and "may look but not act" in r.text
            assert (await c.show_transaction(tx.tx_id)).state == "prepared"
        async with httpx.AsyncClient(base_url=secured.http) as h:
            assert (await h.post("/console/login", data={"token": ADMIN})).status_code == 303
            page = await h.get("/console/transactions")
            assert act in page.text
            confirmation = await h.get(act)  # commit is confirmed on its own page
            seen = re.search(r'name="seen" value="([^"]+)"', confirmation.text)
            assert seen is not None
            form = {"csrf": _csrf(confirmation.text), "seen": seen.group(1)}
            r = await h.post(act, data=form, headers=same_origin)
            assert r.status_code == 303
            assert (await c.show_transaction(tx.tx_id)).state == "committed"
    log = secured.log_path.read_text()
    for token in (ADMIN, READER, PRODUCER, ORDERS_READER):
        assert token not in log


WARNING = "without any token"


def test_a_broker_beyond_loopback_without_a_token_warns(tmp_path: Path) -> None:
    root = tmp_path
    open_b = BrokerProcess(root / "open", "--host", "0.0.0.0").start()
    assert open_b.stop() == 0
    assert WARNING in open_b.log_path.read_text()
    tokened = BrokerProcess(root / "tok", "--host", "0.0.0.0", "--auth-token", ADMIN).start()
    assert tokened.stop() == 0
    text = tokened.log_path.read_text()
    assert WARNING not in text and "without TLS" in text and ADMIN not in text
    local = BrokerProcess(root / "local").start()  # 127.0.0.1
    assert local.stop() == 0
    assert "security:" not in local.log_path.read_text()
