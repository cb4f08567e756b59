"""The store's side of master → slave replication: a master reads its flushed log as raw
whole records; a slave writes them verbatim at the same offsets and indexes them as recovery
replays them (``recovery.replay``). Sync replication reaches the append path through one
interface, ``flush.ReplicationGate``, which the store's durability wait then waits on.

    # master                                        # slave
    data, nxt = store.read_replicated(off, 1 << 20) store.append_replicated(off, data, nxt)
                                                    await store.committer.wait_durable()
"""

from __future__ import annotations

from txbroker.errors import CorruptLog, InvalidOffset, NotFound, StoreFailed
from txbroker.store.commitlog import CommitLog, ScannedRecord
from txbroker.store.consumequeue import ConsumeQueues
from txbroker.store.fences import Fences
from txbroker.store.flush import Flusher
from txbroker.store.keyindex import KeyIndex
from txbroker.store.record import HEADER, MAGIC_BLANK, SIZE_MAGIC, check_record
from txbroker.store.recovery import live_targets, replay
from txbroker.store.state import Lifecycle

__all__ = ["Replication", "parse_records"]


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


class Replication:
    def __init__(
        self,
        commitlog: CommitLog,
        index: KeyIndex,
        queues: ConsumeQueues,
        fences: Fences,
        flusher: Flusher,
        lifecycle: Lifecycle,
    ) -> None:
        self._log = commitlog
        self._index = index
        self._queues = queues
        self._fences = fences
        self._flusher = flusher
        self._lifecycle = lifecycle

    def read_replicated(self, from_offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Master: whole records from ``from_offset`` up to the flushed offset (see
        ``CommitLog.read_raw``), and where the next read starts."""
        self._lifecycle.check_readable()
        log = self._log
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
        limit = self._flusher.flushed
        cut = self._flusher.cut_at
        if cut is not None:
            limit = min(limit, cut)
        return log.read_raw(from_offset, limit, max_bytes)

    def append_replicated(self, offset: int, data: bytes, next_offset: int) -> set[tuple[str, int]]:
        """Slave: write the master's bytes at the same offsets, then index the records as
        recovery does. Returns the (topic, queue) pairs that grew. Durability is the caller's:
        await ``committer.wait_durable()``."""
        self._lifecycle.check_open()
        if offset != self._log.write_pos:
            raise InvalidOffset(
                f"replicated bytes start at {offset}, this log ends at {self._log.write_pos}"
            )
        records = parse_records(data, offset)  # all verified before anything is written
        try:
            self._log.append_raw(offset, data, next_offset)
        except OSError as e:
            failure = StoreFailed(f"cannot write replicated records at offset {offset}: {e}")
            assert self._flusher.committer is not None
            self._flusher.committer.poison(failure)  # FAILED; the log is cut at the flush
            raise failure from e
        grew: set[tuple[str, int]] = set()
        dirty = self._queues.dirty
        for rec in records:
            to_queue, to_index = live_targets(rec, self._fences)
            dirty.add(replay(rec, self._queues, self._index, to_queue, to_index))
            if to_queue:
                grew.add((rec.topic, rec.queue_id))
        self._log.records += len(records)
        return grew
