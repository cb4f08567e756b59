"""Deleting a topic: everything it held becomes unreachable at once, and stays so after a crash.

The steps, in this order:

1. The store says what the deletion's fence is (the end of the log, where each queue ended).
2. The topic registry is written without the topic and with the fence, in one atomic write.
   That write *is* the deletion: a crash before it leaves the topic whole, a crash after it
   (kill -9 right after the answer included) leaves it deleted, because the store opens with
   the fences and no queue, index lookup or recovery gives a dead record back.
3. The store applies the fence in memory and removes the topic's consume-queue files.
4. Consumer groups forget their offsets in the topic, and its members must join again.
5. Long polls waiting on it answer now.
6. Open transactions of the topic are rolled back (``txbroker.tx.deleted``), durably.
7. The groups' offsets file is written, so no old offset comes back either.

Steps 1 to 5 run without yielding the event loop, so no request sees a half-deleted topic.
The fence also kills every copy of the topic's messages in the broker's internal topics:
delayed messages, retries and dead letters (see ``txbroker.store.fences``). The commit log's
bytes are reclaimed by retention, with the segments that hold them.
"""

from __future__ import annotations

import logging

from txbroker.server.groups import GroupCoordinator
from txbroker.server.longpoll import Notifier
from txbroker.server.topics import Topic, TopicRegistry
from txbroker.store import MessageStore
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.deleted import roll_back_topic

__all__ = ["TopicDeletion"]

log = logging.getLogger(__name__)


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
        freed = self._store.drop_topic(name, fence)
        self._groups.drop_topic(name)
        if self._notifier is not None:
            for q in set(range(topic.queues)) | set(fence.ends):
                self._notifier.notify(name, q)
        rolled_back = await roll_back_topic(self._tx, name) if self._tx is not None else 0
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

    def forget_fences(self) -> None:
        """Drop fences retention has made useless (no dead record left in the log and no topic
        of the name); called after retention."""
        names = self._store.forget_fences({t.name for t in self._topics.list()})
        if names:
            self._topics.forget_fences(names)
            for n in names:
                self._store.fences.discard(n)
