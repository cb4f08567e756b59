"""Topic fences on real files: a deleted topic's records, queue files and copies are gone for
readers at once, after a crash and through a rebuild; its name starts empty; retention takes
the bytes and the fence with them."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import OpenStore, small_config
from txbroker.store import (
    PROP_IDEMPOTENCY_KEY,
    PROP_INTERNAL_KEY,
    PROP_KEYS,
    PROP_ORIGINAL_TOPIC,
    PROP_TARGET_TOPIC,
    KeyKind,
    Message,
    MessageStore,
    TopicFence,
)


async def _orders(store: MessageStore, n: int = 10) -> None:
    for i in range(n):
        props = {PROP_KEYS: f"k{i}", PROP_IDEMPOTENCY_KEY: f"ik{i}", PROP_INTERNAL_KEY: f"ix{i}"}
        await store.append(Message("orders", f"o{i}".encode(), i % 2, props))


async def _bodies(store: MessageStore, topic: str, queues: int = 2) -> list[bytes]:
    out = []
    for q in range(queues):
        lo, _ = store.queue_range(topic, q)
        got = await store.get_messages(topic, q, lo, 1000)
        out += [m.body for m in got.messages]
    return out


def _delete(store: MessageStore, topic: str) -> TopicFence:
    fence = store.fence_for(topic)
    store.drop_topic(topic, fence)
    return fence


async def test_dropped_topic_is_unreachable_and_its_name_starts_on(
    tmp_path: Path, open_store: OpenStore
) -> None:
    store = await open_store()
    await _orders(store)
    copy = {PROP_ORIGINAL_TOPIC: "orders", PROP_KEYS: "k1"}
    await store.append(Message("%RETRY%g", b"retry-of-o1", 0, copy))
    await store.append(Message("%SCHEDULE", b"later", 3, {PROP_TARGET_TOPIC: "orders"}))
    await store.append(Message("other", b"keep", 0, {PROP_KEYS: "k1"}))
    fence = _delete(store, "orders")
    assert fence.ends == {0: 5, 1: 5}
    assert not (tmp_path / "store" / "consumequeue" / "orders").exists()
    assert await _bodies(store, "orders") == []
    got = await store.get_messages("%RETRY%g", 0, 0)
    assert got.messages == [] and got.next_offset == 1  # skipped, and paged past
    assert (await store.get_messages("%SCHEDULE", 3, 0)).messages == []
    assert [m.body for m in await store.lookup(KeyKind.KEY, "k1")] == [b"keep"]
    assert await store.lookup(KeyKind.IDEMPOTENCY_KEY, "ik3") == []
    # Internal keys answer "did this happen?", which a deletion does not undo.
    assert [m.body for m in await store.lookup(KeyKind.INTERNAL, "ix3")] == [b"o3"]

    # The name again: its queues number on from where the deleted ones ended.
    assert store.queue_range("orders", 0) == (5, 5)
    res = await store.append(Message("orders", b"new", 0, {PROP_KEYS: "k1"}))
    assert res.queue_offset == 5
    await store.append(Message("%RETRY%g", b"retry-of-new", 0, {PROP_ORIGINAL_TOPIC: "orders"}))
    assert await _bodies(store, "orders") == [b"new"]
    assert [m.body for m in (await store.get_messages("%RETRY%g", 0, 0)).messages] == [
        b"retry-of-new"
    ]
    assert sorted(m.body for m in await store.lookup(KeyKind.KEY, "k1")) == [b"keep", b"new"]

    # A crash (no clean close) and a restart with the persisted fence: the same.
    store.abandon()
    again = await MessageStore.open(small_config(tmp_path / "store"), {"orders": fence})
    try:
        assert await _bodies(again, "orders") == [b"new"]
        assert again.queue_range("orders", 0) == (5, 6)
        assert again.queue_range("orders", 1) == (5, 5)
        assert [m.body for m in await again.lookup(KeyKind.KEY, "k1")] == [b"new", b"keep"]
        assert await again.lookup(KeyKind.IDEMPOTENCY_KEY, "ik3") == []
    finally:
        await again.close()


async def test_a_crash_before_the_queue_files_go_is_repaired_at_open(tmp_path: Path) -> None:
    """The fence is persisted before the files are removed: a crash between leaves the dead
    queue files on disk, and the next open drops them."""
    store = await MessageStore.open(small_config(tmp_path / "s"))
    await _orders(store)
    fence = store.fence_for("orders")  # persisted by its owner ... and then the crash
    store.abandon()
    again = await MessageStore.open(small_config(tmp_path / "s"), {"orders": fence})
    try:
        assert await _bodies(again, "orders") == []
        assert not (tmp_path / "s" / "consumequeue" / "orders").exists()
        assert (await again.append(Message("orders", b"new", 1))).queue_offset == 5
    finally:
        await again.close()


async def test_a_rebuild_from_the_log_skips_dead_records(tmp_path: Path) -> None:
    store = await MessageStore.open(small_config(tmp_path / "s"))
    await _orders(store)
    fence = _delete(store, "orders")
    await store.append(Message("orders", b"new", 0))
    await store.close()
    # Queues are derived data: with them all gone, the log alone must give the same answer.
    shutil.rmtree(tmp_path / "s" / "consumequeue")
    (tmp_path / "s" / "checkpoint.json").unlink()
    again = await MessageStore.open(small_config(tmp_path / "s"), {"orders": fence})
    try:
        assert await _bodies(again, "orders") == [b"new"]
        assert again.queue_range("orders", 0) == (5, 6)
    finally:
        await again.close()


async def test_retention_reclaims_the_space_and_then_the_fence(open_store: OpenStore) -> None:
    store = await open_store(retention_bytes=256 * 1024)
    big = b"x" * 30_000
    for i in range(20):  # about 2.3 segments of the deleted topic
        await store.append(Message("orders", big, i % 2))
    fence = _delete(store, "orders")
    assert store.forget_fences(set()) == []  # its records are still in the log
    for _ in range(20):  # a live topic moves the log on
        await store.append(Message("other", big))
    rep = await store.enforce_retention()
    assert rep.segments_deleted >= 2 and store.log.min_offset >= fence.phys
    assert store.forget_fences({"orders"}) == []  # a topic of the name numbers on from it
    assert store.forget_fences(set()) == ["orders"]


async def test_a_fence_past_what_a_crash_kept_moves_back_to_the_end(tmp_path: Path) -> None:
    """Sync flush: the deletion fences at the end of what was written, and a kill -9 loses the
    records no group commit covered yet. Records appended after the restart start below that
    fence; they belong to the topic created again and must stay alive."""
    store = await MessageStore.open(small_config(tmp_path / "s"))
    await _orders(store, 4)  # acknowledged: durable
    for i in range(50):
        store.append_nowait(Message("orders", b"x" * 1000, i % 2))  # written, not yet synced
    fence = _delete(store, "orders")
    store.abandon()  # the unsynced tail is lost
    again = await MessageStore.open(small_config(tmp_path / "s"), {"orders": fence})
    clamped = again.fences.as_dict()["orders"]
    assert clamped.phys == again.write_offset < fence.phys and clamped.ends == fence.ends
    await again.append(Message("orders", b"new", 0))
    again.abandon()
    # Restarted with the fence its owner persisted after the first restart: still alive.
    third = await MessageStore.open(small_config(tmp_path / "s"), {"orders": clamped})
    try:
        assert await _bodies(third, "orders") == [b"new"]
    finally:
        await third.close()
