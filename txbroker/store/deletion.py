"""Deleting a topic's data from the store: fence it, drop its queues (see ``fences.py``).

The owner of the topic registry asks :meth:`StoreDeletion.fence_for` what the deletion's fence
is, persists it (that write is the deletion's point of no return), then hands it to
:meth:`StoreDeletion.drop_topic`, which makes the records unreachable in memory at once and
removes the topic's consume-queue files. A crash between the two is repaired when the store
opens with the persisted fences: queues left on disk that point at dead records are dropped.

Separate from ``MessageStore`` (which extends this class) because it runs per deletion, an
admin operation, beside the append and read paths it fences.
"""

from __future__ import annotations

import shutil

from txbroker.protocol.names import validate_topic
from txbroker.store.consumequeue import ConsumeQueue
from txbroker.store.core import StoreCore
from txbroker.store.fences import TopicFence
from txbroker.store.record import StoredMessage

__all__ = ["StoreDeletion"]


class StoreDeletion(StoreCore):
    def fence_for(self, topic: str) -> TopicFence:
        """The fence a deletion of ``topic`` now would set: the end of the log, and where each
        of its queues ends (merged with the fence of an earlier deletion of the name)."""
        validate_topic(topic)
        ends = {q: cq.max_offset for (t, q), cq in self.queues.items() if t == topic}
        fence = TopicFence(self.log.write_pos, ends)
        earlier = self.fences.get(topic)
        return earlier.merge(fence) if earlier is not None else fence

    def drop_topic(self, topic: str, fence: TopicFence) -> int:
        """Make ``topic``'s records before ``fence`` unreachable and remove its consume-queue
        files; return the bytes freed. Call after ``fence`` is persisted (see the docstring)."""
        self._check_readable()
        self.fences.set(topic, fence)
        dropped: list[ConsumeQueue] = []
        for key in [k for k in self.queues if k[0] == topic]:
            cq = self.queues.pop(key)
            self._dirty_queues.discard(cq)
            dropped.append(cq)
        freed = sum(f.size for cq in dropped for f in cq.files)
        for cq in dropped:
            cq.close()  # readers in worker threads hold their own references
        # Queue files are derived data: if removing them fails, the next open drops them.
        shutil.rmtree(self._cq_root / topic, ignore_errors=True)
        return freed

    def forget_fences(self, keep: set[str]) -> list[str]:
        """Fences no longer needed: no record before them is left in the log (retention took
        it) and no topic of the name exists (``keep``) whose new queues number on from them.
        Returns their topics, for the registry's owner to drop from what it persists."""
        low = self.log.min_offset
        return [t for t, f in self.fences.items() if f.phys <= low and t not in keep]

    def is_dead(self, msg: StoredMessage) -> bool:
        """Whether ``msg`` belongs to a deleted topic. Check a source message right before
        appending a copy of it (see ``fences.py``: that keeps copies of dead records dead)."""
        return self.fences.is_dead(msg.topic, msg.properties, msg.physical_offset)

    def is_dead_at(self, owner: str, phys: int) -> bool:
        """:meth:`is_dead` for the record at ``phys`` belonging to topic ``owner``."""
        return self.fences.is_dead_at(owner, phys)
