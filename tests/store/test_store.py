"""The store end to end on real files: append, read, queues, index, retention, bad input."""

from __future__ import annotations

import asyncio
import filecmp
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import OpenStore
from txbroker.errors import (
    InvalidArgument,
    InvalidName,
    InvalidOffset,
    MessageTooLarge,
    NotFound,
    NotMaster,
    StoreClosed,
    StoreLocked,
)
from txbroker.store import FlushMode, KeyKind, Message, MessageStore, StoreConfig


async def test_append_then_read_by_offset_and_queue(open_store: OpenStore) -> None:
    store = await open_store()
    res = await store.append(
        Message("orders", b"hello", queue_id=2, properties={"keys": "o-1 c-9", "tags": "paid"})
    )
    assert (res.topic, res.queue_id, res.queue_offset) == ("orders", 2, 0)
    msg = await store.read(res.physical_offset)
    assert msg.body == b"hello" and msg.keys == ["o-1", "c-9"] and msg.tags == "paid"
    assert msg.message_id == res.message_id and len(res.message_id) == 32
    got = await store.get_messages("orders", 2, 0)
    assert [m.body for m in got.messages] == [b"hello"]
    assert (got.next_offset, got.min_offset, got.max_offset) == (1, 0, 1)


async def test_queue_offsets_are_dense_per_queue(open_store: OpenStore) -> None:
    store = await open_store()
    results = await store.append_batch(
        [Message("t", str(i).encode(), queue_id=i % 3) for i in range(30)]
    )
    for qid in range(3):
        offsets = [r.queue_offset for r in results if r.queue_id == qid]
        assert offsets == list(range(10))
        got = await store.get_messages("t", qid, 0, max_count=100)
        assert [int(m.body) for m in got.messages] == list(range(qid, 30, 3))


async def test_tag_filter_skips_other_tags(open_store: OpenStore) -> None:
    store = await open_store()
    for i in range(20):
        await store.append(
            Message("t", str(i).encode(), properties={"tags": "A" if i % 4 else "B"})
        )
    got = await store.get_messages("t", 0, 0, max_count=100, tags=["B"])
    assert [int(m.body) for m in got.messages] == [0, 4, 8, 12, 16]
    assert got.next_offset == 20  # non-matching entries scanned are skipped for good
    two = await store.get_messages("t", 0, 0, max_count=2, tags=["B"])
    assert [int(m.body) for m in two.messages] == [0, 4] and two.next_offset == 5


async def test_lookup_by_key_message_id_and_idempotency_key(open_store: OpenStore) -> None:
    store = await open_store()
    a = await store.append(Message("t", b"a", properties={"keys": "k1 shared", "ik": "idem-1"}))
    b = await store.append(Message("t", b"b", properties={"keys": "shared"}))
    assert [m.body for m in await store.lookup(KeyKind.KEY, "shared")] == [b"b", b"a"]
    assert [m.body for m in await store.lookup(KeyKind.KEY, "k1")] == [b"a"]
    assert [m.body for m in await store.lookup(KeyKind.MESSAGE_ID, b.message_id)] == [b"b"]
    assert [m.physical_offset for m in await store.lookup(KeyKind.IDEMPOTENCY_KEY, "idem-1")] == [
        a.physical_offset
    ]
    # A key kind is its own namespace: an idempotency key is not a business key.
    assert await store.lookup(KeyKind.KEY, "idem-1") == []
    assert await store.lookup(KeyKind.KEY, "absent") == []


async def test_index_and_queues_survive_restart_and_span_many_files(
    tmp_path: Path, open_store: OpenStore
) -> None:
    store = await open_store()
    # 6000 keyed messages: more than one index file (capacity 5000) and CQ file (1000), and
    # several 256 KiB segments.
    for start in range(0, 6000, 500):
        await store.append_batch(
            [
                Message("t", b"x" * 100, queue_id=0, properties={"keys": f"key-{i}"})
                for i in range(start, start + 500)
            ]
        )
    assert len(store.index.files) > 1 and len(store.log.segments) > 2
    await store.close()
    store = await open_store()
    assert store.recovery is not None and store.recovery.records_replayed == 0
    for i in (0, 2999, 5999):
        found = await store.lookup(KeyKind.KEY, f"key-{i}")
        assert len(found) == 1 and found[0].queue_offset == i
    got = await store.get_messages("t", 0, 5990, max_count=100)
    assert [m.queue_offset for m in got.messages] == list(range(5990, 6000))


async def test_deleted_consume_queues_are_rebuilt_identical(
    tmp_path: Path, open_store: OpenStore
) -> None:
    data = tmp_path / "store"
    store = await open_store(data)
    for i in range(2500):
        await store.append(
            Message(
                f"topic{i % 2}",
                bytes(i % 251) * 10,
                queue_id=i % 3,
                properties={"tags": str(i % 5)},
            )
        )
    await store.close()
    saved = tmp_path / "cq-before"
    shutil.copytree(data / "consumequeue", saved)
    shutil.rmtree(data / "consumequeue")
    store = await open_store(data)
    assert store.recovery is not None and len(store.recovery.queues_rebuilt) == 6
    await store.close()
    cmp = filecmp.dircmp(saved, data / "consumequeue")
    _assert_same_tree(cmp)


def _assert_same_tree(cmp: filecmp.dircmp[str]) -> None:
    assert not cmp.left_only and not cmp.right_only, (cmp.left_only, cmp.right_only)
    _, mismatch, errors = filecmp.cmpfiles(cmp.left, cmp.right, cmp.common_files, shallow=False)
    assert not mismatch and not errors
    for sub in cmp.subdirs.values():
        _assert_same_tree(sub)


async def test_a_shortened_consume_queue_is_rebuilt(tmp_path: Path, open_store: OpenStore) -> None:
    data = tmp_path / "store"
    store = await open_store(data)
    for i in range(1500):
        await store.append(Message("t", str(i).encode()))
    await store.close()
    # Drop the queue's second file: the queue is now "behind" the checkpoint.
    (data / "consumequeue" / "t" / "0" / f"{1000:020d}").unlink()
    store = await open_store(data)
    assert store.queue_range("t", 0) == (0, 1500)
    got = await store.get_messages("t", 0, 1490, max_count=20)
    assert [int(m.body) for m in got.messages] == list(range(1490, 1500))


async def test_segments_roll_and_reads_cross_them(open_store: OpenStore) -> None:
    store = await open_store()
    body = b"y" * 60_000  # four of these fill a 256 KiB segment
    results = [await store.append(Message("big", body + bytes([i]))) for i in range(20)]
    assert len(store.log.segments) >= 5
    for i, r in enumerate(results):
        assert (await store.read(r.physical_offset)).body == body + bytes([i])


async def test_cold_reads_go_through_a_worker_thread(open_store: OpenStore) -> None:
    store = await open_store(hot_read_bytes=1)  # every read counts as cold
    res = await store.append(Message("t", b"cold"))
    await store.append(Message("t", b"pad" * 100))
    assert (await store.read(res.physical_offset)).body == b"cold"
    got = await store.get_messages("t", 0, 0)
    assert got.messages[0].body == b"cold"


async def test_retention_by_size_deletes_whole_segments(open_store: OpenStore) -> None:
    store = await open_store(retention_bytes=512 * 1024, retention_ms=None)
    for i in range(40):
        await store.append(
            Message("t", str(i).encode() + b"z" * 50_000, properties={"keys": f"k{i}"})
        )
    before = store.log.min_offset
    rep = await store.enforce_retention()
    assert rep.segments_deleted > 0 and store.log.min_offset > before
    assert store.write_offset - store.log.min_offset <= 512 * 1024 + 256 * 1024
    lo, hi = store.queue_range("t", 0)
    assert lo > 0 and hi == 40
    got = await store.get_messages("t", 0, 0, max_count=100)
    assert got.messages[0].queue_offset == lo  # reading from 0 starts at the new minimum
    assert [int(m.body[:2].rstrip(b"z")) for m in got.messages] == list(range(lo, 40))
    assert await store.lookup(KeyKind.KEY, "k0") == []
    assert len(await store.lookup(KeyKind.KEY, "k39")) == 1
    with pytest.raises(NotFound):
        await store.read(before)


async def test_retention_by_age(open_store: OpenStore) -> None:
    store = await open_store(retention_ms=60_000)
    for _ in range(20):
        await store.append(Message("t", b"a" * 60_000))
    segments = len(store.log.segments)
    assert (await store.enforce_retention()).segments_deleted == 0
    rep = await store.enforce_retention(now_ms=time.time_ns() // 1_000_000 + 61_000)
    # Everything but the active segment has aged out.
    assert rep.segments_deleted == segments - 1


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message("bad/name", b"x"), InvalidName),
        (Message("", b"x"), InvalidName),
        (Message("..", b"x"), InvalidName),
        (Message("%", b"x"), InvalidName),
        (Message("a" * 128, b"x"), InvalidName),
        (Message("t", b"x" * (64 * 1024 + 1)), MessageTooLarge),
        (Message("t", "text"), InvalidArgument),  # type: ignore[arg-type]
        (Message("t", b"x", queue_id=-1), InvalidArgument),
        (Message("t", b"x", queue_id=70_000), InvalidArgument),
        (Message("t", b"x", properties={"k": 5}), InvalidArgument),  # type: ignore[dict-item]
        (Message("t", b"x", properties={"k": "v" * 40_000}), MessageTooLarge),
        (Message("t", b"x", flags=1 << 20), InvalidArgument),
    ],
)
async def test_bad_input_is_refused_and_changes_nothing(
    open_store: OpenStore, message: Message, error: type[Exception]
) -> None:
    store = await open_store()
    good = await store.append(Message("t", b"kept"))
    end = store.write_offset
    with pytest.raises(error):
        await store.append(message)
    with pytest.raises(error):
        await store.append_batch([Message("t", b"first"), message])  # all-or-nothing validation
    assert store.write_offset == end
    assert (await store.read(good.physical_offset)).body == b"kept"
    assert store.queue_range("t", 0) == (0, 1)


async def test_bad_read_arguments(open_store: OpenStore) -> None:
    store = await open_store()
    res = await store.append(Message("t", b"abc"))
    with pytest.raises(InvalidOffset):
        await store.read(-1)
    with pytest.raises(InvalidOffset):
        await store.get_messages("t", 0, -5)
    with pytest.raises(InvalidOffset):
        await store.read(res.physical_offset + 3)  # not a record boundary
    with pytest.raises(NotFound):
        await store.read(10**12)
    with pytest.raises(InvalidName):
        await store.get_messages("no/such", 0, 0)
    assert (await store.get_messages("never-written", 0, 0)).messages == []


async def test_a_data_dir_has_one_owner(tmp_path: Path, open_store: OpenStore) -> None:
    await open_store(tmp_path / "d")
    with pytest.raises(StoreLocked):
        await MessageStore.open(StoreConfig(tmp_path / "d"))


async def test_closed_store_refuses_appends(open_store: OpenStore) -> None:
    store = await open_store()
    await store.close()
    with pytest.raises(StoreClosed):
        await store.append(Message("t", b"x"))


@pytest.mark.parametrize("mode", [FlushMode.SYNC, FlushMode.ASYNC])
async def test_concurrent_appenders_share_fsyncs(open_store: OpenStore, mode: FlushMode) -> None:
    store = await open_store(flush=mode, flush_interval_ms=20)

    async def appender(n: int) -> None:
        for i in range(50):
            await store.append(Message("t", f"{n}:{i}".encode(), queue_id=n % 4))

    await asyncio.gather(*(appender(n) for n in range(32)))
    c = store.committer
    if mode is FlushMode.SYNC:
        assert c.flushed == store.write_offset  # every acknowledged append is covered
        assert c.fsync_records == 1600 and c.fsync_count < 1600  # group commit happened
    total = sum(store.queue_range("t", q)[1] for q in range(4))
    assert total == 1600


async def test_a_shared_durable_wait_covers_every_append_made_before_it_resolves(
    open_store: OpenStore,
) -> None:
    """``durable_together`` hands one future to every append until a group commit starts: each
    one's record must be on disk when it resolves, including the appends made after an idle
    store started the first group at once (that group cannot cover them)."""
    store = await open_store()
    written: list[tuple[asyncio.Future[None], int]] = []
    for round_ in range(3):
        for i in range(20):
            store.append_nowait(Message("t", f"{round_}:{i}".encode()))
            fut = store.durable_together()
            assert fut is not None
            written.append((fut, store.write_offset))
        await asyncio.sleep(0)  # a loop turn: the group started at the end of it
    seen_at: dict[int, int] = {}

    def resolved(end: int, f: asyncio.Future[None]) -> None:
        seen_at[end] = store.flushed_offset

    for fut, end in written:
        fut.add_done_callback(lambda f, end=end: resolved(end, f))
    await asyncio.wait([f for f, _ in written], timeout=10)
    assert all(f.done() and f.exception() is None for f, _ in written)
    assert all(seen_at[end] >= end for _, end in written), "acknowledged before durable"
    assert len({id(f) for f, _ in written}) < len(written)  # shared, not one each


async def test_a_cancelled_append_leaves_the_shared_durable_wait_to_the_others(
    open_store: OpenStore,
) -> None:
    """Every append waits on the one shared durability future: cancelling one waiter must not
    cancel it for the appends that share it."""
    store = await open_store()
    tasks = [asyncio.create_task(store.append(Message("t", f"m{i}".encode()))) for i in range(8)]
    await asyncio.sleep(0)  # every task has appended and waits
    tasks[0].cancel()
    done = await asyncio.gather(*tasks[1:])
    assert [r.queue_offset for r in done] == list(range(1, 8))
    assert store.flushed_offset == store.write_offset


async def test_a_follower_refuses_its_own_appends_and_an_unfollowed_store_fences_each(
    open_store: OpenStore,
) -> None:
    store = await open_store()
    await store.append(Message("t", b"as master"))
    store.follow("txb://master:1")
    for append in (
        lambda: store.append_nowait(Message("t", b"x")),
        lambda: store.append_batch_nowait([Message("t", b"x")]),
    ):
        with pytest.raises(NotMaster, match="txb://master:1"):
            append()
    with pytest.raises(NotMaster, match="txb://master:1"):
        await store.append_batch([Message("t", b"x")])
    assert store.queue_range("t", 0) == (0, 1)

    calls: list[int] = []
    lease_over = False

    def fence() -> None:
        calls.append(store.write_offset)
        if lease_over:
            raise NotMaster("the lease ended")

    store.unfollow(fence)
    await store.append(Message("t", b"as elected master"))
    await store.append_batch([Message("t", b"a"), Message("t", b"b")])
    assert len(calls) == 2  # once before each append, before anything is written
    lease_over = True
    end = store.write_offset
    with pytest.raises(NotMaster, match="the lease ended"):
        store.append_nowait(Message("t", b"refused"))
    assert store.write_offset == end and store.queue_range("t", 0) == (0, 4)


async def test_async_mode_flushes_on_its_interval(open_store: OpenStore) -> None:
    store = await open_store(flush=FlushMode.ASYNC, flush_interval_ms=10)
    await store.append(Message("t", b"x"))
    for _ in range(200):  # bounded wait for the interval flush (10 ms) to run
        if store.flushed_offset == store.write_offset:
            break
        await asyncio.sleep(0.01)
    assert store.flushed_offset == store.write_offset


async def test_retention_survives_a_restart(tmp_path: Path, open_store: OpenStore) -> None:
    data = tmp_path / "store"
    store = await open_store(data, retention_bytes=512 * 1024, retention_ms=None)
    for i in range(40):
        await store.append(Message("t", str(i).encode().ljust(50_000, b"z")))
    await store.enforce_retention()
    lo = store.queue_range("t", 0)[0]
    await store.close()
    store = await open_store(data, retention_bytes=512 * 1024, retention_ms=None)
    assert store.queue_range("t", 0) == (lo, 40)
    got = await store.get_messages("t", 0, 0, max_count=100)
    assert [int(m.body.rstrip(b"z")) for m in got.messages] == list(range(lo, 40))


async def test_reading_past_the_end_is_not_found(open_store: OpenStore) -> None:
    store = await open_store()
    store.append_nowait(Message("t", b"buffered, not yet flushed"))
    with pytest.raises(NotFound):
        await store.read(store.write_offset + 100)


async def test_sync_mode_consumers_only_see_durable_records(open_store: OpenStore) -> None:
    store = await open_store()
    await store.append(Message("t", b"durable"))
    store.append_nowait(Message("t", b"not yet"))  # written to the buffer, no fsync awaited
    got = await store.get_messages("t", 0, 0)
    assert [m.body for m in got.messages] == [b"durable"] and got.next_offset == 1
    await store.durable()
    got = await store.get_messages("t", 0, 1)
    assert [m.body for m in got.messages] == [b"not yet"]


async def test_empty_and_maximum_bodies_at_default_limits(open_store: OpenStore) -> None:
    from txbroker.store import MAX_BODY_BYTES

    store = await open_store(segment_bytes=9 * 1024 * 1024, max_body_bytes=MAX_BODY_BYTES)
    big = os.urandom(MAX_BODY_BYTES)
    results = await store.append_batch(
        [Message("t", b""), Message("t", big), Message("t", big[:1]), Message("t", big)]
    )
    for res, body in zip(results, [b"", big, big[:1], big], strict=True):
        assert (await store.read(res.physical_offset)).body == body
    with pytest.raises(MessageTooLarge):
        await store.append(Message("t", big + b"!"))
    got = await store.get_messages("t", 0, 0, max_count=10)
    assert [len(m.body) for m in got.messages] == [0, MAX_BODY_BYTES, 1, MAX_BODY_BYTES]
