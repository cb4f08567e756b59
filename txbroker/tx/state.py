"""Transactions: states, the one guarded transition function, and the record properties.

    PREPARED ──commit──▶ COMMITTED          (final)
        │    ──rollback─▶ ROLLED_BACK       (final)
        └──max checks──▶ PARKED ──commit | rollback (by an operator)
                                └──resume──▶ PREPARED (checks start again)

Resolution is final and fenced: a second END_TX with the same decision returns the first
result; a different one is refused with TransactionConflict, whoever sends it.

*Stalled* is not a state: a PREPARED transaction whose checks have reached no one for the stall
time is flagged (:meth:`Tx.stalled`) and goes on being checked and resolved as any other, so
nothing about it needs a transition, an op record or fencing; only when the run began is kept.

*Unconfirmed* is not a state either: with sync replication, a PREPARE or a decision whose wait
for the slaves timed out is in the master's log all the same, so it stands (open, or ended) and
is flagged (``Tx.unconfirmed``) until a repeated request has seen the slaves hold it.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, get_args

from txbroker.errors import TransactionConflict
from txbroker.store import record as store_record

__all__ = [
    "CHECK_HISTORY_MAX",
    "HALF_TOPIC",
    "OP_TOPIC",
    "SINCE_UNKNOWN",
    "ENDED_COMMITTED",
    "ENDED_KEY",
    "ENDED_RESOLVED_BY",
    "ENDED_TOPIC",
    "ENDED_UNCONFIRMED",
    "CheckRecord",
    "Decision",
    "EndedRecord",
    "Resolver",
    "Tx",
    "TxState",
    "ended_confirmed",
    "ended_record",
    "ended_state",
    "from_ended",
    "transition",
    "transition_back",
]

HALF_TOPIC: Final = "%HALF"  # prepared messages, invisible to every consumer
OP_TOPIC: Final = "%TXOP"  # one op record per decision, park and resume

# Properties of a half record (beside the message's own: id, keys, tags, headers).
PROP_TX: Final = "tx"  # transaction id (also kept on the committed message)
# The store's name for it: a half message belongs to its target topic (and dies with it).
PROP_TARGET_TOPIC: Final = store_record.PROP_TARGET_TOPIC
PROP_TARGET_QUEUE: Final = "tq"
PROP_GROUP: Final = "pg"  # producer group: picks the check-back secret
PROP_CHECK_URL: Final = "cu"
PROP_TRACEPARENT: Final = "tp"
PROP_TIMEOUT: Final = "to"  # ms after PREPARE before the first back-check
PROP_DELIVER_AT: Final = "da"  # delayed transactional message: deliver at (ms)
PROP_OP_MARK: Final = "om"  # %TXOP end offset when prepared: where recovery reads ops from
# Only on a half record copied forward (halfcopy.py): the transaction as it was when copied, since
# its earlier op records (a park) may be deleted with the segments the copy outlives.
PROP_REPUT: Final = "rp"  # how many times this half was copied forward (1, 2, ...)
PROP_CREATED: Final = "cm"  # store time of the first half record (the PREPARE), ms
PROP_STATE: Final = "ts"  # prepared | parked
PROP_CHECKS: Final = "ck"  # counted back-checks
PROP_NEXT_CHECK: Final = "nc"  # when the next back-check is due, ms
# Properties of an op record.
PROP_OP: Final = "op"  # commit | rollback | park | resume
PROP_HALF_PHYS: Final = "hp"  # physical offset of the half record
PROP_BY: Final = "by"  # producer | check | operator
PROP_REASON: Final = "why"  # also on a copied half: its last reason (a parked one's why)

# Properties that describe the transaction, not the message: stripped when it is committed.
HALF_ONLY: Final = frozenset(
    {
        PROP_TARGET_TOPIC,
        PROP_TARGET_QUEUE,
        PROP_GROUP,
        PROP_CHECK_URL,
        PROP_TIMEOUT,
        PROP_DELIVER_AT,
        PROP_OP_MARK,
        PROP_REPUT,
        PROP_CREATED,
        PROP_STATE,
        PROP_CHECKS,
        PROP_NEXT_CHECK,
        PROP_REASON,
    }
)


class TxState(enum.StrEnum):
    PREPARED = "prepared"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    PARKED = "parked"


class Decision(enum.StrEnum):
    COMMIT = "commit"
    ROLLBACK = "rollback"

    @property
    def state(self) -> TxState:
        return TxState.COMMITTED if self is Decision.COMMIT else TxState.ROLLED_BACK


class Resolver(enum.StrEnum):
    PRODUCER = "producer"
    CHECK = "check"
    OPERATOR = "operator"


# Back-checks remembered per transaction, newest kept: the default parks after 15 counted checks,
# so this holds a parked transaction's whole history while bounding memory for 1M open ones
# (most never need a check and hold none).
CHECK_HISTORY_MAX: Final = 16

# ``Tx.unreachable_since_ms`` of a transaction recovered without it (after a failover: the new
# master has the log, not the old one's tx.json): its first check that cannot reach the service
# dates the run from the transaction's first due check, as if none had reached it since.
SINCE_UNKNOWN: Final = -1


@dataclass(frozen=True, slots=True)
class CheckRecord:
    """One back-check as the console's timeline shows it: in memory only (since the broker
    started); parking, resuming and the decision are in the log."""

    at_ms: int  # when the answer (or the failure) came
    outcome: str  # commit | rollback | unknown, or how it failed: unreachable, timeout, ...
    reason: str
    seconds: float


_ALLOWED: Final[dict[TxState, frozenset[TxState]]] = {
    TxState.PREPARED: frozenset({TxState.COMMITTED, TxState.ROLLED_BACK, TxState.PARKED}),
    TxState.PARKED: frozenset({TxState.COMMITTED, TxState.ROLLED_BACK, TxState.PREPARED}),
    TxState.COMMITTED: frozenset(),
    TxState.ROLLED_BACK: frozenset(),
}


@dataclass(slots=True)
class Tx:
    tx_id: str
    topic: str
    queue_id: int
    producer_group: str
    check_url: str
    message_id: str
    key: str | None
    traceparent: str | None
    timeout_ms: int
    created_ms: int
    half_phys: int
    half_offset: int  # queue offset in %HALF
    op_mark: int  # %TXOP end offset when prepared
    state: TxState = TxState.PREPARED
    checks: int = 0  # back-checks that reached the endpoint (they park it at the maximum)
    attempts: int = 0  # back-checks tried, reached or not (they set the backoff)
    next_check_ms: int = 0
    # When its checks stopped reaching the service: the first of the current run of checks that
    # could not (unreachable, a pulled one no poller took, or one held behind an endpoint that
    # is unreachable), epoch ms; 0 while they reach it (or none was due yet).
    unreachable_since_ms: int = 0
    last_reason: str = ""
    resolved_by: str = ""
    resolved_ms: int = 0
    deliver_at_ms: int | None = None
    # Its last write (the half record while open, the decision once ended) timed out waiting for
    # the slaves (sync replication): it is in this master's log, not known to be on theirs. A
    # repeated PREPARE or END_TX waits for them before it answers as acknowledged.
    unconfirmed: bool = False
    # The half record's body and properties, kept while open when small (saves reading and
    # decoding it back at commit); None means read it from the log.
    half: tuple[bytes, dict[str, str], int] | None = field(default=None, repr=False)
    # While a PREPARE or a resolution is being written: what a concurrent request waits for.
    pending: asyncio.Future[Any] | None = field(default=None, repr=False)
    # The back-checks since the broker started, made at the first one (``record_check``): most
    # transactions never have one, and up to 1M may be open, each an object the garbage
    # collector walks (a deque each would double them).
    history: deque[CheckRecord] | None = field(default=None, repr=False)

    def record_check(self, record: CheckRecord) -> None:
        if self.history is None:
            self.history = deque(maxlen=CHECK_HISTORY_MAX)
        self.history.append(record)

    @property
    def ended(self) -> bool:
        return self.state in (TxState.COMMITTED, TxState.ROLLED_BACK)

    def unreached(self, now_ms: int) -> bool:
        """A check could not reach the service at ``now_ms``: a run of such checks starts,
        unless one is on. Whether anything changed (the state file then needs saving)."""
        if self.unreachable_since_ms > 0:
            return False
        if self.unreachable_since_ms == SINCE_UNKNOWN:
            self.unreachable_since_ms = min(self.created_ms + self.timeout_ms, now_ms)
        else:
            self.unreachable_since_ms = now_ms
        return True

    def reached(self) -> None:
        """A check reached the service (answered, badly, or timed out after it was sent)."""
        self.unreachable_since_ms = 0

    def stalled(self, now_ms: int, after_ms: int) -> bool:
        """PREPARED, and its checks have reached no one for ``after_ms`` or longer."""
        since = self.unreachable_since_ms
        return self.state is TxState.PREPARED and 0 < since <= now_ms - after_ms


# An ended transaction as the coordinator keeps it among the recently ended (up to 100,000): one
# tuple of strings, ints, bools and None, with no reference to the half body, a future or the
# history's deque. CPython stops tracking such a tuple at its first young collection, so the
# collector never walks it again; a Tx object each stayed tracked and every full collection
# walked them all (docs/benchmarks.md, "Performance round"). The fields are Tx's, in its order,
# without tx_id (the key it is kept under), half and pending; the state is a bool (an enum
# member would keep the tuple tracked), and the history is CheckRecord's fields one after the
# other in one flat tuple (a collection untracks a tuple whose tuples it has untracked before:
# one more level would take one more collection).
EndedRecord: TypeAlias = tuple[
    str,  # topic
    int,  # queue_id
    str,  # producer_group
    str,  # check_url
    str,  # message_id
    str | None,  # key
    str | None,  # traceparent
    int,  # timeout_ms
    int,  # created_ms
    int,  # half_phys
    int,  # half_offset
    int,  # op_mark
    bool,  # committed (else rolled back)
    int,  # checks
    int,  # attempts
    int,  # next_check_ms
    int,  # unreachable_since_ms
    str,  # last_reason
    str,  # resolved_by
    int,  # resolved_ms
    int | None,  # deliver_at_ms
    bool,  # unconfirmed
    tuple[int | str | float, ...],  # history: at_ms, outcome, reason, seconds, at_ms, ...
]
# The fields read without rebuilding the Tx: a repeated END_TX's answer, the listing's filters.
ENDED_TOPIC: Final = 0
ENDED_KEY: Final = 5
ENDED_COMMITTED: Final = 12
ENDED_RESOLVED_BY: Final = 18
ENDED_UNCONFIRMED: Final = 21
assert get_args(EndedRecord)[ENDED_COMMITTED] is get_args(EndedRecord)[ENDED_UNCONFIRMED] is bool
assert len(get_args(EndedRecord)) == ENDED_UNCONFIRMED + 2  # then the history, last


def ended_record(tx: Tx) -> EndedRecord:
    """``tx``, which has ended, as the coordinator keeps it (see EndedRecord)."""
    assert tx.ended
    history = tuple(v for r in tx.history or () for v in (r.at_ms, r.outcome, r.reason, r.seconds))
    return (
        tx.topic,
        tx.queue_id,
        tx.producer_group,
        tx.check_url,
        tx.message_id,
        tx.key,
        tx.traceparent,
        tx.timeout_ms,
        tx.created_ms,
        tx.half_phys,
        tx.half_offset,
        tx.op_mark,
        tx.state is TxState.COMMITTED,
        tx.checks,
        tx.attempts,
        tx.next_check_ms,
        tx.unreachable_since_ms,
        tx.last_reason,
        tx.resolved_by,
        tx.resolved_ms,
        tx.deliver_at_ms,
        tx.unconfirmed,
        history,
    )


def ended_confirmed(rec: EndedRecord) -> EndedRecord:
    """``rec`` once its decision is known to be on the slaves."""
    return (*rec[:ENDED_UNCONFIRMED], False, rec[-1])  # the history is last


def ended_state(rec: EndedRecord) -> TxState:
    return TxState.COMMITTED if rec[ENDED_COMMITTED] else TxState.ROLLED_BACK


def from_ended(tx_id: str, rec: EndedRecord) -> Tx:
    """The Tx that ``rec`` keeps: a copy, as it was when it ended (it changes no more)."""
    (
        topic,
        queue_id,
        producer_group,
        check_url,
        message_id,
        key,
        traceparent,
        timeout_ms,
        created_ms,
        half_phys,
        half_offset,
        op_mark,
        committed,
        checks,
        attempts,
        next_check_ms,
        unreachable_since_ms,
        last_reason,
        resolved_by,
        resolved_ms,
        deliver_at_ms,
        unconfirmed,
        history,
    ) = rec
    tx = Tx(
        tx_id,
        topic,
        queue_id,
        producer_group,
        check_url,
        message_id,
        key,
        traceparent,
        timeout_ms,
        created_ms,
        half_phys,
        half_offset,
        op_mark,
        TxState.COMMITTED if committed else TxState.ROLLED_BACK,
        checks,
        attempts,
        next_check_ms,
        unreachable_since_ms,
        last_reason,
        resolved_by,
        resolved_ms,
        deliver_at_ms,
        unconfirmed,
    )
    if history:
        h = history
        tx.history = deque(
            (
                CheckRecord(int(h[i]), str(h[i + 1]), str(h[i + 2]), float(h[i + 3]))
                for i in range(0, len(h), 4)
            ),
            maxlen=CHECK_HISTORY_MAX,
        )
    return tx


def transition_back(tx: Tx, to: TxState) -> None:
    """Undo a transition whose writes failed (nothing reached the log): the one exception to
    the table above, used only by the coordinator's failure path."""
    assert tx.state in (TxState.COMMITTED, TxState.ROLLED_BACK)
    assert to in (TxState.PREPARED, TxState.PARKED)
    tx.state = to
    tx.resolved_by = ""


def transition(tx: Tx, to: TxState) -> None:
    """The only way a transaction changes state."""
    if to not in _ALLOWED[tx.state]:
        raise TransactionConflict(
            f"transaction {tx.tx_id} is {tx.state.value}; it cannot become {to.value}"
        )
    tx.state = to
