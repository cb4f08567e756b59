"""Producing into a real store: queue choice by key, idempotency dedup (also across a restart
and under concurrency), headers, and bad input."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.conftest import OpenStore
from txbroker.errors import InvalidArgument, NotFound
from txbroker.protocol.messages import SendRequest
from txbroker.server.producer import Producer, queue_for_key
from txbroker.server.topics import TopicRegistry


def _registry(path: Path) -> TopicRegistry:
    reg = TopicRegistry(path)
    reg.load()
    reg.create("orders", 4)
    return reg


async def test_same_key_same_queue_and_order(tmp_path: Path, open_store: OpenStore) -> None:
    prod = Producer(await open_store(), _registry(tmp_path / "meta"))
    receipts = [
        await prod.send(SendRequest("orders", str(i).encode(), key="cust-9")) for i in range(5)
    ]
    assert {r.queue_id for r in receipts} == {queue_for_key("cust-9", 4)}
    assert [r.queue_offset for r in receipts] == list(range(5))


async def test_idempotency_key_dedups_across_restart(tmp_path: Path, open_store: OpenStore) -> None:
    reg = _registry(tmp_path / "meta")
    store = await open_store(tmp_path / "data")
    first = await Producer(store, reg).send(SendRequest("orders", b"a", idempotency_key="ik-1"))
    again = await Producer(store, reg).send(SendRequest("orders", b"b", idempotency_key="ik-1"))
    assert again.duplicate and (again.message_id, again.queue_offset) == (
        first.message_id,
        first.queue_offset,
    )
    await store.close()
    store = await open_store(tmp_path / "data")
    after = await Producer(store, reg).send(SendRequest("orders", b"c", idempotency_key="ik-1"))
    assert after.duplicate and after.message_id == first.message_id
    total = sum(store.queue_range("orders", q)[1] for q in range(4))
    assert total == 1  # nothing stored twice


async def test_concurrent_sends_with_one_key_store_once(
    tmp_path: Path, open_store: OpenStore
) -> None:
    store = await open_store()
    prod = Producer(store, _registry(tmp_path / "meta"))
    receipts = await asyncio.gather(
        *(prod.send(SendRequest("orders", b"x", idempotency_key="same")) for _ in range(20))
    )
    assert len({r.message_id for r in receipts}) == 1
    assert sum(not r.duplicate for r in receipts) == 1
    assert sum(store.queue_range("orders", q)[1] for q in range(4)) == 1


async def test_dedup_window_expires(tmp_path: Path, open_store: OpenStore) -> None:
    store = await open_store()
    reg = _registry(tmp_path / "meta")
    await Producer(store, reg).send(SendRequest("orders", b"a", idempotency_key="old"))
    # A window of -1 ms: everything stored is "before the window".
    later = await Producer(store, reg, dedup_window_ms=-1).send(
        SendRequest("orders", b"b", idempotency_key="old")
    )
    assert not later.duplicate


async def test_headers_and_tags_are_stored(tmp_path: Path, open_store: OpenStore) -> None:
    store = await open_store()
    prod = Producer(store, _registry(tmp_path / "meta"))
    r = await prod.send(
        SendRequest("orders", b"x", tags="paid", headers={"trace": "t1"}, queue_id=2)
    )
    got = await store.get_messages("orders", 2, r.queue_offset)
    m = got.messages[0]
    assert m.tags == "paid" and m.properties["h.trace"] == "t1"


@pytest.mark.parametrize(
    ("req", "error"),
    [
        (SendRequest("nope", b"x"), NotFound),
        (SendRequest("orders", b"x", queue_id=4), InvalidArgument),
        (SendRequest("orders", b"x", key=""), InvalidArgument),
        (SendRequest("orders", b"x", key="has space"), InvalidArgument),
        (SendRequest("orders", b"x", tags="t" * 2000), InvalidArgument),
    ],
)
async def test_bad_sends(
    tmp_path: Path, open_store: OpenStore, req: SendRequest, error: type[Exception]
) -> None:
    store = await open_store()
    prod = Producer(store, _registry(tmp_path / "meta"))
    with pytest.raises(error):
        await prod.send(req)
    with pytest.raises(error):
        await prod.send_batch([SendRequest("orders", b"ok"), req])
    assert store.write_offset == 0


async def test_delayed_sends_are_refused_until_supported(
    tmp_path: Path, open_store: OpenStore
) -> None:
    store = await open_store()
    prod = Producer(store, _registry(tmp_path / "meta"))
    with pytest.raises(InvalidArgument, match="not supported yet"):
        await prod.send(SendRequest("orders", b"x", deliver_at_ms=1))
    assert store.write_offset == 0
