"""The NameServer's view of the cluster: everything under ``/txb/`` in memory, fed by list-then-
watch, so a route is answered from memory and never waits for etcd.

The loop lists ``/txb/``, then watches from the listing's revision + 1, so every later write
arrives once, in order; when the watch breaks it lists and watches again, after a pause, while
the last view keeps being served. A route rarely changes and a stale master is corrected by the
client's own refresh, so a NameServer cut off from etcd answering from its last view is more
useful than one refusing to answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Final

from txbroker.cluster.coordination import Coordinator, EventKind
from txbroker.cluster.routes import (
    BROKERS_PREFIX,
    ROOT,
    TOPICS_PREFIX,
    BrokerInfo,
    TopicRoute,
    choose_masters,
    election_group,
)
from txbroker.errors import CoordinationError, NoRoute
from txbroker.protocol.messages import GroupRoute, RouteResponse

__all__ = ["RETRY_INTERVAL_S", "RouteCache"]

log = logging.getLogger(__name__)

# Between a broken watch and the next listing: soon enough that a restarted etcd is followed
# within a second, not so often that many NameServers hammer an etcd that is recovering.
RETRY_INTERVAL_S: Final = 0.5


class RouteCache:
    """Routes and brokers as etcd holds them, kept current by :meth:`run` (a task).

    ::

        cache = RouteCache(coordinator)
        task = asyncio.create_task(cache.run())
        await cache.ready.wait()  # the first listing is in
        cache.route("orders")
    """

    def __init__(self, coordinator: Coordinator, *, retry_interval_s: float = RETRY_INTERVAL_S):
        self.coordinator = coordinator
        self.retry_interval_s = retry_interval_s
        self.routes: dict[str, TopicRoute] = {}
        self.brokers: dict[str, BrokerInfo] = {}  # by key
        # Group -> its election key's create revision, the current term's epoch: a former
        # master's lingering registration names no master (routes.is_former_master).
        self.elections: dict[str, int] = {}
        self.revision = 0  # of the last listing or event applied
        self.ready = asyncio.Event()  # set once the first listing is in
        self.changed = asyncio.Event()  # set on every change applied (tests wait on it)
        self.listings = 0  # how many times /txb/ was listed (1 + the watches broken)

    async def run(self) -> None:
        """List, watch, and again whenever the watch breaks; until cancelled."""
        while True:
            try:
                await self._list_and_watch()
            except CoordinationError as e:  # CoordinatorUnavailable is one
                log.warning(
                    "watching %s broke (%s); serving the view of revision %d, listing again",
                    ROOT,
                    e,
                    self.revision,
                )
            await asyncio.sleep(self.retry_interval_s)  # a back-off, not a synchronisation

    async def _list_and_watch(self) -> None:
        listing = await self.coordinator.list_prefix(ROOT)
        self.routes.clear()
        self.brokers.clear()
        self.elections.clear()
        for kv in listing.items:
            self._put(kv.key, kv.value, kv.create_revision)
        self.revision = listing.revision
        self.listings += 1
        self.ready.set()
        self.changed.set()
        log.info(
            "view of %s at revision %d: %d routes, %d brokers",
            ROOT,
            listing.revision,
            len(self.routes),
            len(self.brokers),
        )
        async with self.coordinator.watch_prefix(
            ROOT, start_revision=listing.revision + 1
        ) as events:
            async for event in events:
                if event.kind is EventKind.DELETE:
                    self.routes.pop(event.key.removeprefix(TOPICS_PREFIX), None)
                    self.brokers.pop(event.key, None)
                    if (group := election_group(event.key)) is not None:
                        self.elections.pop(group, None)
                else:
                    self._put(event.key, event.value, event.create_revision)
                self.revision = event.mod_revision
                self.changed.set()

    def _put(self, key: str, value: bytes, create_revision: int) -> None:
        if (group := election_group(key)) is not None:
            self.elections[group] = create_revision
            return
        try:
            if key.startswith(TOPICS_PREFIX):
                route = TopicRoute.from_json(value)
                name = key.removeprefix(TOPICS_PREFIX)
                if route.topic != name:  # a deletion of the key must find it by the key
                    raise CoordinationError(f"the route of {route.topic!r} under {key}")
                self.routes[name] = route
            elif key.startswith(BROKERS_PREFIX):
                self.brokers[key] = BrokerInfo.from_json(value)
        except CoordinationError as e:  # someone wrote by hand; the rest of the view stands
            log.warning("ignoring %s: %s", key, e)

    def route(self, topic: str) -> RouteResponse:
        """``topic``'s route with each group's master; with ``topic`` empty, every group with a
        registered broker (no queues). Raises :class:`NoRoute` for a topic with none."""
        masters = choose_masters(self.brokers.values(), self.elections)
        if not topic:
            groups = sorted({b.group for b in self.brokers.values()})
            return RouteResponse(
                "", 0, [_group_route(g, [], masters) for g in groups], self.revision
            )
        route = self.routes.get(topic)
        if route is None:
            raise NoRoute(
                f"no route for topic {topic!r} at revision {self.revision}: create it with "
                f"`txbroker topic create {topic} --groups G1,G2 --coordinator etcd://...`"
            )
        return RouteResponse(
            topic,
            route.queues,
            [_group_route(s.group, list(s.queues), masters) for s in route.shares],
            self.revision,
        )


def _group_route(group: str, queues: list[int], masters: Mapping[str, BrokerInfo]) -> GroupRoute:
    master = masters.get(group)
    if master is None:
        return GroupRoute(group, queues, None)
    return GroupRoute(group, queues, master.address, master.epoch)
