"""Receiving over HTTP by receipt, against real broker processes: receive and ack, redelivery
after the invisibility, extend, nack with a delay, the retry limit and the dead-letter topic, a
TCP consumer of the same group beside an HTTP receiver, a restart; and bad input."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import BrokerProcess
from tests.http.conftest import make_topic, problem
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import DlqListResponse, DlqRequest
from txbroker_sdk import Client, Consumer

MAX_RECONSUME = 2  # the broker's: the third hand-back dead-letters a message
FIELDS = {
    "message_id",
    "topic",
    "queue",
    "offset",
    "key",
    "tags",
    "headers",
    "body",
    "encoding",
    "receipt",
    "delivery_attempt",
}


def _broker(data_dir: Path) -> BrokerProcess:
    b = BrokerProcess(data_dir)
    b.env.update({"TXB_MAX_RECONSUME": str(MAX_RECONSUME), "TXB_RETRY_DELAYS_MS": "300"})
    return b


@pytest.fixture(scope="module")
def rb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = _broker(tmp_path_factory.mktemp("receive") / "broker").start()
    yield b
    assert b.stop() == 0
    log = b.log_path.read_text()
    assert "Traceback" not in log, log[-4000:]


@pytest.fixture
async def h(rb: BrokerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=rb.http, timeout=60) as client:
        yield client


def path(group: str, topic: str, action: str) -> str:
    return f"/v1/groups/{group}/topics/{topic}/{action}"


async def publish(h: httpx.AsyncClient, topic: str, *bodies: str) -> None:
    for i, body in enumerate(bodies):
        r = await h.post(f"/v1/topics/{topic}/messages", json={"body": body, "key": f"k{i}"})
        assert r.status_code == 201, r.text


async def receive(
    h: httpx.AsyncClient,
    group: str,
    topic: str,
    *,
    max: int = 10,
    wait_ms: int = 0,
    invisible_ms: int = 30_000,
) -> list[dict[str, Any]]:
    r = await h.post(
        path(group, topic, "receive"),
        json={"max": max, "wait_ms": wait_ms, "invisible_ms": invisible_ms},
    )
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    for m in messages:
        assert m.keys() == FIELDS, m
    return messages


async def receive_n(
    h: httpx.AsyncClient, group: str, topic: str, n: int, **kw: Any
) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while len(got) < n and time.monotonic() < deadline:
        got += await receive(h, group, topic, wait_ms=1000, **kw)
    assert len(got) == n, got
    return got


async def settle(
    h: httpx.AsyncClient, group: str, topic: str, action: str, receipts: list[str], **kw: Any
) -> dict[str, list[str]]:
    r = await h.post(path(group, topic, action), json={"receipts": receipts, **kw})
    assert r.status_code == 200, r.text
    out: dict[str, list[str]] = r.json()
    return out


async def lag(h: httpx.AsyncClient, group: str, topic: str) -> int:
    """The group's messages in the topic not yet committed."""
    groups = (await h.get("/v1/groups")).json()["groups"]
    [g] = [g for g in groups if (g["group"], g["topic"]) == (group, topic)]
    total: int = g["total_lag"]
    return total


async def test_receive_then_ack(rb: BrokerProcess, h: httpx.AsyncClient) -> None:
    await make_topic(rb, "recv-ack")
    await publish(h, "recv-ack", "one", "two", "three")
    got = await receive_n(h, "billing", "recv-ack", 3)
    assert sorted(m["body"] for m in got) == ["one", "three", "two"]
    assert {m["delivery_attempt"] for m in got} == {1}
    assert {m["encoding"] for m in got} == {"utf-8"} and {m["topic"] for m in got} == {"recv-ack"}
    # Invisible: nobody else gets them meanwhile.
    assert await receive(h, "billing", "recv-ack", wait_ms=300) == []
    receipts = [m["receipt"] for m in got]
    assert await settle(h, "billing", "recv-ack", "ack", receipts) == {
        "applied": receipts,
        "stale": [],
    }
    # Acknowledging again is no error: the receipts name nothing in flight any more.
    assert await settle(h, "billing", "recv-ack", "ack", receipts) == {
        "applied": [],
        "stale": receipts,
    }
    # Every queue is committed past what was acknowledged.
    assert await lag(h, "billing", "recv-ack") == 0


async def test_binary_bodies_come_as_base64(rb: BrokerProcess, h: httpx.AsyncClient) -> None:
    await make_topic(rb, "recv-bytes", queues=1)
    r = await h.post(
        "/v1/topics/recv-bytes/messages",
        json={"body": "/wABAg==", "encoding": "base64", "tags": "t", "headers": {"a": "b"}},
    )
    assert r.status_code == 201
    [m] = await receive_n(h, "billing", "recv-bytes", 1)
    assert (m["body"], m["encoding"], m["tags"], m["headers"]) == (
        "/wABAg==",
        "base64",
        "t",
        {"a": "b"},
    )


async def test_redelivered_after_the_invisibility(rb: BrokerProcess, h: httpx.AsyncClient) -> None:
    await make_topic(rb, "recv-again")
    await publish(h, "recv-again", "late")
    [first] = await receive_n(h, "billing", "recv-again", 1, invisible_ms=500)
    started = time.monotonic()
    [again] = await receive_n(h, "billing", "recv-again", 1)
    assert time.monotonic() - started >= 0.4
    assert again["message_id"] == first["message_id"] and again["body"] == "late"
    assert again["delivery_attempt"] == 2 and again["topic"] == "recv-again"
    assert again["receipt"] != first["receipt"]
    # The first delivery's receipt died with its redelivery.
    assert (await settle(h, "billing", "recv-again", "ack", [first["receipt"]]))["stale"] == [
        first["receipt"]
    ]
    assert (await settle(h, "billing", "recv-again", "ack", [again["receipt"]]))["applied"] == [
        again["receipt"]
    ]
    assert await receive(h, "billing", "recv-again", wait_ms=1500) == []


async def test_of_one_receive_only_what_was_neither_acked_nor_extended_comes_back(
    rb: BrokerProcess, h: httpx.AsyncClient
) -> None:
    """A receive's messages share one invisibility deadline: acknowledging or extending some
    of them leaves the others to come back at it, and the extended ones at their own."""
    await make_topic(rb, "recv-part", queues=1)
    await publish(h, "recv-part", "acked", "extended", "lost", "acked too")
    got = await receive(h, "billing", "recv-part", max=4, invisible_ms=500)
    assert [m["body"] for m in got] == ["acked", "extended", "lost", "acked too"]
    receipts = {m["body"]: m["receipt"] for m in got}
    acked = [receipts["acked"], receipts["acked too"]]
    assert (await settle(h, "billing", "recv-part", "ack", acked))["applied"] == acked
    extended = [receipts["extended"]]
    out = await settle(h, "billing", "recv-part", "extend", extended, invisible_ms=2000)
    assert out["applied"] == extended
    [again] = await receive_n(h, "billing", "recv-part", 1)
    assert again["body"] == "lost" and again["delivery_attempt"] == 2
    assert (await settle(h, "billing", "recv-part", "ack", [again["receipt"]]))["applied"]
    [later] = await receive_n(h, "billing", "recv-part", 1)  # after the extension ran out
    assert later["body"] == "extended" and later["delivery_attempt"] == 2
    assert (await settle(h, "billing", "recv-part", "ack", [later["receipt"]]))["applied"]
    assert await receive(h, "billing", "recv-part", wait_ms=700) == []


async def test_extend_keeps_the_receipt(rb: BrokerProcess, h: httpx.AsyncClient) -> None:
    await make_topic(rb, "recv-extend")
    await publish(h, "recv-extend", "slow work")
    [m] = await receive_n(h, "billing", "recv-extend", 1, invisible_ms=600)
    for _ in range(3):  # longer than the first invisibility, extended as it goes
        await asyncio.sleep(0.3)
        out = await settle(h, "billing", "recv-extend", "extend", [m["receipt"]], invisible_ms=600)
        assert out == {"applied": [m["receipt"]], "stale": []}
    assert await receive(h, "billing", "recv-extend", wait_ms=400) == []
    assert (await settle(h, "billing", "recv-extend", "ack", [m["receipt"]]))["applied"] == [
        m["receipt"]
    ]
    assert await receive(h, "billing", "recv-extend", wait_ms=1000) == []


async def test_nack_with_a_delay(rb: BrokerProcess, h: httpx.AsyncClient) -> None:
    await make_topic(rb, "recv-nack")
    await publish(h, "recv-nack", "try later")
    [m] = await receive_n(h, "billing", "recv-nack", 1)
    out = await settle(h, "billing", "recv-nack", "nack", [m["receipt"]], delay_ms=1500)
    assert out == {"applied": [m["receipt"]], "stale": []}
    nacked = time.monotonic()
    assert await receive(h, "billing", "recv-nack", wait_ms=800) == []
    [again] = await receive_n(h, "billing", "recv-nack", 1)
    back_s = time.monotonic() - nacked
    # Which delivery came back first: the scheduled copy (attempt 2) or, had the nack been
    # lost, the original again (attempt 1); then when.
    assert (again["message_id"], again["delivery_attempt"]) == (m["message_id"], 2)
    assert back_s >= 1.4, f"the copy nacked for 1.5 s came back after {back_s:.2f} s"
    await settle(h, "billing", "recv-nack", "ack", [again["receipt"]])


async def test_past_the_retry_limit_to_the_dead_letters(
    rb: BrokerProcess, h: httpx.AsyncClient
) -> None:
    await make_topic(rb, "recv-dlq")
    await publish(h, "recv-dlq", "poison")
    attempts = []
    for _ in range(MAX_RECONSUME + 1):
        [m] = await receive_n(h, "dlq-grp", "recv-dlq", 1)
        attempts.append(m["delivery_attempt"])
        await settle(h, "dlq-grp", "recv-dlq", "nack", [m["receipt"]], delay_ms=0)
    assert attempts == [1, 2, 3]
    assert await receive(h, "dlq-grp", "recv-dlq", wait_ms=1500) == []
    async with await Client.connect(rb.url) as c:
        dlq: DlqListResponse = await c.request(Opcode.DLQ_LIST, DlqRequest("dlq-grp"))
    [dead] = dlq.messages
    assert (dead.message_id, dead.original_topic, dead.body) == (
        m["message_id"],
        "recv-dlq",
        b"poison",
    )
    assert dead.reconsume_count == MAX_RECONSUME + 1


async def test_expiry_counts_toward_the_retry_limit(
    rb: BrokerProcess, h: httpx.AsyncClient
) -> None:
    await make_topic(rb, "recv-expire")
    await publish(h, "recv-expire", "never acked")
    attempts = []
    for _ in range(MAX_RECONSUME + 1):
        [m] = await receive_n(h, "lost-grp", "recv-expire", 1, invisible_ms=200)
        attempts.append(m["delivery_attempt"])
    assert attempts == [1, 2, 3]
    assert await receive(h, "lost-grp", "recv-expire", wait_ms=1500) == []
    async with await Client.connect(rb.url) as c:
        dlq: DlqListResponse = await c.request(Opcode.DLQ_LIST, DlqRequest("lost-grp"))
    assert [d.message_id for d in dlq.messages] == [m["message_id"]]


async def test_concurrent_receives_never_share_a_message(
    rb: BrokerProcess, h: httpx.AsyncClient
) -> None:
    await make_topic(rb, "recv-race", queues=2)
    await receive(h, "racers", "recv-race")
    bodies = [f"m{i}" for i in range(30)]
    got: list[str] = []

    deadline = time.monotonic() + 30  # every message is received long before on any machine

    async def receiver() -> None:
        while len(got) < len(bodies) and time.monotonic() < deadline:
            batch = await receive(h, "racers", "recv-race", max=3, wait_ms=300)
            got.extend(m["body"] for m in batch)
            if batch:
                await settle(h, "racers", "recv-race", "ack", [m["receipt"] for m in batch])

    async def publisher() -> None:
        await publish(h, "recv-race", *bodies)

    await asyncio.gather(publisher(), *(receiver() for _ in range(4)))
    assert len(got) == len(set(got))  # no message handed to two receives
    assert sorted(got) == sorted(bodies)


async def test_a_retry_comes_back_to_its_own_topic(rb: BrokerProcess, h: httpx.AsyncClient) -> None:
    """A group's retry topic holds every topic's retries: each goes to its own topic's
    receivers, never to another topic's (whose token may not consume it)."""
    await make_topic(rb, "recv-left", queues=1)
    await make_topic(rb, "recv-right", queues=1)
    await publish(h, "recv-right", "right")
    [m] = await receive_n(h, "two-topics", "recv-right", 1)
    await settle(h, "two-topics", "recv-right", "nack", [m["receipt"]], delay_ms=0)
    assert await receive(h, "two-topics", "recv-left", wait_ms=1500) == []
    [again] = await receive_n(h, "two-topics", "recv-right", 1)
    assert (again["body"], again["topic"], again["delivery_attempt"]) == ("right", "recv-right", 2)
    await settle(h, "two-topics", "recv-right", "ack", [again["receipt"]])


async def test_a_tcp_consumer_and_an_http_receiver_share_the_group(
    rb: BrokerProcess, h: httpx.AsyncClient
) -> None:
    await make_topic(rb, "recv-shared", queues=4)
    await receive(h, "shared", "recv-shared")  # the broker joins for its receivers
    by_http: list[str] = []
    by_tcp: list[str] = []
    async with await Client.connect(rb.url) as c, Consumer(c, "shared", "recv-shared") as tcp:
        assert len(tcp.queues) == 2  # the group's queues are split between the two members
        await asyncio.sleep(1.5)  # the broker renews its membership and learns its share
        bodies = [f"m{i}" for i in range(40)]
        await publish(h, "recv-shared", *bodies)

        async def over_http() -> None:
            deadline = time.monotonic() + 15
            while len(by_http) + len(by_tcp) < len(bodies) and time.monotonic() < deadline:
                got = await receive(h, "shared", "recv-shared", max=5, wait_ms=200)
                by_http.extend(m["body"] for m in got)
                if got:
                    await settle(h, "shared", "recv-shared", "ack", [m["receipt"] for m in got])

        async def over_tcp() -> None:
            deadline = time.monotonic() + 15
            while len(by_http) + len(by_tcp) < len(bodies) and time.monotonic() < deadline:
                for m in await tcp.fetch(timeout_ms=200):
                    by_tcp.append(m.body.decode())
                    m.ack()

        await asyncio.gather(over_http(), over_tcp())
    assert by_http and by_tcp
    assert sorted(by_http + by_tcp) == sorted(bodies)  # each once, by one of the two


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
async def test_a_restart_loses_nothing(tmp_path: Path, how: str) -> None:
    b = _broker(tmp_path / "broker").start()
    try:
        await make_topic(b, "recv-restart", queues=2)
        async with httpx.AsyncClient(base_url=b.http, timeout=60) as h:
            await publish(h, "recv-restart", *(f"m{i}" for i in range(10)))
            got = await receive_n(h, "durable", "recv-restart", 10, max=10)
            acked = got[::2]
            await settle(h, "durable", "recv-restart", "ack", [m["receipt"] for m in acked])
            await asyncio.sleep(1.5)  # the offsets reach offsets.json
        if how == "SIGKILL":
            b.kill()  # no shutdown: what was in flight is forgotten with the process
        else:
            assert b.stop() == 0
        b.start()
        async with httpx.AsyncClient(base_url=b.http, timeout=60) as h:
            again = []
            for _ in range(5):
                again += await receive(h, "durable", "recv-restart", wait_ms=500)
            bodies = {m["body"] for m in again}
            # Each message not acknowledged comes again; none twice.
            assert {m["body"] for m in got if m not in acked} <= bodies
            assert len(again) == len(bodies)
            await settle(h, "durable", "recv-restart", "ack", [m["receipt"] for m in again])
            assert await receive(h, "durable", "recv-restart", wait_ms=500) == []
    finally:
        b.stop()


async def test_a_slave_refuses_to_hand_out_what_it_could_not_acknowledge(tmp_path: Path) -> None:
    """A static slave may not commit the group's offsets: receiving there is 503 NOT_MASTER."""
    master = _broker(tmp_path / "master").start()
    slave = BrokerProcess(tmp_path / "slave", "--replica-of", master.url)
    try:
        await make_topic(master, "recv-slave")
        slave.start()
        async with httpx.AsyncClient(base_url=slave.http, timeout=30) as h:
            deadline = time.monotonic() + 10
            while True:  # until the slave has the topic from its master
                r = await h.post(
                    path("billing", "recv-slave", "receive"),
                    json={"max": 1, "wait_ms": 0, "invisible_ms": 1000},
                )
                if r.status_code != 404 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            problem(r, 503, "NOT_MASTER")
    finally:
        slave.stop()
        master.stop()


# --- bad input ---


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max": 0, "wait_ms": 0, "invisible_ms": 1000}, "max"),
        ({"max": 1025, "wait_ms": 0, "invisible_ms": 1000}, "max"),
        ({"max": 1, "wait_ms": -1, "invisible_ms": 1000}, "wait_ms"),
        ({"max": 1, "wait_ms": 30_001, "invisible_ms": 1000}, "wait_ms"),
        ({"max": 1, "wait_ms": 0, "invisible_ms": 99}, "invisible_ms"),
        ({"max": 1, "wait_ms": 0, "invisible_ms": 43_200_001}, "invisible_ms"),
        ({"max": 1, "wait_ms": 0}, "invisible_ms"),
        ({"max": "1", "wait_ms": 0, "invisible_ms": 1000}, "max"),
        ({"max": 1, "wait_ms": 0, "invisible_ms": 1000, "colour": "red"}, "colour"),
    ],
)
async def test_receive_bounds(
    rb: BrokerProcess, h: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    await make_topic(rb, "recv-bad")
    p = problem(await h.post(path("billing", "recv-bad", "receive"), json=body), 400, "BAD_REQUEST")
    assert field in str(p["detail"]), p


@pytest.mark.parametrize(
    ("group", "topic", "status", "code"),
    [
        ("billing", "no-such-topic", 404, "NOT_FOUND"),
        ("%billing", "recv-bad", 422, "INVALID_NAME"),
        ("bill*ing", "recv-bad", 422, "INVALID_NAME"),
        ("g" * 121, "recv-bad", 422, "INVALID_ARGUMENT"),
        ("billing", "%RETRY%billing", 422, "INVALID_NAME"),
        ("billing", "%HALF", 422, "INVALID_NAME"),
    ],
)
@pytest.mark.parametrize("action", ["receive", "ack", "nack", "extend"])
async def test_unknown_or_bad_names(
    rb: BrokerProcess,
    h: httpx.AsyncClient,
    group: str,
    topic: str,
    status: int,
    code: str,
    action: str,
) -> None:
    await make_topic(rb, "recv-bad")
    body: dict[str, Any] = {"receipts": ["m.0.0.0123456789abcdef"]}
    if action == "receive":
        body = {"max": 1, "wait_ms": 0, "invisible_ms": 1000}
    elif action == "extend":
        body["invisible_ms"] = 1000
    problem(await h.post(path(group, topic, action), json=body), status, code)


@pytest.mark.parametrize(
    "receipts",
    [[], ["nope"], ["m.0.0.0123"], ["x.0.0.0123456789abcdef"], [42], "m.0.0.0123456789abcdef"],
)
@pytest.mark.parametrize("action", ["ack", "nack", "extend"])
async def test_malformed_receipts(
    rb: BrokerProcess, h: httpx.AsyncClient, receipts: Any, action: str
) -> None:
    await make_topic(rb, "recv-bad")
    body: dict[str, Any] = {"receipts": receipts}
    if action == "extend":
        body["invisible_ms"] = 1000
    problem(await h.post(path("billing", "recv-bad", action), json=body), 400, "BAD_REQUEST")


async def test_nack_delay_and_extend_bounds(rb: BrokerProcess, h: httpx.AsyncClient) -> None:
    await make_topic(rb, "recv-bad")
    receipt = ["m.0.0.0123456789abcdef"]
    for body, action in [
        ({"receipts": receipt, "delay_ms": -1}, "nack"),
        ({"receipts": receipt, "delay_ms": 31 * 86_400_000}, "nack"),
        ({"receipts": receipt, "invisible_ms": 0}, "extend"),
        ({"receipts": receipt}, "extend"),
    ]:
        problem(await h.post(path("billing", "recv-bad", action), json=body), 400, "BAD_REQUEST")


async def test_a_receipt_from_nowhere_is_stale(rb: BrokerProcess, h: httpx.AsyncClient) -> None:
    await make_topic(rb, "recv-bad")
    receipt = ["r.0.7.0123456789abcdef"]
    for action, kw in [("ack", {}), ("nack", {}), ("extend", {"invisible_ms": 1000})]:
        out = await settle(h, "never-received", "recv-bad", action, receipt, **kw)
        assert out == {"applied": [], "stale": receipt}
