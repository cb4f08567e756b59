"""The message store: the one object the broker talks to for durable messages.

Appends run on the event loop: encode, copy into the mapped segment, index; then, in ``sync``
mode, wait for the group commit that covers the record. Reads of recent data come straight
from the mapping; older reads go to a worker thread. A background task checkpoints and applies
retention.

    store = await MessageStore.open(StoreConfig(Path("data")))
    res = await store.append(Message(topic="orders", body=b"..."))
    got = await store.get_messages("orders", 0, 0, max_count=32)
    await store.close()

This module holds opening (lock, recovery), closing, and the append path. ``MessageStore``
extends the read paths (``txbroker.store.reads``) and the checkpoints and retention
(``txbroker.store.maintenance``), which share its parts through ``txbroker.store.core``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Sequence
from typing import Final, TypeAlias

import msgspec

from txbroker.errors import InvalidArgument, MessageTooLarge, StoreFailed, StoreLocked
from txbroker.protocol.ids import new_id
from txbroker.protocol.names import validate_topic
from txbroker.store.checkpoint import write_checkpoint
from txbroker.store.config import StoreConfig
from txbroker.store.consumequeue import ConsumeQueue
from txbroker.store.core import StoreState
from txbroker.store.flush import GroupCommitter
from txbroker.store.maintenance import StoreMaintenance, unlink_all
from txbroker.store.mapped import MappedFile
from txbroker.store.reads import StoreReads
from txbroker.store.record import (
    MAX_QUEUE_ID,
    PROP_MESSAGE_ID,
    Message,
    RecordFlag,
    encode_properties,
)
from txbroker.store.recovery import dispatch, load_queues, recover

__all__ = ["AppendResult", "MessageStore"]

log = logging.getLogger(__name__)


# Output of MessageStore._prepare: topic, topic bytes, body, queue id, flags, born ms,
# properties, encoded properties, message id.
_Prepared: TypeAlias = tuple[str, bytes, bytes, int, int, int, dict[str, str], bytes, str]


# Half messages are never looked up by key or id (their committed copies are), so they are not
# indexed: saves index space and time on the transaction hot path.
_UNINDEXED: Final = int(RecordFlag.TX_HALF)


class AppendResult(msgspec.Struct, frozen=True, gc=False):
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    message_id: str
    store_timestamp_ms: int


class MessageStore(StoreReads, StoreMaintenance):
    # --- lifecycle ------------------------------------------------------------------------

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
        unlink_all(dead)
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

    # --- statistics -----------------------------------------------------------------------

    @property
    def committer(self) -> GroupCommitter:
        assert self._committer is not None
        return self._committer

    @property
    def write_offset(self) -> int:
        return self.log.write_pos

    @property
    def flushed_offset(self) -> int:
        return self._committer.flushed if self._committer else 0
