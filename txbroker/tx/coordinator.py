"""The transaction coordinator: PREPARE, END_TX, operator resolution, and recovery.

PREPARE appends a *half record* to ``%HALF``, which no consumer reads. Resolving appends one
*decision record* under the internal key ``txend:<tx>``: the *visible copy* in the real topic
for a commit, an *op record* in ``%TXOP`` for a rollback. One record, so a decision is never
half written: after a crash a transaction without one is still open (a back-check decides).
With sync replication a record whose wait for the slaves timed out stands too, unconfirmed
(``Tx.unconfirmed``): it is in this master's log, which the slaves copy when they can.
Around this module: ``policy`` (what a PREPARE must name), ``checker`` (back-checks),
``parking``, and ``recovery`` (the rebuild at start, and the state file that keeps it short).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeAlias

from txbroker.errors import (
    InvalidArgument,
    NotFound,
    ReplicationTimeout,
    StoreFailed,
    TooManyTransactions,
    TransactionConflict,
    TransactionNotFound,
)
from txbroker.protocol.ids import new_id
from txbroker.protocol.messages import (
    SendRequest,
    TxEndResponse,
    TxInfo,
    TxPrepareRequest,
    TxPrepareResponse,
)
from txbroker.store import (
    PROP_IDEMPOTENCY_KEY,
    PROP_INTERNAL_KEY,
    PROP_MESSAGE_ID,
    KeyKind,
    Message,
    MessageStore,
    RecordFlag,
)
from txbroker.store.snapshot import Snapshot
from txbroker.tx import parking
from txbroker.tx.policy import PreparePolicy
from txbroker.tx.ports import Publishing
from txbroker.tx.recovery import STATE_FILE, encode_state, recover_open
from txbroker.tx.state import (
    ENDED_KEY,
    ENDED_RESOLVED_BY,
    ENDED_TOPIC,
    ENDED_UNCONFIRMED,
    HALF_ONLY,
    HALF_TOPIC,
    OP_TOPIC,
    PROP_BY,
    PROP_CHECK_URL,
    PROP_DELIVER_AT,
    PROP_GROUP,
    PROP_HALF_PHYS,
    PROP_OP,
    PROP_OP_MARK,
    PROP_REASON,
    PROP_TARGET_QUEUE,
    PROP_TARGET_TOPIC,
    PROP_TIMEOUT,
    PROP_TRACEPARENT,
    PROP_TX,
    Decision,
    EndedRecord,
    Resolver,
    Tx,
    TxState,
    ended_confirmed,
    ended_record,
    ended_state,
    from_ended,
    transition,
    transition_back,
)

__all__ = ["Ended", "OpenCounts", "Prepared", "TxCoordinator", "TxSettings"]

log = logging.getLogger(__name__)

# The listings' state filter: the two open states, and the prepared ones that are stalled.
LISTED: Final = ("prepared", "parked", "stalled")
# This many ended transactions stay in memory for cheap duplicate END_TX answers; older ones
# are answered from their decision records (txend:<tx>) through the index.
RECENT_MAX: Final = 100_000
# What a PREPARE or END_TX written at once answers: the body, and the group commit it must wait
# for before it is sent (None: at once, in async flush mode). The answer is shared with every
# append of that group commit, as a SEND's is: whoever waits on it must not cancel it.
Prepared: TypeAlias = tuple[TxPrepareResponse, "asyncio.Future[None] | None"]
Ended: TypeAlias = tuple[TxEndResponse, "asyncio.Future[None] | None"]
# A transaction whose write waits for a group commit: the state to go back to if the commit
# fails (None for a PREPARE), and the (topic, queue) a commit makes visible.
_Waiting: TypeAlias = tuple[Tx, "TxState | None", "tuple[str, int] | None"]
# Plain ints: IntFlag arithmetic runs in Python and showed up on the append path.
_TX_HALF: Final = int(RecordFlag.TX_HALF)
_TX_OP: Final = int(RecordFlag.TX_OP)
_TX_COMMITTED: Final = int(RecordFlag.TX_COMMITTED)
# Open transactions keep small half bodies in memory (64 MiB in all at most) so a commit needs
# no read back from the log; larger or later ones are read when committed.
CACHE_BODY_MAX: Final = 64 * 1024
CACHE_TOTAL_MAX: Final = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TxSettings:
    timeout_ms: int = 6_000
    max_timeout_ms: int = 24 * 3600 * 1000
    secrets: dict[str, str] = field(default_factory=dict)  # producer group -> secret
    default_secret: str | None = None
    # Open transactions live in memory; bound them (about 1 KiB each without the cached body).
    max_open: int = 1_000_000
    # A PREPARED transaction whose checks have reached no one for this long is stalled: shown
    # to operators and alerted on, never decided. 15 min: longer than a deploy or a restart of
    # the service (8 failed checks at the default backoff), short of the 45 min parking takes.
    stall_after_ms: int = 900_000


@dataclass(frozen=True, slots=True)
class OpenCounts:
    pending: int  # PREPARED
    parked: int
    stalled: int  # of the pending ones


class TxCoordinator:
    def __init__(
        self,
        store: MessageStore,
        publishing: Publishing,
        meta_dir: Path,
        settings: TxSettings,
        on_visible: Callable[[str, int], None],
    ) -> None:
        self._store = store
        self._publishing = publishing
        self._path = meta_dir / STATE_FILE
        self.settings = settings
        self._on_visible = on_visible
        self.open: dict[str, Tx] = {}  # prepared and parked
        self._recent: OrderedDict[str, EndedRecord] = OrderedDict()  # ended, newest last
        # The group commit the last write waits for, and the transactions waiting on it: one
        # callback per group commit settles them all.
        self._round: asyncio.Future[None] | None = None
        self._round_waiting: list[_Waiting] = []
        self.on_prepared: Callable[[Tx], None] = lambda tx: None
        # Since the data directory was created: kept in tx.json, so a restart goes on counting.
        self.counters: dict[str, int] = {"prepared": 0, "committed": 0, "rolled_back": 0}
        self.snapshot = Snapshot(
            self._path, lambda: encode_state(self._store, self.open, self.counters)
        )
        self._cached_bytes = 0
        policy = PreparePolicy(
            settings.secrets, settings.default_secret, settings.timeout_ms, settings.max_timeout_ms
        )
        # Bound once, so the PREPARE hot path pays one call, not an attribute look-up and a call.
        self._check_prepare: Callable[[TxPrepareRequest], tuple[str, int]] = policy.check
        self.secret_for: Callable[[str], str | None] = policy.secret_for

    # --- prepare ---

    def prepare_nowait(self, req: TxPrepareRequest) -> Prepared | None:
        """PREPARE without a task: the answer and the group commit it waits for (see
        ``Prepared``). None when only :meth:`prepare` can answer, because it must wait or
        read: a retried PREPARE, or an id the index may hold as already ended."""
        tx_id, timeout = self._check_prepare(req)
        if (
            tx_id in self.open
            or tx_id in self._recent
            or self._store.may_hold(KeyKind.INTERNAL, f"txend:{tx_id}")
        ):
            return None
        return self._write_half(req, tx_id, timeout)

    async def prepare(self, req: TxPrepareRequest) -> TxPrepareResponse:
        tx_id, timeout = self._check_prepare(req)
        existing = self.open.get(tx_id)
        if existing is not None:
            if existing.state is TxState.PREPARED and existing.topic == req.topic:
                if existing.pending is not None:
                    await asyncio.shield(existing.pending)  # the first PREPARE's group commit
                if existing.unconfirmed:
                    await _durable(self._replicated(tx_id))
                return TxPrepareResponse(tx_id, existing.message_id)  # a retried PREPARE
            raise TransactionConflict(f"transaction {tx_id} exists and is {existing.state.value}")
        ended = self._recent.get(tx_id)
        if ended is not None:
            state = ended_state(ended).value
            raise TransactionConflict(f"transaction {tx_id} exists and is {state}")
        if await self._store.lookup(KeyKind.INTERNAL, f"txend:{tx_id}", limit=1):
            raise TransactionConflict(f"transaction {tx_id} has already ended")
        answer, durable = self._write_half(req, tx_id, timeout)
        await _durable(durable)
        return answer

    def _write_half(self, req: TxPrepareRequest, tx_id: str, timeout: int) -> Prepared:
        """Append the half record of a new transaction and open it; the answer, once durable."""
        if len(self.open) >= self.settings.max_open:
            raise TooManyTransactions(
                f"{len(self.open)} transactions are open (limit {self.settings.max_open}): end "
                "some, or resolve parked ones"
            )
        send = SendRequest(
            req.topic, req.body, req.key, req.tags, req.headers, None, req.message_id
        )
        msg = self._publishing.to_message(send)  # validates topic, key, queue choice
        if req.deliver_at_ms is not None:
            self._publishing.schedule(msg, req.deliver_at_ms)  # refuses an impossible time now
        mid = msg.properties.get(PROP_MESSAGE_ID) or new_id()
        op_mark = self._store.queue_range(OP_TOPIC, 0)[1]
        props = {
            **msg.properties,
            PROP_MESSAGE_ID: mid,
            PROP_TX: tx_id,
            PROP_TARGET_TOPIC: msg.topic,
            PROP_TARGET_QUEUE: str(msg.queue_id),
            PROP_GROUP: req.producer_group,
            PROP_CHECK_URL: req.check_url,
            PROP_TIMEOUT: str(timeout),
            PROP_OP_MARK: str(op_mark),
        }
        props.pop(PROP_IDEMPOTENCY_KEY, None)
        if req.traceparent:
            props[PROP_TRACEPARENT] = req.traceparent
        if req.deliver_at_ms is not None:
            props[PROP_DELIVER_AT] = str(req.deliver_at_ms)
        half = Message(HALF_TOPIC, msg.body, 0, props, _TX_HALF)
        res = self._store.append_nowait(half)  # validates everything before writing anything
        now = res.store_timestamp_ms
        tx = Tx(
            tx_id,
            msg.topic,
            msg.queue_id,
            req.producer_group,
            req.check_url,
            mid,
            send.key,
            req.traceparent,
            timeout,
            now,
            res.physical_offset,
            res.queue_offset,
            op_mark,
            next_check_ms=now + timeout,
            deliver_at_ms=req.deliver_at_ms,
        )
        if len(msg.body) <= CACHE_BODY_MAX and self._cached_bytes < CACHE_TOTAL_MAX:
            tx.half = (msg.body, props, res.store_timestamp_ms)
            self._cached_bytes += len(msg.body)
        # Open (and in the next snapshot's low-water mark) before waiting for durability: a
        # snapshot taken meanwhile must not skip past this half record.
        self.open[tx_id] = tx
        self.snapshot.mark()
        return TxPrepareResponse(tx_id, mid), self._once_durable((tx, None, None))

    def _prepared(self, tx: Tx) -> None:
        self.counters["prepared"] += 1
        self.snapshot.mark()  # the counter
        self.on_prepared(tx)

    def _once_durable(self, waiting: _Waiting) -> asyncio.Future[None] | None:
        """The group commit that makes what was just appended for ``waiting``'s transaction
        durable (None in async flush mode: written is as good as it gets, and the bookkeeping
        is done now). The bookkeeping (:meth:`_settle`) hangs on the group commit itself, never
        on whoever waits for the answer: a client that disconnects drops its answer, not the
        outcome. The future is shared with every append until its group commit starts (whoever
        waits on it, ``tx.pending`` too, shields it or uses ``asyncio.wait``, so none cancels
        it)."""
        durable = self._store.durable_together()
        if durable is None:
            self._settle(waiting, None)
            return None
        if durable is not self._round:
            self._round = durable
            self._round_waiting = []
            durable.add_done_callback(functools.partial(self._settled, self._round_waiting))
        self._round_waiting.append(waiting)
        waiting[0].pending = durable  # what a concurrent request for the same tx waits for
        return durable

    def _settled(self, round_waiting: list[_Waiting], durable: asyncio.Future[None]) -> None:
        """A group commit ended: settle each transaction that waited on it, in write order."""
        if self._round is durable:  # no more appends to its list; the next write starts one
            self._round = None
            self._round_waiting = []
        failure: BaseException | None = (
            StoreFailed("the group commit was cancelled")
            if durable.cancelled()
            else durable.exception()
        )
        for waiting in round_waiting:
            waiting[0].pending = None
            try:
                self._settle(waiting, failure)
            except Exception:  # a bug: the others still settle
                log.exception("settling transaction %s failed", waiting[0].tx_id)

    def _settle(self, waiting: _Waiting, failure: BaseException | None) -> None:
        """The bookkeeping once a write is durable, or once it failed (``failure``): the store
        failed (nothing is known durable), or its wait for the slaves timed out."""
        tx, before, visible = waiting
        if failure is None or isinstance(failure, ReplicationTimeout):
            # A replication timeout leaves the record in this master's log, which the slaves
            # fetch when they can and recovery reads: the write stands, unconfirmed. Taking it
            # back here would leave memory and log disagreeing: a decision undone whose check
            # was dropped as moot (open for ever), a resend appending a second commit.
            tx.unconfirmed = failure is not None
            failure = None
        if before is None:  # a PREPARE
            if failure is None:
                self._prepared(tx)
            else:
                self._forget(tx)
        elif failure is None:
            self._finish(tx)
            if visible is not None:
                self._on_visible(*visible)
        else:
            transition_back(tx, before)

    # --- resolution ---

    def end_nowait(
        self, tx_id: str, decision: Decision, by: Resolver, reason: str = ""
    ) -> Ended | None:
        """:meth:`end` without a task: the answer and the group commit it waits for (see
        ``Ended``; none for a repeated decision). None when only :meth:`end` can answer, because
        it must wait or read: the transaction is not in memory, is being written, or its body
        is not cached."""
        tx = self.open.get(tx_id)
        if tx is None:
            ended = self._recent.get(tx_id)
            if ended is None:
                return None
            state, resolved_by = ended_state(ended), ended[ENDED_RESOLVED_BY]
            if state is decision.state:
                answer = TxEndResponse(tx_id, state.value, resolved_by, duplicate=True)
                # A duplicate is an acknowledgement too: not before the slaves hold the decision.
                return answer, self._replicated(tx_id) if ended[ENDED_UNCONFIRMED] else None
            raise TransactionConflict(
                f"transaction {tx_id} is {state.value} (by {resolved_by}); {decision.value} refused"
            )
        if tx.pending is not None:
            return None
        if decision is Decision.COMMIT and tx.half is None:
            return None
        before = tx.state
        transition(tx, decision.state)  # guarded, synchronous: a racing END_TX sees it at once
        tx.resolved_by = by.value
        tx.last_reason = reason
        return self._resolve(tx, decision, by, reason, before)

    async def end(
        self, tx_id: str, decision: Decision, by: Resolver, reason: str = ""
    ) -> TxEndResponse:
        """Commit or roll back, fenced: same decision again is a no-op, another is refused."""
        got = self.end_nowait(tx_id, decision, by, reason)
        if got is not None:
            answer, durable = got
            await _durable(durable)
            return answer
        tx = self.open.get(tx_id)  # end_nowait answers a recently ended one
        if tx is None:
            return await self._end_unknown(tx_id, decision)
        if tx.pending is not None:
            await asyncio.shield(tx.pending)  # a PREPARE or a resolution still being written
        else:
            # A commit whose body is not cached (large, or over the cache budget): read the
            # half back first, then decide again, since another resolution may run meanwhile.
            stored = await self._store.read(tx.half_phys)
            if tx.half is None:
                tx.half = (stored.body, stored.properties, stored.born_timestamp_ms)
                self._cached_bytes += len(stored.body)
        return await self.end(tx_id, decision, by, reason)

    async def _end_unknown(self, tx_id: str, decision: Decision) -> TxEndResponse:
        found = await self._store.lookup(KeyKind.INTERNAL, f"txend:{tx_id}", limit=1)
        if not found:
            raise TransactionNotFound(f"no transaction {tx_id!r} (never prepared, or expired)")
        rec = found[0]
        ended = rec.properties.get(PROP_OP) if rec.topic == OP_TOPIC else Decision.COMMIT.value
        if ended == decision.value:
            if rec.physical_offset + rec.size > self._store.readable_offset:
                # In the log, not yet known to be on the slaves (see end_nowait).
                await _durable(self._store.durable_together())
            by = rec.properties.get(PROP_BY, "")
            return TxEndResponse(tx_id, decision.state.value, by, duplicate=True)
        raise TransactionConflict(f"transaction {tx_id} ended with {ended}")

    def _resolve(
        self, tx: Tx, decision: Decision, by: Resolver, reason: str, before: TxState
    ) -> Ended:
        """Append the decision record now (synchronously); answer once it is durable."""
        try:
            target = self._append_decision_now(tx, decision, by, reason)
        except BaseException:
            transition_back(tx, before)  # validation failed before anything was written
            raise
        answer = TxEndResponse(tx.tx_id, tx.state.value, tx.resolved_by)
        return answer, self._once_durable((tx, before, target))

    def _append_decision_now(
        self, tx: Tx, decision: Decision, by: Resolver, why: str
    ) -> tuple[str, int] | None:
        end_key = f"txend:{tx.tx_id}"
        if decision is Decision.COMMIT:
            assert tx.half is not None
            if self._store.is_dead_at(tx.topic, tx.half_phys):
                # Deleting a topic rolls back its open transactions; this is the moment between.
                raise NotFound(
                    f"topic {tx.topic!r} was deleted after transaction {tx.tx_id} was prepared: "
                    "its message cannot be committed (roll the transaction back)"
                )
            return self._append_copy(tx.tx_id, tx.half, by, end_key)
        op = {
            PROP_TX: tx.tx_id,
            PROP_OP: decision.value,
            PROP_HALF_PHYS: str(tx.half_phys),
            PROP_BY: by.value,
            PROP_REASON: why[:500],
            PROP_INTERNAL_KEY: end_key,
        }
        self._store.append_nowait(Message(OP_TOPIC, b"", 0, op, _TX_OP))
        return None

    def _forget(self, tx: Tx) -> None:
        if tx.half is not None:
            self._cached_bytes -= len(tx.half[0])
            tx.half = None
        self.open.pop(tx.tx_id, None)

    def _finish(self, tx: Tx) -> None:
        """Bookkeeping once a resolution is durable."""
        tx.resolved_ms = time.time_ns() // 1_000_000
        self._forget(tx)
        self._remember(tx)
        self.counters[tx.state.value] += 1
        self.snapshot.mark()

    def _remember(self, tx: Tx) -> None:
        self._recent[tx.tx_id] = ended_record(tx)
        while len(self._recent) > RECENT_MAX:
            self._recent.popitem(last=False)

    def _replicated(self, tx_id: str) -> asyncio.Future[None] | None:
        """What a repeated request for ``tx_id``, whose last write stands unconfirmed, waits for
        before it answers: the slaves holding the log as it is now, that write with it (the
        store's durability wait, shared: never cancel it). It fails, as the first did, while
        they are out of reach; once it resolves the transaction is confirmed."""
        durable = self._store.durable_together()
        if durable is None:  # nothing to wait for: no replication gate, async flush
            self._confirmed(tx_id, None)
        else:
            durable.add_done_callback(functools.partial(self._confirmed, tx_id))
        return durable

    def _confirmed(self, tx_id: str, durable: asyncio.Future[None] | None) -> None:
        """``tx_id``'s last write is on the slaves, unless ``durable`` (what said so) failed."""
        if durable is not None and (durable.cancelled() or durable.exception() is not None):
            return
        tx = self.open.get(tx_id)
        if tx is not None:
            tx.unconfirmed = False
            return
        ended = self._recent.get(tx_id)
        if ended is not None and ended[ENDED_UNCONFIRMED]:
            self._recent[tx_id] = ended_confirmed(ended)  # keeps its place (the age order)

    def _append_copy(
        self, tx_id: str, half: tuple[bytes, dict[str, str], int], by: Resolver, key: str
    ) -> tuple[str, int] | None:
        """Append the visible copy (or its schedule copy, for a delayed commit) without waiting;
        return (topic, queue) to wake once durable, or None for a scheduled one."""
        body, half_props, born_ms = half
        props = {k: v for k, v in half_props.items() if k not in HALF_ONLY}
        props[PROP_INTERNAL_KEY] = key
        props[PROP_BY] = by.value
        topic = half_props[PROP_TARGET_TOPIC]
        queue_id = int(half_props[PROP_TARGET_QUEUE])
        msg = Message(topic, body, queue_id, props, _TX_COMMITTED, born_ms)
        deliver_at = half_props.get(PROP_DELIVER_AT)
        if deliver_at is not None and int(deliver_at) > time.time_ns() // 1_000_000:
            res = self._store.append_nowait(self._publishing.schedule(msg, int(deliver_at)))
            self._publishing.scheduled(res.queue_id)
            return None
        self._store.append_nowait(msg)
        return (topic, queue_id)

    # --- parking ---

    async def park(self, tx: Tx, reason: str) -> None:
        parking.park(self._store, tx, reason)
        self.snapshot.mark()

    async def resume(self, tx_id: str) -> TxEndResponse:
        tx = parking.resume(self._store, tx_id, self.open.get(tx_id))
        self.snapshot.mark()
        durable = self._store.durable()
        try:
            if durable is not None:
                await durable
        except ReplicationTimeout:
            self.on_prepared(tx)  # its op record stands in this master's log, as a PREPARE's
            raise
        self.on_prepared(tx)
        return TxEndResponse(tx_id, tx.state.value, Resolver.OPERATOR.value)

    # --- queries ---

    def stalled(self, tx: Tx, now_ms: int | None = None) -> bool:
        """Whether ``tx`` is stalled: PREPARED, its checks reaching no one for the stall time."""
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        return tx.stalled(now, self.settings.stall_after_ms)

    def find(self, tx_id: str) -> Tx | None:
        """An open or recently ended transaction (an ended one as a copy, which changes no
        more); None if not in memory."""
        tx = self.open.get(tx_id)
        if tx is not None:
            return tx
        ended = self._recent.get(tx_id)
        return from_ended(tx_id, ended) if ended is not None else None

    def get(self, tx_id: str) -> Tx:
        tx = self.find(tx_id)
        if tx is None:
            raise TransactionNotFound(f"no open or recent transaction {tx_id!r}")
        return tx

    def ended(
        self,
        limit: int,
        *,
        state: TxState | None = None,
        topic: str | None = None,
        by: Resolver | None = None,
        key: str | None = None,
    ) -> list[Tx]:
        """The newest ``limit`` ended transactions that match, newest first, from the last
        RECENT_MAX committed or rolled back since the broker started (memory only: older ones
        are found in the log by their id, ``txend:<tx>``)."""
        out: list[Tx] = []
        if state is not None and state not in (TxState.COMMITTED, TxState.ROLLED_BACK):
            return out
        for tx_id, rec in reversed(self._recent.items()):
            if (
                (state is None or ended_state(rec) is state)
                and (topic is None or rec[ENDED_TOPIC] == topic)
                and (by is None or rec[ENDED_RESOLVED_BY] == by.value)
                and (key is None or rec[ENDED_KEY] == key)
            ):
                out.append(from_ended(tx_id, rec))
                if len(out) >= limit:
                    break
        return out

    def listing(self, which: str | None, topic: str | None) -> list[Tx]:
        """What TX_LIST and ``GET /v1/transactions`` list: open transactions, oldest first;
        ``which`` is ``prepared``, ``parked`` or ``stalled`` (prepared ones), all when empty."""
        if which not in (None, "", *LISTED):
            raise InvalidArgument(f"state must be one of {', '.join(LISTED)}, not {which!r}")
        if which != "stalled":
            return self.list(TxState(which) if which else None, topic)
        now = time.time_ns() // 1_000_000
        return [t for t in self.list(TxState.PREPARED, topic) if self.stalled(t, now)]

    def list(self, state: TxState | None, topic: str | None) -> list[Tx]:
        out = [
            tx
            for tx in self.open.values()
            if (state is None or tx.state is state) and (topic is None or tx.topic == topic)
        ]
        out.sort(key=lambda t: t.created_ms)
        return out

    def counts(self) -> OpenCounts:
        """The open transactions counted by state, in one pass over them."""
        now, after = time.time_ns() // 1_000_000, self.settings.stall_after_ms
        pending = parked = stalled = 0
        for tx in self.open.values():
            if tx.state is TxState.PARKED:
                parked += 1
            elif tx.state is TxState.PREPARED:
                pending += 1
                stalled += tx.stalled(now, after)
        return OpenCounts(pending, parked, stalled)

    def info(self, tx: Tx) -> TxInfo:
        """``tx`` as TX_SHOW, TX_LIST and the HTTP admin API describe it."""
        return TxInfo(
            tx.tx_id,
            tx.state.value,
            tx.topic,
            tx.queue_id,
            tx.producer_group,
            tx.check_url,
            tx.message_id,
            tx.key,
            tx.created_ms,
            tx.checks,
            tx.next_check_ms,
            tx.last_reason,
            tx.resolved_by,
            self.stalled(tx),
            tx.unreachable_since_ms if tx.unreachable_since_ms > 0 and not tx.ended else None,
            tx.unconfirmed,
        )

    # --- recovery ---

    async def recover(self, *, from_start: bool = False, covered: int | None = None) -> None:
        """Rebuild the open transactions (see ``txbroker.tx.recovery``); ``from_start`` when
        taking over as master (failover.py), ``covered`` then the log offset below which the
        new term counts the log as on its slaves."""
        got = await recover_open(
            self._store, self._publishing, self._path, self._append_copy, from_start=from_start
        )
        self.open.clear()  # what an earlier term held is rebuilt from the log too
        self.open.update(got.open)
        if covered is not None:
            # A half past what the slaves are known to hold may be on this broker alone, as
            # one whose wait for them timed out is: a resent PREPARE waits for them too.
            for tx in self.open.values():
                tx.unconfirmed = tx.half_phys >= covered
        # A decision of an earlier term that its slaves were not known to hold is the log's to
        # tell, not memory's: the term this log begins may not have it, and then the
        # transaction is open again (above). Answered from the index when the log has it.
        unconfirmed = [t for t, rec in self._recent.items() if rec[ENDED_UNCONFIRMED]]
        for tx_id in unconfirmed:
            del self._recent[tx_id]
        self.counters.update({k: v for k, v in got.counters.items() if k in self.counters})
        durable = self._store.durable()
        if durable is not None:
            await durable
        if got.finished:
            log.warning("recovery made %d interrupted commits visible", got.finished)
        self.snapshot.mark()
        log.info(
            "transactions: %d open after recovery (%d half and %d op records read in %.2f s)",
            *(len(self.open), got.halves_read, got.ops_read, got.seconds),
        )


async def _durable(durable: asyncio.Future[None] | None) -> None:
    """Until ``durable`` (a shared group commit, see ``Prepared``) has resolved, without
    cancelling it if the caller is cancelled; a cancelled group commit is a store failure."""
    if durable is None:
        return
    try:
        await asyncio.shield(durable)
    except asyncio.CancelledError:
        if durable.cancelled():
            raise StoreFailed("the group commit was cancelled") from None
        raise
