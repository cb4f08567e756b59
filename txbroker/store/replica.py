"""The store's side of master → slave replication: the master reads its flushed log as raw
bytes; a slave writes them verbatim at the same offsets and replays them into its consume
queues and key index through recovery's code path (``recovery.replay``).

The store does not know about slaves, connections or acknowledgements. What the broker adds
(``txbroker.server.replication``) reaches the append path through one small interface, the
:class:`ReplicationGate`: when one is installed, ``durable()`` and ``durable_together()`` give
the gate's future instead of the group commit's.

    # master                                        # slave
    data, nxt = store.read_replicated(off, 1 << 20) store.append_replicated(off, data, nxt)
                                                    await store.committer.wait_durable()
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from txbroker.errors import CorruptLog, InvalidOffset, NotFound, StoreFailed
from txbroker.store.commitlog import ScannedRecord
from txbroker.store.core import StoreCore
from txbroker.store.record import HEADER, MAGIC_BLANK, SIZE_MAGIC, check_record
from txbroker.store.recovery import live_targets, replay

__all__ = ["ReplicationGate", "StoreReplication", "parse_records"]


class ReplicationGate(Protocol):
    """What a write waits for when replication is synchronous (installed on the master)."""

    covered: int  # the log is flushed on enough replicas below this: consumers read below it

    def covering(self, offset: int) -> asyncio.Future[None]:
        """A future resolved once enough replicas have flushed the log up to ``offset``
        (which implies the master flushed it: replicas only receive flushed bytes), or failed
        with a ``ReplicationTimeout``. Shared by many callers: never cancel it."""
        ...


def parse_records(data: bytes, offset: int) -> list[ScannedRecord]:
    """Verify every record of ``data`` (bytes of a log starting at physical ``offset``) as
    recovery verifies the log: magic, sizes, CRC32C, the stored physical offset. A trailing
    BLANK (the end of a segment) is allowed. Raises ``CorruptLog`` naming the first bad one."""
    out: list[ScannedRecord] = []
    rel, n = 0, len(data)
    while rel < n:
        if n - rel == SIZE_MAGIC.size and SIZE_MAGIC.unpack_from(data, rel)[1] == MAGIC_BLANK:
            break
        reason = check_record(data, rel)
        if reason is not None:
            raise CorruptLog(f"replicated record at offset {offset + rel} is invalid: {reason}")
        (total, _, _, flags, qid, qoff, phys, _born, store_ms, _bl, plen, tlen) = (
            HEADER.unpack_from(data, rel)
        )
        if phys != offset + rel:
            raise CorruptLog(f"replicated record at offset {offset + rel} claims offset {phys}")
        p = rel + HEADER.size
        topic = data[p : p + tlen].decode()
        props = data[p + tlen : p + tlen + plen]
        out.append(ScannedRecord(offset + rel, total, flags, qid, qoff, store_ms, topic, props))
        rel += total
    return out


class StoreReplication(StoreCore):
    def read_replicated(self, from_offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Master: whole records from ``from_offset`` up to the flushed offset (see
        ``CommitLog.read_raw``), and where the next read starts."""
        self._check_readable()
        log = self.log
        if from_offset > log.write_pos:
            raise InvalidOffset(
                f"the replica's log ends at {from_offset}, past this master's end "
                f"({log.write_pos}): it holds records this master does not (a divergent tail, "
                "e.g. from an earlier master); truncate it before it follows this one"
            )
        if from_offset < log.min_offset:
            raise NotFound(
                f"offset {from_offset} was deleted by retention (the log starts at "
                f"{log.min_offset}): the replica fell too far behind; seed it again"
            )
        limit = self._committer.flushed if self._committer is not None else 0
        if self._cut_at is not None:
            limit = min(limit, self._cut_at)
        return log.read_raw(from_offset, limit, max_bytes)

    def append_replicated(self, offset: int, data: bytes, next_offset: int) -> set[tuple[str, int]]:
        """Slave: write the master's bytes at the same offsets, then dispatch the records to
        their queues and the key index as recovery does. Returns the (topic, queue) pairs that
        grew. Durability is the caller's: await ``committer.wait_durable()``."""
        self._check_open()
        if offset != self.log.write_pos:
            raise InvalidOffset(
                f"replicated bytes start at {offset}, this log ends at {self.log.write_pos}"
            )
        records = parse_records(data, offset)  # all verified before anything is written
        try:
            self.log.append_raw(offset, data, next_offset)
        except OSError as e:
            failure = StoreFailed(f"cannot write replicated records at offset {offset}: {e}")
            assert self._committer is not None
            self._committer.poison(failure)  # the store is FAILED; the log is cut at the flush
            raise failure from e
        grew: set[tuple[str, int]] = set()
        for rec in records:
            to_queue, to_index = live_targets(rec, self.fences)
            cq = replay(
                rec,
                self.queues,
                self.index,
                self._cq_root,
                self.config.cq_entries_per_file,
                self.fences,
                to_queue,
                to_index,
            )
            self._dirty_queues.add(cq)
            if to_queue:
                grew.add((rec.topic, rec.queue_id))
        self.log.records += len(records)
        return grew
