"""Retries and dead letters for consumer groups.

A NACK sends one message back to its group only: a copy goes through the delay scheduler to the
group's retry topic ``%RETRY%<group>`` after a growing delay, with its reconsume count raised.
Past the maximum (default 16) the copy goes to the group's dead-letter topic ``%DLQ%<group>``
instead, where an operator can list it and re-drive it to its original topic.

Every copy carries an internal key naming what it is a copy of, so a NACK or a re-drive that is
retried (a lost answer, a client retry, a crash) never makes a second copy.
"""

from __future__ import annotations

import logging
import time
from typing import Final

from txbroker.errors import InvalidArgument, NotFound, StaleGeneration
from txbroker.protocol.messages import (
    DlqListResponse,
    DlqMessage,
    DlqRedriveResponse,
    NackRequest,
    NackResponse,
)
from txbroker.server.delay import MAX_DELAY_MS, DelayScheduler
from txbroker.server.groups import GroupCoordinator
from txbroker.server.longpoll import Notifier
from txbroker.server.producer import queue_for_key
from txbroker.server.topics import TopicRegistry
from txbroker.store import (
    PROP_IDEMPOTENCY_KEY,
    PROP_INTERNAL_KEY,
    PROP_KEYS,
    PROP_ORIGINAL_TOPIC,
    KeyKind,
    Message,
    MessageStore,
    StoredMessage,
)

__all__ = [
    "DEFAULT_RETRY_DELAYS_MS",
    "PROP_ORIGINAL_TOPIC",
    "RetryService",
    "dlq_topic",
    "retry_topic",
]

# RocketMQ's consumer retry ladder: 1s 5s 10s 30s 1m 2m 3m ... 10m 20m 30m (16 steps, the default
# maximum number of reconsumes), 6,346 s (about 1 h 46 min) from first failure to dead letter.
DEFAULT_RETRY_DELAYS_MS: Final = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000,
    300_000, 360_000, 420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000,
)  # fmt: skip
PROP_RECONSUME: Final = "rc"
REDRIVE_OWNER: Final = "%redrive"

log = logging.getLogger(__name__)


def retry_topic(group: str) -> str:
    return f"%RETRY%{group}"


def dlq_topic(group: str) -> str:
    return f"%DLQ%{group}"


class RetryService:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicRegistry,
        groups: GroupCoordinator,
        scheduler: DelayScheduler,
        notifier: Notifier,
        *,
        delays_ms: tuple[int, ...] = DEFAULT_RETRY_DELAYS_MS,
        max_reconsume: int = 16,
    ) -> None:
        if max_reconsume < 0 or not delays_ms:
            raise InvalidArgument("max_reconsume must be >= 0 and retry delays non-empty")
        self._store = store
        self._topics = topics
        self._groups = groups
        self._scheduler = scheduler
        self._notifier = notifier
        self._delays = delays_ms
        self._max = max_reconsume

    def ensure_topics(self, group: str) -> None:
        self._topics.ensure_system(retry_topic(group), 1)
        self._topics.ensure_system(dlq_topic(group), 1)

    async def nack(self, req: NackRequest) -> NackResponse:
        queues = self._groups.check(req.group, req.topic, req.member_id, req.generation)
        if req.queue_id not in queues:
            raise StaleGeneration(f"queue {req.queue_id} is not assigned to {req.member_id!r}")
        original = await self._message_at(req.topic, req.queue_id, req.queue_offset)
        rc = int(original.properties.get(PROP_RECONSUME, "0")) + 1
        key = f"nack:{req.group}:{req.topic}:{req.queue_id}:{req.queue_offset}"
        props = dict(original.properties)
        # The producer's idempotency key stays with the original message only: a copy carrying
        # it would answer a later duplicate send with the copy's receipt.
        props.pop(PROP_IDEMPOTENCY_KEY, None)
        props[PROP_RECONSUME] = str(rc)
        props[PROP_INTERNAL_KEY] = key
        props.setdefault(PROP_ORIGINAL_TOPIC, req.topic)
        self.ensure_topics(req.group)
        if rc > self._max:
            if not await self._store.lookup(KeyKind.INTERNAL, key, limit=1):
                target = dlq_topic(req.group)
                self._check_alive(original)
                await self._store.append(Message(target, original.body, 0, props, original.flags))
                self._notifier.notify(target, 0)
            return NackResponse(rc, True, 0)
        delay_ms = req.delay_ms
        if delay_ms is None:
            delay_ms = self._delays[min(rc, len(self._delays)) - 1]
        elif not 0 <= delay_ms <= MAX_DELAY_MS:
            raise InvalidArgument(f"delay_ms must be 0..{MAX_DELAY_MS}")
        at = time.time_ns() // 1_000_000 + delay_ms
        if not await self._store.lookup(KeyKind.INTERNAL, key, limit=1):
            copy = Message(retry_topic(req.group), original.body, 0, props, original.flags)
            self._check_alive(original)
            res = await self._store.append(self._scheduler.prepare(copy, at))
            self._scheduler.notify(res.queue_id)
        return NackResponse(rc, False, at)

    def _check_alive(self, original: StoredMessage) -> None:
        """Right before appending a copy: a copy of a deleted topic's message must not be made
        (see ``txbroker.store.fences``); the topic may have gone while the index was read."""
        if self._store.is_dead(original):
            topic = original.properties.get(PROP_ORIGINAL_TOPIC, original.topic)
            raise NotFound(f"topic {topic!r} was deleted")

    async def _message_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage:
        got = await self._store.get_messages(topic, queue_id, offset, 1)
        if not got.messages or got.messages[0].queue_offset != offset:
            raise NotFound(f"no message at {topic}/{queue_id}/{offset}")
        return got.messages[0]

    async def list_dlq(self, group: str, max_messages: int) -> DlqListResponse:
        topic = dlq_topic(group)
        self._topics.get(topic)
        lo, _ = self._store.queue_range(topic, 0)
        redrive = self._groups.committed(REDRIVE_OWNER, topic, 0) or lo
        got = await self._store.get_messages(topic, 0, lo, max(1, min(max_messages, 1000)))
        return DlqListResponse([_dlq_message(m) for m in got.messages], redrive)

    async def redrive(self, group: str, max_messages: int) -> DlqRedriveResponse:
        """Send dead letters (not yet re-driven) back to their original topics, with their
        reconsume count reset, in order; remembers how far it got."""
        topic = dlq_topic(group)
        self._topics.get(topic)
        lo, _ = self._store.queue_range(topic, 0)
        start = max(self._groups.committed(REDRIVE_OWNER, topic, 0) or lo, lo)
        got = await self._store.get_messages(topic, 0, start, max(1, min(max_messages, 1000)))
        n = 0
        for m in got.messages:
            key = f"redrive:{group}:{m.queue_offset}"
            if not await self._store.lookup(KeyKind.INTERNAL, key, limit=1):
                if self._store.is_dead(m):  # its topic was deleted while we looked
                    self._groups.commit(REDRIVE_OWNER, topic, 0, m.queue_offset + 1)
                    continue
                props = dict(m.properties)
                target = props.pop(PROP_ORIGINAL_TOPIC, "")
                props.pop(PROP_RECONSUME, None)
                props.pop(PROP_IDEMPOTENCY_KEY, None)
                props[PROP_INTERNAL_KEY] = key
                try:
                    t = self._topics.get(target)
                except NotFound:
                    # The original topic was deleted: nothing to re-drive to. Leave it in the
                    # dead-letter topic (listable) and move on rather than stall every redrive.
                    log.warning(
                        "dead letter %d of %s: topic %r is gone", m.queue_offset, group, target
                    )
                    self._groups.commit(REDRIVE_OWNER, topic, 0, m.queue_offset + 1)
                    continue
                key_prop = props.get(PROP_KEYS)
                qid = queue_for_key(key_prop.split()[0], t.queues) if key_prop else 0
                await self._store.append(Message(target, m.body, qid, props, m.flags))
                self._notifier.notify(target, qid)
            self._groups.commit(REDRIVE_OWNER, topic, 0, m.queue_offset + 1)
            n += 1
        if got.next_offset > start:  # past dead letters of deleted topics, skipped by the store
            self._groups.commit(REDRIVE_OWNER, topic, 0, got.next_offset)
        return DlqRedriveResponse(n)


def _dlq_message(m: StoredMessage) -> DlqMessage:
    return DlqMessage(
        m.message_id or "",
        m.properties.get(PROP_ORIGINAL_TOPIC, ""),
        m.queue_offset,
        int(m.properties.get(PROP_RECONSUME, "0")),
        m.body,
        m.store_timestamp_ms,
    )
