"""Transactional messages against a real broker process and a real HTTP check-back server."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from tests.conftest import BrokerProcess, run_cli
from tests.server.test_metrics import scrape, value
from tests.tx.conftest import GROUP, CheckServer, tx_broker
from txbroker.errors import InvalidArgument, InvalidName, TransactionConflict, TransactionNotFound
from txbroker_checkback import CheckStatus
from txbroker_sdk import Client, Consumer


async def _consume_all(c: Client, topic: str, group: str, quiet_ms: int = 700) -> list[bytes]:
    """Everything the topic delivers to a fresh group until it has been quiet for quiet_ms."""
    out: list[bytes] = []
    async with Consumer(c, group, topic) as consumer:
        while True:
            batch = await consumer.fetch(timeout_ms=quiet_ms)
            if not batch:
                return out
            for m in batch:
                out.append(m.body)
                m.ack()


async def _wait_state(c: Client, tx_id: str, state: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while (info := await c.show_transaction(tx_id)).state != state:
        assert time.monotonic() < deadline, f"{tx_id} stayed {info.state}: {info.last_reason}"
        await asyncio.sleep(0.05)  # polling the broker's state: the condition under test


async def test_commit_delivers_exactly_once(broker: BrokerProcess, checks: CheckServer) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=2)
        tx = await c.prepare(
            "orders",
            b"order-1",
            producer_group=GROUP,
            check_url=checks.url,
            key="o1",
            timeout_ms=60_000,  # ended in time by this test: no check is due
        )
        assert await _consume_all(c, "orders", "early", quiet_ms=300) == []  # invisible
        async with httpx.AsyncClient(base_url=broker.http) as h:
            r = await h.get("/v1/messages", params={"topic": "orders", "key": "o1"})
            assert r.json()["messages"] == []
        first = await tx.commit()
        again = await tx.commit()
        assert (first.state, first.duplicate, again.duplicate) == ("committed", False, True)
        with pytest.raises(TransactionConflict):
            await tx.rollback()
        assert await _consume_all(c, "orders", "billing") == [b"order-1"]
        async with httpx.AsyncClient(base_url=broker.http) as h:
            visible = (await h.get(f"/v1/messages/{tx.message_id}")).json()
        assert (visible["topic"], visible["body"]) == ("orders", "order-1")  # same message id
    assert checks.seen == []  # ended in time: never checked


async def test_rollback_is_never_delivered(broker: BrokerProcess, checks: CheckServer) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=1)
        tx = await c.prepare("orders", b"nope", producer_group=GROUP, check_url=checks.url)
        assert (await tx.rollback()).state == "rolled_back"
        assert (await tx.rollback()).duplicate
        with pytest.raises(TransactionConflict):
            await tx.commit()
        await asyncio.sleep(0.6)  # past the check timeout: a rolled-back tx is never checked
        assert await _consume_all(c, "orders", "g") == []
    assert checks.seen == []


@pytest.mark.parametrize(
    ("answer", "state"), [(CheckStatus.COMMIT, "committed"), (CheckStatus.ROLLBACK, "rolled_back")]
)
async def test_missing_end_is_resolved_by_a_check(
    broker: BrokerProcess, checks: CheckServer, answer: CheckStatus, state: str
) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=1)
        tx = await c.prepare(
            "orders",
            b"checked",
            producer_group=GROUP,
            check_url=checks.url,
            traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        checks.answers[tx.tx_id] = answer
        await _wait_state(c, tx.tx_id, state)
        info = await c.show_transaction(tx.tx_id)
        assert info.resolved_by == "check"
        expected = [b"checked"] if answer is CheckStatus.COMMIT else []
        assert await _consume_all(c, "orders", "g") == expected
        # The producer's late END_TX is fenced by what the check decided.
        if answer is CheckStatus.COMMIT:
            assert (await tx.commit()).duplicate
            with pytest.raises(TransactionConflict):
                await tx.rollback()
        else:
            with pytest.raises(TransactionConflict):
                await tx.commit()
    assert [(s.tx_id, s.topic, s.producer_group) for s in checks.seen] == [
        (tx.tx_id, "orders", GROUP)
    ]
    # The trace context travels from the PREPARE through the back-check.
    assert checks.traceparents == ["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]


async def test_unknown_answers_park_after_the_maximum(
    broker: BrokerProcess, checks: CheckServer
) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=1)
        tx = await c.prepare("orders", b"undecided", producer_group=GROUP, check_url=checks.url)
        await _wait_state(c, tx.tx_id, "parked")
        info = await c.show_transaction(tx.tx_id)
        assert info.checks == 3 and "parked after 3 checks" in info.last_reason
        assert checks.checks_for(tx.tx_id) == 3
        parked = await c.list_transactions(state="parked")
        assert [t.tx_id for t in parked.transactions] == [tx.tx_id]
        async with httpx.AsyncClient(base_url=broker.http) as h:
            m = await scrape(h)
        counts = [value(m, f"txbroker_tx_{s}") for s in ("pending", "parked", "stalled")]
        assert counts == [0, 1, 0]
        await asyncio.sleep(0.5)
        assert checks.checks_for(tx.tx_id) == 3  # parked: no more checks
        # An operator resumes; the service now knows the answer.
        checks.answers[tx.tx_id] = CheckStatus.COMMIT
        assert (await c.resolve_transaction(tx.tx_id, "resume")).state == "prepared"
        await _wait_state(c, tx.tx_id, "committed")
        assert await _consume_all(c, "orders", "g") == [b"undecided"]


@pytest.mark.parametrize("path", ["/down", "/500", "/slow", "/garbage"])
async def test_broken_endpoints_never_commit(
    broker: BrokerProcess, checks: CheckServer, path: str
) -> None:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    from tests.httpserver import serve_app

    async def err(_: object) -> Response:
        return PlainTextResponse("boom", 500)

    async def slow(_: object) -> Response:
        await asyncio.sleep(1.5)
        return Response(b'{"status": "COMMIT"}', media_type="application/json")

    async def garbage(_: object) -> Response:
        return PlainTextResponse("OK, committed!", 200)

    app = Starlette(
        routes=[
            Route("/500", err, methods=["POST"]),
            Route("/slow", slow, methods=["POST"]),
            Route("/garbage", garbage, methods=["POST"]),
        ]
    )
    async with serve_app(app) as base, await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=1)
        url = "http://127.0.0.1:1/nothing-listens" if path == "/down" else base + path
        tx = await c.prepare("orders", b"must-not-commit", producer_group=GROUP, check_url=url)
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            info = await c.show_transaction(tx.tx_id)
            assert info.state in ("prepared", "parked"), info
            if info.state == "parked":
                break
            await asyncio.sleep(0.1)
        assert info.last_reason  # says why it is undecided
        if path != "/down":
            assert info.state == "parked"  # answered (badly) 3 times
        else:
            assert info.state == "prepared" and info.checks == 0  # never reached: not counted
        assert await _consume_all(c, "orders", "g", quiet_ms=300) == []


async def test_unknown_and_invalid_requests(broker: BrokerProcess, checks: CheckServer) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=1)
        with pytest.raises(TransactionNotFound):
            await c.end_transaction("0" * 32, "commit")
        with pytest.raises(InvalidArgument, match="secret"):
            await c.prepare("orders", b"x", producer_group="stranger", check_url=checks.url)
        with pytest.raises(InvalidArgument, match="http"):
            await c.prepare("orders", b"x", producer_group=GROUP, check_url="ftp://x")
        with pytest.raises(InvalidName):
            await c.prepare("%HALF", b"x", producer_group=GROUP, check_url=checks.url)
        with pytest.raises(InvalidName):  # half messages cannot be consumed directly
            await c.request(
                __import__("txbroker.protocol.frames", fromlist=["Opcode"]).Opcode.HEARTBEAT,
                {"group": "spy", "topic": "%HALF", "member_id": "m"},
            )
        with pytest.raises(InvalidArgument, match="days away"):
            await c.prepare(
                "orders",
                b"x",
                producer_group=GROUP,
                check_url=checks.url,
                deliver_at_ms=int(time.time() * 1000) + 40 * 86_400_000,
            )
        tx = await c.prepare("orders", b"x", producer_group=GROUP, check_url=checks.url)
        again = await c.prepare(
            "orders", b"x", producer_group=GROUP, check_url=checks.url, tx_id=tx.tx_id
        )
        assert again.message_id == tx.message_id  # a retried PREPARE is idempotent
        await tx.rollback()
        with pytest.raises(TransactionConflict):
            await c.prepare(
                "orders", b"x", producer_group=GROUP, check_url=checks.url, tx_id=tx.tx_id
            )


async def test_parked_and_pending_survive_a_restart(tmp_path, checks: CheckServer) -> None:  # type: ignore[no-untyped-def]
    b = tx_broker(tmp_path / "b").start()
    async with await Client.connect(b.url) as c:
        await c.create_topic("orders", queues=1)
        parked = await c.prepare("orders", b"parked", producer_group=GROUP, check_url=checks.url)
        await _wait_state(c, parked.tx_id, "parked")
        pending = await c.prepare(
            "orders", b"pending", producer_group=GROUP, check_url=checks.url, timeout_ms=60_000
        )
        committed = await c.prepare("orders", b"done", producer_group=GROUP, check_url=checks.url)
        await committed.commit()
    assert b.stop() == 0
    b = tx_broker(tmp_path / "b").start()
    try:
        async with await Client.connect(b.url) as c:
            assert (await c.show_transaction(parked.tx_id)).state == "parked"
            assert (await c.show_transaction(pending.tx_id)).state == "prepared"
            listed = await c.list_transactions()
            assert {t.tx_id for t in listed.transactions} == {parked.tx_id, pending.tx_id}
            assert (await c.end_transaction(committed.tx_id, "commit")).duplicate  # from the op log
            with pytest.raises(TransactionConflict):
                await c.end_transaction(committed.tx_id, "rollback")
            await c.end_transaction(pending.tx_id, "commit")  # from the new connection
            await c.resolve_transaction(parked.tx_id, "rollback")  # an operator decides
            with pytest.raises(TransactionConflict):
                await c.resolve_transaction(parked.tx_id, "commit")
            assert sorted(await _consume_all(c, "orders", "g")) == [b"done", b"pending"]
    finally:
        b.stop()


async def test_delayed_transactional_message(broker: BrokerProcess, checks: CheckServer) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=1)
        at = int(time.time() * 1000) + 1500
        tx = await c.prepare(
            "orders", b"later", producer_group=GROUP, check_url=checks.url, deliver_at_ms=at
        )
        await tx.commit()
        async with Consumer(c, "g", "orders") as consumer:
            got = []
            deadline = time.monotonic() + 10
            while not got:
                assert time.monotonic() < deadline
                got = await consumer.fetch(timeout_ms=500)
        assert got[0].body == b"later" and at <= got[0].msg.store_ms <= at + 1000


async def test_http_admin_lists_and_resolves(broker: BrokerProcess, checks: CheckServer) -> None:
    async with await Client.connect(broker.url) as c, httpx.AsyncClient(base_url=broker.http) as h:
        await c.create_topic("orders", queues=1)
        tx = await c.prepare(
            "orders", b"via-http", producer_group=GROUP, check_url=checks.url, timeout_ms=60_000
        )
        listed = (await h.get("/v1/transactions", params={"state": "prepared"})).json()
        assert [t["tx_id"] for t in listed["transactions"]] == [tx.tx_id]
        r = await h.post(f"/v1/transactions/{tx.tx_id}/commit")
        assert r.status_code == 200 and r.json()["state"] == "committed"
        r = await h.post(f"/v1/transactions/{tx.tx_id}/rollback")
        assert r.status_code == 409 and r.json()["code"] == "TRANSACTION_CONFLICT"
        metrics = (await h.get("/metrics")).text
        assert 'txbroker_tx_decision="commit"} 1.0' in metrics
        assert re.search(r"^txbroker_tx_pending\{.*\} 0\.0$", metrics, re.M)
        assert await _consume_all(c, "orders", "g") == [b"via-http"]


def test_tx_cli(broker: BrokerProcess, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, "--server", broker.url, timeout=60)

    assert cli("topic", "create", "cli-tx").returncode == 0
    out = cli(
        "tx",
        "prepare",
        "cli-tx",
        "--check-url",
        "http://127.0.0.1:1/x",
        "--group",
        GROUP,
        "--body",
        "hello",
        "--timeout-ms",
        "600000",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    tx_id = json.loads(out.stdout)["tx_id"]
    listed = [
        json.loads(x) for x in cli("tx", "list", "--state", "pending", "--json").stdout.splitlines()
    ]
    assert [t["tx_id"] for t in listed] == [tx_id]
    shown = json.loads(cli("tx", "show", tx_id, "--json").stdout)
    assert shown["state"] == "prepared" and shown["topic"] == "cli-tx"
    assert json.loads(cli("tx", "commit", tx_id, "--json").stdout)["state"] == "committed"
    refused = cli("tx", "rollback", tx_id)
    assert refused.returncode == 2 and "TRANSACTION_CONFLICT" in refused.stderr
    missing = cli("tx", "show", "nope")
    assert missing.returncode == 2 and "TRANSACTION_NOT_FOUND" in missing.stderr
