"""The master's ReplicaTracker as the store's replication gate, on a real store in-process."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import OpenStore
from txbroker.errors import ReplicationTimeout
from txbroker.server.replication.master import ReplicaTracker
from txbroker.store import Message


async def test_writes_wait_for_min_insync_slaves(open_store: OpenStore) -> None:
    store = await open_store()
    tracker = store.replication_gate = ReplicaTracker(store, min_insync=2, timeout_s=30)
    store.append_nowait(Message("t", b"a"))
    first = store.durable_together()
    store.append_nowait(Message("t", b"b"))
    assert store.durable_together() is first  # one future for the writes of a round
    end = store.write_offset
    await asyncio.wait_for(store.committer.drain(), 10)  # the gate started the master's flush
    assert store.flushed_offset == end
    tracker.report("s1", end)
    await asyncio.sleep(0)
    assert first is not None and not first.done()  # one slave of the two
    tracker.report("s2", end - 1)
    await asyncio.sleep(0)
    assert not first.done()  # the second has not flushed the last byte
    store.append_nowait(Message("t", b"c"))  # after a report: the next round's future
    second = store.durable_together()
    assert second is not first
    tracker.report("s2", end)
    await asyncio.wait_for(first, 1)
    assert second is not None and not second.done()
    # A caller's own wait (durable()) may be cancelled without touching the shared one.
    own = store.durable()
    assert own is not None
    own.cancel()
    await asyncio.sleep(0)
    assert not second.cancelled()
    tracker.report("s1", store.write_offset)
    tracker.report("s2", store.write_offset)
    await asyncio.wait_for(second, 1)
    assert [r["replica"] for r in tracker.status()] == ["s1", "s2"]


async def test_a_write_no_slave_acknowledges_fails_after_the_timeout(
    open_store: OpenStore,
) -> None:
    store = await open_store()
    store.replication_gate = ReplicaTracker(store, min_insync=1, timeout_s=0.2)
    with pytest.raises(ReplicationTimeout, match="0 of the 1 slaves"):
        await asyncio.wait_for(store.append(Message("t", b"lonely")), 5)
    # The record is in the master's log all the same (the answer says it may be delivered).
    assert store.write_offset > 0


async def test_a_topic_change_waits_for_min_insync_slaves_to_hold_its_version(
    open_store: OpenStore,
) -> None:
    store = await open_store()
    tracker = ReplicaTracker(store, min_insync=2, timeout_s=30)
    tracker.report("s1", 0, 3)
    tracker.report("s2", 0, 2)
    assert tracker.topics_covering(2).done()  # both hold it already
    third = tracker.topics_covering(3)
    tracker.report("s3", 0, -1)  # a slave that does not say counts for no version
    await asyncio.sleep(0)
    assert not third.done()
    tracker.report("s2", 0, 3)
    await asyncio.wait_for(third, 1)
    lost = tracker.topics_covering(4)
    tracker.fail_waiting(ReplicationTimeout("stepped down"))
    with pytest.raises(ReplicationTimeout, match="stepped down"):
        await lost


async def test_a_topic_change_no_slave_holds_fails_after_the_timeout(
    open_store: OpenStore,
) -> None:
    store = await open_store()
    tracker = ReplicaTracker(store, min_insync=1, timeout_s=0.2)
    tracker.report("s1", 0, 0)
    with pytest.raises(ReplicationTimeout, match=r"0 of the 1 slaves .* topics \(version 1\)"):
        await asyncio.wait_for(tracker.topics_covering(1), 5)


async def test_no_report_acknowledges_a_write_once_the_term_may_have_ended(
    open_store: OpenStore,
) -> None:
    # A successor is chosen by reports written after the old master's lease ended: an
    # acknowledgement after that moment could be missing from every one of them.
    store = await open_store()
    valid = [True]
    tracker = store.replication_gate = ReplicaTracker(
        store, min_insync=1, timeout_s=30, term_valid=lambda: valid[0]
    )
    store.append_nowait(Message("t", b"late"))
    waiting = store.durable_together()
    assert waiting is not None
    await asyncio.wait_for(store.committer.drain(), 10)
    valid[0] = False
    tracker.report("s1", store.write_offset)
    await asyncio.sleep(0.05)
    assert not waiting.done()
    assert tracker.replicas == {"s1": store.write_offset}  # the report itself is kept
    tracker.fail_waiting(ReplicationTimeout("stepped down"))  # what the step-down does
    with pytest.raises(ReplicationTimeout):
        await waiting
