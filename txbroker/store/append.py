"""Appending: validate and encode messages, reserve every file they need, write them to the
commit log, and index them (consume-queue entry, key-index entries).

An append is all or nothing: whatever can fail for want of space or permission is created
before anything is written. ``index_record`` is also how recovery and replication replay a
record, so appends and replays build byte-identical queues and the same key index.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final, TypeAlias

from txbroker.errors import InvalidArgument, MessageTooLarge, StoreFailed
from txbroker.protocol.ids import ID_CHARS, new_id
from txbroker.protocol.names import validate_topic
from txbroker.store.commitlog import CommitLog
from txbroker.store.config import StoreConfig
from txbroker.store.consumequeue import ConsumeQueue, ConsumeQueues, tag_hash
from txbroker.store.flush import Flusher
from txbroker.store.keyindex import KeyIndex, KeyKind
from txbroker.store.record import (
    HEADER,
    KEY_SEPARATOR,
    MAX_QUEUE_ID,
    PROP_IDEMPOTENCY_KEY,
    PROP_INTERNAL_KEY,
    PROP_KEYS,
    PROP_MESSAGE_ID,
    PROP_TAGS,
    Message,
    RecordFlag,
    encode_properties,
)

__all__ = ["UNINDEXED", "AppendResult", "Appender", "index_record"]

# Half messages are never looked up by key or id (their committed copies are), so they are not
# indexed: saves index space and time on the transaction hot path.
UNINDEXED: Final = int(RecordFlag.TX_HALF)
_HEADER_BYTES: Final = HEADER.size
# The key kinds as plain ints: compiled, a Final int is a constant, where reading an enum's
# member goes through its class's attribute lookup (hundreds of instructions a time).
_MESSAGE_ID: Final = int(KeyKind.MESSAGE_ID)
_KEY: Final = int(KeyKind.KEY)
_IDEMPOTENCY_KEY: Final = int(KeyKind.IDEMPOTENCY_KEY)
_INTERNAL: Final = int(KeyKind.INTERNAL)

# The encoded properties of a message whose only property is the id new_id() gave it, less the
# id's bytes (the encoder's own output, so the bytes are the same as encoding the map): most
# sends carry no properties, and this spares them a copied dict and a call to the encoder.
_ID_ONLY_HEAD: Final = encode_properties({PROP_MESSAGE_ID: "0" * ID_CHARS})[:-ID_CHARS]

# Output of Appender.prepare: topic, topic bytes, body, queue id, flags, born ms, properties,
# encoded properties, message id.
_Prepared: TypeAlias = tuple[str, bytes, bytes, int, int, int, dict[str, str], bytes, str]


class AppendResult:
    """Where a message was appended. A plain class, not a ``msgspec.Struct``: compiled, making
    one is a C call with its fields stored unboxed where they can be, and one is made per message;
    a ``Struct`` stays a Python class whose construction goes through Python's call machinery."""

    def __init__(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        physical_offset: int,
        size: int,
        message_id: str,
        store_timestamp_ms: int,
    ) -> None:
        self.topic: Final = topic
        self.queue_id: Final = queue_id
        self.queue_offset: Final = queue_offset
        self.physical_offset: Final = physical_offset
        self.size: Final = size
        self.message_id: Final = message_id
        self.store_timestamp_ms: Final = store_timestamp_ms

    def __repr__(self) -> str:
        return (
            f"AppendResult({self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, physical_offset={self.physical_offset})"
        )


def index_record(
    queue: ConsumeQueue,
    index: KeyIndex,
    props: dict[str, str],
    phys: int,
    size: int,
    qoff: int,
    store_ms: int,
    *,
    to_queue: bool = True,
    to_index: bool = True,
) -> None:
    """Record one stored message in its consume queue and the key index."""
    if to_queue:
        tags = props.get(PROP_TAGS)
        queue.put(qoff, phys, size, tag_hash(tags) if tags else 0)  # most have none: no call
    if to_index:
        mid = props.get(PROP_MESSAGE_ID)
        if mid:
            index.add(_MESSAGE_ID, mid, phys, store_ms)
        keys = props.get(PROP_KEYS)
        if keys:
            for k in keys.split(KEY_SEPARATOR):
                if k:
                    index.add(_KEY, k, phys, store_ms)
        ik = props.get(PROP_IDEMPOTENCY_KEY)
        if ik:
            index.add(_IDEMPOTENCY_KEY, ik, phys, store_ms)
        ix = props.get(PROP_INTERNAL_KEY)
        if ix:
            index.add(_INTERNAL, ix, phys, store_ms)


def _entries(props: dict[str, str]) -> int:
    """How many key-index entries index_record() makes for a record with ``props`` (an upper
    bound)."""
    keys = props.get(PROP_KEYS)
    n = 1 + (keys.count(KEY_SEPARATOR) + 1 if keys else 0)
    return n + (PROP_IDEMPOTENCY_KEY in props) + (PROP_INTERNAL_KEY in props)


class Appender:
    """The store's write path, on the event loop, without yielding."""

    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        index: KeyIndex,
        queues: ConsumeQueues,
        flusher: Flusher,
    ) -> None:
        self._log = commitlog
        self._index = index
        self._queues = queues
        self._flusher = flusher
        self._max_body = config.max_body_bytes
        self._topic_bytes: dict[str, bytes] = {}

    def prepare(self, msg: Message) -> _Prepared:
        """Validate and encode what does not depend on the log position."""
        if not isinstance(msg, Message):
            raise InvalidArgument(f"expected a Message, got {type(msg).__name__}")
        # Read untyped: a field of any type must reach its check below (compiled by mypyc, a
        # typed read raises TypeError first).
        m: Any = msg
        topic = m.topic
        tb = self._topic_bytes.get(topic)
        if tb is None:
            validate_topic(topic)
            tb = self._topic_bytes[topic] = topic.encode()
        body: object = m.body
        if type(body) is not bytes:
            if not isinstance(body, bytearray | memoryview):
                raise InvalidArgument(f"body must be bytes, not {type(body).__name__}")
            body = bytes(body)
        if len(body) > self._max_body:
            raise MessageTooLarge(
                f"message body is {len(body)} bytes; the limit is {self._max_body}"
            )
        qid = m.queue_id
        if type(qid) is not int or not 0 <= qid <= MAX_QUEUE_ID:
            raise InvalidArgument(f"queue_id must be an int in 0..{MAX_QUEUE_ID}, not {qid!r}")
        flags = m.flags
        if not isinstance(flags, int) or not 0 <= flags <= 0xFFFF:  # RecordFlag is an int
            raise InvalidArgument(f"flags must be an int in 0..65535, not {flags!r}")
        born = m.born_timestamp_ms
        if type(born) is not int or born < 0:
            raise InvalidArgument(f"born_timestamp_ms must be a non-negative int, not {born!r}")
        props = m.properties
        if not isinstance(props, dict):
            raise InvalidArgument(f"properties must be a dict, not {type(props).__name__}")
        mid = props.get(PROP_MESSAGE_ID)
        if not mid:
            mid = new_id()
            if not props:
                props_b: bytes = _ID_ONLY_HEAD + mid.encode()
                return (topic, tb, body, qid, flags, born, {PROP_MESSAGE_ID: mid}, props_b, mid)
            props = {**props, PROP_MESSAGE_ID: mid}
        return (topic, tb, body, qid, flags, born, props, encode_properties(props), mid)

    def write_one(self, p: _Prepared) -> AppendResult:
        """:meth:`write_all` of one record, without a batch's lists and tables: a single send,
        most of the messages a broker stores."""
        topic, tb, body, qid, flags, _born, props, props_b, _mid = p
        key = (topic, qid)
        log = self._log
        try:
            phys = log.reserve_one(_HEADER_BYTES + len(tb) + len(props_b) + len(body))
            cq = self._queues.by_key.get(key)
            if cq is None:
                cq = self._queues.new(topic, qid)
            cq.reserve(1)
            self._index.reserve(0 if flags & UNINDEXED else _entries(props), phys)
        except (OSError, StoreFailed) as e:
            raise StoreFailed(f"append refused, nothing was written: {e}") from e
        first = log.write_pos
        try:
            res = self._write_record(p, key, cq, time.time_ns() // 1_000_000)
            self._queues.dirty.add(cq)
            return res
        except (OSError, StoreFailed) as e:
            self._flusher.fail_write(e, first)

    def write_all(self, batch: Sequence[_Prepared]) -> list[AppendResult]:
        """Append every record of ``batch`` or none. Everything that can fail for want of
        space or permission (a log segment, a queue file, a key-index file) is created first;
        if that fails, nothing was written, the store stays open, and the next append tries
        again (a full disk refuses appends until space comes back). Only an I/O error while
        writing what was reserved fails the store (``Flusher.fail_write``)."""
        try:
            queues = self._reserve(batch)
        except (OSError, StoreFailed) as e:
            raise StoreFailed(f"append refused, nothing was written: {e}") from e
        first = self._log.write_pos
        try:
            return self._write(batch, queues)
        except (OSError, StoreFailed) as e:
            self._flusher.fail_write(e, first)

    def _reserve(self, batch: Sequence[_Prepared]) -> dict[tuple[str, int], ConsumeQueue]:
        """Create the files ``batch`` will be written to (see :meth:`write_all`); return its
        consume queues, new ones included (they join the store when a record is written)."""
        sizes: list[int] = []
        counts: dict[tuple[str, int], int] = {}
        entries = 0
        for topic, tb, body, qid, flags, _born, props, props_b, _mid in batch:
            sizes.append(_HEADER_BYTES + len(tb) + len(props_b) + len(body))
            counts[(topic, qid)] = counts.get((topic, qid), 0) + 1
            if not flags & UNINDEXED:
                entries += _entries(props)
        phys = self._log.reserve(sizes)
        known = self._queues.by_key
        queues: dict[tuple[str, int], ConsumeQueue] = {}
        for key, n in counts.items():
            cq = known.get(key)
            if cq is None:
                cq = self._queues.new(*key)
            cq.reserve(n)
            queues[key] = cq
        self._index.reserve(entries, phys)
        return queues

    def _write(
        self, batch: Sequence[_Prepared], queues: dict[tuple[str, int], ConsumeQueue]
    ) -> list[AppendResult]:
        """Write the reserved records, each to the log, its consume queue and the key index.
        One clock reading stamps the batch, and what does not change from record to record is
        looked up once: this is the append hot path, where every message's cost passes."""
        store_ms = time.time_ns() // 1_000_000
        out: list[AppendResult] = []
        for p in batch:
            key = (p[0], p[3])
            out.append(self._write_record(p, key, queues[key], store_ms))
        self._queues.dirty.update(queues.values())
        return out

    def _write_record(
        self, p: _Prepared, key: tuple[str, int], cq: ConsumeQueue, store_ms: int
    ) -> AppendResult:
        """Write one reserved record to the log, its consume queue ``cq`` (the queue of
        ``key``) and the key index."""
        topic, tb, body, qid, flags, born, props, props_b, mid = p
        qoff = cq.max_offset
        # The log's method called on it, not through a bound method: a C call compiled.
        phys, size = self._log.append(
            tb, props_b, body, flags, qid, qoff, born or store_ms, store_ms
        )
        known = self._queues.by_key
        if known.get(key) is not cq:
            known[key] = cq
        index_record(
            cq, self._index, props, phys, size, qoff, store_ms, to_index=not flags & UNINDEXED
        )
        return AppendResult(topic, qid, qoff, phys, size, mid, store_ms)
