"""Leases kept alive and registrations against a real etcd: kept past their TTL, lost (and
reported) before they can have expired on etcd when etcd stops answering, registered again
when it answers again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.cluster.conftest import EtcdServer
from tests.conftest import IN_CI
from txbroker.cluster.coordination import EventKind
from txbroker.cluster.lease import LeaseKeeper, LeaseState
from txbroker.cluster.registration import Registration, RegistrationState

if not IN_CI:
    pytest.importorskip("aetcd")

from txbroker.cluster.etcd import EtcdCoordinator, connect_etcd

EVENT_TIMEOUT_S = 15.0


@pytest.fixture
async def coordinator(etcd: EtcdServer) -> AsyncIterator[EtcdCoordinator]:
    async with await connect_etcd(etcd.url, request_timeout_s=1.0) as c:
        yield c


async def test_a_kept_lease_outlives_its_ttl_and_stop_revokes_it(
    coordinator: EtcdCoordinator,
) -> None:
    keeper = await LeaseKeeper.grant(coordinator, 2)
    rev = await coordinator.put("/txb/k/a", b"", lease=keeper.lease)
    async with coordinator.watch_prefix("/txb/k/", start_revision=rev + 1) as watch:
        # Three TTLs without an event: the key was never deleted (a bounded wait for nothing).
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(3 * keeper.lease.ttl_s):
                await anext(watch)
        assert keeper.state is LeaseState.KEEPING and keeper.is_valid()
        assert keeper.last_renewed_s > keeper.lease.granted_at_s + 2 * keeper.lease.ttl_s
        await keeper.stop()
        async with asyncio.timeout(EVENT_TIMEOUT_S):
            event = await anext(watch)
    assert (event.kind, event.key) == (EventKind.DELETE, "/txb/k/a")
    assert keeper.state is LeaseState.ENDED and not keeper.is_valid()


async def test_the_keeper_gives_up_before_the_lease_can_have_expired(
    etcd: EtcdServer, coordinator: EtcdCoordinator
) -> None:
    lost_at: list[float] = []
    lost = asyncio.Event()

    def on_lost(reason: str) -> None:
        lost_at.append(time.monotonic())
        lost.set()

    keeper = await LeaseKeeper.grant(coordinator, 2, on_lost=on_lost)
    rev = await coordinator.put("/txb/p/a", b"", lease=keeper.lease)
    await asyncio.wait_for(keeper.renewed.wait(), EVENT_TIMEOUT_S)  # one keep-alive answered
    etcd.pause()
    try:
        await asyncio.wait_for(lost.wait(), EVENT_TIMEOUT_S)
        renewed_s = keeper.last_renewed_s
        # etcd cannot have ended the lease before renewed_s + TTL: the keeper gave up earlier,
        # by its safety margin.
        assert lost_at[0] < renewed_s + keeper.lease.ttl_s
        assert lost_at[0] >= renewed_s + keeper.lease.ttl_s - keeper.safety_margin_s - 0.1
        assert keeper.state is LeaseState.LOST and not keeper.is_valid()
        assert "no keep-alive answered" in keeper.lost_reason
    finally:
        etcd.resume()
    # And etcd does end it: the key goes once etcd runs again.
    async with asyncio.timeout(EVENT_TIMEOUT_S):
        async with coordinator.watch_prefix("/txb/p/", start_revision=rev + 1) as watch:
            event = await anext(watch)
    assert event.kind is EventKind.DELETE
    await keeper.stop()  # after a loss: revoking a lease etcd already ended is no error


async def test_a_revoked_lease_is_lost_at_its_next_keepalive(
    coordinator: EtcdCoordinator,
) -> None:
    keeper = await LeaseKeeper.grant(coordinator, 3)
    await coordinator.revoke_lease(keeper.lease)  # someone else ended it
    await asyncio.wait_for(keeper.lost.wait(), EVENT_TIMEOUT_S)
    assert "expired or was revoked" in keeper.lost_reason


async def test_a_registration_comes_back_after_etcd_was_unreachable(
    etcd: EtcdServer, coordinator: EtcdCoordinator
) -> None:
    registration = Registration(coordinator, "/txb/brokers/g1/b1", b"v1", ttl_s=2)
    await registration.start()
    first = await coordinator.get("/txb/brokers/g1/b1")
    assert first is not None and first.value == b"v1"
    await registration.update(b"v2")
    updated = await coordinator.get("/txb/brokers/g1/b1")
    assert updated is not None and (updated.value, updated.lease_id) == (b"v2", first.lease_id)

    keeper = registration._keeper
    assert keeper is not None
    etcd.pause()
    try:
        await asyncio.wait_for(keeper.lost.wait(), EVENT_TIMEOUT_S)
        assert registration.state is RegistrationState.REREGISTERING
    finally:
        etcd.resume()
    async with asyncio.timeout(EVENT_TIMEOUT_S):
        async with coordinator.watch_prefix(
            "/txb/brokers/", start_revision=updated.mod_revision + 1
        ) as watch:
            async for event in watch:
                if event.kind is EventKind.PUT:
                    break
    again = await coordinator.get("/txb/brokers/g1/b1")
    assert again is not None and again.value == b"v2" and again.lease_id != first.lease_id
    # The watch may see the put before the registration has its answer: its task ends then.
    registering = registration._again
    assert registering is not None
    await asyncio.wait_for(asyncio.shield(registering), EVENT_TIMEOUT_S)
    assert registration.registrations == 2
    assert registration.state is RegistrationState.REGISTERED

    await registration.stop()
    assert await coordinator.get("/txb/brokers/g1/b1") is None  # revoked: gone at once
