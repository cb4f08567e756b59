"""Deleting a topic without rewriting the log: fences, and the deletion that sets one.

A :class:`TopicFence` records where the log ended when a topic was deleted and where each of
its queues ended. A record *belongs* to the topic it names as its origin (``ot`` on a retry or
dead-letter copy, else ``tt`` on a half message or delayed copy, else its own topic); one that
belongs to a fenced topic and lies before the fence is dead: no read, lookup or recovery brings
it back, and retention reclaims its bytes. A topic created again starts its queues where the
deleted ones ended. :class:`TopicFencing` names and applies fences; the topic registry's
owner persists them (the point of no return) and hands them to the store when it opens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from txbroker.protocol.names import validate_topic
from txbroker.store.record import PROP_ORIGINAL_TOPIC, PROP_TARGET_TOPIC

if TYPE_CHECKING:
    from txbroker.store.commitlog import CommitLog
    from txbroker.store.consumequeue import ConsumeQueues
    from txbroker.store.state import Lifecycle

__all__ = ["Fences", "TopicFencing", "TopicFence", "owner_topic"]


class TopicFence(msgspec.Struct, frozen=True):
    """What a topic's deletion left: records of the topic before ``phys`` are dead; ``ends``
    maps each queue id it ever had to the queue offset a new queue of that name starts at."""

    phys: int
    ends: dict[int, int] = msgspec.field(default_factory=dict)

    def merge(self, later: TopicFence) -> TopicFence:
        """The fence of a second deletion of the name: its offset, every queue's latest end."""
        return TopicFence(max(self.phys, later.phys), {**self.ends, **later.ends})


def owner_topic(topic: str, props: Mapping[str, str]) -> str:
    """The user topic a record belongs to (see the module docstring)."""
    return props.get(PROP_ORIGINAL_TOPIC) or props.get(PROP_TARGET_TOPIC) or topic


class Fences:
    """The fences in force, by topic name. Empty in a store whose topics were never deleted,
    and then every check is one dictionary test."""

    def __init__(self, fences: Mapping[str, TopicFence] | None = None) -> None:
        self._by_topic: dict[str, TopicFence] = dict(fences or {})

    def __bool__(self) -> bool:
        return bool(self._by_topic)

    def get(self, topic: str) -> TopicFence | None:
        return self._by_topic.get(topic)

    def set(self, topic: str, fence: TopicFence) -> None:
        self._by_topic[topic] = fence

    def clamp(self, log_end: int) -> list[str]:
        """After recovery: no fence may lie past the end of the log. A deletion fences at the
        end of what was *written*; a crash can lose the unflushed tail before it, and new
        records would then be appended below the fence and taken for dead. Every record that
        survived lies before ``log_end``, so fencing there kills the same ones. Returns the
        topics whose fence moved, for the owner to persist before anything is appended."""
        moved = [t for t, f in self._by_topic.items() if f.phys > log_end]
        for t in moved:
            self._by_topic[t] = TopicFence(log_end, self._by_topic[t].ends)
        return moved

    def as_dict(self) -> dict[str, TopicFence]:
        return dict(self._by_topic)

    def discard(self, topic: str) -> None:
        self._by_topic.pop(topic, None)

    def items(self) -> list[tuple[str, TopicFence]]:
        return list(self._by_topic.items())

    def start(self, topic: str, queue_id: int) -> int:
        """The queue offset a new queue of ``topic`` starts at (0 unless it was deleted)."""
        fence = self._by_topic.get(topic)
        return fence.ends.get(queue_id, 0) if fence is not None else 0

    def is_dead_at(self, owner: str, phys: int) -> bool:
        fence = self._by_topic.get(owner)
        return fence is not None and phys < fence.phys

    def is_dead(self, topic: str, props: Mapping[str, str], phys: int) -> bool:
        """Whether the record at ``phys`` (of ``topic``, with ``props``) was deleted."""
        if not self._by_topic:
            return False
        return self.is_dead_at(owner_topic(topic, props), phys)


class TopicFencing:
    """Deleting a topic's data: name its fence, then (once the owner persisted it) apply it.
    A crash between the two is repaired at the next open, with the persisted fences: queues
    left on disk that point at dead records are dropped."""

    def __init__(
        self, commitlog: CommitLog, queues: ConsumeQueues, fences: Fences, lifecycle: Lifecycle
    ) -> None:
        self._log = commitlog
        self._queues = queues
        self._fences = fences
        self._lifecycle = lifecycle

    def fence_for(self, topic: str) -> TopicFence:
        """The fence a deletion of ``topic`` now would set: the end of the log, and where each
        of its queues ends (merged with the fence of an earlier deletion of the name)."""
        validate_topic(topic)
        ends = {q: cq.max_offset for (t, q), cq in self._queues.by_key.items() if t == topic}
        fence = TopicFence(self._log.write_pos, ends)
        earlier = self._fences.get(topic)
        return earlier.merge(fence) if earlier is not None else fence

    def drop_topic(self, topic: str, fence: TopicFence) -> int:
        """Make ``topic``'s records before ``fence`` unreachable and remove its consume-queue
        files; return the bytes freed. Call once ``fence`` is persisted."""
        self._lifecycle.check_readable()
        self._fences.set(topic, fence)
        return self._queues.drop_topic(topic)

    def forget_fences(self, keep: set[str]) -> list[str]:
        """Fences no longer needed: no record before them is left in the log (retention took
        it) and no topic of the name exists (``keep``) whose new queues number on from them.
        Returns their topics, for the registry's owner to drop from what it persists."""
        low = self._log.min_offset
        return [t for t, f in self._fences.items() if f.phys <= low and t not in keep]
