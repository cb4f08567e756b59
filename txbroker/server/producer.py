"""Producing: a send's request becomes a stored message, appended, its receipt answered.

Queue choice: an explicit ``queue_id`` wins; else a key maps to ``crc32c(key) % queues`` (same
key, same queue, so per-key order holds); else sends rotate round-robin over the queues.
Idempotency: a send whose key was stored within the dedup window returns the original receipt
(``duplicate=True``) and stores nothing; the key index answers across restarts, and requests
holding one key are serialised through an in-flight table. The producer is also the
transaction coordinator's ``Publishing`` port (``txbroker.tx.ports``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from typing import Final

import google_crc32c

from txbroker.errors import InvalidArgument, InvalidName
from txbroker.protocol.messages import SendReceipt, SendRequest
from txbroker.protocol.names import SYSTEM_PREFIX
from txbroker.server.delay import PROP_TARGET_QUEUE, SCHEDULE_TOPIC, DelayScheduler
from txbroker.server.longpoll import Notifier
from txbroker.server.topics import Topic, TopicRegistry
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
    """Sends into the store: :meth:`publish`, and :meth:`publish_deduplicated` on top of it for
    requests with idempotency keys. Every front end (the wire handlers, an HTTP API, the
    transaction coordinator through :meth:`to_message`) goes through these."""

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
        # Idempotency keys held by a request now: others with one of them wait for it.
        self._inflight: dict[str, asyncio.Future[None]] = {}
        # The queues each pending group commit makes readable: woken together once durable.
        self._woken_by: dict[asyncio.Future[None], set[tuple[str, int]]] = {}

    # --- the send path ---

    def publish(
        self, reqs: Sequence[SendRequest]
    ) -> tuple[list[SendReceipt], asyncio.Future[None] | None]:
        """Append ``reqs`` now, all or none, without looking at idempotency keys; return their
        receipts and what the answer must wait for: the group commit that makes them durable
        (shared with every append until that commit starts: add callbacks, never cancel it),
        or None in async flush mode. Queues are woken once durable. No coroutine, task or
        future per request: this is most of what a send costs the broker.

        ::

            receipts, durable = producer.publish([SendRequest("orders", b"x")])
            if durable is not None:
                await asyncio.shield(durable)
        """
        if len(reqs) == 1:  # a single SEND, most of them: no lists to build and take apart
            msg = self._stored_form(reqs[0])
            res = self._store.append_nowait(msg)
            return [self._receipt(msg, res)], self._wake_when_durable((res,))
        return self._append([self._stored_form(r) for r in reqs])

    async def publish_deduplicated(self, reqs: Sequence[SendRequest]) -> list[SendReceipt]:
        """:meth:`publish` for requests with idempotency keys, answered once durable: every
        request is checked, every key looked up, then the new messages are appended in one
        all-or-nothing batch. A key already stored (or repeated in ``reqs``) is answered with
        the first receipt, ``duplicate=True``, once that is durable too. Keys are claimed all
        at once, after waiting (while claiming none) for requests holding any of them, so two
        never wait on each other."""
        built = [(self._stored_form(r), self._topics.get(r.topic)) for r in reqs]
        keys = {r.idempotency_key for r in reqs if r.idempotency_key is not None}
        while held := [self._inflight[k] for k in keys if k in self._inflight]:
            await asyncio.wait(held)  # their outcome is in the index by the time we look
        loop = asyncio.get_running_loop()
        claimed = {k: loop.create_future() for k in keys}
        self._inflight.update(claimed)
        try:
            by_key: dict[str, SendReceipt] = {}
            # A key found stored may not be durable yet: its first request may have timed out
            # waiting for the slaves, its record left in the log. A duplicate is an
            # acknowledgement too, so it waits for what it answers for, as the first did.
            undurable = False
            for k in keys:
                found = await self._find_stored(k)
                if found is not None:
                    by_key[k] = _receipt(found, duplicate=True)
                    end = found.physical_offset + found.size
                    undurable = undurable or end > self._store.readable_offset
            todo: list[int] = []  # what is appended: no key, or a key's first new message
            for i, r in enumerate(reqs):
                ik = r.idempotency_key
                if ik is None or ik not in by_key:
                    todo.append(i)
                    if ik is not None:
                        by_key[ik] = _PENDING
            msgs = [self._still_valid(reqs[i], *built[i]) for i in todo]
            new, durable = self._append(msgs)
            if durable is None and undurable:
                durable = self._store.durable_together()
            if durable is not None:
                await asyncio.shield(durable)
            out = dict(zip(todo, new, strict=True))
            for i in todo:
                ik = reqs[i].idempotency_key
                if ik is not None:
                    by_key[ik] = out[i]
            return [
                out[i] if i in out else _as_duplicate(by_key[r.idempotency_key or ""])
                for i, r in enumerate(reqs)
            ]
        finally:
            for k, fut in claimed.items():
                del self._inflight[k]
                fut.set_result(None)  # waiters look the key up again: stored, or not

    def _still_valid(self, req: SendRequest, msg: Message, topic: Topic) -> Message:
        """``msg`` as built before the index was read, or built again if its topic changed
        meanwhile (deleted: refused; created again, maybe with other queues)."""
        return msg if self._topics.get(req.topic) is topic else self._stored_form(req)

    def _append(self, msgs: list[Message]) -> tuple[list[SendReceipt], asyncio.Future[None] | None]:
        if not msgs:
            return [], None
        results = self._store.append_batch_nowait(msgs)
        receipts = [self._receipt(m, r) for m, r in zip(msgs, results, strict=True)]
        return receipts, self._wake_when_durable(results)

    def _stored_form(self, req: SendRequest) -> Message:
        """The message as it is appended: itself, or its schedule copy when delayed."""
        msg = self.to_message(req)
        if req.deliver_at_ms is not None and req.deliver_at_ms > time.time_ns() // 1_000_000:
            return self.schedule(msg, req.deliver_at_ms)
        return msg

    # --- the transaction coordinator's Publishing port (txbroker.tx.ports) ---

    def to_message(self, req: SendRequest) -> Message:
        name = req.topic
        if name.startswith(SYSTEM_PREFIX):  # internal topics are the broker's own
            raise InvalidName(f"topic {name!r} is reserved for the broker (leading '%')")
        topic = self._topics.get(name)  # the name's one check: known, or why not
        key, tags, ik = req.key, req.tags, req.idempotency_key
        if key is not None:
            _check_identifier("key", key)
        if tags is not None:
            _check_identifier("tags", tags)
        if ik is not None:
            _check_identifier("idempotency_key", ik)
        qid = req.queue_id
        if qid is not None:
            if not 0 <= qid < topic.queues:
                raise InvalidArgument(f"queue {qid} does not exist in {topic.name!r}")
        elif key is not None:
            qid = queue_for_key(key, topic.queues)
        else:
            qid = next(self._rr) % topic.queues
        headers = req.headers
        props = {HEADER_PREFIX + k: v for k, v in headers.items()} if headers else {}
        if key is not None:
            props[PROP_KEYS] = key
        if tags is not None:
            props[PROP_TAGS] = tags
        if ik is not None:
            props[PROP_IDEMPOTENCY_KEY] = ik
        if req.message_id is not None:
            props[PROP_MESSAGE_ID] = req.message_id
        return Message(topic.name, req.body, queue_id=qid, properties=props)

    def schedule(self, msg: Message, deliver_at_ms: int) -> Message:
        if self._scheduler is None:
            raise InvalidArgument("this broker does not deliver delayed messages")
        return self._scheduler.prepare(msg, deliver_at_ms)

    def scheduled(self, level: int) -> None:
        assert self._scheduler is not None  # a scheduled copy was made by it
        self._scheduler.notify(level)

    def ensure_system_topic(self, name: str, queues: int) -> None:
        self._topics.ensure_system(name, queues)

    # --- after the append ---

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

    def _wake(self, topic: str, qid: int) -> None:
        if topic == SCHEDULE_TOPIC:
            self.scheduled(qid)
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


def _check_identifier(name: str, value: str) -> None:
    if not value or len(value.encode()) > MAX_KEY_BYTES or " " in value:
        raise InvalidArgument(f"{name} must be 1-{MAX_KEY_BYTES} bytes with no spaces")


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


# Marks a key whose first message is in this request (publish_deduplicated): never answered.
_PENDING: Final = SendReceipt("", "", 0, SCHEDULED_OFFSET)
