"""Consuming: heartbeats, pulls with long polling, and offset commits for consumer groups.

A pull reads each queue from the position the client sends (the client moves its positions
only when an answer arrives), or from the group's committed offset for a queue the client has
not read yet. So an answer lost on the way (a dropped connection, a client timeout) is simply
read again, and after a rebalance the queue's new owner starts at the committed offset:
whatever was delivered but not acknowledged is delivered again, at least once, never skipped.
"""

from __future__ import annotations

import itertools
import time
from typing import Final

from txbroker.errors import InvalidArgument, InvalidName, StaleGeneration
from txbroker.protocol.messages import (
    AckRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaveRequest,
    PulledMessage,
    PullRequest,
    PullResponse,
    QueuePosition,
)
from txbroker.server.groups import ConsumeMode, GroupCoordinator
from txbroker.server.longpoll import Notifier
from txbroker.server.producer import HEADER_PREFIX
from txbroker.server.retry import (
    PROP_ORIGINAL_TOPIC,
    PROP_RECONSUME,
    RetryService,
    retry_topic,
)
from txbroker.server.topics import TopicRegistry
from txbroker.store import PROP_KEYS, MessageStore, StoredMessage
from txbroker.tx.state import PROP_TRACEPARENT

__all__ = ["MAX_HOLD_MS", "MAX_PULL_MESSAGES", "ConsumerService"]

# 30 s, RocketMQ's default long-poll suspension: long enough to make idle polling cheap, short
# enough that a dead connection is noticed by the client's own timeout soon after.
MAX_HOLD_MS: Final = 30_000
MAX_PULL_MESSAGES: Final = 1024
# An answer carries at most this many body bytes (at least one message), well under the 16 MiB
# frame limit whatever the message sizes.
MAX_PULL_BYTES: Final = 8 * 1024 * 1024
# How long a member with no queues is held before it may ask again.
IDLE_MEMBER_HOLD_S: Final = 1.0


class ConsumerService:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicRegistry,
        groups: GroupCoordinator,
        notifier: Notifier,
        retry: RetryService,
    ) -> None:
        self._retry = retry
        self._store = store
        self._topics = topics
        self._groups = groups
        self._notifier = notifier
        self.stopping = False  # set at shutdown: held pulls answer at once
        self._rr = itertools.count()

    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        topic = self._topics.get(self._readable(req.group, req.topic))
        try:
            mode = ConsumeMode(req.mode)
        except ValueError as e:
            raise InvalidArgument(f"mode must be clustering or broadcast, not {req.mode!r}") from e
        if req.start not in ("earliest", "latest", "timestamp"):
            raise InvalidArgument("start must be earliest, latest or timestamp")
        generation, queues = self._groups.heartbeat(
            req.group, topic.name, req.member_id, topic.queues, mode
        )
        self._retry.ensure_topics(req.group)  # so the group's consumers can subscribe to them
        owner = self._groups.offset_owner(req.group, topic.name, req.member_id)
        for q in queues:
            if self._groups.committed(owner, topic.name, q) is None:
                # Fix the starting point at join time, so "latest" means latest-at-join.
                start = await self._start_offset(topic.name, q, req.start, req.start_timestamp_ms)
                self._groups.commit(owner, topic.name, q, start)
        return HeartbeatResponse(generation, queues)

    @staticmethod
    def _readable(group: str, topic: str) -> str:
        """Consumers read user topics and their own group's retry topic; never half messages,
        op records or the scheduler's copies."""
        if topic.startswith("%") and topic != retry_topic(group):
            raise InvalidName(f"topic {topic!r} is internal to the broker")
        return topic

    async def leave(self, req: LeaveRequest) -> None:
        self._groups.leave(req.group, req.topic, req.member_id)

    async def _start_offset(self, topic: str, q: int, start: str, ts_ms: int) -> int:
        lo, hi = self._store.queue_range(topic, q)
        if start == "earliest":
            return lo
        if start == "latest":
            return hi
        while lo < hi:  # first message stored at or after ts_ms (store times rise per queue)
            mid = (lo + hi) // 2
            got = await self._store.get_messages(topic, q, mid, 1)
            if got.messages and got.messages[0].store_timestamp_ms < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    async def pull(self, req: PullRequest) -> PullResponse:
        if not 1 <= req.max_messages <= MAX_PULL_MESSAGES:
            raise InvalidArgument(f"max_messages must be 1..{MAX_PULL_MESSAGES}")
        topic = self._topics.get(self._readable(req.group, req.topic)).name
        queues = self._groups.check(req.group, topic, req.member_id, req.generation)
        owner = self._groups.offset_owner(req.group, topic, req.member_id)
        hold_s = min(max(req.hold_ms, 0), MAX_HOLD_MS) / 1000
        deadline = time.monotonic() + hold_s
        if not queues:
            # Nothing assigned (more members than queues): hold a little so an idle member does
            # not spin, then let it heartbeat and learn whether that changed.
            # Watch a key no queue has, so shutdown's wake_all() still ends this hold.
            with self._notifier.watch([(topic, -1)]) as watch:
                if not self.stopping:
                    await watch.wait(min(hold_s, IDLE_MEMBER_HOLD_S))
            return PullResponse([])
        shift = next(self._rr) % len(queues)  # fairness: start at a different queue each time
        queues = queues[shift:] + queues[:shift]
        positions = {p.queue_id: p.offset for p in req.positions}
        while True:
            with self._notifier.watch((topic, q) for q in queues) as watch:
                out, nexts = await self._read(owner, topic, queues, positions, req)
                if out or self.stopping:
                    return PullResponse(out, nexts)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not await watch.wait(remaining) or self.stopping:
                    return PullResponse([], nexts)
            # Woken: the generation may have moved while we waited.
            queues = self._groups.check(req.group, topic, req.member_id, req.generation)

    async def _read(
        self,
        owner: str,
        topic: str,
        queues: list[int],
        positions: dict[int, int],
        req: PullRequest,
    ) -> tuple[list[PulledMessage], list[QueuePosition]]:
        """Read from each queue's position. Nothing is remembered here: the client moves its
        positions when the answer arrives, so an answer lost on the way is read again."""
        out: list[PulledMessage] = []
        nexts: list[QueuePosition] = []
        budget = MAX_PULL_BYTES
        for q in queues:
            if len(out) >= req.max_messages or budget <= 0:
                break
            lo, _ = self._store.queue_range(topic, q)
            offset = positions.get(q)
            if offset is None:
                committed = self._groups.committed(owner, topic, q)
                offset = committed if committed is not None else lo
            got = await self._store.get_messages(
                topic, q, max(offset, lo), req.max_messages - len(out), req.tags
            )
            next_offset = got.next_offset
            for m in got.messages:
                # Whole records (body, properties, header) count, so the answer frame stays
                # under the frame limit whatever mix of message sizes the queue holds.
                if out and m.size > budget:
                    next_offset = m.queue_offset  # the answer is full: this one comes next time
                    budget = 0
                    break
                budget -= m.size
                out.append(_pulled(m))
            nexts.append(QueuePosition(q, next_offset))
        return out, nexts

    async def ack(self, req: AckRequest) -> None:
        topic = self._topics.get(req.topic).name
        queues = set(self._groups.check(req.group, topic, req.member_id, req.generation))
        owner = self._groups.offset_owner(req.group, topic, req.member_id)
        for pos in req.positions:
            if pos.queue_id not in queues:
                raise StaleGeneration(f"queue {pos.queue_id} is not assigned to {req.member_id!r}")
            lo, hi = self._store.queue_range(topic, pos.queue_id)
            if not lo <= pos.offset <= hi:
                raise InvalidArgument(f"offset {pos.offset} is outside queue range {lo}..{hi}")
        for pos in req.positions:
            self._groups.commit(owner, topic, pos.queue_id, pos.offset)


def _pulled(m: StoredMessage) -> PulledMessage:
    props = m.properties
    headers = {k[len(HEADER_PREFIX) :]: v for k, v in props.items() if k.startswith(HEADER_PREFIX)}
    tp = props.get(PROP_TRACEPARENT)
    if tp is not None:  # the producer's span: a consumer's span continues its trace
        headers["traceparent"] = tp
    return PulledMessage(
        message_id=m.message_id or "",
        topic=props.get(PROP_ORIGINAL_TOPIC, m.topic),
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        body=m.body,
        key=props.get(PROP_KEYS),
        tags=m.tags,
        headers=headers,
        born_ms=m.born_timestamp_ms,
        store_ms=m.store_timestamp_ms,
        reconsume_count=int(props.get(PROP_RECONSUME, "0")),
    )
