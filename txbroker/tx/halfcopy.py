"""Copying open half messages forward (:class:`HalfCopier`), as RocketMQ re-puts checked halves.

A half record must outlive its segment while its transaction is open: a parked transaction may
be committed by hand days later, and the commit copies the half's body. The copier appends a
copy at the end of the log before retention deletes the half's segment (the store's
``RetentionHook``) and when recovery's span grows much longer than the open transactions
(compaction). A copy carries the transaction's state, so the op records before it may go; a
crash between writing copies and saving ``tx.json`` leaves two halves, and recovery keeps the
later. The steps and properties: docs/transactions.md, "Half messages copied forward".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

from txbroker.errors import Internal, InvalidArgument
from txbroker.store import AppendResult, Message, MessageStore, RecordFlag
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.state import (
    HALF_TOPIC,
    OP_TOPIC,
    PROP_CHECKS,
    PROP_CREATED,
    PROP_NEXT_CHECK,
    PROP_OP_MARK,
    PROP_REASON,
    PROP_REPUT,
    PROP_STATE,
    Tx,
)

__all__ = ["COMPACT_FACTOR", "COMPACT_MIN_SPAN", "HalfCopier", "copy_properties"]

log = logging.getLogger(__name__)

_TX_HALF: Final = int(RecordFlag.TX_HALF)
# A span of this many %HALF records costs recovery about a third of a second at start (each a
# record read and a key-index look-up; docs/benchmarks.md, "Transaction recovery"): not worth
# copying for.
COMPACT_MIN_SPAN: Final = 10_000
# Past four records per open transaction, the oldest are copied; half the allowed span is kept
# where it is, so a compaction leaves the span under the trigger and copies at most one record
# per new half record (amortised) even with every open transaction old.
COMPACT_FACTOR: Final = 4
# Copies per compaction round (one every COMPACT_INTERVAL_S): a backlog of old open
# transactions is worked off over several rounds instead of stalling the event loop in one.
COMPACT_MAX_MOVES: Final = 10_000
COMPACT_INTERVAL_S: Final = 10
# Copies appended per fsync; bodies read back are held until then, so a batch also stops at
# 64 MiB of them (a 4 MiB body is the largest).
BATCH_MAX: Final = 1_000
BATCH_BYTES_MAX: Final = 64 * 1024 * 1024
# Properties only a copy carries, replaced on every copy.
_COPY_ONLY: Final = frozenset(
    {PROP_OP_MARK, PROP_REPUT, PROP_CREATED, PROP_STATE, PROP_CHECKS, PROP_NEXT_CHECK, PROP_REASON}
)


def copy_properties(props: dict[str, str], tx: Tx, op_mark: int) -> dict[str, str]:
    """The properties of a copy of the half record with ``props``, for ``tx`` as it is now."""
    out = {k: v for k, v in props.items() if k not in _COPY_ONLY}
    out[PROP_OP_MARK] = str(op_mark)
    out[PROP_REPUT] = str(int(props.get(PROP_REPUT, "0")) + 1)
    out[PROP_CREATED] = str(tx.created_ms)
    out[PROP_STATE] = tx.state.value
    out[PROP_CHECKS] = str(tx.checks)
    out[PROP_NEXT_CHECK] = str(tx.next_check_ms)
    if tx.last_reason:
        out[PROP_REASON] = tx.last_reason[:500]
    return out


class HalfCopier:
    """Copies open halves forward for retention and compaction. Created with the store (so
    retention never runs without it) and started once the coordinator has recovered: before
    that, retention waits (``before_retention`` raises)."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store
        self._coord: TxCoordinator | None = None
        self._lock = asyncio.Lock()  # retention and compaction never copy the same half twice

    def start(self, coord: TxCoordinator) -> None:
        self._coord = coord

    async def before_retention(self, log_start: int) -> None:
        coord = self._started()
        async with self._lock:
            doomed = [t for t in coord.open.values() if t.half_phys < log_start]
            moved = await self._move(coord, doomed)
            left = [
                t
                for t in coord.open.values()
                if t.half_phys < log_start and not self._store.is_dead_at(t.topic, t.half_phys)
            ]
        if moved:
            log.info("retention: %d open transactions' half messages copied forward", moved)
        if left:
            raise Internal(
                f"{len(left)} open transactions' half messages could not be copied forward "
                f"(first: {left[0].tx_id}); their segments are kept"
            )

    def due(self) -> list[Tx]:
        """The open transactions to copy so recovery's span is bounded by how many are open:
        none while the span is at most max(COMPACT_MIN_SPAN, COMPACT_FACTOR x open)."""
        coord = self._started()
        txs = coord.open.values()
        if not txs:
            return []
        half_hi = self._store.queue_range(HALF_TOPIC, 0)[1]
        op_hi = self._store.queue_range(OP_TOPIC, 0)[1]
        span = max(COMPACT_MIN_SPAN, COMPACT_FACTOR * len(txs))
        half_low = min(t.half_offset for t in txs)
        op_low = min(t.op_mark for t in txs)
        if half_hi - half_low <= span and op_hi - op_low <= span:
            return []
        keep = span // 2
        old = [t for t in txs if t.half_offset < half_hi - keep or t.op_mark < op_hi - keep]
        old.sort(key=lambda t: t.half_offset)
        return old

    async def compact(self) -> int:
        """Copy the oldest open halves forward when recovery's span is too long for how many
        are open; return how many were copied."""
        if self._coord is None:
            return 0
        async with self._lock:
            moved = await self._move(self._coord, self.due()[:COMPACT_MAX_MOVES])
        if moved:
            log.info("transactions: %d old open half messages copied forward", moved)
        return moved

    def _started(self) -> TxCoordinator:
        if self._coord is None:
            raise Internal("the transactions are not recovered yet; retention waits")
        return self._coord

    async def _move(self, coord: TxCoordinator, txs: Sequence[Tx]) -> int:
        pending = [t.pending for t in txs if t.pending is not None]
        if pending:  # a PREPARE or a decision being written: see how it ends first
            await asyncio.wait(pending)
        moved = 0
        batch: list[tuple[Tx, tuple[bytes, dict[str, str], int]]] = []
        size = 0
        for tx in sorted(txs, key=lambda t: t.half_offset):
            if coord.open.get(tx.tx_id) is not tx or tx.ended:
                continue
            half = tx.half
            if half is None:
                stored = await self._store.read(tx.half_phys)
                half = (stored.body, stored.properties, stored.born_timestamp_ms)
            batch.append((tx, half))
            size += len(half[0])
            if len(batch) >= BATCH_MAX or size >= BATCH_BYTES_MAX:
                moved += await self._move_batch(coord, batch)
                batch, size = [], 0
        if batch:
            moved += await self._move_batch(coord, batch)
        if moved:
            coord.snapshot.mark()
            await coord.snapshot.save_async()  # the marks move past the old halves
        return moved

    async def _move_batch(
        self, coord: TxCoordinator, batch: list[tuple[Tx, tuple[bytes, dict[str, str], int]]]
    ) -> int:
        store = self._store
        written: list[tuple[Tx, AppendResult, int, dict[str, str]]] = []
        for tx, (body, props, _born) in batch:  # one event-loop step: no op record between
            if coord.open.get(tx.tx_id) is not tx or tx.ended or tx.pending is not None:
                continue  # ended (or ending) while bodies were read: its decision is written
            if store.is_dead_at(tx.topic, tx.half_phys):
                continue  # its topic was deleted: the deletion rolls it back
            op_mark = store.queue_range(OP_TOPIC, 0)[1]
            copy = copy_properties(props, tx, op_mark)
            msg = Message(HALF_TOPIC, body, 0, copy, _TX_HALF, tx.created_ms)
            try:
                res = store.append_nowait(msg)
            except InvalidArgument as e:  # this copy only (too large with its state)
                log.error("cannot copy the half message of %s forward: %s", tx.tx_id, e)
                continue
            written.append((tx, res, op_mark, copy))
        if not written:
            return 0
        await store.committer.wait_durable()  # async flush mode too: the old copy may go next
        for tx, res, op_mark, copy in written:
            if coord.open.get(tx.tx_id) is not tx:
                continue  # ended meanwhile: its decision record is after the copy
            tx.half_phys, tx.half_offset = res.physical_offset, res.queue_offset
            tx.op_mark = op_mark
            if tx.half is not None:
                tx.half = (tx.half[0], copy, tx.half[2])
        return len(written)
