"""What operators ask the broker: a topic's queues and offsets, consumer groups and their lag.

Computed here once; the wire's admin requests (TOPIC_LIST/DESCRIBE, OFFSETS: the CLI), the HTTP
admin API and /metrics all read these answers.
"""

from __future__ import annotations

import time

from txbroker.errors import NotFound
from txbroker.protocol.messages import GroupInfo, QueueLag, QueueOffsets, TopicInfo
from txbroker.server.groups import GroupCoordinator
from txbroker.server.rates import Rates
from txbroker.server.topics import Topic, TopicRegistry
from txbroker.store import MessageStore

__all__ = ["Admin"]


class Admin:
    def __init__(self, store: MessageStore, topics: TopicRegistry, groups: GroupCoordinator):
        self._store = store
        self._topics = topics
        self._groups = groups
        self._topic_rates: Rates[str] = Rates()
        self._group_rates: Rates[tuple[str, str]] = Rates()

    def sample(self, now: float | None = None) -> None:
        """Sample the counters rates are computed from (the housekeeping loop, once a second):
        each topic's end offsets and each group's committed offsets, summed over queues."""
        now = time.monotonic() if now is None else now
        ends = {}
        for t in self._topics.list():
            ends[t.name] = sum(o.max_offset for o in self.offsets(t))
        self._topic_rates.add(now, ends)
        committed = {}
        for owner, name in self._groups.groups():
            if name in ends:
                queues = range(self._topics.get(name).queues)
                committed[(owner, name)] = sum(
                    self._groups.committed(owner, name, q) or 0 for q in queues
                )
        self._group_rates.add(now, committed)

    def offsets(self, topic: Topic) -> list[QueueOffsets]:
        out = []
        for q in range(topic.queues):
            lo, hi = self._store.queue_range(topic.name, q)
            out.append(QueueOffsets(q, lo, hi))
        return out

    def topic_info(self, topic: Topic) -> TopicInfo:
        offsets = self.offsets(topic)
        messages = sum(o.max_offset - o.min_offset for o in offsets)
        rate = self._topic_rates.rate(topic.name)
        return TopicInfo(topic.name, topic.queues, messages, topic.created_ms, offsets, rate)

    def lag(self, owner: str, topic: Topic) -> list[QueueLag]:
        """Per queue: messages past the group's committed offset (from the oldest one kept,
        when nothing is committed yet or the committed ones were deleted by retention)."""
        out = []
        for o in self.offsets(topic):
            committed = self._groups.committed(owner, topic.name, o.queue)
            start = max(committed if committed is not None else o.min_offset, o.min_offset)
            out.append(QueueLag(o.queue, o.max_offset, committed, o.max_offset - start))
        return out

    def groups(self, group: str | None = None, topic: str | None = None) -> list[GroupInfo]:
        """Consumer groups of user topics, each (group, topic) once, with live members and lag
        per queue; only those of ``group`` and/or ``topic`` when given (NotFound if a named
        topic does not exist). A group counts once it has committed an offset or has a live
        member."""
        if topic is not None:
            self._topics.get(topic)
        pairs = set(self._groups.groups()) | set(self._groups.live())
        out = []
        for owner, name in sorted(pairs):
            base = owner.split("@", 1)[0]
            if name.startswith("%") or (group is not None and base != group):
                continue
            if topic is not None and name != topic:
                continue
            try:
                t = self._topics.get(name)
            except NotFound:
                continue  # the topic was deleted since
            queues = self.lag(owner, t)
            members = sorted(self._groups.members(base, name))
            lag = sum(q.lag for q in queues)
            rate = self._group_rates.rate((owner, name))
            out.append(GroupInfo(owner, name, members, queues, lag, rate))
        return out
