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
from txbroker.server.delay import PROP_TARGET_QUEUE, SCHEDULE_TOPIC, DelayScheduler
from txbroker.server.longpoll import Notifier
from txbroker.server.topics import TopicRegistry
from txbroker.store import (
    PROP_IDEMPOTENCY_KEY,
    PROP_KEYS,
    PROP_MESSAGE_ID,
    PROP_TAGS,
    PROP_TARGET_TOPIC,
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
        # The queues each pending group commit makes readable (send_nowait): woken together.
        self._woken_by: dict[asyncio.Future[None], set[tuple[str, int]]] = {}

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
                # Again, now: the topic may have been deleted (or re-created with other queues)
                # while the index was read, and nothing may land in a deleted topic.
                msg = self._stored_form(req)
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
        """All or nothing: every message is validated, then what is stored is appended in one
        batch, one group commit for the lot; if that fails, none of it is stored."""
        if any(r.idempotency_key is not None for r in reqs):
            for r in reqs:  # validate every one, store limits included, before sending any
                self._store.validate(self._stored_form(r))
            return await self._send_batch_deduplicated(reqs)
        msgs = [self._stored_form(r) for r in reqs]
        results = await self._store.append_batch(msgs)
        return [self._after_append(m, r) for m, r in zip(msgs, results, strict=True)]

    async def _send_batch_deduplicated(self, reqs: Sequence[SendRequest]) -> list[SendReceipt]:
        """A batch with idempotency keys: look every key up, then append the new messages in
        one all-or-nothing batch. A key repeated in the batch is stored once (the repeats are
        duplicates of the first). The keys are claimed in the in-flight table all at once, after
        waiting (while claiming none) for other requests that hold any of them, so two batches
        never wait for each other."""
        keys = {r.idempotency_key for r in reqs if r.idempotency_key is not None}
        while held := [self._inflight[k] for k in keys if k in self._inflight]:
            await asyncio.wait(held)  # their outcome is in the index by the time we look
        loop = asyncio.get_running_loop()
        claimed: dict[str, asyncio.Future[SendReceipt]] = {k: loop.create_future() for k in keys}
        self._inflight.update(claimed)
        try:
            by_key: dict[str, SendReceipt] = {}
            for k in keys:
                found = await self._find_stored(k)
                if found is not None:
                    by_key[k] = _receipt(found, duplicate=True)
            todo: list[int] = []  # what is appended: no key, or a key's first new message
            queued: set[str] = set()
            for i, r in enumerate(reqs):
                ik = r.idempotency_key
                if ik is None or (ik not in by_key and ik not in queued):
                    todo.append(i)
                    if ik is not None:
                        queued.add(ik)
            # Built again, now: the topic may have been deleted while the index was read.
            msgs = [self._stored_form(reqs[i]) for i in todo]
            results = await self._store.append_batch(msgs) if msgs else []
            out: dict[int, SendReceipt] = {}
            for i, m, res in zip(todo, msgs, results, strict=True):
                out[i] = self._after_append(m, res)
                ik = reqs[i].idempotency_key
                if ik is not None:
                    by_key[ik] = out[i]
            receipts = [
                out[i] if i in out else _as_duplicate(by_key[r.idempotency_key or ""])
                for i, r in enumerate(reqs)
            ]
            for k, fut in claimed.items():
                fut.set_result(by_key[k])
            return receipts
        except BaseException as e:
            for fut in claimed.values():
                if not fut.done():
                    fut.set_exception(e)
                    fut.exception()  # mark retrieved: waiters re-raise it, nobody logs it
            raise
        finally:
            for k in keys:
                del self._inflight[k]

    def send_nowait(self, req: SendRequest) -> tuple[SendReceipt, asyncio.Future[None] | None]:
        """Append a send without an idempotency key now; return its receipt and what the
        answer must wait for: the group commit that makes it durable (shared with every append
        until that commit starts), or None in async flush mode. Queues are woken once it is
        durable. The task-free front of :meth:`send` (``handlers.py``): no coroutine, task or
        future per message, which was most of what a single send cost the broker."""
        assert req.idempotency_key is None, "deduplicated sends need send()"
        msg = self._stored_form(req)
        res = self._store.append_nowait(msg)
        return self._receipt(msg, res), self._wake_when_durable((res,))

    def send_batch_nowait(
        self, reqs: Sequence[SendRequest]
    ) -> tuple[list[SendReceipt], asyncio.Future[None] | None]:
        """:meth:`send_batch` for a batch without idempotency keys, as :meth:`send_nowait`
        answers: all or nothing, appended now, the receipts and what to wait for."""
        assert all(r.idempotency_key is None for r in reqs), "deduplicated sends need send_batch()"
        msgs = [self._stored_form(r) for r in reqs]
        results = self._store.append_batch_nowait(msgs)
        receipts = [self._receipt(m, r) for m, r in zip(msgs, results, strict=True)]
        return receipts, self._wake_when_durable(results)

    def _wake_when_durable(self, results: Sequence[AppendResult]) -> asyncio.Future[None] | None:
        """Wake the queues of ``results`` once they are durable (now, in async flush mode);
        return the group commit to wait for, or None."""
        durable = self._store.durable_together()
        if durable is None:
            for res in results:
                self._wake(res.topic, res.queue_id)
            return None
        woken = self._woken_by.get(durable)
        if woken is None:
            woken = self._woken_by[durable] = set()
            durable.add_done_callback(self._wake_all)
        for res in results:
            woken.add((res.topic, res.queue_id))
        return durable

    def _wake_all(self, durable: asyncio.Future[None]) -> None:
        woken = self._woken_by.pop(durable)
        if not durable.cancelled() and durable.exception() is None:
            for topic, qid in woken:
                self._wake(topic, qid)

    def _after_append(self, msg: Message, res: AppendResult) -> SendReceipt:
        """Wake whoever waits for this queue (the append is acknowledged, so readable: durable
        in sync mode) and make the producer's receipt."""
        self._wake(res.topic, res.queue_id)
        return self._receipt(msg, res)

    def _wake(self, topic: str, qid: int) -> None:
        if topic == SCHEDULE_TOPIC:
            assert self._scheduler is not None
            self._scheduler.notify(qid)
        elif self._notifier is not None:
            self._notifier.notify(topic, qid)

    @staticmethod
    def _receipt(msg: Message, res: AppendResult) -> SendReceipt:
        if res.topic == SCHEDULE_TOPIC:
            return _scheduled_receipt(res.message_id, msg.properties)
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
