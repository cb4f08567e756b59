"""Retention: deleting whole commit-log segments by age or size, oldest first.

Before deleting, it tells its ``RetentionHook`` (if set) where the log will start, so the
owner of records that must outlive their segment (the broker's open transactions) copies
them forward first. Queue and index files that only point into deleted segments go too.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import Protocol

import msgspec

from txbroker.store.checkpoint import Checkpointer
from txbroker.store.commitlog import CommitLog
from txbroker.store.config import StoreConfig
from txbroker.store.consumequeue import ConsumeQueues
from txbroker.store.flush import Flusher
from txbroker.store.keyindex import KeyIndex
from txbroker.store.mapped import MappedFile, fsync_dir
from txbroker.store.record import HEADER, MAGIC_MESSAGE
from txbroker.store.state import Lifecycle, StoreState

__all__ = ["Retention", "RetentionHook", "RetentionReport", "unlink_all"]


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


class Retention:
    """Deletes whole commit-log segments older than ``retention_ms`` or beyond
    ``retention_bytes``, with the queue and index files that only point into them."""

    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLog,
        index: KeyIndex,
        queues: ConsumeQueues,
        flusher: Flusher,
        lifecycle: Lifecycle,
        checkpointer: Checkpointer,
    ) -> None:
        self._config = config
        self._log = commitlog
        self._index = index
        self._queues = queues
        self._flusher = flusher
        self._lifecycle = lifecycle
        self._checkpointer = checkpointer
        # Set by the store's owner before records that must outlive their segment are written.
        self.hook: RetentionHook | None = None

    async def enforce(self, now_ms: int | None = None) -> RetentionReport:
        """Delete the segments due; the hook is asked first. Only the segments planned before
        it ran are deleted (its copies made the log longer, which the next round weighs)."""
        self._lifecycle.check_readable()
        now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        cut = self._cut(now_ms)
        if cut is None:
            return RetentionReport(0, 0, self._log.min_offset)
        if self.hook is not None:
            await self.hook.before_retention(cut)
        dead: list[MappedFile] = []
        committer = self._flusher.committer
        while len(self._log.segments) > 1 and self._log.segments[1].base <= cut:
            seg = self._log.pop_oldest()
            if committer is not None:
                committer.forget(seg.base)
            dead.append(seg)
        if not dead:
            return RetentionReport(0, 0, self._log.min_offset)
        log_min = self._log.min_offset
        for cq in self._queues.by_key.values():
            dead.extend(cq.drop_before_phys(log_min))
        dead.extend(self._index.drop_before_phys(log_min))
        segments = sum(1 for f in dead if f.path.parent == self._log.dir)
        freed = sum(f.size for f in dead)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, unlink_all, dead)
        if self._lifecycle.state is StoreState.OPEN:
            # The new log start, and an index state past the files just dropped.
            await self._checkpointer.checkpoint(index=True)
        return RetentionReport(segments, freed, log_min)

    def _cut(self, now_ms: int) -> int | None:
        """Where the log will start once the segments due for deletion are gone (the base of
        the oldest segment kept), or None when none is due. Never the active (last) one."""
        cfg = self._config
        segs = self._log.segments
        end = self._log.write_pos
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
