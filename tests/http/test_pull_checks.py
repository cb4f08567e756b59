"""Back-checks by pull on real brokers: a transaction prepared with ``"check_url": "pull"`` is
offered to its producer group's pollers when due, answered by commit, rollback or unknown; an
unanswered check is offered again on the checker's schedule, after a restart too; bad input is
a 4xx problem."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import BrokerProcess
from tests.http.conftest import GROUP, problem
from tests.http.test_cluster import TOPIC as CLUSTER_TOPIC
from tests.http.test_cluster import _roles, pair  # noqa: F401  # pair: the fixture
from txbroker.chaos.cluster import Cluster
from txbroker.protocol.messages import PulledMessage
from txbroker_sdk import Client, Consumer

ADMIN = "pull-checks-admin-5e1a"
ORDERS = "pull-checks-orders-producer-0b7c"  # produce on orders* only
READER = "pull-checks-reader-77d2"
# Quick checks, so a test sees the schedule in seconds: an answer window of 1 s, then backoff
# from 300 ms, parked after 3 counted checks.
DEADLINE_MS = 1000
SETTINGS = f"""
check_deadline_ms = {DEADLINE_MS}
check_backoff_base_ms = 300
max_checks = 3
tx_secrets = {{ "{GROUP}" = "pull-test-secret" }}

[[tokens]]
name = "ops"
token = "{ADMIN}"
roles = ["admin"]

[[tokens]]
name = "svc-orders"
token = "{ORDERS}"
roles = ["produce"]
topics = ["orders*"]

[[tokens]]
name = "dashboard"
token = "{READER}"
roles = ["read"]
"""


def _broker(root: Path) -> BrokerProcess:
    root.mkdir(parents=True, exist_ok=True)
    (root / "broker.toml").write_text(SETTINGS)
    return BrokerProcess(root / "broker", "--config", str(root / "broker.toml"))


@pytest.fixture(scope="module")
def pull_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = _broker(tmp_path_factory.mktemp("pull-checks")).start()
    yield b
    assert b.stop() == 0
    log = b.log_path.read_text()
    assert "Traceback" not in log and " failed\n" not in log, log[-4000:]


def _client(b: BrokerProcess, token: str = ADMIN) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=b.http, timeout=30, headers={"Authorization": f"Bearer {token}"}
    )


@pytest.fixture
async def http(pull_broker: BrokerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(pull_broker) as h:
        yield h


async def _topic(b: BrokerProcess, topic: str) -> None:
    async with await Client.connect(b.url, auth_token=ADMIN) as c:
        await c.create_topic(topic, queues=1)


async def _prepare(http: httpx.AsyncClient, topic: str, body: str, timeout_ms: int = 100) -> str:
    r = await http.post(
        "/v1/transactions",
        json={
            "topic": topic,
            "body": body,
            "key": body,
            "producer_group": GROUP,
            "check_url": "pull",
            "timeout_ms": timeout_ms,
        },
    )
    assert r.status_code == 201, r.text
    tx_id: str = r.json()["tx_id"]
    return tx_id


async def _poll(
    http: httpx.AsyncClient, wait_ms: int = 5000, n: int = 10
) -> list[dict[str, object]]:
    r = await http.post(f"/v1/producer-groups/{GROUP}/checks", json={"max": n, "wait_ms": wait_ms})
    assert r.status_code == 200, r.text
    assert r.json()["answer_within_ms"] == DEADLINE_MS
    checks: list[dict[str, object]] = r.json()["checks"]
    return checks


async def _poll_for(http: httpx.AsyncClient, tx_id: str, within_s: float = 10) -> dict[str, object]:
    """The check of ``tx_id``, polled for (other tests' checks are left unanswered)."""
    until = time.monotonic() + within_s
    while time.monotonic() < until:
        for c in await _poll(http, wait_ms=1000):
            if c["tx_id"] == tx_id:
                return c
    raise AssertionError(f"no check of {tx_id} within {within_s} s")


async def _consume(b: BrokerProcess, topic: str, n: int) -> list[PulledMessage]:
    got: list[PulledMessage] = []
    async with (
        await Client.connect(b.url, auth_token=ADMIN) as c,
        Consumer(c, "g", topic) as consumer,
    ):
        for _ in range(50):
            for m in await consumer.fetch(timeout_ms=200):
                got.append(m.msg)
                m.ack()
            if len(got) >= n:
                break
    return got


async def _stored_count(b: BrokerProcess, topic: str) -> int:
    async with _client(b) as h:
        [t] = [t for t in (await h.get("/v1/topics")).json()["topics"] if t["topic"] == topic]
    return sum(q["max_offset"] for q in t["queues"])


async def test_a_restart_re_derives_the_due_checks(tmp_path: Path) -> None:
    b = _broker(tmp_path).start()
    try:
        await _topic(b, "orders-pull-restart")
        async with _client(b) as http:
            waiting = await _prepare(http, "orders-pull-restart", "order-7")
            taken = await _prepare(http, "orders-pull-restart", "order-8")
            await asyncio.sleep(0.3)
            got = await _poll(http, n=1)
            assert [c["tx_id"] for c in got] == [waiting]  # oldest first; order-8 stays queued
            got = await _poll(http, n=1)
            assert [c["tx_id"] for c in got] == [taken]
        await asyncio.sleep(1.2)  # tx.json is saved about every second
        assert b.stop() == 0
        b.start()
        async with _client(b) as http:
            # Neither check is lost with the process that handed it out: both are due again
            # (their windows ended, or end, on the same schedule), and wait for a poller.
            until = time.monotonic() + 10
            while not re.search(
                r"^txbroker_tx_checks_pull_queued(\{[^}]*\})? 2(\.0)?$",
                metrics := (await http.get("/metrics")).text,
                re.M,
            ):
                assert time.monotonic() < until, metrics
                await asyncio.sleep(0.1)
            seen: dict[str, dict[str, object]] = {}
            until = time.monotonic() + 10
            while len(seen) < 2 and time.monotonic() < until:
                seen.update({str(c["tx_id"]): c for c in await _poll(http, wait_ms=1000)})
            assert set(seen) == {waiting, taken}
            r = await http.post(f"/v1/transactions/{taken}/commit")
            assert r.status_code == 200 and r.json()["state"] == "committed"
            r = await http.post(f"/v1/transactions/{waiting}/rollback")
            assert r.status_code == 200 and r.json()["state"] == "rolled_back"
    finally:
        assert b.stop() == 0


async def test_a_pulled_check_answered_commit_delivers_once(
    pull_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    await _topic(pull_broker, "orders-pull-commit")
    tx_id = await _prepare(http, "orders-pull-commit", "order-1")
    started = time.monotonic()
    check = await _poll_for(http, tx_id)
    assert time.monotonic() - started < 5  # due 100 ms after the PREPARE, not later
    assert check == {
        "tx_id": tx_id,
        "topic": "orders-pull-commit",
        "producer_group": GROUP,
        "check_count": 0,
        "key": "order-1",
        "message_id": check["message_id"],
    }
    r = await http.post(f"/v1/transactions/{tx_id}/commit")
    assert r.status_code == 200 and r.json()["state"] == "committed", r.text
    [m] = await _consume(pull_broker, "orders-pull-commit", 1)
    assert m.body == b"order-1" and m.message_id == check["message_id"]
    # Answered: not offered again, and an unknown now is refused with the state it is in.
    assert tx_id not in [c["tx_id"] for c in await _poll(http, wait_ms=DEADLINE_MS + 600)]
    p = problem(await http.post(f"/v1/transactions/{tx_id}/unknown"), 409, "TRANSACTION_CONFLICT")
    assert p["state"] == "committed"


async def test_a_pulled_check_answered_rollback_delivers_nothing(
    pull_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    await _topic(pull_broker, "orders-pull-rollback")
    tx_id = await _prepare(http, "orders-pull-rollback", "order-2")
    await _poll_for(http, tx_id)
    r = await http.post(f"/v1/transactions/{tx_id}/rollback")
    assert r.status_code == 200 and r.json()["state"] == "rolled_back", r.text
    assert (await http.get(f"/v1/transactions/{tx_id}")).json()["state"] == "rolled_back"


async def test_unknown_counts_a_check_backs_off_and_parks(
    pull_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    await _topic(pull_broker, "orders-pull-unknown")
    tx_id = await _prepare(http, "orders-pull-unknown", "order-3")
    for n in range(3):
        check = await _poll_for(http, tx_id)
        assert check["check_count"] == n
        answered = time.time() * 1000
        r = await http.post(f"/v1/transactions/{tx_id}/unknown")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["tx_id"] == tx_id and body["checks"] == n + 1
        if n < 2:
            assert body["state"] == "prepared"
            # The same backoff as a check sent over HTTP answered UNKNOWN: 300 ms doubling.
            wait = body["next_check_ms"] - answered
            assert 300 * 2**n - 100 <= wait <= 300 * 2**n + 2000, (n, wait)
            # Answered once: a second answer finds no check out.
            again = await http.post(f"/v1/transactions/{tx_id}/unknown")
            assert problem(again, 409, "TRANSACTION_CONFLICT")["state"] == "prepared"
    assert body["state"] == "parked"
    shown = (await http.get(f"/v1/transactions/{tx_id}")).json()
    assert shown["state"] == "parked" and "answered UNKNOWN" in shown["last_reason"]
    # Parked: no longer offered; the producer (or an operator) may still decide.
    assert tx_id not in [c["tx_id"] for c in await _poll(http, wait_ms=800)]
    r = await http.post(f"/v1/transactions/{tx_id}/commit")
    assert r.status_code == 200 and r.json()["state"] == "committed"


async def test_an_unanswered_check_is_offered_again_counted_as_a_timeout(
    pull_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    await _topic(pull_broker, "orders-pull-again")
    tx_id = await _prepare(http, "orders-pull-again", "order-4")
    first = await _poll_for(http, tx_id)
    taken = time.monotonic()
    second = await _poll_for(http, tx_id)
    # Out for its answer window, then due after the backoff: not before.
    assert time.monotonic() - taken >= DEADLINE_MS / 1000
    assert (first["check_count"], second["check_count"]) == (0, 1)
    shown = (await http.get(f"/v1/transactions/{tx_id}")).json()
    assert shown["checks"] == 1 and "no answer to the pulled check" in shown["last_reason"]
    # Late answers to the first check are the producer's to give: a commit still commits.
    r = await http.post(f"/v1/transactions/{tx_id}/commit")
    assert r.status_code == 200 and r.json()["state"] == "committed"


async def test_checks_go_only_to_pollers_that_may_answer_them(pull_broker: BrokerProcess) -> None:
    await _topic(pull_broker, "orders-pull-roles")
    await _topic(pull_broker, "payments-pull-roles")
    async with _client(pull_broker) as admin, _client(pull_broker, ORDERS) as orders:
        mine = await _prepare(orders, "orders-pull-roles", "order-5")
        theirs = await _prepare(admin, "payments-pull-roles", "payment-5")
        await asyncio.sleep(0.3)
        seen = {c["tx_id"] for c in await _poll(orders, wait_ms=2000, n=1024)}
        assert mine in seen and theirs not in seen
        # The other check stayed queued for a poller that may answer it.
        assert theirs in {c["tx_id"] for c in await _poll(admin, wait_ms=2000, n=1024)}
        p = problem(await orders.post(f"/v1/transactions/{theirs}/unknown"), 403, "FORBIDDEN")
        assert "payments-pull-roles" in str(p["detail"])
        for tx_id in (mine, theirs):
            await admin.post(f"/v1/transactions/{tx_id}/rollback")


async def test_bad_polls_and_answers_are_problems(
    pull_broker: BrokerProcess, http: httpx.AsyncClient
) -> None:
    path = f"/v1/producer-groups/{GROUP}/checks"
    problem(await http.post(path, content=b"{", headers={"content-type": "application/json"}), 400)
    problem(await http.post(path, content=b"{}"), 415, "UNSUPPORTED_MEDIA_TYPE")
    p = problem(await http.post(path, json={"max": 1, "colour": "red"}), 400, "BAD_REQUEST")
    assert "colour" in str(p["detail"])
    problem(await http.post(path, json={"max": 0}), 400, "BAD_REQUEST")
    problem(await http.post(path, json={"max": 1025}), 400, "BAD_REQUEST")
    problem(await http.post(path, json={"wait_ms": 30_001}), 400, "BAD_REQUEST")
    problem(await http.post(path, json={"wait_ms": "soon"}), 400, "BAD_REQUEST")
    problem(await http.post("/v1/producer-groups/%25HALF/checks", json={}), 422, "INVALID_NAME")
    problem(await http.get(path), 405)
    async with httpx.AsyncClient(base_url=pull_broker.http) as anonymous:
        problem(await anonymous.post(path, json={}), 401, "UNAUTHENTICATED")
    async with _client(pull_broker, READER) as reader:
        problem(await reader.post(path, json={}), 403, "FORBIDDEN")
    problem(await http.post("/v1/transactions/no-such-tx/unknown"), 404, "TRANSACTION_NOT_FOUND")
    # A check not taken yet cannot be answered: nothing is out.
    await _topic(pull_broker, "orders-pull-bad")
    tx_id = await _prepare(http, "orders-pull-bad", "order-6", timeout_ms=600_000)
    p = problem(await http.post(f"/v1/transactions/{tx_id}/unknown"), 409, "TRANSACTION_CONFLICT")
    assert p["state"] == "prepared"
    await http.post(f"/v1/transactions/{tx_id}/rollback")
    # Not a check URL, nor "pull".
    r = await http.post(
        "/v1/transactions",
        json={"topic": "orders-pull-bad", "body": "x", "producer_group": GROUP, "check_url": "pul"},
    )
    assert "pull" in str(problem(r, 422, "INVALID_ARGUMENT")["detail"])
    assert await _stored_count(pull_broker, "orders-pull-bad") == 0


async def test_polls_go_to_the_master_and_a_new_master_offers_the_checks_again(
    pair: Cluster,  # noqa: F811
) -> None:
    a, b = await _roles(pair)
    checks = f"/v1/producer-groups/{GROUP}/checks"
    async with httpx.AsyncClient(timeout=30) as h:
        prepare = {
            "topic": CLUSTER_TOPIC,
            "body": "paid",
            "producer_group": GROUP,
            "check_url": "pull",
            "timeout_ms": 100,
        }
        r = await h.post(a.proc.http + "/v1/transactions", json=prepare)
        assert r.status_code == 201, r.text
        tx_id = r.json()["tx_id"]
        # A poll at the slave is a write's kind of request: redirected to the master.
        until = time.monotonic() + 30
        while (r := await h.post(b.proc.http + checks, json={})).status_code == 503:
            assert time.monotonic() < until, r.text
            await asyncio.sleep(0.2)
        assert r.status_code == 307 and r.headers["location"] == a.proc.http + checks, r.text
        r = await h.post(a.proc.http + checks, json={"wait_ms": 5000})
        assert [c["tx_id"] for c in r.json()["checks"]] == [tx_id], r.text

        # Taken, never answered, and the master dies: the check was in no one's memory but
        # the dead master's, and the new one offers it again from the log.
        await pair.kill_master("g1")
        elected = await pair.wait_master("g1", other_than=a.broker_id)
        assert elected.broker_id == b.broker_id
        until = time.monotonic() + 30
        while (
            not (r := await h.post(b.proc.http + checks, json={"wait_ms": 1000}))
            .json()
            .get("checks")
        ):
            assert r.status_code in (200, 503) and time.monotonic() < until, r.text
        assert [c["tx_id"] for c in r.json()["checks"]] == [tx_id], r.text
        # With sync replication b's writes wait for a slave: a rejoins, as the slave of b.
        await pair.restart(a)
        await pair.wait_members("g1")
        r = await h.post(b.proc.http + f"/v1/transactions/{tx_id}/commit")
        assert r.status_code == 200 and r.json()["state"] == "committed", r.text
