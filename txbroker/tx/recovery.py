"""Recovery of open transactions at start, and the state file that keeps it short.

Every half record in ``%HALF`` without a decision record is open again, parked or not as its op
records say, with the back-check counts saved in ``meta/tx.json``. That file also holds two
low-water marks (the oldest unresolved half record, and the ``%TXOP`` end when it was
prepared), so restart cost follows the unresolved window, not history; ``txbroker.tx.halfcopy``
keeps the window short, and of two half records of one transaction the later wins. Separate
from the coordinator because it runs once, at start, off the PREPARE/END_TX paths.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeAlias

import msgspec

from txbroker.errors import TxbError
from txbroker.store import PROP_MESSAGE_ID, KeyKind, MessageStore, StoredMessage
from txbroker.tx.ports import Publishing
from txbroker.tx.state import (
    HALF_TOPIC,
    OP_TOPIC,
    PROP_BY,
    PROP_CHECK_URL,
    PROP_CHECKS,
    PROP_CREATED,
    PROP_DELIVER_AT,
    PROP_GROUP,
    PROP_NEXT_CHECK,
    PROP_OP,
    PROP_OP_MARK,
    PROP_REASON,
    PROP_REPUT,
    PROP_STATE,
    PROP_TARGET_QUEUE,
    PROP_TARGET_TOPIC,
    PROP_TIMEOUT,
    PROP_TRACEPARENT,
    PROP_TX,
    SINCE_UNKNOWN,
    Resolver,
    Tx,
    TxState,
)

__all__ = [
    "STATE_FILE",
    "AppendCopy",
    "Recovered",
    "encode_state",
    "recover_open",
    "tx_from_half",
]

log = logging.getLogger(__name__)

STATE_FILE: Final = "tx.json"
SCAN_BATCH: Final = 512

# The coordinator's way of appending a committed copy (``TxCoordinator._append_copy``): the
# transaction id, the half record's (body, properties, born ms), who resolved it, the internal
# key; returns (topic, queue) to wake, or None for a scheduled copy.
AppendCopy: TypeAlias = Callable[
    [str, tuple[bytes, dict[str, str], int], Resolver, str], tuple[str, int] | None
]


# A file written before ``half_hi`` existed: its counts are newer than any half in the log.
_NO_HALF_HI: Final = 1 << 62


class _Saved(msgspec.Struct):
    half_low: int = 0
    op_low: int = 0
    checks: dict[str, tuple[int, int, str]] = msgspec.field(default_factory=dict)
    # The end of %HALF when the file was taken: ``checks`` is newer than every half before it
    # and older than every copy after it (a copy carries its own counts).
    half_hi: int = _NO_HALF_HI
    counters: dict[str, int] = msgspec.field(default_factory=dict)
    # (attempts, unreachable_since_ms) of the transactions in ``checks`` where either is not 0:
    # the backoff and the stall clock go on after a restart. None in a file written before it
    # existed: those transactions' runs are unknown (``SINCE_UNKNOWN``).
    attempts: dict[str, tuple[int, int]] | None = None


@dataclass(slots=True)
class Recovered:
    open: dict[str, Tx]  # prepared and parked, oldest half first
    finished: int  # commits an earlier version recorded, made visible now
    counters: dict[str, int]  # the coordinator's counters as last saved
    halves_read: int = 0  # %HALF records read: what a restart costs
    ops_read: int = 0  # %TXOP records read
    seconds: float = 0.0


def encode_state(
    store: MessageStore, open_txs: Mapping[str, Tx], counters: Mapping[str, int]
) -> bytes:
    """The state file's content for the transactions open now."""
    half_hi = store.queue_range(HALF_TOPIC, 0)[1]
    op_hi = store.queue_range(OP_TOPIC, 0)[1]
    saved = _Saved(
        half_low=min((t.half_offset for t in open_txs.values()), default=half_hi),
        op_low=min((t.op_mark for t in open_txs.values()), default=op_hi),
        checks={t.tx_id: (t.checks, t.next_check_ms, t.last_reason) for t in open_txs.values()},
        half_hi=half_hi,
        counters=dict(counters),
        attempts={
            t.tx_id: (t.attempts, t.unreachable_since_ms)
            for t in open_txs.values()
            if t.attempts or t.unreachable_since_ms
        },
    )
    return msgspec.json.encode(saved)


async def recover_open(
    store: MessageStore,
    publishing: Publishing,
    path: Path,
    append_copy: AppendCopy,
    *,
    from_start: bool = False,
) -> Recovered:
    """Rebuild open transactions from %HALF, %TXOP and the index past the saved low-water
    marks (and complete commits recorded as op records by an earlier version, whose copies are
    appended here but not waited for). ``from_start``: ignore the saved marks and back-check
    counts and read both queues from their first retained record (a slave taking over: its
    file, if any, is from an earlier term and may point past records a later master wrote).

    The coordinator holds its open transactions in memory only; after a restart they are rebuilt
    from the log. A half record is open when the index has no ``txend:<tx>`` and ``%TXOP`` no
    commit or rollback op for it. A transaction may have two half records (a crash came between a
    copy forward and the next state file): the later one wins, and it carries the state its
    earlier op records described. The file also keeps the transaction counters across restarts.
    """
    started = time.perf_counter()
    publishing.ensure_system_topic(HALF_TOPIC, 1)
    publishing.ensure_system_topic(OP_TOPIC, 1)
    saved = _load(path)
    if from_start:
        saved = _Saved(counters=saved.counters)
    ops: dict[str, list[StoredMessage]] = {}
    ops_read = halves_read = 0
    async for rec in _scan(store, OP_TOPIC, saved.op_low):
        tx_id = rec.properties.get(PROP_TX, "")
        ops.setdefault(tx_id, []).append(rec)
        ops_read += 1
    open_txs: dict[str, Tx] = {}
    finished = 0
    async for half in _scan(store, HALF_TOPIC, saved.half_low):
        halves_read += 1
        tx = tx_from_half(half)
        open_txs.pop(tx.tx_id, None)  # a later copy of the same transaction wins
        history = ops.get(tx.tx_id, [])
        final = next(
            (o for o in history if o.properties.get(PROP_OP) in ("commit", "rollback")), None
        )
        if final is None and await store.lookup(KeyKind.INTERNAL, f"txend:{tx.tx_id}", limit=1):
            continue  # committed: its visible copy is its decision record
        if final is not None:
            if final.properties[PROP_OP] == "commit":  # written by an earlier version
                try:
                    target = await _complete_commit(
                        store,
                        append_copy,
                        tx,
                        Resolver(final.properties.get(PROP_BY, "producer")),
                    )
                except TxbError as e:  # never let one record stop the broker starting
                    log.error("cannot complete the commit of %s: %s", tx.tx_id, e)
                    continue
                if target is not None:
                    finished += 1
            continue
        resumed = False
        for o in history:  # park and resume after this half record, in order
            if o.queue_offset < tx.op_mark:
                continue  # before a copy: the copy's own state already says what it did
            op = o.properties.get(PROP_OP)
            if op == "park":
                tx.state = TxState.PARKED
                tx.last_reason = o.properties.get(PROP_REASON, "")
                resumed = False
            elif op == "resume":
                tx.state, tx.checks = TxState.PREPARED, 0
                resumed = True
        default = (tx.checks, tx.next_check_ms, tx.last_reason)
        count, next_ms, reason = default
        if PROP_REPUT not in half.properties or half.queue_offset < saved.half_hi:
            count, next_ms, reason = saved.checks.get(tx.tx_id, default)  # newer than the half
        if tx.state is TxState.PARKED:
            tx.checks = count
        elif not resumed:  # counts saved before a resume belong to the earlier round
            tx.checks, tx.next_check_ms = count, next_ms
            tx.last_reason = reason or tx.last_reason
            if saved.attempts is not None and tx.tx_id in saved.checks:
                tx.attempts, tx.unreachable_since_ms = saved.attempts.get(tx.tx_id, (0, 0))
            else:  # prepared after the file, or a failover: the file cannot say
                tx.unreachable_since_ms = SINCE_UNKNOWN
        else:  # resumed: the saved run may be the earlier round's or this one's
            tx.unreachable_since_ms = SINCE_UNKNOWN
        open_txs[tx.tx_id] = tx
    took = time.perf_counter() - started
    return Recovered(open_txs, finished, saved.counters, halves_read, ops_read, took)


def _load(path: Path) -> _Saved:
    """The saved state (all defaults before the first snapshot): small, read once at start."""
    if not path.exists():
        return _Saved()
    return msgspec.json.decode(path.read_bytes(), type=_Saved)


async def _complete_commit(
    store: MessageStore, append_copy: AppendCopy, tx: Tx, by: Resolver
) -> tuple[str, int] | None:
    """Append the committed copy of a commit an earlier version recorded as an op record
    (under the key ``txc:<tx>``) unless it exists; return where it went (to notify)."""
    key = f"txc:{tx.tx_id}"
    if await store.lookup(KeyKind.INTERNAL, key, limit=1) or store.is_dead_at(
        tx.topic, tx.half_phys
    ):
        return None  # done already, or its topic was deleted since
    stored = await store.read(tx.half_phys)
    half = (stored.body, stored.properties, stored.born_timestamp_ms)
    return append_copy(tx.tx_id, half, by, key)


async def _scan(store: MessageStore, topic: str, start: int) -> AsyncIterator[StoredMessage]:
    lo, hi = store.queue_range(topic, 0)
    offset = max(start, lo)
    while offset < hi:
        got = await store.get_messages(topic, 0, offset, SCAN_BATCH)
        for m in got.messages:  # half messages of deleted topics are skipped by the store
            yield m
        if got.next_offset <= offset:
            break
        offset = got.next_offset


def tx_from_half(m: StoredMessage) -> Tx:
    """The open transaction a half record describes, as it was when prepared (or, for a copy
    made by ``txbroker.tx.halfcopy``, when copied)."""
    p = m.properties
    timeout = int(p[PROP_TIMEOUT])
    deliver_at = p.get(PROP_DELIVER_AT)
    created = int(p.get(PROP_CREATED, m.store_timestamp_ms))
    tx = Tx(
        p[PROP_TX],
        p[PROP_TARGET_TOPIC],
        int(p[PROP_TARGET_QUEUE]),
        p[PROP_GROUP],
        p[PROP_CHECK_URL],
        p.get(PROP_MESSAGE_ID, ""),
        m.keys[0] if m.keys else None,
        p.get(PROP_TRACEPARENT),
        timeout,
        created,
        m.physical_offset,
        m.queue_offset,
        int(p.get(PROP_OP_MARK, "0")),
        next_check_ms=int(p.get(PROP_NEXT_CHECK, created + timeout)),
        deliver_at_ms=int(deliver_at) if deliver_at else None,
    )
    if PROP_REPUT in p:
        tx.state = TxState(p.get(PROP_STATE, TxState.PREPARED.value))
        tx.checks = int(p.get(PROP_CHECKS, "0"))
        tx.last_reason = p.get(PROP_REASON, "")
    return tx
