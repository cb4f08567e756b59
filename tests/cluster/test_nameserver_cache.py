"""The NameServer's cache against a real etcd: it follows writes by watch, and lists again
when the watch breaks (etcd killed and started again), answering from its last view meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.cluster.conftest import EtcdServer
from tests.conftest import IN_CI
from txbroker.cluster.routes import BrokerInfo, Role, broker_key, spread_queues, topic_key
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
