"""The NameServer's cache against a real etcd: it follows writes by watch, and lists again
when the watch breaks (etcd killed and started again), answering from its last view meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.cluster.conftest import EtcdServer
from tests.conftest import IN_CI
from txbroker.cluster.routes import (
    BrokerInfo,
    Role,
    broker_key,
    master_key,
    spread_queues,
    topic_key,
)
from txbroker.errors import NoRoute

if not IN_CI:
    pytest.importorskip("aetcd")

from txbroker.cluster import connect_coordinator
from txbroker.nameserver.cache import RouteCache

EVENT_TIMEOUT_S = 15.0


async def _until(cache: RouteCache, done: Callable[[], bool]) -> None:
    """Wait (bounded) on the cache's change event until ``done()`` holds."""
    async with asyncio.timeout(EVENT_TIMEOUT_S):
        while not done():
            cache.changed.clear()
            if done():
                return
            await cache.changed.wait()


async def test_the_cache_follows_writes_and_lists_again_after_etcd_comes_back(
    etcd: EtcdServer,
) -> None:
    async with await connect_coordinator(etcd.url) as coordinator:
        cache = RouteCache(coordinator, retry_interval_s=0.1)
        feeding = asyncio.create_task(cache.run())
        try:
            async with asyncio.timeout(EVENT_TIMEOUT_S):
                await cache.ready.wait()
            with pytest.raises(NoRoute, match="no route for topic 'orders'"):
                cache.route("orders")

            await coordinator.put(topic_key("orders"), spread_queues("orders", 4, ["g1"]).to_json())
            info = BrokerInfo("g1", "b1", Role.MASTER, "txb://127.0.0.1:1", "http://x")
            await coordinator.put(broker_key("g1", "b1"), info.to_json())
            await coordinator.put(topic_key("bad"), b"not json")  # ignored, the rest stands
            await _until(
                cache,
                lambda: (
                    bool(cache.route("orders").groups[0].master)
                    if "orders" in cache.routes
                    else False
                ),
            )
            answer = cache.route("orders")
            assert answer.queues == 4 and answer.groups[0].master == "txb://127.0.0.1:1"
            listings = cache.listings

            etcd.kill()
            etcd.start()  # same data, same ports: the watch broke, the session reconnects
            assert cache.route("orders").queues == 4  # the last view, meanwhile

            await coordinator.put(topic_key("orders"), spread_queues("orders", 8, ["g1"]).to_json())
            await coordinator.delete(broker_key("g1", "b1"))
            await _until(cache, lambda: cache.route("orders").queues == 8 and not cache.brokers)
            assert cache.listings > listings  # listed again, not only watched
            assert cache.route("orders").groups[0].master is None
        finally:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)


async def test_a_former_masters_lingering_registration_names_no_master(etcd: EtcdServer) -> None:
    """The cache follows each group's election key: a master whose term is over (its key gone,
    or another's term begun) is none, as in `cluster status`; a group with no election (brokers
    given --role master) keeps its registered master."""

    def a_master(broker_id: str, epoch: int) -> BrokerInfo:
        return BrokerInfo("g1", broker_id, Role.MASTER, f"txb://{broker_id}:1", "", epoch=epoch)

    async with await connect_coordinator(etcd.url) as coordinator:
        cache = RouteCache(coordinator, retry_interval_s=0.1)
        feeding = asyncio.create_task(cache.run())
        try:
            await coordinator.put(topic_key("t"), spread_queues("t", 2, ["g1", "g2"]).to_json())
            static = BrokerInfo("g2", "s1", Role.MASTER, "txb://s1:1", "")
            await coordinator.put(broker_key("g2", "s1"), static.to_json())
            await coordinator.put(master_key("g1"), a_master("b1", 0).to_json())
            term = await coordinator.get(master_key("g1"))
            assert term is not None
            first = term.create_revision
            await coordinator.put(broker_key("g1", "b1"), a_master("b1", first).to_json())

            def masters() -> dict[str, str | None]:
                return {g.group: g.master for g in cache.route("t").groups}

            await _until(cache, lambda: "t" in cache.routes and masters()["g1"] == "txb://b1:1")
            assert masters()["g2"] == "txb://s1:1"

            await coordinator.delete(master_key("g1"))  # b1's term ends; its key lingers
            await _until(cache, lambda: masters()["g1"] is None)
            await coordinator.put(master_key("g1"), a_master("b2", 0).to_json())
            await _until(cache, lambda: cache.elections.get("g1", first) != first)
            assert masters()["g1"] is None  # b2 elected, not registered as master yet
            second = cache.elections["g1"]
            await coordinator.put(broker_key("g1", "b2"), a_master("b2", second).to_json())
            await _until(cache, lambda: masters()["g1"] == "txb://b2:1")
            assert masters()["g2"] == "txb://s1:1"
        finally:
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
