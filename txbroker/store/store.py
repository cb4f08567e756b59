"""The message store: the one object the broker talks to for durable messages.

``MessageStore`` owns the store's parts and delegates to them: the commit log, the consume
queues, the key index, the ``Flusher`` (group commit, replication gate, the failed write's
cut), the ``Appender``, the ``Reader``, the ``Checkpointer``, ``Retention``, ``TopicFencing``
and ``Replication``. It opens and recovers them, runs their housekeeping, closes them.

    store = await MessageStore.open(StoreConfig(Path("data")))
    res = await store.append(Message(topic="orders", body=b"..."))
    await store.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from txbroker.errors import NotMaster, StoreFailed, StoreLocked
from txbroker.store.append import Appender, AppendResult
from txbroker.store.checkpoint import (
    Checkpoint,
    Checkpointer,
    ShutdownMarker,
    TailCut,
    write_checkpoint,
)
from txbroker.store.commitlog import CommitLog
from txbroker.store.config import FlushMode, StoreConfig
from txbroker.store.consumequeue import ConsumeQueues
from txbroker.store.fences import Fences, TopicFence, TopicFencing
from txbroker.store.flush import Flusher, GroupCommitter, ReplicationGate
from txbroker.store.keyindex import KeyIndex, KeyKind
from txbroker.store.mapped import MappedFile
from txbroker.store.reads import GetResult, Reader
from txbroker.store.record import Message, StoredMessage
from txbroker.store.recovery import RecoveryReport, recover
from txbroker.store.replication import Replication
from txbroker.store.retention import Retention, RetentionHook, RetentionReport, unlink_all
from txbroker.store.state import Lifecycle, StoreState

__all__ = ["AppendResult", "MessageStore"]

log = logging.getLogger(__name__)


class MessageStore:
    def __init__(self, config: StoreConfig, fences: Mapping[str, TopicFence] | None = None) -> None:
        self.config = config
        self.dir = Path(config.data_dir)
        sync = config.flush is FlushMode.SYNC
        self._lifecycle = lifecycle = Lifecycle()
        self.fences = Fences(fences)  # deleted topics (see fences.py)
        self.log = CommitLog(self.dir / "commitlog", config.segment_bytes, buffered=sync)
        self.index = KeyIndex(self.dir / "index", config.index_slots, config.index_capacity)
        self._queues = ConsumeQueues(
            self.dir / "consumequeue", config.cq_entries_per_file, self.fences
        )
        self.queues = self._queues.by_key  # (topic, queue id) -> ConsumeQueue
        self._flusher = flusher = Flusher(self.log, sync, TailCut(self.dir), lifecycle)
        self._appender = Appender(config, self.log, self.index, self._queues, flusher)
        self._reader = Reader(
            config, self.log, self.index, self._queues, self.fences, flusher, lifecycle
        )
        self._checkpointer = Checkpointer(
            self.dir,
            self.log,
            self.index,
            self._queues,
            flusher,
            lifecycle,
            config.index_flush_interval_ms,
        )
        self._retention = Retention(
            config, self.log, self.index, self._queues, flusher, lifecycle, self._checkpointer
        )
        self._fencing = TopicFencing(self.log, self._queues, self.fences, lifecycle)
        self._replication = Replication(
            self.log, self.index, self._queues, self.fences, flusher, lifecycle
        )
        self._marker = ShutdownMarker(self.dir)
        self._lock_fd = -1
        self._tasks: list[asyncio.Task[None]] = []
        self.recovery: RecoveryReport | None = None
        # The role check at the append entry (follow/unfollow): a master that needs none pays
        # one attribute test (``_guarded``). ``_refusal`` refuses every append of a follower;
        # ``_lease_fence`` raises to refuse one (an elected master whose lease may have ended).
        self._guarded = False
        self._refusal: str | None = None
        self._lease_fence: Callable[[], None] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    @classmethod
    async def open(
        cls, config: StoreConfig, fences: Mapping[str, TopicFence] | None = None
    ) -> MessageStore:
        """Open (and recover) the store in ``config.data_dir``. ``fences``: the deleted topics'
        fences, as persisted by the topic registry (see ``txbroker.store.fences``)."""
        store = cls(config, fences)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, store._open_files)
        except BaseException:
            await loop.run_in_executor(None, store._close_files_quietly)
            raise
        store._flusher.start(loop)
        store._lifecycle.advance(StoreState.OPEN)
        store._tasks.append(asyncio.create_task(store._housekeeping(), name="txb-store-house"))
        if config.flush is not FlushMode.SYNC:
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
        self._lifecycle.advance(StoreState.RECOVERING)
        abnormal = self._marker.was_abnormal()
        self.log.load()
        self.index.load()
        self._queues.load()
        tail_cut = TailCut(self.dir)
        self.recovery = rep = recover(
            self.dir,
            self.log,
            self._queues,
            self.index,
            abnormal,
            self.config.truncate_damaged_tail,
            self.fences,
            tail_cut.read(),
        )
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
        cp = self._checkpointer.now()
        write_checkpoint(self.dir, cp)
        self._checkpointer.written(cp)
        tail_cut.clear()  # applied and durable (the log and the checkpoint above)
        self._marker.set()

    def _close_files_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self._close_files()

    def _close_files(self) -> None:
        self._queues.close()
        self.index.close()
        self.log.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    async def close(self) -> None:
        """Flush everything, write a final checkpoint, mark the shutdown clean."""
        lifecycle = self._lifecycle
        if lifecycle.state in (StoreState.CLOSING, StoreState.CLOSED):
            return
        if lifecycle.state is StoreState.CREATED:
            lifecycle.advance(StoreState.CLOSED)
            return
        committer = self.committer
        # A failed store writes no checkpoint: its log ends at the cut (TailCut), and a
        # checkpoint past it would make the next open ignore the cut and keep queue entries
        # for records that were never written (or that their producers were told failed).
        clean = (
            lifecycle.state is StoreState.OPEN
            and committer.failure is None
            and self._flusher.cut_at is None
        )
        lifecycle.advance(StoreState.CLOSING)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        loop = asyncio.get_running_loop()
        if clean:
            await committer.drain()
            cp = self._checkpointer.now()
            dirty = list(self.queues.values())
            await committer.run_in_durable_thread(
                lambda: self._checkpointer.make_durable(cp, dirty, index=True)
            )
            if committer.failure is None:
                await loop.run_in_executor(None, self._marker.clear)
        committer.close()
        await loop.run_in_executor(None, self._close_files)
        lifecycle.advance(StoreState.CLOSED)

    def abandon(self) -> None:
        """Drop the store as a kill -9 would: no final flush, no checkpoint, the shutdown marker
        left in place, buffered (unacknowledged) records lost. For crash tests in one process."""
        for t in self._tasks:
            t.cancel()
        if self._flusher.committer is not None:
            self._flusher.committer.close()
        self._close_files()
        self._lifecycle.state = StoreState.CLOSED

    async def __aenter__(self) -> MessageStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _housekeeping(self) -> None:
        """Checkpoint every ``checkpoint_interval_ms``; apply retention every
        ``retention_check_interval_ms``, after a checkpoint."""
        cfg = self.config
        next_retention = time.monotonic() + cfg.retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(cfg.checkpoint_interval_ms / 1000)
            try:
                await self._checkpointer.checkpoint()
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + cfg.retention_check_interval_ms / 1000
                    rep = await self._retention.enforce()
                    if rep.segments_deleted:
                        log.info("retention deleted %d segments", rep.segments_deleted)
            except StoreFailed:
                if self._lifecycle.state is not StoreState.OPEN:
                    return  # failed: nothing more to make durable until a restart
                log.exception("store housekeeping failed")  # an append refused: retried
            except Exception:  # keep housekeeping alive; the next round retries
                log.exception("store housekeeping failed")

    async def _interval_flush(self) -> None:
        """Async flush mode: flush what is written every ``flush_interval_ms``."""
        committer = self.committer
        while True:
            await asyncio.sleep(self.config.flush_interval_ms / 1000)
            committer.request_flush()

    # --- append ---------------------------------------------------------------------------

    def append_nowait(self, msg: Message) -> AppendResult:
        """Append without waiting for durability (see :meth:`durable`). All checks run before
        anything is written, so a rejected message leaves the store untouched."""
        if self._guarded:
            self._check_role()
        self._lifecycle.check_open()
        appender = self._appender
        return appender.write_one(appender.prepare(msg))

    def append_batch_nowait(self, msgs: Sequence[Message]) -> list[AppendResult]:
        """Append several messages, all or none, without waiting for durability: every one is
        validated and every file they need is created before any is written."""
        if self._guarded:
            self._check_role()
        self._lifecycle.check_open()
        appender = self._appender
        prepared = [appender.prepare(m) for m in msgs]
        return appender.write_all(prepared) if prepared else []

    async def append(self, msg: Message) -> AppendResult:
        """:meth:`append_nowait`, answered once the record is durable (:meth:`durable`)."""
        res = self.append_nowait(msg)
        durable = self._flusher.durable()
        if durable is not None:
            await durable
        return res

    async def append_batch(self, msgs: Sequence[Message]) -> list[AppendResult]:
        """:meth:`append_batch_nowait`, answered once the batch is durable."""
        out = self.append_batch_nowait(msgs)
        durable = self._flusher.durable() if out else None
        if durable is not None:
            await durable
        return out

    def validate(self, msg: Message) -> None:
        """Raise what :meth:`append` would raise for ``msg``'s content, writing nothing."""
        self._appender.prepare(msg)

    def durable(self) -> asyncio.Future[None] | None:
        """A future of the caller's own (it may cancel it), resolved once everything appended
        so far is durable: flushed in sync mode, held by enough replicas with sync
        replication. None when nothing is waited for (async mode without a gate)."""
        return self._flusher.durable()

    def durable_together(self) -> asyncio.Future[None] | None:
        """:meth:`durable`, one future shared by every caller (until the next group commit
        starts): add callbacks to it, never cancel it."""
        return self._flusher.durable(own=False)

    def follow(self, master: str) -> None:
        """Make this store a replica of ``master``'s log: from now on only
        ``append_replicated`` writes to it, and every other append raises ``NotMaster``
        naming the master (a slave's own write would make its log diverge)."""
        self._refusal = f"this broker is a slave of {master}: writes go to the master"
        self._lease_fence = None
        self._guarded = True

    def unfollow(self, fence: Callable[[], None]) -> None:
        """Take this store's own appends again: a slave made master (failover). ``fence`` is
        called before each append and raises to refuse it: an elected master's lease may end
        between two appends, and a process frozen past it handles what waits on its sockets
        before its timers (failover.py)."""
        self._refusal = None
        self._lease_fence = fence
        self._guarded = True

    def _check_role(self) -> None:
        if self._refusal is not None:
            raise NotMaster(self._refusal)
        if self._lease_fence is not None:
            self._lease_fence()

    def cut_tail(self, offset: int) -> None:
        """Record durably that the log ends at ``offset``: the next open drops what follows
        (``TailCut``), and reads stop there now. For a slave whose log runs past its master's
        (a divergent tail, failover.py); the broker restarts to apply it."""
        self._flusher.cut(offset)

    # --- reads ----------------------------------------------------------------------------

    async def read(self, physical_offset: int) -> StoredMessage:
        """The record at a physical offset (as returned by :meth:`append`)."""
        return await self._reader.read(physical_offset)

    async def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        tags: Iterable[str] | None = None,
    ) -> GetResult:
        """Up to ``max_count`` messages of one queue from queue offset ``offset`` on (see
        ``Reader.get_messages``): page by ``next_offset``."""
        return await self._reader.get_messages(topic, queue_id, offset, max_count, tags)

    def queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min, max) queue offsets: readable messages are min <= offset < max."""
        return self._reader.queue_range(topic, queue_id)

    def may_hold(self, kind: KeyKind, key: str) -> bool:
        """False when no message has ``key`` (no I/O); True means :meth:`lookup` may find one."""
        return self._reader.may_hold(kind, key)

    async def lookup(
        self, kind: KeyKind, key: str, *, limit: int = 32, since_ms: int = 0
    ) -> list[StoredMessage]:
        """Messages whose key, message id or idempotency key equals ``key``, newest first."""
        return await self._reader.lookup(kind, key, limit=limit, since_ms=since_ms)

    # --- checkpoints and retention --------------------------------------------------------

    async def checkpoint(self, *, index: bool = True) -> Checkpoint:
        """Make queues and key index durable up to the current end of the log and record it;
        with ``index=False`` the key index only when its flush is due (what the store's own
        checkpoints do, see ``StoreConfig.index_flush_interval_ms``)."""
        return await self._checkpointer.checkpoint(index=index)

    async def enforce_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Delete whole segments older than ``retention_ms`` or beyond ``retention_bytes``,
        after asking :attr:`retention_hook` (see ``retention.py``)."""
        return await self._retention.enforce(now_ms)

    @property
    def retention_hook(self) -> RetentionHook | None:
        return self._retention.hook

    @retention_hook.setter
    def retention_hook(self, hook: RetentionHook | None) -> None:
        self._retention.hook = hook

    # --- deleted topics -------------------------------------------------------------------

    def fence_for(self, topic: str) -> TopicFence:
        """The fence a deletion of ``topic`` now would set (see ``fences.py``)."""
        return self._fencing.fence_for(topic)

    def drop_topic(self, topic: str, fence: TopicFence) -> int:
        """Make ``topic``'s records before ``fence`` unreachable and remove its queue files;
        return the bytes freed. Call once ``fence`` is persisted."""
        return self._fencing.drop_topic(topic, fence)

    def forget_fences(self, keep: set[str]) -> list[str]:
        """The topics whose fences retention made useless (see ``TopicFencing``)."""
        return self._fencing.forget_fences(keep)

    def is_dead(self, msg: StoredMessage) -> bool:
        """Whether ``msg`` belongs to a deleted topic. Check a source message right before
        appending a copy of it (see ``fences.py``: that keeps copies of dead records dead)."""
        return self.fences.is_dead(msg.topic, msg.properties, msg.physical_offset)

    def is_dead_at(self, owner: str, phys: int) -> bool:
        """:meth:`is_dead` for the record at ``phys`` belonging to topic ``owner``."""
        return self.fences.is_dead_at(owner, phys)

    # --- replication ----------------------------------------------------------------------

    def read_replicated(self, from_offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Master: whole flushed records from ``from_offset``, and where the next read starts."""
        return self._replication.read_replicated(from_offset, max_bytes)

    def append_replicated(self, offset: int, data: bytes, next_offset: int) -> set[tuple[str, int]]:
        """Slave: write the master's bytes at the same offsets and index them; returns the
        (topic, queue) pairs that grew. Durability is the caller's (``committer``)."""
        return self._replication.append_replicated(offset, data, next_offset)

    @property
    def replication_gate(self) -> ReplicationGate | None:
        """Installed by sync replication: appends and consumers wait on it (``flush.py``)."""
        return self._flusher.gate

    @replication_gate.setter
    def replication_gate(self, gate: ReplicationGate | None) -> None:
        self._flusher.gate = gate

    # --- state and statistics -------------------------------------------------------------

    @property
    def state(self) -> StoreState:
        return self._lifecycle.state

    @property
    def committer(self) -> GroupCommitter:
        assert self._flusher.committer is not None
        return self._flusher.committer

    @property
    def write_offset(self) -> int:
        return self.log.write_pos

    @property
    def flushed_offset(self) -> int:
        return self._flusher.flushed

    @property
    def readable_offset(self) -> int:
        """Consumers see records below this (see ``Flusher.readable_offset``)."""
        return self._flusher.readable_offset
