"""Topic fences: how a deleted topic's records become unreachable at once, without rewriting
the log.

Deleting a topic records a :class:`TopicFence` for its name: the commit-log offset at the moment
of deletion, and where each of its queues ended. Every record that *belongs* to the topic and
lies before the fence is dead: no queue read, key lookup or recovery brings it back, and
retention reclaims its bytes with the segment that holds it. A topic created again under the
name starts empty, its queues numbering on from where the deleted ones ended (so a client's
stale position or committed offset can only point before the new messages, never into them).

A record belongs to the topic it names as its origin: the original topic of a retry or
dead-letter copy (``ot``), else the target topic of a half message or a delayed copy (``tt``),
else its own topic. So one rule covers the topic's own queues and every copy of its messages
in the broker's internal topics. It stays true because every copy is appended after its
source, and the broker checks that the source is alive right before appending the copy (see
:meth:`Fences.is_dead`): a copy is never younger than a deletion that killed its source.

The fences are persisted by the owner of the topic registry (atomically, with the deletion
itself) and handed to the store when it opens.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from txbroker.store.record import PROP_ORIGINAL_TOPIC, PROP_TARGET_TOPIC

__all__ = ["Fences", "TopicFence", "owner_topic"]


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
