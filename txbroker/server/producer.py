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
from txbroker.server.longpoll import Notifier
from txbroker.server.topics import TopicRegistry
from txbroker.store import (
    PROP_IDEMPOTENCY_KEY,
    PROP_KEYS,
    PROP_MESSAGE_ID,
    PROP_TAGS,
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
    ) -> None:
        self._store = store
        self._notifier = notifier
        self._topics = topics
        self._window_ms = dedup_window_ms
        self._rr = itertools.count()
        self._inflight: dict[str, asyncio.Future[SendReceipt]] = {}

    def to_message(self, req: SendRequest) -> Message:
        topic = self._topics.get(req.topic)
        if req.deliver_at_ms is not None:
            # Refuse rather than deliver early: the delay scheduler is not built yet.
            raise InvalidArgument("delayed delivery (deliver_at_ms) is not supported yet")
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

    async def send(self, req: SendRequest) -> SendReceipt:
        msg = self.to_message(req)
        ik = req.idempotency_key
        if ik is None:
            res = await self._store.append(msg)
            self._notify(res.topic, res.queue_id)
            return SendReceipt(res.message_id, res.topic, res.queue_id, res.queue_offset)
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
                res = await self._store.append(msg)
                self._notify(res.topic, res.queue_id)
                receipt = SendReceipt(res.message_id, res.topic, res.queue_id, res.queue_offset)
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
            return [await self.send(r) for r in reqs]
        msgs = [self.to_message(r) for r in reqs]
        results = await self._store.append_batch(msgs)
        for topic, qid in {(r.topic, r.queue_id) for r in results}:
            self._notify(topic, qid)
        return [SendReceipt(r.message_id, r.topic, r.queue_id, r.queue_offset) for r in results]

    def _notify(self, topic: str, queue_id: int) -> None:
        # Called once the append is acknowledged, i.e. readable (durable, in sync mode).
        if self._notifier is not None:
            self._notifier.notify(topic, queue_id)

    async def _find_stored(self, ik: str) -> StoredMessage | None:
        since = time.time_ns() // 1_000_000 - self._window_ms
        found = await self._store.lookup(KeyKind.IDEMPOTENCY_KEY, ik, limit=1, since_ms=since)
        return found[0] if found else None


def _receipt(m: StoredMessage, *, duplicate: bool) -> SendReceipt:
    return SendReceipt(m.message_id or "", m.topic, m.queue_id, m.queue_offset, duplicate)


def _as_duplicate(r: SendReceipt) -> SendReceipt:
    return SendReceipt(r.message_id, r.topic, r.queue_id, r.queue_offset, True)
