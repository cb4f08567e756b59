"""Parking and resuming: transactions the back-checks could not settle wait for an operator.

After ``max_checks`` counted back-checks the checker parks a transaction: it stays open (its
half record is kept, and recovery rebuilds it as parked) but is not checked again. An operator
then commits or rolls it back with an ordinary, fenced END_TX (by ``operator``), or resumes it:
PREPARED again with its counts reset, checked at once. Park and resume each append one op
record to ``%TXOP`` (without the ``txend:`` key, which only a decision has), so recovery
replays them in order. Separate from the coordinator because none of this is on the
PREPARE/END_TX path; the coordinator's ``park`` and ``resume`` call these and keep the books.
"""

from __future__ import annotations

import time
from typing import Final

from txbroker.errors import TransactionConflict
from txbroker.store import Message, MessageStore, RecordFlag
from txbroker.tx.state import (
    OP_TOPIC,
    PROP_BY,
    PROP_HALF_PHYS,
    PROP_OP,
    PROP_REASON,
    PROP_TX,
    Resolver,
    Tx,
    TxState,
    transition,
)

__all__ = ["park", "resume"]

_TX_OP: Final = int(RecordFlag.TX_OP)


def park(store: MessageStore, tx: Tx, reason: str) -> None:
    """Stop checking ``tx`` until an operator acts; ``reason`` says why."""
    transition(tx, TxState.PARKED)
    tx.last_reason = reason
    _append_op(store, tx, "park", Resolver.CHECK, reason)


def resume(store: MessageStore, tx_id: str, tx: Tx | None) -> Tx:
    """Make the parked ``tx`` (the open transaction ``tx_id``, if any) prepared again, due
    for a check now."""
    if tx is None or tx.state is not TxState.PARKED:
        state = tx.state.value if tx else "not open"
        raise TransactionConflict(f"only a parked transaction can resume; {tx_id} is {state}")
    transition(tx, TxState.PREPARED)
    tx.checks = tx.attempts = 0
    tx.reached()  # a new round: the stall clock starts at its first check that cannot reach
    tx.next_check_ms = time.time_ns() // 1_000_000
    tx.last_reason = "resumed by an operator"
    _append_op(store, tx, "resume", Resolver.OPERATOR, tx.last_reason)
    return tx


def _append_op(store: MessageStore, tx: Tx, op: str, by: Resolver, why: str) -> None:
    props = {
        PROP_TX: tx.tx_id,
        PROP_OP: op,
        PROP_HALF_PHYS: str(tx.half_phys),
        PROP_BY: by.value,
        PROP_REASON: why[:500],
    }
    store.append_nowait(Message(OP_TOPIC, b"", 0, props, _TX_OP))
