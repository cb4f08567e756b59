"""The coordination interface against a real etcd (tests/cluster/conftest.py): keys, prefixes,
compare-and-set, leases, watches from a revision, and the errors when etcd is not there."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.cluster.conftest import EtcdServer, free_port
from tests.conftest import IN_CI
from txbroker.cluster import connect_coordinator
from txbroker.cluster.coordination import EventKind, WatchEvent
from txbroker.errors import CoordinationError, CoordinatorUnavailable, InvalidArgument, LeaseExpired

if not IN_CI:  # by hand, skip without the client; under CI its absence is an error
    pytest.importorskip("aetcd")

from txbroker.cluster.etcd import EtcdCoordinator, connect_etcd

# Every wait below is for an event with this bound; none should come near it.
EVENT_TIMEOUT_S = 10.0


@pytest.fixture
async def coordinator(etcd: EtcdServer) -> AsyncIterator[EtcdCoordinator]:
    async with await connect_etcd(etcd.url) as c:
        yield c


async def test_put_get_list_delete(coordinator: EtcdCoordinator) -> None:
    rev_a = await coordinator.put("/txb/t/a", b"1")
    rev_b = await coordinator.put("/txb/t/b", b"2")
    await coordinator.put("/txb/u/c", b"3")  # beside the prefix, not under it
    assert rev_b > rev_a

    got = await coordinator.get("/txb/t/a")
    assert got is not None
    assert (got.value, got.mod_revision, got.create_revision) == (b"1", rev_a, rev_a)
    assert got.lease_id == 0
    assert await coordinator.get("/txb/t/none") is None

    listing = await coordinator.list_prefix("/txb/t/")
    assert [(kv.key, kv.value) for kv in listing.items] == [("/txb/t/a", b"1"), ("/txb/t/b", b"2")]
    assert listing.revision >= rev_b + 1  # the /txb/u/c write came after

    assert await coordinator.delete("/txb/t/a")
    assert not await coordinator.delete("/txb/t/a")
    assert await coordinator.delete_prefix("/txb/") == 2


async def test_create_and_put_if_revision_let_one_writer_win(
    coordinator: EtcdCoordinator,
) -> None:
    first = await coordinator.create("/txb/k", b"first")
    assert first is not None
    assert await coordinator.create("/txb/k", b"second") is None  # it exists

    # Two writers read revision `first`; the one who writes first wins, the other learns it.
    won = await coordinator.put_if_revision("/txb/k", b"writer 1", first)
    assert won is not None and won > first
    assert await coordinator.put_if_revision("/txb/k", b"writer 2", first) is None
    got = await coordinator.get("/txb/k")
    assert got is not None and got.value == b"writer 1"

    # Revision 0 means "only if absent", like create.
    assert await coordinator.put_if_revision("/txb/k", b"x", 0) is None
    assert await coordinator.put_if_revision("/txb/new", b"x", 0) is not None


async def test_list_then_watch_from_revision_misses_nothing(
    coordinator: EtcdCoordinator,
) -> None:
    """Writes race the listing and the watch's start: listing at R and watching from R + 1
    sees each later write once, in order, and none from before."""
    writes = 200
    listed_now = asyncio.Event()

    async def writer() -> None:
        for i in range(writes):
            await coordinator.put(f"/txb/w/{i % 7}", str(i).encode())
            if i == writes // 4:
                listed_now.set()  # let the listing happen in the middle of the writes
        await coordinator.put("/txb/w/done", b"")

    task = asyncio.create_task(writer())
    await asyncio.wait_for(listed_now.wait(), EVENT_TIMEOUT_S)
    listing = await coordinator.list_prefix("/txb/w/")
    seen_before = {kv.key: int(kv.value) for kv in listing.items}
    events: list[WatchEvent] = []
    async with asyncio.timeout(EVENT_TIMEOUT_S):
        async with coordinator.watch_prefix(
            "/txb/w/", start_revision=listing.revision + 1
        ) as watch:
            async for event in watch:
                if event.key == "/txb/w/done":
                    break
                events.append(event)
    await task

    values = [int(e.value) for e in events]
    assert all(e.kind is EventKind.PUT for e in events)
    assert values == sorted(values) and len(set(values)) == len(values)  # in order, once
    assert [e.mod_revision for e in events] == sorted(e.mod_revision for e in events)
    # Nothing missed: the listing plus the events account for every write.
    first_watched = values[0]
    assert max(seen_before.values()) == first_watched - 1
    assert values == list(range(first_watched, writes))


async def test_watch_sees_deletes_and_a_compacted_revision_is_an_error(
    coordinator: EtcdCoordinator,
) -> None:
    async with coordinator.watch_prefix("/txb/d/") as watch:
        rev = await coordinator.put("/txb/d/x", b"1")
        await coordinator.delete("/txb/d/x")
        async with asyncio.timeout(EVENT_TIMEOUT_S):
            put, delete = await anext(watch), await anext(watch)
    assert (put.kind, put.key, put.mod_revision) == (EventKind.PUT, "/txb/d/x", rev)
    assert (delete.kind, delete.key, delete.value) == (EventKind.DELETE, "/txb/d/x", b"")
    assert delete.mod_revision == rev + 1

    await coordinator._clients[0].compact(rev + 1)
    with pytest.raises(CoordinationError, match="compacted below"):
        async with asyncio.timeout(EVENT_TIMEOUT_S):
            async with coordinator.watch_prefix("/txb/d/", start_revision=rev) as watch:
                await anext(watch)


async def test_lease_expiry_deletes_its_keys(coordinator: EtcdCoordinator) -> None:
    lease = await coordinator.grant_lease(1)
    # etcd raises 1 s to its minimum: 1.5 election timeouts (1 s by default), rounded up.
    assert lease.ttl_s == 2
    await coordinator.put("/txb/l/a", b"", lease=lease)
    created = await coordinator.create("/txb/l/b", b"", lease=lease)
    assert created is not None
    got = await coordinator.get("/txb/l/a")
    assert got is not None and got.lease_id == lease.id
    assert await coordinator.keepalive(lease) >= 1

    async with coordinator.watch_prefix("/txb/l/") as watch:
        # No keep-alive from here: etcd deletes both keys when the TTL runs out.
        async with asyncio.timeout(lease.ttl_s + EVENT_TIMEOUT_S):
            deleted = {(await anext(watch)).key for _ in range(2)}
    assert deleted == {"/txb/l/a", "/txb/l/b"}
    assert (await coordinator.list_prefix("/txb/l/")).items == ()
    with pytest.raises(LeaseExpired):
        await coordinator.keepalive(lease)
    with pytest.raises(LeaseExpired):
        await coordinator.put("/txb/l/c", b"", lease=lease)
    await coordinator.revoke_lease(lease)  # already gone: not an error


async def test_revoke_deletes_keys_at_once(coordinator: EtcdCoordinator) -> None:
    lease = await coordinator.grant_lease(60)
    await coordinator.put("/txb/r/a", b"", lease=lease)
    # A put-if-revision keeps the key under the lease it names.
    got = await coordinator.get("/txb/r/a")
    assert got is not None
    assert await coordinator.put_if_revision("/txb/r/a", b"2", got.mod_revision, lease=lease)
    again = await coordinator.get("/txb/r/a")
    assert again is not None and again.lease_id == lease.id
    await coordinator.revoke_lease(lease)
    assert await coordinator.get("/txb/r/a") is None
    with pytest.raises(LeaseExpired, match="expired or was revoked"):
        await coordinator.keepalive(lease)


async def test_unavailable_when_etcd_is_down(tmp_path: object) -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(CoordinatorUnavailable) as raised:
        await connect_etcd(f"etcd://127.0.0.1:{port}", request_timeout_s=1.0)
    assert time.monotonic() - started < 1.0 + 2.0
    message = str(raised.value)
    assert f"127.0.0.1:{port}" in message and "connection refused" in message
    assert "Is etcd running" in message
    assert raised.value.retriable


async def test_unavailable_within_the_deadline_when_etcd_hangs(
    etcd: EtcdServer, coordinator: EtcdCoordinator
) -> None:
    await coordinator.put("/txb/h", b"")
    etcd.pause()
    try:
        for call in (
            coordinator.get("/txb/h"),
            coordinator.put("/txb/h", b"x"),
            coordinator.grant_lease(5),
        ):
            started = time.monotonic()
            with pytest.raises(CoordinatorUnavailable, match="no answer within 2 s"):
                await call
            assert time.monotonic() - started < coordinator.request_timeout_s + 1.0
    finally:
        etcd.resume()
    assert await coordinator.get("/txb/h") is not None  # the session works again


async def test_unavailable_after_etcd_dies_and_back_after_restart(
    etcd: EtcdServer, coordinator: EtcdCoordinator
) -> None:
    await coordinator.put("/txb/p", b"1")
    async with coordinator.watch_prefix("/txb/") as watch:
        etcd.kill()
        with pytest.raises(CoordinatorUnavailable, match="watch stream broke"):
            async with asyncio.timeout(EVENT_TIMEOUT_S):
                await anext(watch)
    with pytest.raises(CoordinatorUnavailable, match="get /txb/p"):
        await coordinator.get("/txb/p")
    etcd.start()
    got = await coordinator.get("/txb/p")  # the same session reconnects by itself
    assert got is not None and got.value == b"1"


async def test_a_dead_endpoint_first_in_the_url_is_passed_over(etcd: EtcdServer) -> None:
    dead = free_port()
    async with await connect_etcd(f"etcd://127.0.0.1:{dead},{etcd.url[len('etcd://') :]}") as c:
        # Writes too: a refused connection proves the request was never sent.
        assert await c.create("/txb/e", b"") is not None
        assert c.endpoint.port == etcd.client_port


async def test_connect_coordinator_opens_an_etcd_session(etcd: EtcdServer) -> None:
    async with await connect_coordinator(etcd.url) as c:
        assert isinstance(c, EtcdCoordinator)
        assert await c.create("/txb/hello", b"world") is not None
    with pytest.raises(InvalidArgument):
        await connect_coordinator("zk://127.0.0.1:2181")
