"""The message store: the one object the broker talks to for durable messages.

Appends run on the event loop: encode, copy into the mapped segment, index; then, in ``sync``
mode, wait for the group commit that covers the record. Reads of recent data come straight
from the mapping; older reads go to a worker thread. A background task checkpoints and applies
retention.

    store = await MessageStore.open(StoreConfig(Path("data")))
    res = await store.append(Message(topic="orders", body=b"..."))
    got = await store.get_messages("orders", 0, 0, max_count=32)
    await store.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import logging
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final, TypeAlias

import msgspec

from txbroker.errors import (
    InvalidArgument,
    InvalidOffset,
    MessageTooLarge,
    NotFound,
    StoreClosed,
    StoreFailed,
    StoreLocked,
)
from txbroker.protocol.ids import new_id
from txbroker.protocol.names import validate_topic
from txbroker.store.checkpoint import (
    Checkpoint,
    ShutdownMarker,
    queue_key,
    write_checkpoint,
)
from txbroker.store.commitlog import CommitLog
from txbroker.store.config import FlushMode, StoreConfig
from txbroker.store.consumequeue import ConsumeQueue, tag_hash
from txbroker.store.flush import GroupCommitter
from txbroker.store.keyindex import KeyIndex, KeyKind
from txbroker.store.mapped import MappedFile, fsync_dir
from txbroker.store.record import (
    HEADER,
    MAGIC_MESSAGE,
    MAX_QUEUE_ID,
    PROP_IDEMPOTENCY_KEY,
    PROP_INTERNAL_KEY,
    PROP_KEYS,
    PROP_MESSAGE_ID,
    Message,
    RecordFlag,
    StoredMessage,
    decode_record,
    encode_properties,
)
from txbroker.store.recovery import RecoveryReport, dispatch, load_queues, recover

__all__ = ["AppendResult", "GetResult", "MessageStore", "RetentionReport", "StoreState"]

log = logging.getLogger(__name__)


# Output of MessageStore._prepare: topic, topic bytes, body, queue id, flags, born ms,
# properties, encoded properties, message id.
_Prepared: TypeAlias = tuple[str, bytes, bytes, int, int, int, dict[str, str], bytes, str]


# Half messages are never looked up by key or id (their committed copies are), so they are not
# indexed: saves index space and time on the transaction hot path.
_UNINDEXED: Final = int(RecordFlag.TX_HALF)


class StoreState(enum.Enum):
    CREATED = "created"
    RECOVERING = "recovering"
    OPEN = "open"
    FAILED = "failed"  # an fsync failed: reads work, appends refused
    CLOSING = "closing"
    CLOSED = "closed"


_ALLOWED: dict[StoreState, frozenset[StoreState]] = {
    StoreState.CREATED: frozenset({StoreState.RECOVERING, StoreState.CLOSED}),
    StoreState.RECOVERING: frozenset({StoreState.OPEN, StoreState.CLOSED}),
    StoreState.OPEN: frozenset({StoreState.FAILED, StoreState.CLOSING}),
    StoreState.FAILED: frozenset({StoreState.CLOSING}),
    StoreState.CLOSING: frozenset({StoreState.CLOSED}),
    StoreState.CLOSED: frozenset(),
}


class AppendResult(msgspec.Struct, frozen=True, gc=False):
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    message_id: str
    store_timestamp_ms: int


class GetResult(msgspec.Struct, frozen=True):
    messages: list[StoredMessage]
    next_offset: int  # where the next read of this queue should start
    min_offset: int
    max_offset: int


class RetentionReport(msgspec.Struct, frozen=True):
    segments_deleted: int
    bytes_freed: int
    log_min_offset: int


class MessageStore:
    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.dir = Path(config.data_dir)
        self._state = StoreState.CREATED
        self._sync = config.flush is FlushMode.SYNC
        self.log = CommitLog(self.dir / "commitlog", config.segment_bytes, buffered=self._sync)
        self.index = KeyIndex(self.dir / "index", config.index_slots, config.index_capacity)
        self._cq_root = self.dir / "consumequeue"
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._topic_bytes: dict[str, bytes] = {}
        self._dirty_queues: set[ConsumeQueue] = set()
        self._marker = ShutdownMarker(self.dir)
        self._lock_fd = -1
        self._committer: GroupCommitter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.recovery: RecoveryReport | None = None
        self._append_waiters: set[asyncio.Future[None]] = set()
        self._max_body = config.max_body_bytes

    # --- lifecycle ------------------------------------------------------------------------

    def _transition(self, to: StoreState) -> None:
        if to not in _ALLOWED[self._state]:
            raise AssertionError(f"store cannot go from {self._state.value} to {to.value}")
        self._state = to

    @property
    def state(self) -> StoreState:
        return self._state

    @classmethod
    async def open(cls, config: StoreConfig) -> MessageStore:
        store = cls(config)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, store._open_files)
        except BaseException:
            await loop.run_in_executor(None, store._close_files_quietly)
            raise
        store._committer = GroupCommitter(loop, store.log)
        store._transition(StoreState.OPEN)
        store._tasks.append(asyncio.create_task(store._housekeeping(), name="txb-store-house"))
        if not store._sync:
            store._tasks.append(asyncio.create_task(store._interval_flush(), name="txb-flush"))
        return store

    def _open_files(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise StoreLocked(f"{self.dir} is in use by another process") from e
        self._transition(StoreState.RECOVERING)
        abnormal = self._marker.was_abnormal()
        self.log.load()
        self.index.load()
        self.queues = load_queues(self._cq_root, self.config.cq_entries_per_file)
        self.recovery = recover(
            self.dir,
            self.log,
            self.queues,
            self.index,
            self._cq_root,
            self.config.cq_entries_per_file,
            abnormal,
            self.config.truncate_damaged_tail,
        )
        rep = self.recovery
        if rep.records_replayed or rep.queues_rebuilt or rep.index_rebuilt or abnormal:
            for cq in self.queues.values():
                cq.sync(everything=True)
            self.log.sync_all()
            self.index.sync(everything=True)
            log.info(
                "recovered %s: %d records replayed from offset %d in %.2fs",
                self.dir,
                rep.records_replayed,
                rep.replay_from,
                rep.seconds,
            )
        # Retention may have deleted segments whose queue entries are still on disk: move each
        # queue's minimum past them, and drop files that only point into them.
        dead: list[MappedFile] = []
        for cq in self.queues.values():
            dead.extend(cq.drop_before_phys(self.log.min_offset))
        dead.extend(self.index.drop_before_phys(self.log.min_offset))
        _unlink_all(dead)
        write_checkpoint(self.dir, self._checkpoint_now())
        self._marker.set()

    def _close_files_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self._close_files()

    def _close_files(self) -> None:
        for cq in self.queues.values():
            cq.close()
        self.index.close()
        self.log.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    async def close(self) -> None:
        """Flush everything, write a final checkpoint, mark the shutdown clean."""
        if self._state in (StoreState.CLOSING, StoreState.CLOSED):
            return
        if self._state is StoreState.CREATED:
            self._transition(StoreState.CLOSED)
            return
        clean = self._state is StoreState.OPEN
        self._transition(StoreState.CLOSING)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        assert self._committer is not None
        loop = asyncio.get_running_loop()
        if clean:
            await self._committer.drain()
            cp = self._checkpoint_now()
            dirty = list(self.queues.values())
            await self._committer.run_in_durable_thread(lambda: self._make_durable(cp, dirty))
            if self._committer.failure is None:
                await loop.run_in_executor(None, self._marker.clear)
        self._committer.close()
        await loop.run_in_executor(None, self._close_files)
        self._transition(StoreState.CLOSED)

    def abandon(self) -> None:
        """Drop the store as a kill -9 would: no final flush, no checkpoint, the shutdown marker
        left in place, buffered (unacknowledged) records lost. For crash tests in one process."""
        for t in self._tasks:
            t.cancel()
        if self._committer is not None:
            self._committer.close()
        self._close_files()
        self._state = StoreState.CLOSED

    async def __aenter__(self) -> MessageStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- append ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state is not StoreState.OPEN:
            if self._state is StoreState.FAILED and self._committer is not None:
                assert self._committer.failure is not None
                raise self._committer.failure
            raise StoreClosed(f"the store is {self._state.value}")
        if self._committer is not None and self._committer.failure is not None:
            self._transition(StoreState.FAILED)
            raise self._committer.failure

    def append_nowait(self, msg: Message) -> AppendResult:
        """Append without waiting for durability (see :meth:`durable`). All checks run before
        anything is written, so a rejected message leaves the store untouched."""
        self._check_open()
        return self._write(self._prepare(msg))

    def validate(self, msg: Message) -> None:
        """Raise what :meth:`append` would raise for ``msg``'s content, writing nothing."""
        self._prepare(msg)

    def _prepare(self, msg: Message) -> _Prepared:
        """Validate and encode what does not depend on the log position."""
        if not isinstance(msg, Message):
            raise InvalidArgument(f"expected a Message, got {type(msg).__name__}")
        topic = msg.topic
        tb = self._topic_bytes.get(topic)
        if tb is None:
            validate_topic(topic)
            tb = self._topic_bytes[topic] = topic.encode()
        body: object = msg.body
        if type(body) is not bytes:
            if not isinstance(body, bytearray | memoryview):
                raise InvalidArgument(f"body must be bytes, not {type(body).__name__}")
            body = bytes(body)
        if len(body) > self._max_body:
            raise MessageTooLarge(
                f"message body is {len(body)} bytes; the limit is {self._max_body}"
            )
        qid = msg.queue_id
        if type(qid) is not int or not 0 <= qid <= MAX_QUEUE_ID:
            raise InvalidArgument(f"queue_id must be an int in 0..{MAX_QUEUE_ID}, not {qid!r}")
        flags = msg.flags
        if not isinstance(flags, int) or not 0 <= flags <= 0xFFFF:  # RecordFlag is an int
            raise InvalidArgument(f"flags must be an int in 0..65535, not {flags!r}")
        born = msg.born_timestamp_ms
        if type(born) is not int or born < 0:
            raise InvalidArgument(f"born_timestamp_ms must be a non-negative int, not {born!r}")
        props = msg.properties
        if not isinstance(props, dict):
            raise InvalidArgument(f"properties must be a dict, not {type(props).__name__}")
        mid = props.get(PROP_MESSAGE_ID)
        if not mid:
            mid = new_id()
            props = {**props, PROP_MESSAGE_ID: mid}
        return (topic, tb, body, qid, flags, born, props, encode_properties(props), mid)

    def _write(self, p: _Prepared) -> AppendResult:
        topic, tb, body, qid, flags, born, props, props_b, mid = p
        try:
            key = (topic, qid)
            cq = self.queues.get(key)
            if cq is None:
                cq = self.queues[key] = ConsumeQueue(
                    self._cq_root, topic, qid, self.config.cq_entries_per_file
                )
            qoff = cq.max_offset
            store_ms = time.time_ns() // 1_000_000
            phys, size = self.log.append(
                tb, props_b, body, flags, qid, qoff, born or store_ms, store_ms
            )
            dispatch(
                cq, self.index, props, phys, size, qoff, store_ms, to_index=flags & _UNINDEXED == 0
            )
        except (OSError, StoreFailed) as e:
            # The record may be in the log and not in its queue: nothing can be undone safely
            # in place, so stop appending; reopening recovers a consistent state.
            failure = e if isinstance(e, StoreFailed) else StoreFailed(f"append failed: {e}")
            if failure is not e:
                failure.__cause__ = e
            assert self._committer is not None
            self._committer.poison(failure)
            self._transition(StoreState.FAILED)
            raise failure from None
        self._dirty_queues.add(cq)
        return AppendResult(topic, qid, qoff, phys, size, mid, store_ms)

    def durable(self) -> asyncio.Future[None] | None:
        """In sync mode, a future resolved when everything appended so far is on disk."""
        if not self._sync:
            return None
        assert self._committer is not None
        return self._committer.wait_durable()

    async def append(self, msg: Message) -> AppendResult:
        res = self.append_nowait(msg)
        if self._sync:
            assert self._committer is not None
            await self._committer.wait_durable()
        return res

    async def append_batch(self, msgs: Sequence[Message]) -> list[AppendResult]:
        """Append several messages; every one is validated before any is written."""
        self._check_open()
        prepared = [self._prepare(m) for m in msgs]
        out = [self._write(p) for p in prepared]
        if self._sync and out:
            assert self._committer is not None
            await self._committer.wait_durable()
        return out

    # --- read -----------------------------------------------------------------------------

    def _is_hot(self, phys: int) -> bool:
        return phys >= self.log.write_pos - self.config.hot_read_bytes

    async def read(self, physical_offset: int) -> StoredMessage:
        """The record at a physical offset (as returned by :meth:`append`)."""
        if type(physical_offset) is not int or physical_offset < 0:
            raise InvalidOffset(f"physical offset must be a non-negative int: {physical_offset!r}")
        self._check_readable()
        if self._is_hot(physical_offset):
            data = self.log.read_inline(physical_offset)
        else:
            loop = asyncio.get_running_loop()
            data = await loop.run_in_executor(None, self.log.read_cold, physical_offset)
        return decode_record(data)

    def _check_readable(self) -> None:
        if self._state not in (StoreState.OPEN, StoreState.FAILED):
            raise StoreClosed(f"the store is {self._state.value}")

    async def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        tags: Iterable[str] | None = None,
    ) -> GetResult:
        """Up to ``max_count`` messages of one queue from queue offset ``offset`` on."""
        validate_topic(topic)
        if type(offset) is not int or offset < 0:
            raise InvalidOffset(f"queue offset must be a non-negative int: {offset!r}")
        if max_count <= 0:
            raise InvalidArgument("max_count must be positive")
        self._check_readable()
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            return GetResult([], offset, 0, 0)
        hashes = {tag_hash(t) for t in tags} if tags is not None else None
        entries, next_off = cq.read(offset, max_count, hashes)
        limit = self.readable_offset
        for i, e in enumerate(entries):
            if e[1] >= limit:  # not durable yet: a consumer must not act on it
                entries, next_off = entries[:i], e[0]
                break
        if not entries:
            return GetResult([], max(next_off, cq.min_offset), cq.min_offset, cq.max_offset)
        if all(self._is_hot(e[1]) for e in entries):
            raws = [self.log.read_inline(e[1]) for e in entries]
        else:
            loop = asyncio.get_running_loop()
            raws = await loop.run_in_executor(
                None, lambda: [self.log.read_cold(e[1]) for e in entries]
            )
        msgs = [decode_record(r) for r in raws]
        return GetResult(msgs, next_off, cq.min_offset, cq.max_offset)

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min, max) queue offsets: readable messages are min <= offset < max."""
        cq = self.queues.get((topic, queue_id))
        return (cq.min_offset, cq.max_offset) if cq else (0, 0)

    def may_hold(self, kind: KeyKind, key: str) -> bool:
        """False when no message has ``key`` (no I/O); True means :meth:`lookup` may find one
        (the index matches 64-bit hashes, so a True is checked by reading the record)."""
        return bool(self.index.find(kind, key, 1))

    async def lookup(
        self, kind: KeyKind, key: str, *, limit: int = 32, since_ms: int = 0
    ) -> list[StoredMessage]:
        """Messages whose key, message id or idempotency key equals ``key``, newest first."""
        if not isinstance(key, str) or not key:
            raise InvalidArgument("lookup key must be a non-empty string")
        self._check_readable()
        seen: set[int] = set()
        out: list[StoredMessage] = []
        for phys in self.index.find(kind, key, limit * 4, since_ms):
            if phys in seen or phys < self.log.min_offset or phys >= self.log.write_pos:
                continue
            seen.add(phys)
            try:
                msg = await self.read(phys)
            except (NotFound, InvalidOffset):
                continue
            if msg.store_timestamp_ms >= since_ms and _has_key(msg, kind, key):
                out.append(msg)
                if len(out) >= limit:
                    break
        return out

    # --- durability, checkpoint, retention ------------------------------------------------

    def _checkpoint_now(self) -> Checkpoint:
        base, count = self.index.state()
        return Checkpoint(
            log_offset=self.log.write_pos,
            index_base=base,
            index_count=count,
            queues={queue_key(t, q): cq.max_offset for (t, q), cq in self.queues.items()},
            written_ms=time.time_ns() // 1_000_000,
        )

    def _make_durable(self, cp: Checkpoint, queues: list[ConsumeQueue]) -> None:
        """In the durable-work thread, once the log is durable up to ``cp.log_offset``."""
        for cq in queues:
            cq.sync()
        self.index.sync()
        write_checkpoint(self.dir, cp)

    async def checkpoint(self) -> Checkpoint:
        """Make queues and index durable up to the current end of the log and record it."""
        self._check_open()
        assert self._committer is not None
        cp = self._checkpoint_now()
        dirty, self._dirty_queues = list(self._dirty_queues), set()
        if self.index.files:
            self.index.files[-1].write_header()
        await self._committer.wait_durable()  # the log first: P must be durable before queues
        await self._committer.run_in_durable_thread(lambda: self._make_durable(cp, dirty))
        return cp

    async def enforce_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Delete whole segments older than ``retention_ms`` or beyond ``retention_bytes``;
        consume queues and index files that only point into them go too."""
        self._check_readable()
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        dead: list[MappedFile] = []
        cfg = self.config
        while len(self.log.segments) > 1:
            total = self.log.write_pos - self.log.min_offset
            over_size = cfg.retention_bytes is not None and total > cfg.retention_bytes
            expired = False
            if cfg.retention_ms is not None:
                newest_ms = _newest_ms(self.log.segments[0], self.log.segments[1])
                expired = newest_ms is not None and now_ms - newest_ms > cfg.retention_ms
            if not (over_size or expired):
                break
            seg = self.log.pop_oldest()
            if self._committer is not None:
                self._committer.forget(seg.base)
            dead.append(seg)
        if not dead:
            return RetentionReport(0, 0, self.log.min_offset)
        log_min = self.log.min_offset
        for cq in self.queues.values():
            dead.extend(cq.drop_before_phys(log_min))
        dead.extend(self.index.drop_before_phys(log_min))
        segments = sum(1 for f in dead if f.path.parent == self.log.dir)
        freed = sum(f.size for f in dead)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _unlink_all, dead)
        if self._state is StoreState.OPEN:
            await self.checkpoint()  # records the new log start; also syncs the directories
        return RetentionReport(segments, freed, log_min)

    async def _housekeeping(self) -> None:
        cfg = self.config
        next_retention = time.monotonic() + cfg.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(cfg.checkpoint_interval_ms / 1000)
            try:
                await self.checkpoint()
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + cfg.retention_check_interval_ms / 1000
                    rep = await self.enforce_retention()
                    if rep.segments_deleted:
                        log.info("retention deleted %d segments", rep.segments_deleted)
            except StoreFailed:
                return
            except Exception:  # keep housekeeping alive; the next round retries
                log.exception("store housekeeping failed")

    async def _interval_flush(self) -> None:
        assert self._committer is not None
        while True:
            await asyncio.sleep(self.config.flush_interval_ms / 1000)
            self._committer.request_flush()

    # --- statistics -----------------------------------------------------------------------

    @property
    def committer(self) -> GroupCommitter:
        assert self._committer is not None
        return self._committer

    @property
    def write_offset(self) -> int:
        return self.log.write_pos

    @property
    def readable_offset(self) -> int:
        """Consumers see records below this: in sync mode only durable ones, so no consumer
        ever acts on a record a power loss could still take back; in async mode all."""
        if self._sync:
            return self._committer.flushed if self._committer else 0
        return self.log.write_pos

    @property
    def flushed_offset(self) -> int:
        return self._committer.flushed if self._committer else 0


def _has_key(msg: StoredMessage, kind: KeyKind, key: str) -> bool:
    if kind is KeyKind.MESSAGE_ID:
        return msg.properties.get(PROP_MESSAGE_ID) == key
    if kind is KeyKind.IDEMPOTENCY_KEY:
        return msg.properties.get(PROP_IDEMPOTENCY_KEY) == key
    if kind is KeyKind.INTERNAL:
        return msg.properties.get(PROP_INTERNAL_KEY) == key
    return key in msg.properties.get(PROP_KEYS, "").split()


def _newest_ms(seg: MappedFile, successor: MappedFile) -> int | None:
    """Store time of the newest record in ``seg``: bounded by the first record of the next
    segment (everything in ``seg`` was stored before it). If the successor is still empty, fall
    back to the file's modification time (its last write)."""
    total, magic, *fields = HEADER.unpack_from(successor.mm, 0)
    if magic == MAGIC_MESSAGE and total:
        return int(fields[6])  # store_ms
    try:
        return int(os.stat(seg.path).st_mtime * 1000)
    except FileNotFoundError:
        return None


def _unlink_all(files: list[MappedFile]) -> None:
    for f in files:
        f.close(unlink=True)
    for d in {f.path.parent for f in files}:
        if d.exists():
            fsync_dir(d)
