"""Deleting a topic deletes it, on real broker processes: its messages,
queue files, group offsets, retries, dead letters, delayed messages and open transactions are
gone at once and after a kill -9 right after the answer, and a topic created again under the
name starts empty."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import BrokerProcess
from txbroker.errors import NotFound, TransactionConflict
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import DlqRequest, GroupsRequest
from txbroker_sdk import Client, Consumer

# Back-checks must not resolve anything while the test runs: nothing listens there.
NOWHERE = "http://127.0.0.1:9/check"


async def _fetch_all(consumer: Consumer, quiet_ms: int = 800, limit_s: float = 20) -> list[bytes]:
    """Everything the consumer gets until a fetch of ``quiet_ms`` brings nothing (bounded)."""
    out: list[bytes] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        got = await consumer.fetch(timeout_ms=quiet_ms)
        if not got:
            return out
        for m in got:
            out.append(m.body)
            m.ack()
    raise AssertionError(f"still receiving after {limit_s}s: {len(out)} messages")


async def _wait_for(consumer: Consumer, n: int, limit_s: float = 20) -> list[bytes]:
    out: list[bytes] = []
    deadline = time.monotonic() + limit_s
    while len(out) < n:
        assert time.monotonic() < deadline, f"got {out}, want {n} messages"
        for m in await consumer.fetch(timeout_ms=500):
            out.append(m.body)
            m.ack()
    return out


async def _fill(c: Client) -> tuple[str, str]:
    """The topic ``orders`` with a bit of everything: messages with keys and idempotency keys,
    a group's committed offsets, a retry the group still owes, a dead letter, a delayed
    message, an open transaction. Returns (the open transaction's id, a message id)."""
    await c.create_topic("orders", queues=2)
    first = await c.send("orders", b"old-0", key="k0", idempotency_key="ik0")
    for i in range(1, 12):
        await c.send("orders", f"old-{i}".encode(), key=f"k{i}")
    await c.send("orders", b"old-late", deliver_at_ms=time.time_ns() // 1_000_000 + 3_000)
    tx = await c.prepare("orders", b"old-tx", producer_group="shop", check_url=NOWHERE)
    async with Consumer(c, "old", "orders") as consumer:
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        dead_lettered = retry_pending = False
        while not (dead_lettered and retry_pending and len(got) >= 12):
            assert time.monotonic() < deadline, (got, dead_lettered, retry_pending)
            for m in await consumer.fetch(timeout_ms=500):
                got.append(m.body)
                if m.body == b"old-1":  # nacked until dead-lettered (max_reconsume = 1)
                    dead_lettered = (await m.nack()).dead_lettered
                elif m.body == b"old-2" and m.reconsume_count == 0:
                    await m.nack()  # back through the group's retry topic
                elif m.body == b"old-2":
                    retry_pending = True  # not acknowledged: the group still owes it
                else:
                    m.ack()
        await consumer.commit()
    groups = await c.request(Opcode.OFFSETS, GroupsRequest("old", "orders"))
    assert groups.groups and any(q.committed for q in groups.groups[0].queues)
    dlq = await c.request(Opcode.DLQ_LIST, DlqRequest("old"))
    assert [m.body for m in dlq.messages] == [b"old-1"]
    return tx.tx_id, first.message_id


@pytest.mark.parametrize("crash", [False, True], ids=["running", "kill-9-after-answer"])
async def test_a_deleted_topic_is_gone_and_its_name_starts_empty(
    tmp_path: Path, crash: bool
) -> None:
    cfg = tmp_path / "broker.toml"
    # One quick retry, then dead letters; no back-check while the test runs.
    cfg.write_text(
        "retry_delays_ms = [100]\nmax_reconsume = 1\ntx_timeout_ms = 3600000\n"
        'tx_default_secret = "s3cret"\n'
    )
    data = tmp_path / "broker"
    b = BrokerProcess(data, "--config", str(cfg)).start()
    try:
        async with await Client.connect(b.url) as c:
            tx_id, message_id = await _fill(c)
            queues_dir = data / "store" / "consumequeue" / "orders"
            assert queues_dir.exists()
            await c.delete_topic("orders")
            if crash:
                b.kill()  # right after the answer: nothing else ran since
        if crash:
            b = BrokerProcess(data, "--config", str(cfg)).start()
        async with await Client.connect(b.url) as c:
            # Gone for every reader, at once.
            with pytest.raises(NotFound):
                await c.describe_topic("orders")
            assert not queues_dir.exists()  # its queue files: the space is back
            assert (await c.request(Opcode.OFFSETS, GroupsRequest("old"))).groups == []
            assert (await c.request(Opcode.DLQ_LIST, DlqRequest("old"))).messages == []
            assert (await c.list_transactions(topic="orders")).transactions == []
            with pytest.raises(TransactionConflict, match=r"rolled_back|rollback"):
                await c.end_transaction(tx_id, "commit")
            async with httpx.AsyncClient(base_url=b.http) as http:
                r = await http.get(f"/v1/messages/{message_id}")
                assert r.status_code == 404, r.text

            # The name again: empty, numbering on from where the deleted queues ended.
            info = await c.create_topic("orders", queues=2)
            assert info.messages == 0
            assert sum(o.max_offset for o in info.offsets) == 12
            async with Consumer(c, "fresh", "orders") as fresh, Consumer(c, "old", "orders") as old:
                assert await _fetch_all(fresh) == []
                assert await _fetch_all(old) == []  # no old offset, retry or dead letter
                again = await c.send("orders", b"new-0", key="k0", idempotency_key="ik0")
                assert not again.duplicate  # the deleted message's key is gone too
                await c.send("orders", b"new-1", key="k1")
                # Past the deleted delayed message's time: it must not arrive either.
                left_ms = info.created_ms + 3_500 - time.time_ns() // 1_000_000
                await asyncio.sleep(max(left_ms, 0) / 1000)  # a clock time, not a sync point
                assert sorted(await _wait_for(fresh, 2)) == [b"new-0", b"new-1"]
                assert sorted(await _wait_for(old, 2)) == [b"new-0", b"new-1"]
                assert await _fetch_all(fresh) == [] and await _fetch_all(old) == []
            async with httpx.AsyncClient(base_url=b.http) as http:
                r = await http.get("/v1/messages", params={"topic": "orders", "key": "k0"})
                assert [m["body"] for m in r.json()["messages"]] == ["new-0"], r.text
    finally:
        b.stop()
