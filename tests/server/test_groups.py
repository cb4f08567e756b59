"""Consumer-group logic on its own: average allocation, generations, expiry, offsets."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txbroker.errors import StaleGeneration
from txbroker.server.groups import ConsumeMode, GroupCoordinator, allocate_average
from txbroker.server.longpoll import Notifier


@given(
    queues=st.integers(1, 64),
    members=st.sets(st.text(min_size=1, max_size=5), min_size=1, max_size=20),
)
def test_average_allocation_covers_every_queue_once(queues: int, members: set[str]) -> None:
    ms = list(members)
    owned = [q for m in ms for q in allocate_average(queues, ms, m)]
    assert sorted(owned) == list(range(queues))
    sizes = [len(allocate_average(queues, ms, m)) for m in ms]
    assert max(sizes) - min(sizes) <= 1


def test_join_leave_and_expiry_bump_generation(tmp_path: Path) -> None:
    gc = GroupCoordinator(tmp_path, session_timeout_ms=1000)
    g1, q_a = gc.heartbeat("g", "t", "a", 4, ConsumeMode.CLUSTERING, now=0)
    assert q_a == [0, 1, 2, 3]
    g2, q_b = gc.heartbeat("g", "t", "b", 4, ConsumeMode.CLUSTERING, now=0.1)
    assert g2 > g1 and q_b == [2, 3]
    with pytest.raises(StaleGeneration):
        gc.check("g", "t", "a", g1)  # a still thinks it owns all four
    assert gc.check("g", "t", "a", g2) == [0, 1]
    # b stops heartbeating; a's next heartbeat after the session timeout takes everything back.
    g3, q_a = gc.heartbeat("g", "t", "a", 4, ConsumeMode.CLUSTERING, now=1.5)
    assert g3 > g2 and q_a == [0, 1, 2, 3]
    gc.leave("g", "t", "a")
    with pytest.raises(StaleGeneration):
        gc.check("g", "t", "a", g3)


def test_broadcast_gives_everyone_everything(tmp_path: Path) -> None:
    gc = GroupCoordinator(tmp_path)
    gc.heartbeat("g", "t", "a", 3, ConsumeMode.BROADCAST)
    _, qs = gc.heartbeat("g", "t", "b", 3, ConsumeMode.BROADCAST)
    assert qs == [0, 1, 2]
    assert gc.offset_owner("g", "t", "a") != gc.offset_owner("g", "t", "b")


def test_offsets_persist(tmp_path: Path) -> None:
    gc = GroupCoordinator(tmp_path)
    gc.commit("g", "t", 2, 17)
    gc.snapshot.save()
    again = GroupCoordinator(tmp_path)
    again.load()
    assert again.committed("g", "t", 2) == 17 and again.committed("g", "t", 0) is None


async def test_notifier_wakes_waiters_and_times_out() -> None:
    import asyncio

    n = Notifier()
    waiter = asyncio.create_task(n.wait([("t", 1), ("t", 2)], 5))
    await asyncio.sleep(0)  # let it register
    assert n.waiting == 2
    n.notify("t", 2)
    assert await asyncio.wait_for(waiter, 1) is True
    assert n.waiting == 0
    assert await n.wait([("t", 3)], 0.01) is False


def test_a_slave_takes_its_masters_offsets_within_its_own_queues(tmp_path: Path) -> None:
    """Copied offsets (replication) are the master's, backwards too (one the slave kept from a
    term of its own as master may lie past records its log no longer holds the same way),
    never past the slave's queue end (entries it has not copied yet may never be the group's,
    and a failover writes others there), only for topics it has."""
    gc = GroupCoordinator(tmp_path)
    gc.commit("billing", "orders", 1, 7)  # from its own term as master
    ends = {("orders", 0): 10, ("orders", 1): 10}
    gc.adopt_offsets(
        {"billing": {"orders": {0: 12, 1: 5}, "gone": {0: 3}}},
        exists=lambda t: t == "orders",
        queue_end=lambda t, q: ends[(t, q)],
    )
    assert gc.committed("billing", "orders", 0) == 10  # clamped to the queue's end
    assert gc.committed("billing", "orders", 1) == 5  # the master's, behind its own
    assert gc.groups() == [("billing", "orders")]
    assert gc.all_offsets() == {"billing": {"orders": {0: 10, 1: 5}}}


def test_offsets_past_a_cut_queue_end_come_back_to_it(tmp_path: Path) -> None:
    """After a tail was cut from the log (a divergent tail, a torn write), no committed offset
    lies past its queue's end: the entries a later master writes there are the group's."""
    gc = GroupCoordinator(tmp_path)
    gc.commit("billing", "orders", 0, 12)
    gc.commit("billing", "orders", 1, 4)
    gc.clamp_offsets(lambda t, q: {0: 11, 1: 9}[q])
    assert gc.all_offsets() == {"billing": {"orders": {0: 11, 1: 4}}}
