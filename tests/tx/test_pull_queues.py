"""PullQueues, the bookkeeping of back-checks by pull, rule by rule: oldest first, dropped when no
longer due, kept for another poller when this one may not see them, pollers woken by a push or a
clear; a check out once until answered."""

from __future__ import annotations

import asyncio
import time

from txbroker.tx.pull import PulledCheck, PullQueues


def test_take_is_oldest_first_per_group_and_drops_what_is_no_longer_due() -> None:
    q = PullQueues()
    for tx in ("a", "b", "c", "d"):
        q.push("orders-svc", tx)
    q.push("payments-svc", "p")
    ended = {"b"}
    assert q.take("orders-svc", 2, lambda t: t not in ended, lambda t: True) == ["a", "c"]
    assert q.queued == 2  # d, and the other group's p
    assert q.take("orders-svc", 10, lambda t: True, lambda t: True) == ["d"]
    assert q.take("orders-svc", 10, lambda t: True, lambda t: True) == []
    assert q.take("payments-svc", 10, lambda t: True, lambda t: True) == ["p"]


def test_checks_a_poller_may_not_see_stay_queued_in_order() -> None:
    q = PullQueues()
    for tx in ("a", "x", "b", "y"):
        q.push("g", tx)
    assert q.take("g", 10, lambda t: True, lambda t: t in "ab") == ["a", "b"]
    assert q.take("g", 10, lambda t: True, lambda t: True) == ["x", "y"]


def test_a_check_is_out_until_answered_once() -> None:
    q = PullQueues()
    check = PulledCheck(due_ms=1_000, taken_s=time.monotonic())
    q.taken("t", check)
    assert q.out("t") == check and q.out_count == 1
    assert q.answered("t") == check
    assert q.answered("t") is None and q.out("t") is None


async def test_a_push_wakes_the_groups_pollers_and_only_them() -> None:
    q = PullQueues()
    # Timeouts long enough that a machine busy with other tests cannot end either before the
    # push: woken within 4 s, it was the push and not its 5 s timeout.
    created = time.monotonic()  # before either waiter's timeout starts
    mine = asyncio.create_task(q.wait("g", 5))
    other = asyncio.create_task(q.wait("h", 2))
    await asyncio.sleep(0.01)
    q.push("g", "t")
    await asyncio.wait_for(mine, 4)
    assert not other.done()
    await other  # its own timeout, which the event loop may fire up to its clock's resolution early
    assert time.monotonic() - created >= 2 - 0.01


async def test_clear_forgets_everything_and_wakes_every_poller() -> None:
    q = PullQueues()
    q.push("g", "t")
    q.taken("u", PulledCheck(1, 0.0))
    waiting = asyncio.create_task(q.wait("h", 5))
    await asyncio.sleep(0.01)
    q.clear()
    await asyncio.wait_for(waiting, 1)
    assert q.queued == 0 and q.out_count == 0
