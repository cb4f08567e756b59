"""Recovery of open transactions at start, and the state file that keeps it short.

The coordinator holds its open transactions in memory only; after a restart they are rebuilt
from the log. Every half record in ``%HALF`` without a decision record (no ``txend:<tx>`` in the
index, no commit or rollback op in ``%TXOP``) is open again, parked or not as its park and
resume op records say, with the back-check counts saved in ``meta/tx.json``.

The same file holds two low-water marks: the oldest unresolved half record, and the ``%TXOP``
end offset when it was prepared. Recovery reads from those, so restart cost follows the
unresolved window, not history. This is separate from the coordinator because it runs once, at
start, reading back what the PREPARE/END_TX paths wrote; none of it is on those paths.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
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
    PROP_DELIVER_AT,
    PROP_GROUP,
    PROP_OP,
    PROP_OP_MARK,
    PROP_REASON,
    PROP_TARGET_QUEUE,
    PROP_TARGET_TOPIC,
    PROP_TIMEOUT,
    PROP_TRACEPARENT,
    PROP_TX,
    Resolver,
    Tx,
    TxState,
)

__all__ = ["STATE_FILE", "AppendCopy", "encode_state", "recover_open", "tx_from_half"]

log = logging.getLogger(__name__)

STATE_FILE: Final = "tx.json"
SCAN_BATCH: Final = 512

# The coordinator's way of appending a committed copy (``TxCoordinator._append_copy``): the
# transaction id, the half record's (body, properties, born ms), who resolved it, the internal
# key; returns (topic, queue) to wake, or None for a scheduled copy.
AppendCopy: TypeAlias = Callable[
    [str, tuple[bytes, dict[str, str], int], Resolver, str], tuple[str, int] | None
]


class _Saved(msgspec.Struct):
    half_low: int = 0
    op_low: int = 0
    checks: dict[str, tuple[int, int, str]] = msgspec.field(default_factory=dict)


def encode_state(store: MessageStore, open_txs: Mapping[str, Tx]) -> bytes:
    """The state file's content for the transactions open now."""
    half_hi = store.queue_range(HALF_TOPIC, 0)[1]
    op_hi = store.queue_range(OP_TOPIC, 0)[1]
    saved = _Saved(
        half_low=min((t.half_offset for t in open_txs.values()), default=half_hi),
        op_low=min((t.op_mark for t in open_txs.values()), default=op_hi),
        checks={t.tx_id: (t.checks, t.next_check_ms, t.last_reason) for t in open_txs.values()},
    )
    return msgspec.json.encode(saved)


async def recover_open(
    store: MessageStore, publishing: Publishing, path: Path, append_copy: AppendCopy
) -> tuple[dict[str, Tx], int]:
    """Rebuild open transactions from %HALF, %TXOP and the index past the saved low-water
    marks (and complete commits recorded as op records by an earlier version, whose copies are
    appended here but not waited for). Returns the open transactions and how many commits were
    completed."""
    publishing.ensure_system_topic(HALF_TOPIC, 1)
    publishing.ensure_system_topic(OP_TOPIC, 1)
    saved = _load(path)
    ops: dict[str, list[StoredMessage]] = {}
    async for rec in _scan(store, OP_TOPIC, saved.op_low):
        tx_id = rec.properties.get(PROP_TX, "")
        ops.setdefault(tx_id, []).append(rec)
    open_txs: dict[str, Tx] = {}
    finished = 0
    async for half in _scan(store, HALF_TOPIC, saved.half_low):
        tx = tx_from_half(half)
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
        for o in history:  # park and resume, in order
            op = o.properties.get(PROP_OP)
            if op == "park":
                tx.state = TxState.PARKED
                tx.last_reason = o.properties.get(PROP_REASON, "")
                resumed = False
            elif op == "resume":
                tx.state, tx.checks = TxState.PREPARED, 0
                resumed = True
        count, next_ms, reason = saved.checks.get(tx.tx_id, (0, tx.next_check_ms, ""))
        if tx.state is TxState.PARKED:
            tx.checks = count
        elif not resumed:  # counts saved before a resume belong to the earlier round
            tx.checks, tx.next_check_ms = count, next_ms
            tx.last_reason = reason or tx.last_reason
        open_txs[tx.tx_id] = tx
    return open_txs, finished


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
    if await store.lookup(KeyKind.INTERNAL, key, limit=1):
        return None
    stored = await store.read(tx.half_phys)
    half = (stored.body, stored.properties, stored.born_timestamp_ms)
    return append_copy(tx.tx_id, half, by, key)


async def _scan(store: MessageStore, topic: str, start: int) -> AsyncIterator[StoredMessage]:
    lo, hi = store.queue_range(topic, 0)
    offset = max(start, lo)
    while offset < hi:
        got = await store.get_messages(topic, 0, offset, SCAN_BATCH)
        if not got.messages:
            break
        for m in got.messages:
            yield m
        offset = got.next_offset


def tx_from_half(m: StoredMessage) -> Tx:
    """The open transaction a half record describes, as it was when prepared."""
    p = m.properties
    timeout = int(p[PROP_TIMEOUT])
    deliver_at = p.get(PROP_DELIVER_AT)
    return Tx(
        p[PROP_TX],
        p[PROP_TARGET_TOPIC],
        int(p[PROP_TARGET_QUEUE]),
        p[PROP_GROUP],
        p[PROP_CHECK_URL],
        p.get(PROP_MESSAGE_ID, ""),
        m.keys[0] if m.keys else None,
        p.get(PROP_TRACEPARENT),
        timeout,
        m.store_timestamp_ms,
        m.physical_offset,
        m.queue_offset,
        int(p.get(PROP_OP_MARK, "0")),
        next_check_ms=m.store_timestamp_ms + timeout,
        deliver_at_ms=int(deliver_at) if deliver_at else None,
    )
