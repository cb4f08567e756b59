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
from collections.abc import Callable, Mapping, Sequence
from typing import Final, NoReturn, TypeAlias

import msgspec

from txbroker.errors import (
    InvalidArgument,
    MessageTooLarge,
    NotMaster,
    StoreFailed,
    StoreLocked,
)
from txbroker.protocol.ids import new_id
from txbroker.protocol.names import validate_topic
from txbroker.store.checkpoint import write_checkpoint
from txbroker.store.config import StoreConfig
from txbroker.store.consumequeue import ConsumeQueue
from txbroker.store.core import StoreState
from txbroker.store.deletion import StoreDeletion
from txbroker.store.fences import Fences, TopicFence
from txbroker.store.flush import GroupCommitter
from txbroker.store.maintenance import StoreMaintenance, unlink_all
from txbroker.store.mapped import MappedFile
from txbroker.store.reads import StoreReads
from txbroker.store.record import (
    HEADER,
    KEY_SEPARATOR,
    MAX_QUEUE_ID,
    PROP_IDEMPOTENCY_KEY,
    PROP_INTERNAL_KEY,
    PROP_KEYS,
    PROP_MESSAGE_ID,
    Message,
    RecordFlag,
    encode_properties,
)
from txbroker.store.recovery import dispatch, load_queues, recover
from txbroker.store.replica import StoreReplication

__all__ = ["AppendResult", "MessageStore"]

log = logging.getLogger(__name__)


# Output of MessageStore._prepare: topic, topic bytes, body, queue id, flags, born ms,
# properties, encoded properties, message id.
_Prepared: TypeAlias = tuple[str, bytes, bytes, int, int, int, dict[str, str], bytes, str]


# Half messages are never looked up by key or id (their committed copies are), so they are not
# indexed: saves index space and time on the transaction hot path.
_UNINDEXED: Final = int(RecordFlag.TX_HALF)
_HEADER_BYTES: Final = HEADER.size


class AppendResult(msgspec.Struct, frozen=True, gc=False):
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    message_id: str
    store_timestamp_ms: int


class MessageStore(StoreReads, StoreMaintenance, StoreDeletion, StoreReplication):
    # --- lifecycle ------------------------------------------------------------------------

    @classmethod
    async def open(
        cls, config: StoreConfig, fences: Mapping[str, TopicFence] | None = None
    ) -> MessageStore:
        """Open (and recover) the store in ``config.data_dir``. ``fences``: the deleted topics'
        fences, as persisted by the topic registry (see ``txbroker.store.fences``)."""
        store = cls(config)
        store.fences = Fences(fences)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, store._open_files)
        except BaseException:
            await loop.run_in_executor(None, store._close_files_quietly)
            raise
        store._committer = GroupCommitter(loop, store.log)
        store._committer.on_failure = store._on_commit_failure
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
            self.fences,
            self._tail_cut.read(),
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
        clamped = self.fences.clamp(self.log.write_pos)
        if clamped:
            log.warning("fences of deleted topics %s moved back to the end of the log", clamped)
        # Retention may have deleted segments whose queue entries are still on disk: move each
        # queue's minimum past them, and drop files that only point into them.
        dead: list[MappedFile] = []
        for cq in self.queues.values():
            dead.extend(cq.drop_before_phys(self.log.min_offset))
        dead.extend(self.index.drop_before_phys(self.log.min_offset))
        unlink_all(dead)
        write_checkpoint(self.dir, self._checkpoint_now())
        self._tail_cut.clear()  # applied and durable (the log and the checkpoint above)
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
        assert self._committer is not None
        # A failed store writes no checkpoint: its log ends at the cut (TailCut), and a
        # checkpoint past it would make the next open ignore the cut and keep queue entries
        # for records that were never written (or that their producers were told failed).
        clean = (
            self._state is StoreState.OPEN
            and self._committer.failure is None
            and self._cut_at is None
        )
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
        p = self._prepare(msg)
        return self._write_all((p,))[0]

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

    def _write_all(self, batch: Sequence[_Prepared]) -> list[AppendResult]:
        """Append every record of ``batch`` or none. Everything that can fail for want of
        space or permission (a log segment, a queue file, a key-index file) is created first;
        if that fails, nothing was written, the store stays open, and the next append tries
        again (a full disk refuses appends until space comes back). Only an I/O error while
        writing what was reserved fails the store (see :meth:`_fail_write`)."""
        try:
            queues = self._reserve(batch)
        except (OSError, StoreFailed) as e:
            raise StoreFailed(f"append refused, nothing was written: {e}") from e
        first = self.log.write_pos
        try:
            return self._write(batch, queues)
        except (OSError, StoreFailed) as e:
            self._fail_write(e, first)

    def _reserve(self, batch: Sequence[_Prepared]) -> dict[tuple[str, int], ConsumeQueue]:
        """Create the files ``batch`` will be written to (see :meth:`_write_all`); return its
        consume queues, new ones included (they join the store when a record is written)."""
        sizes: list[int] = []
        counts: dict[tuple[str, int], int] = {}
        entries = 0
        for topic, tb, body, qid, flags, _born, props, props_b, _mid in batch:
            sizes.append(_HEADER_BYTES + len(tb) + len(props_b) + len(body))
            counts[(topic, qid)] = counts.get((topic, qid), 0) + 1
            if not flags & _UNINDEXED:  # as dispatch() indexes it (an upper bound)
                keys = props.get(PROP_KEYS)
                entries += 1 + (keys.count(KEY_SEPARATOR) + 1 if keys else 0)
                entries += (PROP_IDEMPOTENCY_KEY in props) + (PROP_INTERNAL_KEY in props)
        phys = self.log.reserve(sizes)
        queues: dict[tuple[str, int], ConsumeQueue] = {}
        for key, n in counts.items():
            cq = self.queues.get(key)
            if cq is None:
                topic, qid = key
                start = self.fences.start(topic, qid)
                cq = ConsumeQueue(self._cq_root, topic, qid, self.config.cq_entries_per_file, start)
            cq.reserve(n)
            queues[key] = cq
        self.index.reserve(entries, phys)
        return queues

    def _write(
        self, batch: Sequence[_Prepared], queues: dict[tuple[str, int], ConsumeQueue]
    ) -> list[AppendResult]:
        """Write the reserved records, each to the log, its consume queue and the key index.
        One clock reading stamps the batch, and what does not change from record to record is
        looked up once: this is the append hot path, where every message's cost passes."""
        store_ms = time.time_ns() // 1_000_000
        append = self.log.append
        index = self.index
        known = self.queues
        out: list[AppendResult] = []
        for topic, tb, body, qid, flags, born, props, props_b, mid in batch:
            key = (topic, qid)
            cq = queues[key]
            qoff = cq.max_offset
            phys, size = append(tb, props_b, body, flags, qid, qoff, born or store_ms, store_ms)
            if known.get(key) is not cq:
                known[key] = cq
            dispatch(cq, index, props, phys, size, qoff, store_ms, to_index=not flags & _UNINDEXED)
            out.append(AppendResult(topic, qid, qoff, phys, size, mid, store_ms))
        self._dirty_queues.update(queues.values())
        return out

    def _fail_write(self, e: BaseException, first: int) -> NoReturn:
        """A write the reservation made safe failed all the same (an I/O error): part of the
        batch may be in the log and not in its queue, which cannot be undone safely in place.
        Stop appending, and cut the log durably where nothing after was acknowledged, so no
        restart delivers what the client was told failed: in sync flush mode from the flushed
        offset (nothing past it was acknowledged), else from the batch's first record."""
        failure = e if isinstance(e, StoreFailed) else StoreFailed(f"append failed: {e}")
        if failure is not e:
            failure.__cause__ = e
        assert self._committer is not None
        self._cut_tail(self._committer.flushed if self._sync else first)
        self._committer.poison(failure)  # calls _on_commit_failure: the store is FAILED
        if self._state is StoreState.OPEN:  # the committer had failed already
            self._transition(StoreState.FAILED)
        raise failure from None

    def _on_commit_failure(self) -> None:
        """The group committer failed (a write or an fdatasync of the log, or the syncer
        died), or a write did: in sync mode nothing past the flushed offset was acknowledged,
        so cut the log there; and the store is FAILED from now on, not at its next append, so
        nothing (a close, a checkpoint) treats it as healthy."""
        if self._sync:
            self._cut_tail(self.flushed_offset)
        if self._state is StoreState.OPEN:
            self._transition(StoreState.FAILED)

    def _cut_tail(self, offset: int) -> None:
        """Record durably that the log ends at ``offset`` (see ``TailCut``); the first cut of
        a run stands. If even that write fails, the disk is gone and recovery keeps what it
        finds (logged loudly)."""
        if self._cut_at is not None:
            return
        self._cut_at = offset  # from now on nothing from there is read or counted (reads.py)
        try:
            self._tail_cut.write(offset)
        except OSError:
            log.exception(
                "cannot record where the failed write cut the log (offset %d): records after "
                "it that clients were told failed may come back at the next start",
                offset,
            )

    def durable(self) -> asyncio.Future[None] | None:
        """In sync mode, a future resolved when everything appended so far is on disk. With a
        replication gate (sync replication), when enough replicas have flushed it too."""
        if self.replication_gate is not None:
            # The gate's future is shared; this one is the caller's own, which it may cancel.
            return asyncio.shield(self.replication_gate.covering(self.log.write_pos))
        if not self._sync:
            return None
        assert self._committer is not None
        return self._committer.wait_durable()

    def durable_together(self) -> asyncio.Future[None] | None:
        """:meth:`durable`, one future shared by every caller until the next group commit
        starts (``GroupCommitter.durable_together``): add callbacks to it, never cancel it.
        With a replication gate, the gate's (shared) future for the end of the log."""
        if self.replication_gate is not None:
            return self.replication_gate.covering(self.log.write_pos)
        if not self._sync:
            return None
        assert self._committer is not None
        return self._committer.durable_together()

    async def append(self, msg: Message) -> AppendResult:
        res = self.append_nowait(msg)
        if self.replication_gate is not None:  # shared with other writers: shielded
            await asyncio.shield(self.replication_gate.covering(self.log.write_pos))
        elif self._sync:
            assert self._committer is not None
            await self._committer.wait_durable()
        return res

    def append_batch_nowait(self, msgs: Sequence[Message]) -> list[AppendResult]:
        """Append several messages, all or none, without waiting for durability: every one is
        validated and every file they need is created before any is written."""
        self._check_open()
        prepared = [self._prepare(m) for m in msgs]
        return self._write_all(prepared) if prepared else []

    async def append_batch(self, msgs: Sequence[Message]) -> list[AppendResult]:
        """:meth:`append_batch_nowait`, answered once the batch is durable in sync mode."""
        out = self.append_batch_nowait(msgs)
        if self.replication_gate is not None and out:
            await asyncio.shield(self.replication_gate.covering(self.log.write_pos))
        elif self._sync and out:
            assert self._committer is not None
            await self._committer.wait_durable()
        return out

    def follow(self, master: str) -> None:
        """Make this store a replica of ``master``'s log: from now on only
        ``append_replicated`` writes to it, and every other append raises ``NotMaster``
        naming the master (a slave's own write would make its log diverge). Done by shadowing
        the two append entry points on this instance, so a master's appends pay nothing."""

        def refuse(*_: object) -> NoReturn:
            raise NotMaster(f"this broker is a slave of {master}: writes go to the master")

        self.append_nowait = refuse  # type: ignore[method-assign, assignment]
        self.append_batch_nowait = refuse  # type: ignore[method-assign, assignment]

    def unfollow(self, fence: Callable[[], None]) -> None:
        """Take this store's own appends again: a slave made master (failover). ``fence`` is
        called before each append and raises to refuse it: an elected master's lease may end
        between two appends, and a process frozen past it handles what waits on its sockets
        before its timers (failover.py). Shadowed on the instance as :meth:`follow` does."""
        for name in ("append_nowait", "append_batch_nowait"):
            self.__dict__.pop(name, None)
        one, batch = self.append_nowait, self.append_batch_nowait

        def append_nowait(msg: Message) -> AppendResult:
            fence()
            return one(msg)

        def append_batch_nowait(msgs: Sequence[Message]) -> list[AppendResult]:
            fence()
            return batch(msgs)

        self.append_nowait = append_nowait  # type: ignore[method-assign]
        self.append_batch_nowait = append_batch_nowait  # type: ignore[method-assign]

    def cut_tail(self, offset: int) -> None:
        """Record durably that the log ends at ``offset``: the next open drops what follows
        (``TailCut``), and reads stop there now. For a slave whose log runs past its master's
        (a divergent tail, failover.py); the broker restarts to apply it."""
        self._cut_tail(offset)

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
