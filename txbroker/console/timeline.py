"""One transaction's story, from what the broker knows: PREPARE, each back-check and its answer,
parking and resuming, the decision, the delivery, and how far each consumer group got.

Every source is a bounded read: the coordinator's memory, the half record, ``%TXOP`` from the
op mark on, the key index and the committed offsets (:func:`build_timeline` lists them). A
transaction ended long ago (out of memory, or after a restart) is rebuilt from the log alone;
one whose records retention deleted is not found. A read the store fails (closed, a corrupt
record) is listed in ``Timeline.unread``, never taken for a record that is not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass, field
from typing import Final

from txbroker.console.context import Deps
from txbroker.console.messages import MessageView
from txbroker.console.render import duration_ms
from txbroker.errors import NotFound, StoreError, TransactionNotFound, TxbError
from txbroker.server.retry import dlq_topic, retry_topic
from txbroker.store import KeyKind, StoredMessage
from txbroker.tx.state import (
    OP_TOPIC,
    PROP_BY,
    PROP_HALF_PHYS,
    PROP_OP,
    PROP_OP_MARK,
    PROP_REASON,
    PROP_TRACEPARENT,
    PROP_TX,
    Tx,
)

__all__ = [
    "Event",
    "GroupProgress",
    "Timeline",
    "build_timeline",
    "group_progress",
    "trace_id_of",
]

# %TXOP records read looking for this transaction's park and resume: a few seconds of a busy
# broker's rollbacks; past it the page says the scan stopped.
OP_SCAN_MAX: Final = 5_000
OP_SCAN_BATCH: Final = 500
# Records appended without a wait (parking, resuming) become readable with the next group
# commit; the page asks for one and waits this long at most (an fsync takes milliseconds).
DURABLE_WAIT_S: Final = 2.0
# W3C trace context: version-traceid-parentid-flags, lowercase hex.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@dataclass(frozen=True, slots=True)
class Event:
    at_ms: int
    kind: str  # prepare | check | park | resume | commit | rollback | deliver
    title: str
    detail: str
    tone: str  # ok | warn | bad | info: how the page colours it


@dataclass(frozen=True, slots=True)
class GroupProgress:
    group: str
    committed: int | None  # the group's next offset on the message's queue
    status: str  # processed | waiting | failed
    note: str
    # Why the index could not say whether its handler failed (None: it could); the status is
    # then from the committed offset alone.
    unread: str | None = None


@dataclass(slots=True)
class Timeline:
    tx_id: str
    state: str
    tx: Tx | None
    message: MessageView | None = None
    events: list[Event] = field(default_factory=list)
    delivered: StoredMessage | None = None
    groups: list[GroupProgress] = field(default_factory=list)
    trace_id: str | None = None
    trace_link: str | None = None
    notes: list[str] = field(default_factory=list)
    # Reads the store failed, each "<what>: <why>": the timeline may lack what they held.
    unread: list[str] = field(default_factory=list)


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C ``traceparent``; None if absent, malformed or all zeros."""
    m = _TRACEPARENT.fullmatch(traceparent or "")
    if m is None or m.group(1) == "ff" or set(m.group(2)) == {"0"}:
        return None
    return m.group(2)


async def _first(
    deps: Deps, kind: KeyKind, key: str, limit: int, what: str, unread: list[str]
) -> list[StoredMessage]:
    try:
        return await deps.store.lookup(kind, key, limit=limit)
    except TxbError as e:
        unread.append(f"{what}: {e}")
        return []


async def _read(deps: Deps, phys: int, what: str, unread: list[str]) -> StoredMessage | None:
    try:
        return await deps.store.read(phys)
    except NotFound:
        return None  # deleted by retention, or not readable yet
    except TxbError as e:
        unread.append(f"{what}: {e}")
        return None


async def _ops(deps: Deps, tx_id: str, mark: int, t: Timeline) -> list[StoredMessage]:
    lo, hi = deps.store.queue_range(OP_TOPIC, 0)
    offset, read, out = max(mark, lo), 0, []
    while offset < hi and read < OP_SCAN_MAX:
        got = await deps.store.get_messages(OP_TOPIC, 0, offset, OP_SCAN_BATCH)
        if not got.messages:
            break
        read += len(got.messages)
        out += [m for m in got.messages if m.properties.get(PROP_TX) == tx_id]
        offset = got.next_offset
    if offset < hi:
        t.notes.append(f"parking records were looked for in the first {read:,} operations only")
    return out


def _op_event(m: StoredMessage) -> Event:
    op, by = m.properties.get(PROP_OP, "?"), m.properties.get(PROP_BY, "?")
    why = m.properties.get(PROP_REASON, "")
    if op == "park":
        return Event(m.store_timestamp_ms, "park", "parked", why, "bad")
    if op == "resume":
        return Event(m.store_timestamp_ms, "resume", f"resumed by {by}", why, "info")
    if op == "rollback":
        return Event(m.store_timestamp_ms, "rollback", f"rolled back by {by}", why, "warn")
    return Event(m.store_timestamp_ms, op, f"{op} by {by}", why, "info")


async def build_timeline(deps: Deps, tx_id: str) -> Timeline:
    """Everything the broker knows about ``tx_id``; NotFound if it knows nothing.

    Sources, all bounded reads:

    - the coordinator's memory (open transactions and the last 100,000 ended ones): state, check
      count, reason, and the back-checks since the broker started (``Tx.history``);
    - the half record (``%HALF``, at the physical offset the transaction keeps): the message as
      prepared, its ``traceparent``;
    - ``%TXOP`` from the transaction's op mark on (at most ``OP_SCAN_MAX`` records): its park,
      resume and rollback records;
    - the index: the decision record (``txend:<tx>``), the visible copy (by message id), and each
      group's NACK of it (``nack:<group>:<topic>:<queue>:<offset>``);
    - committed offsets: a group has processed the message once it committed past its offset (the
      broker is told no more than that).
    """
    durable = deps.store.durable()
    if durable is not None:  # shielded: a timeout here must not cancel the group commit
        with contextlib.suppress(TimeoutError, TxbError):
            await asyncio.wait_for(asyncio.shield(durable), DURABLE_WAIT_S)
    try:
        tx: Tx | None = deps.tx.get(tx_id)
    except TransactionNotFound:
        tx = None
    unread: list[str] = []
    ends = await _first(deps, KeyKind.INTERNAL, f"txend:{tx_id}", 1, "the decision", unread)
    end = ends[0] if ends else None
    half = await _read(deps, tx.half_phys, "the half message", unread) if tx is not None else None
    if half is None and end is not None and end.topic == OP_TOPIC:
        phys = end.properties.get(PROP_HALF_PHYS, "")
        half = await _read(deps, int(phys), "the half message", unread) if phys.isdigit() else None
    mid = tx.message_id if tx is not None else None
    if mid is None and end is not None and end.topic != OP_TOPIC:
        mid = end.message_id
    if mid is None and half is not None:
        mid = half.message_id
    found = (
        await _first(deps, KeyKind.MESSAGE_ID, mid, 8, "the visible copy", unread) if mid else []
    )
    copies = [c for c in found if c.properties.get(PROP_TX) == tx_id]
    visible = next((c for c in copies if not c.topic.startswith("%")), None)
    if tx is None and end is None and half is None and visible is None:
        if unread:  # nothing found, but not everything could be looked at: not "not found"
            raise StoreError(f"transaction {tx_id!r} could not be looked up: {'; '.join(unread)}")
        raise NotFound(
            f"no transaction {tx_id!r}: never prepared here, or retention deleted its records"
        )
    if tx is not None:
        state = tx.state.value
    elif end is not None:
        state = "rolled_back" if end.topic == OP_TOPIC else "committed"
    else:
        state = "unknown"
    t = Timeline(tx_id, state, tx, unread=unread)
    shown = visible or half or (end if end is not None and end.topic != OP_TOPIC else None)
    if shown is not None:
        t.message = MessageView.of(shown)

    # PREPARE
    if half is not None:
        at = half.store_timestamp_ms
        detail = f"half message at %HALF offset {half.queue_offset}"
    else:
        at = tx.created_ms if tx is not None else (shown.born_timestamp_ms if shown else 0)
        # An ended transaction out of memory: the half record is not indexed, so its time is
        # the committed copy's birth (the half's store time, carried over).
        detail = "time of the half message, as the committed copy keeps it"
    if tx is not None:
        due = duration_ms(tx.timeout_ms)
        detail += f"; producer group {tx.producer_group}; first back-check after {due}"
    t.events.append(Event(at, "prepare", "prepared", detail, "info"))

    # back-checks (since the broker started) and %TXOP: park, resume, rollback
    for c in (tx.history or ()) if tx is not None else ():
        outcome = c.outcome.lower()  # an answer's status is upper case on the wire
        tone = {"commit": "ok", "rollback": "warn"}.get(outcome, "bad")
        reason = f"{c.reason} ({c.seconds * 1000:.0f} ms)" if c.reason else f"{c.seconds:.3f} s"
        t.events.append(Event(c.at_ms, "check", f"back-check: {outcome}", reason, tone))
    if tx is not None and tx.checks and not tx.history:
        t.notes.append(f"{tx.checks} back-check(s) ran before the broker last started")
    mark = tx.op_mark if tx is not None else None
    if mark is None and half is not None:
        raw = half.properties.get(PROP_OP_MARK, "")
        mark = int(raw) if raw.isdigit() else None
    ops = await _ops(deps, tx_id, mark, t) if mark is not None else []
    if (
        end is not None
        and end.topic == OP_TOPIC
        and all(o.physical_offset != end.physical_offset for o in ops)
    ):
        ops.append(end)
    t.events += [_op_event(m) for m in ops]

    # the decision and the delivery
    if end is not None and end.topic != OP_TOPIC:
        by = end.properties.get(PROP_BY, "?")
        t.events.append(Event(end.store_timestamp_ms, "commit", f"committed by {by}", "", "ok"))
    elif end is None and tx is not None and tx.ended and tx.resolved_ms:
        title = f"{tx.state.value.replace('_', ' ')} by {tx.resolved_by}"
        t.events.append(Event(tx.resolved_ms, tx.state.value, title, tx.last_reason, "ok"))
    if visible is not None:
        t.delivered = visible
        where = f"{visible.topic} queue {visible.queue_id} at offset {visible.queue_offset}"
        at = visible.store_timestamp_ms
        t.events.append(Event(at, "deliver", "visible to consumers", where, "ok"))
        t.groups = await group_progress(deps, visible)
    t.events.sort(key=lambda e: e.at_ms)

    traceparent = tx.traceparent if tx is not None else None
    for m in (half, visible, end):
        if traceparent is None and m is not None:
            traceparent = m.properties.get(PROP_TRACEPARENT)
    t.trace_id = trace_id_of(traceparent)
    url = deps.settings.trace_url
    if t.trace_id is not None and url is not None:
        t.trace_link = url.replace("{trace_id}", t.trace_id)
    return t


async def group_progress(deps: Deps, m: StoredMessage) -> list[GroupProgress]:
    """How far each consumer group of ``m``'s topic got with it (committed offsets, and a NACK
    of it in the index)."""
    out = []
    for g in deps.admin.groups(topic=m.topic):
        q = next((q for q in g.queues if q.queue == m.queue_id), None)
        committed = q.committed if q is not None else None
        base = g.group.split("@", 1)[0]
        nack = f"nack:{base}:{m.topic}:{m.queue_id}:{m.queue_offset}"
        unread = None
        try:
            failed = await deps.store.lookup(KeyKind.INTERNAL, nack, limit=1)
        except TxbError as e:
            failed, unread = [], str(e)
        if committed is not None and committed > m.queue_offset:
            status, note = "processed", f"committed offset {committed} is past {m.queue_offset}"
        elif committed is None:
            status, note = "waiting", "the group has committed nothing on this queue yet"
        else:
            ahead = m.queue_offset - committed
            status, note = "waiting", f"{ahead:,} message(s) before it still to process"
        if failed:
            where = dlq_topic(base) if failed[0].topic == dlq_topic(base) else retry_topic(base)
            status = "failed" if where == dlq_topic(base) else status
            note += f"; its handler failed at least once (a copy went to {where})"
        if unread is not None:
            note += f"; whether its handler failed is not known: {unread}"
        out.append(GroupProgress(g.group, committed, status, note, unread))
    return out
