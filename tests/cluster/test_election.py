"""Elections against a real etcd: one winner among candidates, a quick hand-over on
resignation, and a leader cut off from etcd stepping down before its lease can have expired,
strictly before the next leader is elected."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from tests.cluster.blackhole import Blackhole
from tests.cluster.conftest import EtcdServer
from tests.conftest import IN_CI
from txbroker.cluster.coordination import KeyValue
from txbroker.cluster.election import Election, ElectionState, watch_leader

if not IN_CI:
    pytest.importorskip("aetcd")

from txbroker.cluster.etcd import EtcdCoordinator, connect_etcd

KEY = "/txb/groups/g1/master"
TTL_S = 2  # etcd 3.4's shortest lease: the takeovers below take about this long
EVENT_TIMEOUT_S = 15.0


@dataclass
class Candidate:
    """An election plus when (time.monotonic()) it won and when it stepped down."""

    election: Election
    stepped_down_at: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, coordinator: EtcdCoordinator, name: str) -> Candidate:
        candidate = cls(Election(coordinator, KEY, name.encode(), ttl_s=TTL_S))
        candidate.election._on_step_down = lambda _reason: candidate.stepped_down_at.append(
            time.monotonic()
        )
        return candidate

    async def campaign(self) -> float:
        await self.election.campaign()
        return time.monotonic()


@pytest.fixture
async def coordinators(etcd: EtcdServer) -> AsyncIterator[list[EtcdCoordinator]]:
    """Two sessions, as two brokers would have (each its own gRPC channel)."""
    async with (
        await connect_etcd(etcd.url, request_timeout_s=1.0) as a,
        await connect_etcd(etcd.url, request_timeout_s=1.0) as b,
    ):
        yield [a, b]


async def test_one_of_two_candidates_wins_and_resigning_hands_over_at_once(
    coordinators: list[EtcdCoordinator],
) -> None:
    a, b = Candidate.of(coordinators[0], "a"), Candidate.of(coordinators[1], "b")
    tasks = {asyncio.create_task(c.campaign()): c for c in (a, b)}
    done, pending = await asyncio.wait(
        tasks, timeout=EVENT_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
    )
    assert len(done) == 1 and len(pending) == 1
    winner, loser = tasks[done.pop()], tasks[next(iter(pending))]
    assert winner.election.is_leader() and winner.election.state is ElectionState.LEADER
    assert loser.election.state is ElectionState.CAMPAIGNING and not loser.election.is_leader()
    held = await coordinators[0].get(KEY)
    assert held is not None and held.value == winner.election.value
    assert winner.election.term is not None
    assert held.create_revision == winner.election.term.epoch

    resigned_at = time.monotonic()
    await winner.election.resign()
    assert winner.election.state is ElectionState.RESIGNED and not winner.stepped_down_at
    won_at = await asyncio.wait_for(next(iter(pending)), EVENT_TIMEOUT_S)
    # The lease was revoked, so the other did not wait out the TTL.
    assert won_at - resigned_at < TTL_S
    assert loser.election.term is not None and winner.election.term is not None
    assert loser.election.term.epoch > winner.election.term.epoch
    await loser.election.resign()
    assert await coordinators[0].get(KEY) is None


async def test_a_leader_cut_off_from_etcd_steps_down_before_the_next_is_elected(
    etcd: EtcdServer, coordinators: list[EtcdCoordinator]
) -> None:
    """A partition at the election's level: the leader's connection to etcd
    goes silent (no RST: a black hole); it must stop leading before etcd can have expired its
    lease, which is before anyone else can win."""
    async with (
        Blackhole(etcd.client_port) as hole,
        await connect_etcd(f"etcd://127.0.0.1:{hole.port}", request_timeout_s=1.0) as cut_off,
    ):
        a, b = Candidate.of(cut_off, "a"), Candidate.of(coordinators[1], "b")
        await asyncio.wait_for(a.campaign(), EVENT_TIMEOUT_S)
        keeper = a.election.keeper
        assert keeper is not None
        b_won = asyncio.create_task(b.campaign())

        hole.cut()
        await asyncio.wait_for(a.election.stepped_down.wait(), EVENT_TIMEOUT_S)
        b_won_at = await asyncio.wait_for(b_won, EVENT_TIMEOUT_S)

        stepped_down_at = a.stepped_down_at[0]
        lease_safe_until = keeper.last_renewed_s + keeper.lease.ttl_s
        assert stepped_down_at < lease_safe_until  # before etcd can have ended the lease
        assert stepped_down_at < b_won_at  # so never two leaders
        assert a.election.state is ElectionState.STEPPED_DOWN
        assert not a.election.is_leader() and b.election.is_leader()
        assert "lease lost" in a.election.step_down_reason
        # The takeover took the TTL and little more (etcd's expiry runs every 0.5 s).
        assert b_won_at - stepped_down_at < TTL_S + 2.0
        await b.election.resign()
        await a.election.resign()  # stepped down already: nothing to do, no hang


async def test_a_leader_steps_down_when_etcd_stops_and_a_new_one_wins_after(
    etcd: EtcdServer, coordinators: list[EtcdCoordinator]
) -> None:
    a, b = Candidate.of(coordinators[0], "a"), Candidate.of(coordinators[1], "b")
    await asyncio.wait_for(a.campaign(), EVENT_TIMEOUT_S)
    keeper = a.election.keeper
    assert keeper is not None
    await asyncio.wait_for(keeper.renewed.wait(), EVENT_TIMEOUT_S)
    b_won = asyncio.create_task(b.campaign())
    etcd.pause()
    try:
        await asyncio.wait_for(a.election.stepped_down.wait(), EVENT_TIMEOUT_S)
        assert a.stepped_down_at[0] < keeper.last_renewed_s + keeper.lease.ttl_s
        assert not b_won.done()  # nobody can win while etcd is stopped
    finally:
        etcd.resume()
    b_won_at = await asyncio.wait_for(b_won, EVENT_TIMEOUT_S)
    assert a.stepped_down_at[0] < b_won_at
    held = await coordinators[0].get(KEY)
    assert held is not None and held.value == b"b"
    await b.election.resign()


async def test_the_leader_steps_down_when_its_key_is_deleted(
    coordinators: list[EtcdCoordinator],
) -> None:
    a = Candidate.of(coordinators[0], "a")
    await asyncio.wait_for(a.campaign(), EVENT_TIMEOUT_S)
    await coordinators[1].delete(KEY)  # an operator's etcdctl del
    await asyncio.wait_for(a.election.stepped_down.wait(), EVENT_TIMEOUT_S)
    assert "deleted" in a.election.step_down_reason
    # It may campaign again, with a new lease and a higher epoch.
    first = a.election.term
    await asyncio.wait_for(a.campaign(), EVENT_TIMEOUT_S)
    assert first is not None and a.election.term is not None
    assert a.election.term.epoch > first.epoch and a.election.term.lease_id != first.lease_id
    await a.election.resign()


async def test_watch_leader_follows_every_change(coordinators: list[EtcdCoordinator]) -> None:
    seen: asyncio.Queue[KeyValue | None] = asyncio.Queue()

    async def follow() -> None:
        async for leader in watch_leader(coordinators[1], KEY):
            await seen.put(leader)

    follower = asyncio.create_task(follow())
    try:
        assert await asyncio.wait_for(seen.get(), EVENT_TIMEOUT_S) is None  # nobody yet
        a, b = Candidate.of(coordinators[0], "a"), Candidate.of(coordinators[0], "b")
        await asyncio.wait_for(a.campaign(), EVENT_TIMEOUT_S)
        leader = await asyncio.wait_for(seen.get(), EVENT_TIMEOUT_S)
        assert leader is not None and leader.value == b"a"
        assert a.election.keeper is not None and leader.lease_id == a.election.keeper.lease.id
        await a.election.resign()
        assert await asyncio.wait_for(seen.get(), EVENT_TIMEOUT_S) is None
        await asyncio.wait_for(b.campaign(), EVENT_TIMEOUT_S)
        leader = await asyncio.wait_for(seen.get(), EVENT_TIMEOUT_S)
        assert leader is not None and leader.value == b"b"
        await b.election.resign()
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)


async def test_many_candidates_take_turns_one_leader_at_a_time(
    coordinators: list[EtcdCoordinator],
) -> None:
    """Four candidates on two sessions campaign, lead briefly and resign, twelve terms in all:
    whenever one is elected no other believes it leads, and epochs only grow."""
    candidates = [Candidate.of(coordinators[i % 2], f"c{i}") for i in range(4)]
    terms: list[tuple[int, bytes]] = []
    done = asyncio.Event()

    async def take_turns(c: Candidate) -> None:
        while not done.is_set():
            await c.election.campaign()
            others = [o.election.value for o in candidates if o is not c and o.election.is_leader()]
            assert not others, f"{c.election.value!r} elected while {others} lead"
            assert c.election.term is not None
            terms.append((c.election.term.epoch, c.election.value))
            if len(terms) >= 12:
                done.set()
            await c.election.resign()

    tasks = [asyncio.create_task(take_turns(c)) for c in candidates]
    try:
        await asyncio.wait_for(done.wait(), EVENT_TIMEOUT_S)
    finally:
        for t in tasks:
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not [e for e in errors if not isinstance(e, asyncio.CancelledError)]
    epochs = [epoch for epoch, _ in terms]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)
    assert len({value for _, value in terms}) > 1  # turns were shared
    # A resign() cut short by the cancellation still revoked its lease: the key is gone now,
    # not a TTL later.
    assert await coordinators[0].get(KEY) is None
