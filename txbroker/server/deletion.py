"""Deleting a topic: everything it held becomes unreachable at once, and stays so after a crash.

The store names the fence (where each queue ended); the registry is written without the topic
and with the fence in one atomic write, which *is* the deletion (the store opens with the
fences, so nothing dead comes back after a crash); the store drops the topic's queue files;
groups forget their offsets; held pulls answer; open transactions are rolled back durably (a
half message dies with its topic, so it could never commit); the offsets file is written. Up
to the rollbacks nothing yields the event loop, so no request sees a half-deleted topic.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from txbroker.errors import ReplicationTimeout, StoreFailed, TxbError
from txbroker.protocol.messages import TxEndResponse
from txbroker.server.groups import GroupCoordinator
from txbroker.server.longpoll import Notifier
from txbroker.server.topics import Topic, TopicRegistry
from txbroker.store import MessageStore, TopicFence
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.state import Decision, Resolver

__all__ = ["TopicDeletion"]

log = logging.getLogger(__name__)

# Why a deleted topic's transactions were rolled back: a later END_TX commit is refused
# naming it, rather than landing a message in a topic created again under the name.
_REASON: Final = "topic deleted"


class TopicDeletion:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicRegistry,
        groups: GroupCoordinator,
        notifier: Notifier | None,
        tx: TxCoordinator | None,
    ) -> None:
        self._store = store
        self._topics = topics
        self._groups = groups
        self._notifier = notifier
        self._tx = tx

    async def delete(self, name: str) -> Topic:
        """Delete topic ``name`` (see the module docstring); answers once it is durable."""
        self._topics.deletable(name)
        fence = self._store.fence_for(name)
        topic = self._topics.delete(name, fence)  # the point of no return
        freed = self._drop(name, topic, fence)
        rolled_back = await _roll_back_topic(self._tx, name) if self._tx is not None else 0
        await self._groups.snapshot.save_async()
        self.forget_fences()
        log.info(
            "topic %s deleted: records before log offset %d fenced, %d bytes of queue files "
            "freed, %d open transactions rolled back",
            name,
            fence.phys,
            freed,
            rolled_back,
        )
        return topic

    async def follow(self, name: str, fence: TopicFence) -> None:
        """A slave takes its master's deletion of ``name`` with the master's ``fence`` (the
        logs are the same bytes at the same offsets, so it fences the same records). Open
        transactions are not rolled back here: the master's rollbacks come in its log."""
        topic = self._topics.follow_deletion(name, fence)  # the point of no return
        freed = self._drop(name, topic, fence)
        await self._groups.snapshot.save_async()
        log.info(
            "topic %s deleted on the master: records before log offset %d fenced here, %d "
            "bytes of queue files freed",
            name,
            fence.phys,
            freed,
        )

    def _drop(self, name: str, topic: Topic | None, fence: TopicFence) -> int:
        """After the fence is persisted: the store's queues, the groups' offsets and held
        pulls of the topic go; returns the bytes freed. Nothing here yields the event loop."""
        freed = self._store.drop_topic(name, fence)
        self._groups.drop_topic(name)
        if self._notifier is not None:
            queues = set(range(topic.queues)) if topic is not None else set()
            for q in queues | set(fence.ends):
                self._notifier.notify(name, q)
        return freed

    def forget_fences(self) -> None:
        """Drop fences retention has made useless (no dead record left in the log and no topic
        of the name); called after retention."""
        names = self._store.forget_fences({t.name for t in self._topics.list()})
        if names:
            self._topics.forget_fences(names)
            for n in names:
                self._store.fences.discard(n)


async def _roll_back_topic(coord: TxCoordinator, topic: str) -> int:
    """Roll back every open (prepared or parked) transaction of ``topic``; return how many.
    Returns once the rollbacks are durable. Those ended otherwise meanwhile stay as they
    ended. A rollback whose wait for the slaves timed out stands in this master's log,
    unconfirmed (coordinator.py), and counts. If the store fails, the halves stay dead all the
    same (a restart does not reopen them); the failure is logged."""
    done = 0
    waits: list[asyncio.Future[TxEndResponse]] = []
    durables: list[asyncio.Future[None]] = []  # group commits, shared: waited for, not gathered
    why = _REASON
    for tx in coord.list(None, topic):
        try:
            got = coord.end_nowait(tx.tx_id, Decision.ROLLBACK, Resolver.OPERATOR, why)
        except TxbError:
            continue  # ended meanwhile (a commit that won): nothing to roll back
        if got is None:  # being written, or its half not in memory: the slow path waits
            coro = coord.end(tx.tx_id, Decision.ROLLBACK, Resolver.OPERATOR, why)
            waits.append(asyncio.ensure_future(coro))
        elif got[1] is not None:
            durables.append(got[1])
        else:
            done += 1
    if durables:
        await asyncio.wait(set(durables))
    for d in durables:
        failure = StoreFailed("the group commit was cancelled") if d.cancelled() else d.exception()
        if failure is None:
            done += 1
        elif isinstance(failure, ReplicationTimeout):
            done += 1
            _unconfirmed(topic, failure)
        else:
            log.error(
                "topic %s deleted, but rolling back its transaction failed: %s", topic, failure
            )
    for r in await asyncio.gather(*waits, return_exceptions=True):
        if isinstance(r, StoreFailed):
            log.error("topic %s deleted, but rolling back its transaction failed: %s", topic, r)
        elif isinstance(r, ReplicationTimeout):
            done += 1
            _unconfirmed(topic, r)
        elif isinstance(r, TxbError):
            continue  # ended otherwise meanwhile
        elif isinstance(r, BaseException):
            raise r
        else:
            done += 1
    return done


def _unconfirmed(topic: str, e: ReplicationTimeout) -> None:
    log.warning(
        "topic %s deleted: a rollback of its transaction stands on this master, unconfirmed "
        "by the slaves: %s",
        topic,
        e,
    )
