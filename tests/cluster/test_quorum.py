"""Who may campaign (``Membership.eligible``) against a real etcd: with sync replication, only
a candidate holding fresh reports from all but min-insync of the group's members, and the best
of them; ``txbroker cluster forget`` drops a member that will not come back."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack

import pytest

from tests.cluster.conftest import EtcdServer
from tests.conftest import IN_CI
from txbroker.errors import InvalidArgument
from txbroker.server.membership import Membership, MembershipSettings

if not IN_CI:
    pytest.importorskip("aetcd")

from txbroker.cluster.etcd import connect_etcd
from txbroker.cluster.routes import forget_member

Start = Callable[..., Awaitable[Membership]]


@pytest.fixture
async def member(etcd: EtcdServer) -> AsyncIterator[Start]:
    """Start a member of group g1 (registered, its member key written); each is stopped at
    teardown. Its registration is rewritten only when the test publishes it."""
    async with AsyncExitStack() as stack:

        async def start(broker_id: str, offsets: dict[str, int], acked_on: int = 1) -> Membership:
            settings = MembershipSettings(
                etcd.url, "g1", broker_id, "slave", "txb://127.0.0.1:1", "http://x:1", acked_on
            )
            m = Membership(
                settings,
                flushed_offset=lambda: offsets[broker_id],
                update_interval_s=3600,  # no rewrite unless the test asks
            )
            await m.start()
            stack.push_async_callback(m.stop)
            return m

        yield start


async def _revision(etcd: EtcdServer) -> int:
    async with await connect_etcd(etcd.url) as c:
        return (await c.list_prefix("/txb/")).revision


async def test_a_candidate_waits_for_fresh_reports_from_all_but_min_insync_members(
    etcd: EtcdServer, member: Start, caplog: pytest.LogCaptureFixture
) -> None:
    offsets = {"a": 30, "b": 20, "c": 10}
    started = {n: await member(n, offsets) for n in "abc"}
    a, b, c = (started[n] for n in "abc")
    await a.stop()  # the old master, gone: its registration with it, its membership not
    vacant_since = await _revision(etcd)  # every registration so far is stale
    caplog.set_level(logging.INFO, "txbroker.server.membership")
    # b fresh alone (eligible publishes the candidate's own report first): one of three
    # members, and a write's one slave copy may be on c.
    assert not await b.eligible(vacant_since)
    assert "waiting for fresh reports from 2 of the 3 members" in caplog.text
    assert "have b; missing a, c" in caplog.text
    # c, now fresh too, holds less than b: it never campaigns over b.
    assert not await c.eligible(vacant_since)
    assert "b holds more (epoch 0, offset 20 against 0, 10)" in caplog.text
    assert await b.eligible(vacant_since)  # b and c: two of three, b the best


async def test_min_insync_two_of_three_needs_only_the_candidate_and_async_no_quorum(
    etcd: EtcdServer, member: Start
) -> None:
    offsets = {"a": 30, "b": 20, "c": 10, "x": 0, "y": 0}
    both = await member("b", offsets, 2)
    await member("c", offsets, 2)
    third = await member("a", offsets, 2)
    await third.stop()
    vacant_since = await _revision(etcd)
    # Every acknowledged write is on both slaves: b's own fresh report is enough.
    assert await both.eligible(vacant_since)
    offsets.update(x=50)
    alone = await member("x", offsets, 0)
    assert await alone.eligible(vacant_since)  # async: the best registered, no quorum


async def test_a_forgotten_member_no_longer_counts(etcd: EtcdServer, member: Start) -> None:
    offsets = {"b": 20, "c": 10, "d": 0}
    b = await member("b", offsets)
    await member("c", offsets)
    d = await member("d", offsets)
    async with await connect_etcd(etcd.url) as coordinator:
        with pytest.raises(InvalidArgument, match=r"registered \(running\): stop it first"):
            await forget_member(coordinator, "g1", "d")
        await d.stop()
        vacant_since = (await coordinator.list_prefix("/txb/")).revision
        assert not await b.eligible(vacant_since)  # 1 fresh (b) of 3, 2 needed
        await forget_member(coordinator, "g1", "d")
        with pytest.raises(InvalidArgument, match="not a member"):
            await forget_member(coordinator, "g1", "d")
    # Two members: whichever was master, the write's one slave copy is on the other, so the
    # candidate's own fresh report is the quorum.
    assert await b.eligible(vacant_since)
