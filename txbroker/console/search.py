"""Finding what the broker knows about an id an operator holds: "what happened to order o-1?".

The query is compared, exactly, with:

- transaction ids: the open and recently ended ones in memory, older ones by their decision
  record (``txend:<tx>`` in the index);
- message ids, message keys and idempotency keys: the key index, the newest ``LOOKUP_MAX`` of
  each;
- the keys and message ids of open and recently ended transactions, in memory: half messages
  are not indexed, so a pending or rolled-back transaction is found by its key here;
- header values: not indexed, so the newest messages of every queue (and of ``%HALF``) are read,
  ``SCAN_MAX`` in all; :class:`Scan` says how far that went, and the page says it too.

A source the store fails to read (closed, a corrupt record) is named in ``Found.failures``
with why, and the others are still searched: an empty table is then no proof of absence.

Every message found links to its transaction, and every transaction to its timeline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final

from txbroker.console.context import Deps
from txbroker.console.messages import MessageView
from txbroker.console.timeline import GroupProgress, group_progress
from txbroker.errors import InvalidArgument, NotFound, TxbError
from txbroker.server.producer import HEADER_PREFIX, MAX_KEY_BYTES
from txbroker.store import KeyKind, StoredMessage
from txbroker.tx.state import (
    HALF_TOPIC,
    OP_TOPIC,
    PROP_HALF_PHYS,
    PROP_TARGET_TOPIC,
    PROP_TX,
    Tx,
)

__all__ = [
    "FAILURES_SHOWN",
    "QUERY_BYTES_MAX",
    "SCAN_MAX",
    "Found",
    "MessageHit",
    "Scan",
    "TxHit",
    "search",
]

# Nothing searchable is longer than a key (ids are 32 characters; header values are compared
# up to the same length).
QUERY_BYTES_MAX: Final = MAX_KEY_BYTES
# Index matches read per kind, and hits listed per table: a page a person reads.
LOOKUP_MAX: Final = 50
SHOWN_MAX: Final = 50
# The header scan, shared over the queues (each gets at least SCAN_QUEUE_MIN of its newest, at
# most SCAN_QUEUE_MAX): a record is read and decoded in microseconds, so a whole scan stays under
# a tenth of a second of the broker's event loop, and it yields after every batch, so the
# broker's other requests wait for one batch at most.
SCAN_MAX: Final = 20_000
SCAN_QUEUE_MIN: Final = 100
SCAN_QUEUE_MAX: Final = 5_000
SCAN_BATCH: Final = 256
assert SCAN_QUEUE_MIN <= SCAN_QUEUE_MAX <= SCAN_MAX
# Failures listed above the results: a store that fails everywhere fails each queue alike (one
# line, every queue named), so more lines than this are distinct faults; the page counts the rest.
FAILURES_SHOWN: Final = 10
# What each kind of index lookup searches, as the page names it.
_INDEXED: Final = {
    KeyKind.MESSAGE_ID: "message ids",
    KeyKind.KEY: "keys",
    KeyKind.IDEMPOTENCY_KEY: "idempotency keys",
    KeyKind.INTERNAL: "decision records",
}


@dataclass(frozen=True, slots=True)
class TxHit:
    tx_id: str
    state: str  # prepared | parked | committed | rolled_back | unknown
    topic: str
    key: str | None
    prepared_ms: int
    matched: list[str]  # what matched: "transaction id", "key", "header order-ref", ...


@dataclass(frozen=True, slots=True)
class MessageHit:
    message: MessageView
    matched: list[str]
    groups: list[GroupProgress]


@dataclass(frozen=True, slots=True)
class Scan:
    """How far the header scan read."""

    read: int  # messages read
    queues: int  # queues read (of topics and %HALF)
    per_queue: int  # the newest this many of each queue
    complete: bool  # True: every kept message of every queue was read


@dataclass(slots=True)
class Found:
    query: str
    transactions: list[TxHit] = field(default_factory=list)
    messages: list[MessageHit] = field(default_factory=list)
    scan: Scan | None = None
    more: bool = False  # more matched than a table shows
    # What could not be searched and why, one line per cause ("<sources>: <why>"): where the
    # store failed a read, nothing found is not "not there".
    failures: list[str] = field(default_factory=list)


def check_query(raw: str) -> str:
    """The query as searched (surrounding blanks dropped); InvalidArgument if too long."""
    q = raw.strip()
    if len(q.encode()) > QUERY_BYTES_MAX:
        raise InvalidArgument(
            f"search for at most {QUERY_BYTES_MAX:,} bytes: no id, key or header value compared "
            "is longer"
        )
    return q


class _Failures:
    """The sources a search could not read, grouped by why: a closed store fails every source
    alike, and one line naming them all reads better than one line each."""

    def __init__(self) -> None:
        self._by_why: dict[str, list[str]] = {}

    def add(self, source: str, why: TxbError | str) -> None:
        sources = self._by_why.setdefault(str(why), [])
        if source not in sources:
            sources.append(source)

    def lines(self) -> list[str]:
        return [f"{', '.join(sources)}: {why}" for why, sources in self._by_why.items()]


class _Hits:
    """Matches gathered from every source, each transaction and message once, and the sources
    that failed."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.txs: dict[str, tuple[Tx | None, StoredMessage | None, str | None, list[str]]] = {}
        self.msgs: dict[int, tuple[StoredMessage, list[str]]] = {}
        self.failures = _Failures()

    def tx(
        self,
        tx_id: str,
        matched: str,
        tx: Tx | None = None,
        m: StoredMessage | None = None,
        state: str | None = None,
    ) -> None:
        known = self.txs.get(tx_id)
        if known is None:
            tx = tx if tx is not None else self.deps.tx.find(tx_id)
            self.txs[tx_id] = (tx, m, state, [matched])
        elif matched not in known[3]:
            known[3].append(matched)

    def message(self, m: StoredMessage, matched: str) -> None:
        known = self.msgs.get(m.physical_offset)
        if known is None:
            self.msgs[m.physical_offset] = (m, [matched])
        elif matched not in known[1]:
            known[1].append(matched)
        tx_id = m.properties.get(PROP_TX)
        if tx_id:
            # A copy in a topic is what a commit makes visible; its key, id and headers are its
            # transaction's.
            self.tx(tx_id, matched, m=m, state="committed")

    def half(self, m: StoredMessage, matched: str) -> None:
        tx_id = m.properties.get(PROP_TX)
        if tx_id:
            self.tx(tx_id, matched, m=m)


async def _lookup(
    deps: Deps, kind: KeyKind, key: str, limit: int, failures: _Failures
) -> list[StoredMessage]:
    try:
        return await deps.store.lookup(kind, key, limit=limit)
    except TxbError as e:  # the store is closed, or a record is corrupt: the rest is searched
        failures.add(f"the key index ({_INDEXED[kind]})", e)
        return []


async def _decided(deps: Deps, tx_id: str, failures: _Failures) -> StoredMessage | None:
    """The decision record of an ended transaction (the committed copy, or a rollback op)."""
    found = await _lookup(deps, KeyKind.INTERNAL, f"txend:{tx_id}", 1, failures)
    return found[0] if found else None


async def _half_of(deps: Deps, op: StoredMessage, failures: _Failures) -> StoredMessage | None:
    raw = op.properties.get(PROP_HALF_PHYS, "")
    if not raw.isdigit():
        return None
    try:
        return await deps.store.read(int(raw))
    except NotFound:
        return None  # deleted by retention: the rollback record still says how it ended
    except TxbError as e:
        failures.add(f"the half message of transaction {op.properties.get(PROP_TX, '?')}", e)
        return None


async def _scan(deps: Deps, q: str, hits: _Hits) -> Scan:
    """Compare ``q`` with every header value (and, in %HALF, keys and message ids: half
    messages are not indexed) of the newest messages of each queue."""
    queues = [(t.name, i) for t in deps.topics.list() for i in range(t.queues)]
    queues.append((HALF_TOPIC, 0))
    per_queue = max(SCAN_QUEUE_MIN, min(SCAN_QUEUE_MAX, SCAN_MAX // len(queues)))
    read, complete = 0, True
    for topic, queue in queues:
        lo, hi = deps.store.queue_range(topic, queue)
        offset = max(lo, hi - per_queue)
        if offset > lo:
            complete = False  # older messages than this queue's share
        while offset < hi and read < SCAN_MAX:
            count = min(SCAN_BATCH, hi - offset, SCAN_MAX - read)
            try:
                got = await deps.store.get_messages(topic, queue, offset, count)
            except TxbError as e:  # the rest of this queue is not searched; the others are
                hits.failures.add(f"queue {topic}/{queue}", e)
                break
            read += len(got.messages)
            for m in got.messages:
                half = topic == HALF_TOPIC
                for k, v in m.properties.items():
                    if v == q and k.startswith(HEADER_PREFIX):
                        label = f"header {k[len(HEADER_PREFIX) :]}"
                        (hits.half if half else hits.message)(m, label)
                if half and q in m.keys:
                    hits.half(m, "key")
                if half and m.message_id == q:
                    hits.half(m, "message id")
            if got.next_offset <= offset:
                break  # nothing more is readable yet
            offset = got.next_offset
            await asyncio.sleep(0)  # a long scan must not hold up the broker's own work
        if offset < hi:
            complete = False
    return Scan(read, len(queues), per_queue, complete)


async def search(deps: Deps, query: str) -> Found:
    """Everything the broker holds that ``query`` names (see the module's docstring)."""
    q = check_query(query)
    found = Found(q)
    if not q:
        return found
    hits = _Hits(deps)

    # a transaction id, and the message its commit made visible (which holds its decision)
    tx = deps.tx.find(q)
    end = await _decided(deps, q, hits.failures)
    if tx is not None:
        hits.tx(q, "transaction id", tx=tx)
    elif end is not None and end.topic == OP_TOPIC:
        half = await _half_of(deps, end, hits.failures)
        hits.tx(q, "transaction id", m=half, state="rolled_back")
    elif end is not None:
        hits.tx(q, "transaction id", m=end, state="committed")
    if end is not None and not end.topic.startswith("%"):
        hits.message(end, "transaction id")

    # the index: message ids, keys, idempotency keys
    for kind, label in (
        (KeyKind.MESSAGE_ID, "message id"),
        (KeyKind.KEY, "key"),
        (KeyKind.IDEMPOTENCY_KEY, "idempotency key"),
    ):
        for m in await _lookup(deps, kind, q, LOOKUP_MAX, hits.failures):
            # Internal copies (retries, dead letters, scheduled) are the timeline's to tell.
            if not m.topic.startswith("%"):
                hits.message(m, label)

    # open and recently ended transactions, by key or message id (their halves are not indexed)
    for t in [*deps.tx.open.values(), *deps.tx.ended(LOOKUP_MAX, key=q)]:
        if t.key == q:
            hits.tx(t.tx_id, "key", tx=t)
        if t.message_id == q:
            hits.tx(t.tx_id, "message id", tx=t)

    found.scan = await _scan(deps, q, hits)

    messages = sorted(hits.msgs.values(), key=lambda h: h[0].store_timestamp_ms, reverse=True)
    for m, matched in messages[:SHOWN_MAX]:
        groups = await group_progress(deps, m)
        for g in groups:
            if g.unread is not None:
                hits.failures.add(f"the key index (failed deliveries to {g.group})", g.unread)
        found.messages.append(MessageHit(MessageView.of(m), matched, groups))
    txs = [await _tx_hit(deps, tx_id, *known, hits.failures) for tx_id, known in hits.txs.items()]
    txs.sort(key=lambda h: h.prepared_ms, reverse=True)
    found.transactions = txs[:SHOWN_MAX]
    found.more = len(messages) > SHOWN_MAX or len(txs) > SHOWN_MAX
    found.failures = hits.failures.lines()
    return found


async def _tx_hit(
    deps: Deps,
    tx_id: str,
    tx: Tx | None,
    m: StoredMessage | None,
    state: str | None,
    matched: list[str],
    failures: _Failures,
) -> TxHit:
    if tx is not None:
        return TxHit(tx_id, tx.state.value, tx.topic, tx.key, tx.created_ms, matched)
    if state is None:  # a half message out of memory: its decision record says how it ended
        end = await _decided(deps, tx_id, failures)
        if end is not None:
            state = "rolled_back" if end.topic == OP_TOPIC else "committed"
    topic = ""
    if m is not None:
        topic = m.topic if m.topic != HALF_TOPIC else m.properties.get(PROP_TARGET_TOPIC, "")
    keys = m.keys if m is not None else []
    at = m.born_timestamp_ms if m is not None else 0
    return TxHit(tx_id, state or "unknown", topic, keys[0] if keys else None, at, matched)
