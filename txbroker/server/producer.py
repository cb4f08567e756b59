"""Producing: validate a send, choose its queue, deduplicate by idempotency key, append.

Queue choice: an explicit ``queue_id`` wins; else a key maps to ``crc32c(key) % queues`` (same
key, same queue, so per-key order holds); else sends rotate round-robin over the queues.

Idempotency: a send whose key was stored within the dedup window returns the original receipt
(``duplicate=True``) and stores nothing. The key index answers across restarts; concurrent
sends with one key are serialised through an in-flight table so the second waits for the first
rather than racing it past the index.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from typing import Final

import google_crc32c

from txbroker.errors import InvalidArgument
from txbroker.protocol.messages import SendReceipt, SendRequest
from txbroker.protocol.names import validate_topic
from txbroker.server.delay import (
    PROP_TARGET_QUEUE,
    PROP_TARGET_TOPIC,
    SCHEDULE_TOPIC,
    DelayScheduler,
)
from txbroker.server.longpoll import Notifier
from txbroker.server.topics import TopicRegistry
from txbroker.store import (
    PROP_IDEMPOTENCY_KEY,
    PROP_KEYS,
    PROP_MESSAGE_ID,
    PROP_TAGS,
    AppendResult,
    KeyKind,
    Message,
    MessageStore,
    StoredMessage,
)

__all__ = ["HEADER_PREFIX", "Producer", "queue_for_key"]

HEADER_PREFIX: Final = "h."  # user headers live in record properties under this prefix
# Keys, tags and idempotency keys are identifiers, not payload: 1 KiB each is generous.
MAX_KEY_BYTES: Final = 1024
DEFAULT_DEDUP_WINDOW_MS: Final = 24 * 3600 * 1000
SCHEDULED_OFFSET: Final = -1


def queue_for_key(key: str, queues: int) -> int:
    crc: int = google_crc32c.value(key.encode())
    return crc % queues


class Producer:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicRegistry,
        *,
        dedup_window_ms: int = DEFAULT_DEDUP_WINDOW_MS,
        notifier: Notifier | None = None,
        scheduler: DelayScheduler | None = None,
    ) -> None:
        self._store = store
        self._notifier = notifier
        self._scheduler = scheduler
        self._topics = topics
        self._window_ms = dedup_window_ms
        self._rr = itertools.count()
        self._inflight: dict[str, asyncio.Future[SendReceipt]] = {}

    def to_message(self, req: SendRequest) -> Message:
        validate_topic(req.topic, allow_system=False)  # internal topics are the broker's own
        topic = self._topics.get(req.topic)
        for name, value in (
            ("key", req.key),
            ("tags", req.tags),
            ("idempotency_key", req.idempotency_key),
        ):
            if value is not None and (
                not value or len(value.encode()) > MAX_KEY_BYTES or " " in value
            ):
                raise InvalidArgument(f"{name} must be 1-{MAX_KEY_BYTES} bytes with no spaces")
        if req.queue_id is not None:
            if not 0 <= req.queue_id < topic.queues:
                raise InvalidArgument(f"queue {req.queue_id} does not exist in {topic.name!r}")
            qid = req.queue_id
        elif req.key is not None:
            qid = queue_for_key(req.key, topic.queues)
        else:
            qid = next(self._rr) % topic.queues
        props = {HEADER_PREFIX + k: v for k, v in req.headers.items()}
        if req.key is not None:
            props[PROP_KEYS] = req.key
        if req.tags is not None:
            props[PROP_TAGS] = req.tags
        if req.idempotency_key is not None:
            props[PROP_IDEMPOTENCY_KEY] = req.idempotency_key
        if req.message_id is not None:
            props[PROP_MESSAGE_ID] = req.message_id
        return Message(topic.name, req.body, queue_id=qid, properties=props)

    def _stored_form(self, req: SendRequest) -> Message:
        """The message as it is appended: itself, or its schedule copy when delayed."""
        msg = self.to_message(req)
        if req.deliver_at_ms is not None and req.deliver_at_ms > time.time_ns() // 1_000_000:
            if self._scheduler is None:
                raise InvalidArgument("this broker does not deliver delayed messages")
            return self._scheduler.prepare(msg, req.deliver_at_ms)
        return msg

    async def send(self, req: SendRequest) -> SendReceipt:
        msg = self._stored_form(req)
        ik = req.idempotency_key
        if ik is None:
            return self._after_append(msg, await self._store.append(msg))
        pending = self._inflight.get(ik)
        if pending is not None:
            first = await asyncio.shield(pending)
            return _as_duplicate(first)
        fut: asyncio.Future[SendReceipt] = asyncio.get_running_loop().create_future()
        self._inflight[ik] = fut
        try:
            found = await self._find_stored(ik)
            if found is not None:
                receipt = _receipt(found, duplicate=True)
            else:
                receipt = self._after_append(msg, await self._store.append(msg))
            fut.set_result(receipt)
            return receipt
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # mark retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            del self._inflight[ik]

    async def send_batch(self, reqs: Sequence[SendRequest]) -> list[SendReceipt]:
        """All-or-nothing validation, then one group commit for the lot. Batches carrying
        idempotency keys go through :meth:`send` one by one to keep the dedup guarantee."""
        if any(r.idempotency_key is not None for r in reqs):
            for r in reqs:  # validate every one, store limits included, before sending any
                self._store.validate(self._stored_form(r))
            return [await self.send(r) for r in reqs]
        msgs = [self._stored_form(r) for r in reqs]
        results = await self._store.append_batch(msgs)
        return [self._after_append(m, r) for m, r in zip(msgs, results, strict=True)]

    def _after_append(self, msg: Message, res: AppendResult) -> SendReceipt:
        """Wake whoever waits for this queue (the append is acknowledged, so readable: durable
        in sync mode) and make the producer's receipt."""
        if res.topic == SCHEDULE_TOPIC:
            assert self._scheduler is not None
            self._scheduler.notify(res.queue_id)
            return _scheduled_receipt(res.message_id, msg.properties)
        if self._notifier is not None:
            self._notifier.notify(res.topic, res.queue_id)
        return SendReceipt(res.message_id, res.topic, res.queue_id, res.queue_offset)

    async def _find_stored(self, ik: str) -> StoredMessage | None:
        since = time.time_ns() // 1_000_000 - self._window_ms
        found = await self._store.lookup(KeyKind.IDEMPOTENCY_KEY, ik, limit=1, since_ms=since)
        return found[0] if found else None


def _receipt(m: StoredMessage, *, duplicate: bool) -> SendReceipt:
    if m.topic == SCHEDULE_TOPIC:
        r = _scheduled_receipt(m.message_id or "", m.properties)
        return SendReceipt(r.message_id, r.topic, r.queue_id, r.queue_offset, duplicate)
    return SendReceipt(m.message_id or "", m.topic, m.queue_id, m.queue_offset, duplicate)


def _scheduled_receipt(message_id: str, props: dict[str, str]) -> SendReceipt:
    """A delayed message has no queue offset until it is delivered: -1 says so."""
    return SendReceipt(
        message_id, props[PROP_TARGET_TOPIC], int(props[PROP_TARGET_QUEUE]), SCHEDULED_OFFSET
    )


def _as_duplicate(r: SendReceipt) -> SendReceipt:
    return SendReceipt(r.message_id, r.topic, r.queue_id, r.queue_offset, True)
