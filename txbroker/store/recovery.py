"""Opening a store: load files, verify the log from the checkpoint, truncate a torn tail, and
replay records into consume queues and the key index until all three agree again.

Phases run in order through one guarded transition function; the report says what each did.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec

from txbroker.errors import CorruptLog
from txbroker.store.append import UNINDEXED, index_record
from txbroker.store.checkpoint import Checkpoint, queue_key, read_checkpoint
from txbroker.store.commitlog import CommitLog, ScanEnd, ScannedRecord
from txbroker.store.consumequeue import ConsumeQueue, ConsumeQueues
from txbroker.store.fences import Fences
from txbroker.store.keyindex import KeyIndex

__all__ = ["Phase", "RecoveryReport", "live_targets", "recover", "replay"]

_CUT: Final = "cut: not acknowledged"

log = logging.getLogger(__name__)
_props_decoder = msgspec.msgpack.Decoder(dict[str, str])


class Phase(enum.Enum):
    LOAD = "load"
    PLAN = "plan"
    REPLAY = "replay"
    TRUNCATE = "truncate"
    DONE = "done"


_NEXT = {Phase.LOAD: Phase.PLAN, Phase.PLAN: Phase.REPLAY, Phase.REPLAY: Phase.TRUNCATE}
_NEXT[Phase.TRUNCATE] = Phase.DONE


@dataclass
class RecoveryReport:
    abnormal: bool = False
    checkpoint_offset: int = 0
    index_offset: int = 0  # the key index was durable up to here; re-indexed from it
    replay_from: int = 0
    end_offset: int = 0
    records_replayed: int = 0
    torn_bytes_cleared: int = 0
    torn_reason: str | None = None
    queues_rebuilt: list[str] = field(default_factory=list)
    index_rebuilt: bool = False
    dropped_after_damage: bool = False
    seconds: float = 0.0
    phase: Phase = Phase.LOAD

    def advance(self, to: Phase) -> None:
        if _NEXT.get(self.phase) is not to:
            raise AssertionError(f"recovery cannot go from {self.phase} to {to}")
        self.phase = to


def replay(
    rec: ScannedRecord,
    queues: ConsumeQueues,
    index: KeyIndex,
    to_queue: bool,
    to_index: bool,
) -> ConsumeQueue:
    """Index one record read back from the log (a recovery scan, or bytes a replica received
    from its master, see ``replication.py``) as its append did; returns its queue."""
    qkey = (rec.topic, rec.queue_id)
    cq = queues.by_key.get(qkey)
    if cq is None:
        cq = queues.by_key[qkey] = queues.new(*qkey)
    props = _props_decoder.decode(rec.props) if rec.props else {}
    index_record(
        cq,
        index,
        props,
        rec.phys,
        rec.size,
        rec.queue_offset,
        rec.store_ms,
        to_queue=to_queue,
        to_index=to_index,
    )
    return cq


def live_targets(rec: ScannedRecord, fences: Fences) -> tuple[bool, bool]:
    """(to_queue, to_index) for a record past the checkpoint: what an append did with it.
    Half messages are not indexed (``append.UNINDEXED``); a deleted topic's records get no
    queue entry."""
    to_queue = not (fences and fences.is_dead_at(rec.topic, rec.phys))
    return to_queue, not rec.flags & UNINDEXED


def recover(
    data_dir: Path,
    commitlog: CommitLog,
    queue_set: ConsumeQueues,
    index: KeyIndex,
    abnormal: bool,
    truncate_damage: bool = False,
    fences: Fences | None = None,
    cut_at: int | None = None,
) -> RecoveryReport:
    """Bring log, queues and index into agreement (see the module docstring). ``fences``: the
    deleted topics' fences, whose dead records no queue gets back. ``cut_at``: where a failed
    write cut the log (see ``TailCut``); nothing from there on was acknowledged."""
    t0 = time.perf_counter()
    fences = fences or Fences()
    queues, cq_root = queue_set.by_key, queue_set.root
    rep = RecoveryReport(abnormal=abnormal)
    _drop_dead_queues(queues, fences, cq_root)
    cp = read_checkpoint(data_dir)
    if cp is None:
        # No checkpoint: nothing is known consistent; verify and replay the whole log.
        cp = Checkpoint(log_offset=commitlog.min_offset)
        rebuild_index = True
    else:
        rebuild_index = False
    p = max(cp.log_offset, commitlog.min_offset)
    pi = max(cp.index_durable, commitlog.min_offset)  # the key index holds the records before
    rep.checkpoint_offset = p
    rep.index_offset = pi
    rep.advance(Phase.PLAN)

    # A queue shorter on disk than the checkpoint says (or missing) is rebuilt from the log.
    for key, count in cp.queues.items():
        topic, _, qid = key.rpartition("/")
        fence = fences.get(topic)
        if fence is not None and fence.phys >= cp.log_offset:
            continue  # counted before the topic was deleted: those entries are dead
        cq = queues.get((topic, int(qid)))
        if cq is None and count <= fences.start(topic, int(qid)):
            continue  # a re-created topic's queue, empty: nothing to rebuild
        if cq is not None:
            cq.reload_end(count)
        if cq is None or cq.max_offset < count:
            rep.queues_rebuilt.append(key)
    for key in rep.queues_rebuilt:
        topic, _, qid = key.rpartition("/")
        old = queues.pop((topic, int(qid)), None)
        if old is not None:
            old.close()
        shutil.rmtree(cq_root / topic / qid, ignore_errors=True)
    rebuild = set(rep.queues_rebuilt)

    active_base, _ = index.state()
    if not rebuild_index and cp.index_base >= 0 and cp.index_base != active_base:
        known = {f.f.base for f in index.files}
        rebuild_index = cp.index_base not in known
    if rebuild_index:
        _wipe_index(index)
    elif abnormal:
        # Entries past the index's checkpoint may be torn (power loss) or missing (never
        # flushed); trust only its checkpointed prefix of its file, drop newer files, and let
        # the replay re-add the rest from the log.
        while index.files and index.files[-1].f.base > cp.index_base:
            index.files.pop().f.close(unlink=True)
        if index.files:
            index.files[-1].relink(cp.index_count)
    rep.index_rebuilt = rebuild_index

    replay_from = commitlog.min_offset if (rebuild or rebuild_index) else min(p, pi)
    rep.replay_from = replay_from
    rep.advance(Phase.REPLAY)
    end_out: list[ScanEnd] = []
    n = 0
    cut = cut_at if cut_at is not None and cut_at >= commitlog.min_offset else None
    if cut is not None and cut < p:
        # A checkpoint past the cut (a failed store's close must never write one, but a
        # directory may come from a version that did).
        # The cut stands (nothing from there on was acknowledged); recover from it, so the
        # queue entries between it and the checkpoint are dropped too.
        log.warning("checkpoint at %d lies past the cut at %d: recovering from the cut", p, cut)
        p = rep.checkpoint_offset = cut
        pi = rep.index_offset = min(pi, cut)
        if not (rebuild or rebuild_index):
            replay_from = rep.replay_from = min(p, pi)
    start = replay_from
    while True:
        for rec in commitlog.scan(start, end_out):
            if cut is not None and rec.phys >= cut:
                end_out.append(ScanEnd(rec.phys, _CUT))
                break
            past_cp = rec.phys >= p
            qkey = (rec.topic, rec.queue_id)
            to_queue = past_cp or (bool(rebuild) and queue_key(*qkey) in rebuild)
            if to_queue and fences and fences.is_dead_at(rec.topic, rec.phys):
                to_queue = False  # its topic was deleted; the index keeps it for internal keys
            # Half messages are not indexed (append.UNINDEXED); replay must build the same index.
            to_index = (rec.phys >= pi or rebuild_index) and not rec.flags & UNINDEXED
            if not (to_queue or to_index):
                continue
            replay(rec, queue_set, index, to_queue, to_index)
            n += 1
        end, reason = end_out[-1]
        if end >= p or start >= p or reason == _CUT or rebuild or rebuild_index:
            break
        # The scan for the index stopped before P, inside the log recorded as durable (damage,
        # or a hole): that is not a torn tail to cut. The queue entries there are durable (a
        # read of the damaged record fails, as one before P always does); only the index
        # entries from there to P cannot be rebuilt. Go on from P.
        log.error(
            "commit log record at offset %d is invalid (%s) inside the region the checkpoint "
            "recorded as durable (up to %d): the key index will not find the records from it "
            "to %d",
            end,
            reason or "unwritten hole",
            p,
            p,
        )
        start = p
    rep.records_replayed = n
    end, reason = end_out[-1]
    if cut is not None and reason != _CUT and end >= cut:
        # The scan stopped at or past the cut for another reason (a record the failed write
        # left torn, zeros where it wrote nothing): not damage, the unacknowledged tail.
        reason = _CUT
    rep.end_offset = end
    rep.torn_reason = reason

    rep.advance(Phase.TRUNCATE)
    if reason == _CUT:
        # Not damage: records a failed write left and the client was told failed (sync mode:
        # never acknowledged). Valid records follow by design; drop them all.
        log.warning("recovery dropped the unacknowledged records from offset %d on", end)
        rep.torn_bytes_cleared = commitlog.truncate(end, clear_tail=True)
        for cq in queues.values():
            cq.truncate_from_phys(end)
            cq.clear_after_end()
    elif reason is not None or abnormal:
        if reason is not None and end < p:
            raise CorruptLog(
                f"commit log record at offset {end} is invalid ({reason}) inside the region the "
                f"checkpoint recorded as durable (up to {p}): the disk or a tool damaged it"
            )
        later = commitlog.find_valid_after(end)
        if later is not None and truncate_damage:
            log.error(
                "commit log damaged at offset %d (%s); truncating as configured, dropping the "
                "records from there on, the first valid one at %d",
                end,
                reason or "unwritten hole",
                later,
            )
            rep.dropped_after_damage = True
        elif later is not None:
            raise CorruptLog(
                f"commit log is damaged at offset {end} ({reason or 'unwritten hole'}) but a valid "
                f"record follows at offset {later}: refusing to drop possibly acknowledged data. "
                "Restore the segment from a backup, or reopen with truncate_damaged_tail=True "
                "(txbroker serve --repair-truncate) to drop everything from the damage on"
            )
        rep.torn_bytes_cleared = commitlog.truncate(end, clear_tail=True)
        for cq in queues.values():
            cq.truncate_from_phys(end)
            cq.clear_after_end()
        if rep.torn_bytes_cleared:
            log.warning(
                "recovery cleared a torn tail of %d bytes at offset %d (%s)",
                rep.torn_bytes_cleared,
                end,
                reason,
            )
    else:
        commitlog.truncate(end, clear_tail=False)
    rep.advance(Phase.DONE)
    rep.seconds = time.perf_counter() - t0
    return rep


def _drop_dead_queues(
    queues: dict[tuple[str, int], ConsumeQueue], fences: Fences, cq_root: Path
) -> None:
    """Remove queues of a deleted topic that a crash left on disk (the deletion is durable in
    the fences before the files go): their entries point at dead records."""
    if not fences:
        return
    for (topic, qid), cq in list(queues.items()):
        fence = fences.get(topic)
        if fence is None:
            continue
        first = cq.entry_raw(cq.min_offset) if cq.max_offset > cq.min_offset else None
        dead_first = first is not None and first[1] != 0 and first[0] < fence.phys
        if dead_first or cq.min_offset < fence.ends.get(qid, 0):
            del queues[(topic, qid)]
            cq.close()
            shutil.rmtree(cq_root / topic / str(qid), ignore_errors=True)
            with contextlib.suppress(OSError):  # the topic's directory, once empty
                (cq_root / topic).rmdir()


def _wipe_index(index: KeyIndex) -> None:
    while index.files:
        index.files.pop().f.close(unlink=True)
