"""The store's read paths: one record by physical offset, a queue's messages, lookups by key.

Reads of recent data (the last ``hot_read_bytes`` of the log) come straight from the mapping
on the event loop; older reads go to a worker thread. Consumers see only records below
``Flusher.readable_offset``: in sync flush mode the durable ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import msgspec

from txbroker.errors import CorruptLog, InvalidArgument, InvalidOffset, NotFound
from txbroker.protocol.names import validate_topic
from txbroker.store.commitlog import CommitLog
from txbroker.store.config import StoreConfig
from txbroker.store.consumequeue import ConsumeQueues, tag_hash
from txbroker.store.fences import Fences
from txbroker.store.flush import Flusher
from txbroker.store.keyindex import KeyIndex, KeyKind
from txbroker.store.record import (
    PROP_IDEMPOTENCY_KEY,
    PROP_INTERNAL_KEY,
    PROP_KEYS,
    PROP_MESSAGE_ID,
    StoredMessage,
    check_record,
    decode_record,
)
from txbroker.store.state import Lifecycle

__all__ = ["GetResult", "Reader"]


class GetResult(msgspec.Struct, frozen=True):
    messages: list[StoredMessage]
    next_offset: int  # where the next read of this queue should start
    min_offset: int
    max_offset: int


class Reader:
    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        index: KeyIndex,
        queues: ConsumeQueues,
        fences: Fences,
        flusher: Flusher,
        lifecycle: Lifecycle,
    ) -> None:
        self._log = commitlog
        self._index = index
        self._queues = queues.by_key
        self._fences = fences
        self._flusher = flusher
        self._lifecycle = lifecycle
        self._hot_bytes = config.hot_read_bytes

    def _is_hot(self, phys: int) -> bool:
        return phys >= self._log.write_pos - self._hot_bytes

    async def read(self, physical_offset: int) -> StoredMessage:
        """The record at a physical offset (as returned by :meth:`append`)."""
        if type(physical_offset) is not int or physical_offset < 0:
            raise InvalidOffset(f"physical offset must be a non-negative int: {physical_offset!r}")
        self._lifecycle.check_readable()
        if self._is_hot(physical_offset):
            data = self._log.read_inline(physical_offset)
        else:
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(None, self._log.read_cold, physical_offset)
        return _decoded(data, physical_offset)

    async def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        tags: Iterable[str] | None = None,
    ) -> GetResult:
        """Up to ``max_count`` messages of one queue from queue offset ``offset`` on. Messages
        of deleted topics are skipped (see ``fences.py``), so an answer may hold fewer than
        the queue's entries, or none, with ``next_offset`` past them: page by ``next_offset``.
        """
        validate_topic(topic)
        if type(offset) is not int or offset < 0:
            raise InvalidOffset(f"queue offset must be a non-negative int: {offset!r}")
        if max_count <= 0:
            raise InvalidArgument("max_count must be positive")
        self._lifecycle.check_readable()
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            start = self._fences.start(topic, queue_id)
            return GetResult([], max(offset, start), start, start)
        hashes = {tag_hash(t) for t in tags} if tags is not None else None
        entries, next_off = cq.read(offset, max_count, hashes)
        limit = self._flusher.readable_offset
        for i, e in enumerate(entries):
            if e[1] >= limit:  # not durable yet: a consumer must not act on it
                entries, next_off = entries[:i], e[0]
                break
        if not entries:
            return GetResult([], max(next_off, cq.min_offset), cq.min_offset, cq.max_offset)
        if all(self._is_hot(e[1]) for e in entries):
            raws = [self._log.read_inline(e[1]) for e in entries]
        else:
            loop = asyncio.get_running_loop()
            raws = await loop.run_in_executor(
                None, lambda: [self._log.read_cold(e[1]) for e in entries]
            )
        try:
            msgs = [decode_record(r) for r in raws]
        except CorruptLog:  # rare: decoded again, one by one, to name the record's offset
            msgs = [_decoded(r, e[1]) for r, e in zip(raws, entries, strict=True)]
        if self._fences:
            # Copies in internal queues of a deleted topic's messages (and anything read while
            # the topic was being deleted) are skipped; next_offset moves past them.
            msgs = [
                m
                for m in msgs
                if not self._fences.is_dead(m.topic, m.properties, m.physical_offset)
            ]
        return GetResult(msgs, next_off, cq.min_offset, cq.max_offset)

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min, max) queue offsets: readable messages are min <= offset < max."""
        cq = self._queues.get((topic, queue_id))
        if cq is None:  # nothing stored yet (a re-created topic's queues start on, fences.py)
            start = self._fences.start(topic, queue_id)
            return (start, start)
        cut = self._flusher.cut_at
        if cut is not None:  # the store failed: what it cut off is not counted
            return (cq.min_offset, max(cq.first_at_or_after(cut), cq.min_offset))
        return (cq.min_offset, cq.max_offset)

    def may_hold(self, kind: KeyKind, key: str) -> bool:
        """False when no message has ``key`` (no I/O); True means :meth:`lookup` may find one
        (the index matches 64-bit hashes, so a True is checked by reading the record)."""
        return bool(self._index.find(kind, key, 1))

    async def lookup(
        self, kind: KeyKind, key: str, *, limit: int = 32, since_ms: int = 0
    ) -> list[StoredMessage]:
        """Messages whose key, message id or idempotency key equals ``key``, newest first."""
        if not isinstance(key, str) or not key:
            raise InvalidArgument("lookup key must be a non-empty string")
        self._lifecycle.check_readable()
        seen: set[int] = set()
        out: list[StoredMessage] = []
        # The index holds entries for a failed write's records (added as they were written):
        # they end at its cut, not at the end of the log.
        end = self._flusher.end
        for phys in self._index.find(kind, key, limit * 4, since_ms):
            if phys in seen or phys < self._log.min_offset or phys >= end:
                continue
            seen.add(phys)
            try:
                msg = await self.read(phys)
            except (NotFound, InvalidOffset):
                continue
            if kind is not KeyKind.INTERNAL and self._fences.is_dead(
                msg.topic, msg.properties, phys
            ):
                # A deleted topic's message is gone for readers. Internal keys still find it:
                # they answer "did this step happen?" (a transaction's decision record, a
                # retry's copy), which its deletion does not undo.
                continue
            if msg.store_timestamp_ms >= since_ms and _has_key(msg, kind, key):
                out.append(msg)
                if len(out) >= limit:
                    break
        return out


def _decoded(data: bytes, phys: int) -> StoredMessage:
    """The record read at ``phys``; a CorruptLog names the offset (the one a reader can act on:
    ``decode_record`` sees a buffer, not the log)."""
    try:
        return decode_record(data)
    except CorruptLog as e:
        why = check_record(data) or str(e)
        raise CorruptLog(f"the record at physical offset {phys} is corrupt: {why}") from e


def _has_key(msg: StoredMessage, kind: KeyKind, key: str) -> bool:
    if kind is KeyKind.MESSAGE_ID:
        return msg.properties.get(PROP_MESSAGE_ID) == key
    if kind is KeyKind.IDEMPOTENCY_KEY:
        return msg.properties.get(PROP_IDEMPOTENCY_KEY) == key
    if kind is KeyKind.INTERNAL:
        return msg.properties.get(PROP_INTERNAL_KEY) == key
    return key in msg.properties.get(PROP_KEYS, "").split()
