"""The store's background upkeep: checkpoints, retention, and the loops that run them.

A checkpoint makes consume queues and the key index durable up to the current end of the log
and records that offset, so recovery replays only what came after it (see
``txbroker.store.checkpoint``). Retention deletes whole commit-log segments older than
``retention_ms`` or beyond ``retention_bytes``, with the queue and index files that only point
into them. Before deleting, it tells its ``RetentionHook`` (if one is set) where the log will
start, so an owner of records that must outlive their segment (the broker's open transactions)
copies them forward first. A housekeeping task runs both on their intervals; in async flush
mode another asks the group committer to flush on its interval.

Separate from ``MessageStore`` (which extends this class) because none of it runs per message:
it works on whole files, on timers, beside the append and read paths.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Protocol

import msgspec

from txbroker.errors import StoreFailed
from txbroker.store.checkpoint import Checkpoint, queue_key, write_checkpoint
from txbroker.store.consumequeue import ConsumeQueue
from txbroker.store.core import StoreCore, StoreState
from txbroker.store.mapped import MappedFile, fsync_dir
from txbroker.store.record import HEADER, MAGIC_MESSAGE

__all__ = ["RetentionHook", "RetentionReport", "StoreMaintenance", "unlink_all"]

log = logging.getLogger(__name__)


class RetentionReport(msgspec.Struct, frozen=True):
    segments_deleted: int
    bytes_freed: int
    log_min_offset: int


class RetentionHook(Protocol):
    """Told before retention deletes records: the store knows nothing of what its records
    mean, so whoever does (the transaction layer, above the store) copies forward what must
    survive. The store owns this interface; the layer above implements it."""

    async def before_retention(self, log_start: int) -> None:
        """Every record before the physical offset ``log_start`` is about to be deleted;
        return once what must outlive them is appended again and durable. Raising keeps them:
        nothing is deleted in this round (the next one asks again)."""
        ...


class StoreMaintenance(StoreCore):
    # Set by the store's owner before records that must outlive their segment are written.
    retention_hook: RetentionHook | None = None

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
        consume queues and index files that only point into them go too. The hook is asked
        first; only the segments planned before it ran are deleted (its copies made the log
        longer, which the next round weighs)."""
        self._check_readable()
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        cut = self._retention_cut(now_ms)
        if cut is None:
            return RetentionReport(0, 0, self.log.min_offset)
        if self.retention_hook is not None:
            await self.retention_hook.before_retention(cut)
        dead: list[MappedFile] = []
        while len(self.log.segments) > 1 and self.log.segments[1].base <= cut:
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
        await loop.run_in_executor(None, unlink_all, dead)
        if self._state is StoreState.OPEN:
            await self.checkpoint()  # records the new log start; also syncs the directories
        return RetentionReport(segments, freed, log_min)

    def _retention_cut(self, now_ms: int) -> int | None:
        """Where the log will start once the segments due for deletion are gone (the base of
        the oldest segment kept), or None when none is due. Never the active (last) one."""
        cfg = self.config
        segs = self.log.segments
        end = self.log.write_pos
        cut: int | None = None
        for seg, successor in itertools.pairwise(segs):
            over_size = cfg.retention_bytes is not None and end - seg.base > cfg.retention_bytes
            expired = False
            if cfg.retention_ms is not None:
                newest_ms = _newest_ms(seg, successor)
                expired = newest_ms is not None and now_ms - newest_ms > cfg.retention_ms
            if not (over_size or expired):
                break
            cut = successor.base
        return cut

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
                if self._state is not StoreState.OPEN:
                    return  # failed: nothing more to make durable until a restart
                log.exception("store housekeeping failed")  # an append refused: retried
            except Exception:  # keep housekeeping alive; the next round retries
                log.exception("store housekeeping failed")

    async def _interval_flush(self) -> None:
        assert self._committer is not None
        while True:
            await asyncio.sleep(self.config.flush_interval_ms / 1000)
            self._committer.request_flush()


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


def unlink_all(files: list[MappedFile]) -> None:
    """Close and delete ``files``, then sync their directories so the deletions hold."""
    for f in files:
        f.close(unlink=True)
    for d in {f.path.parent for f in files}:
        if d.exists():
            fsync_dir(d)
