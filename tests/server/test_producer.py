"""Producing into a real store: queue choice by key, idempotency dedup (also across a restart
and under concurrency), headers, and bad input."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.conftest import OpenStore
from txbroker.errors import InvalidArgument, NotFound
from txbroker.protocol.messages import SendReceipt, SendRequest
from txbroker.server.delay import DelayScheduler
from txbroker.server.producer import Producer, queue_for_key
from txbroker.server.topics import TopicRegistry


async def _send_batch(prod: Producer, reqs: list[SendRequest]) -> list[SendReceipt]:
    """As the SEND handlers call the producer: keyed requests through the deduplicating path,
    the rest through ``publish``, answered once durable."""
    if any(r.idempotency_key is not None for r in reqs):
        return await prod.publish_deduplicated(reqs)
    receipts, durable = prod.publish(reqs)
    if durable is not None:
        await durable
    return receipts


async def _send(prod: Producer, req: SendRequest) -> SendReceipt:
    return (await _send_batch(prod, [req]))[0]


def _registry(path: Path) -> TopicRegistry:
    reg = TopicRegistry(path)
    reg.load()
    reg.create("orders", 4)
    return reg


async def test_same_key_same_queue_and_order(tmp_path: Path, open_store: OpenStore) -> None:
    prod = Producer(await open_store(), _registry(tmp_path / "meta"))
    receipts = [
        await _send(prod, SendRequest("orders", str(i).encode(), key="cust-9")) for i in range(5)
    ]
    assert {r.queue_id for r in receipts} == {queue_for_key("cust-9", 4)}
    assert [r.queue_offset for r in receipts] == list(range(5))


async def test_idempotency_key_dedups_across_restart(tmp_path: Path, open_store: OpenStore) -> None:
    reg = _registry(tmp_path / "meta")
    store = await open_store(tmp_path / "data")
    first = await _send(Producer(store, reg), SendRequest("orders", b"a", idempotency_key="ik-1"))
    again = await _send(Producer(store, reg), SendRequest("orders", b"b", idempotency_key="ik-1"))
    assert again.duplicate and (again.message_id, again.queue_offset) == (
        first.message_id,
        first.queue_offset,
    )
    await store.close()
    store = await open_store(tmp_path / "data")
    after = await _send(Producer(store, reg), SendRequest("orders", b"c", idempotency_key="ik-1"))
    assert after.duplicate and after.message_id == first.message_id
    total = sum(store.queue_range("orders", q)[1] for q in range(4))
    assert total == 1  # nothing stored twice


async def test_concurrent_sends_with_one_key_store_once(
    tmp_path: Path, open_store: OpenStore
) -> None:
    store = await open_store()
    prod = Producer(store, _registry(tmp_path / "meta"))
    receipts = await asyncio.gather(
        *(_send(prod, SendRequest("orders", b"x", idempotency_key="same")) for _ in range(20))
    )
    assert len({r.message_id for r in receipts}) == 1
    assert sum(not r.duplicate for r in receipts) == 1
    assert sum(store.queue_range("orders", q)[1] for q in range(4)) == 1


async def test_keyed_batches_store_each_key_once_without_waiting_on_each_other(
    tmp_path: Path, open_store: OpenStore
) -> None:
    """Batches with idempotency keys, concurrent with each other and with single sends over
    the same keys in opposite orders (two batches that each waited for the other's keys would
    hang), and a key repeated within a batch: each key stored once."""
    store = await open_store()
    prod = Producer(store, _registry(tmp_path / "meta"))
    ab = [
        SendRequest("orders", b"a", idempotency_key="a"),
        SendRequest("orders", b"b", idempotency_key="b"),
    ]
    ba = list(reversed(ab))
    twice = [
        *ab,
        SendRequest("orders", b"plain"),
        SendRequest("orders", b"a2", idempotency_key="a"),
    ]
    async with asyncio.timeout(10):
        results = await asyncio.gather(
            _send_batch(prod, ab),
            _send_batch(prod, ba),
            _send_batch(prod, twice),
            _send(prod, ab[0]),
        )
    stored = sum(store.queue_range("orders", q)[1] for q in range(4))
    assert stored == 3  # a, b and the plain one
    receipts = [*results[0], *results[1], *results[2], results[3]]
    assert sum(not r.duplicate for r in receipts) == 3
    of_a = [results[0][0], results[1][1], results[2][0], results[2][3], results[3]]
    assert len({r.message_id for r in of_a}) == 1


async def test_dedup_window_expires(tmp_path: Path, open_store: OpenStore) -> None:
    store = await open_store()
    reg = _registry(tmp_path / "meta")
    await _send(Producer(store, reg), SendRequest("orders", b"a", idempotency_key="old"))
    # A window of -1 ms: everything stored is "before the window".
    later = await _send(
        Producer(store, reg, dedup_window_ms=-1), SendRequest("orders", b"b", idempotency_key="old")
    )
    assert not later.duplicate


async def test_headers_and_tags_are_stored(tmp_path: Path, open_store: OpenStore) -> None:
    store = await open_store()
    prod = Producer(store, _registry(tmp_path / "meta"))
    r = await _send(
        prod, SendRequest("orders", b"x", tags="paid", headers={"trace": "t1"}, queue_id=2)
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
        await _send(prod, req)
    with pytest.raises(error):
        await _send_batch(prod, [SendRequest("orders", b"ok"), req])
    assert store.write_offset == 0


async def test_delayed_delivery_on_time(tmp_path: Path, open_store: OpenStore) -> None:
    store = await open_store()
    reg = _registry(tmp_path / "meta")
    delivered: list[tuple[str, int]] = []
    sched = DelayScheduler(store, reg, tmp_path / "meta", lambda t, q: delivered.append((t, q)))
    sched.load()
    sched.start()
    try:
        prod = Producer(store, reg, scheduler=sched)
        now = time.time_ns() // 1_000_000
        targets = {f"d{i}": now + ms for i, ms in enumerate((300, 1200, 2500, 700))}
        for key, at in targets.items():
            r = await _send(prod, SendRequest("orders", key.encode(), key=key, deliver_at_ms=at))
            assert r.queue_offset == -1 and r.topic == "orders"  # scheduled, not yet delivered
        arrived: dict[str, int] = {}
        deadline = time.monotonic() + 10
        while len(arrived) < len(targets):
            assert time.monotonic() < deadline, f"arrived only {sorted(arrived)}"
            for q in range(4):
                got = await store.get_messages("orders", q, 0, 100)
                for m in got.messages:
                    arrived.setdefault(m.body.decode(), m.store_timestamp_ms)
            await asyncio.sleep(0.02)  # polling the store: the check itself, not a sync point
        for key, at in targets.items():
            assert at <= arrived[key] <= at + 1000, (key, arrived[key] - at)
        assert sched.delivered == 4 and sched.pending() == 0
    finally:
        await sched.stop()


async def test_delay_beyond_the_maximum_is_refused(tmp_path: Path, open_store: OpenStore) -> None:
    store = await open_store()
    reg = _registry(tmp_path / "meta")
    sched = DelayScheduler(store, reg, tmp_path / "meta", lambda t, q: None)
    sched.load()
    prod = Producer(store, reg, scheduler=sched)
    with pytest.raises(InvalidArgument, match="days away"):
        await _send(
            prod, SendRequest("orders", b"x", deliver_at_ms=time.time_ns() // 10**6 + 10**11)
        )
    assert store.write_offset == 0


async def test_scheduler_replay_after_lost_cursors_delivers_nothing_twice(
    tmp_path: Path, open_store: OpenStore
) -> None:
    store = await open_store()
    reg = _registry(tmp_path / "meta")
    sched = DelayScheduler(store, reg, tmp_path / "meta", lambda t, q: None)
    sched.load()
    sched.start()
    prod = Producer(store, reg, scheduler=sched)
    at = time.time_ns() // 1_000_000 + 400
    await _send(prod, SendRequest("orders", b"once", queue_id=1, deliver_at_ms=at))
    deadline = time.monotonic() + 10
    while store.queue_range("orders", 1)[1] == 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await sched.stop()
    assert sched.moved >= 1  # it went through at least one intermediate level
    # A crash that lost every saved cursor: a new scheduler re-reads every level from 0.
    (tmp_path / "meta" / "schedule.json").unlink(missing_ok=True)
    again = DelayScheduler(store, reg, tmp_path / "meta", lambda t, q: None)
    again.load()
    again.start()
    try:
        deadline = time.monotonic() + 5
        while again.pending():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        assert again.delivered == 0 and again.moved == 0
        assert store.queue_range("orders", 1) == (0, 1)
    finally:
        await again.stop()
