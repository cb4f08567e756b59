"""The outbox relay: claims unpublished rows in id order and publishes them.

    relay = Relay(client, engine, namespace="orders-db")
    await relay.run(stop)  # until the stop event is set

Each row goes with the idempotency key ``outbox:<namespace>:<id>``, then is marked published, so
a relay that dies between the two sends it again and the broker keeps one copy (within its
``dedup_window_ms``). Several relays may run; rows of one key go in id order. :class:`Relay`
says how claims, ordering, tracing and stopping work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue
from sqlalchemy import Row, Select, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from txbroker.errors import InvalidArgument, TxbError
from txbroker.runtime import tracing as tr
from txbroker.runtime.tracing import tracing_on
from txbroker_outbox.writer import CHANNEL, TRACEPARENT
from txbroker_sdk import faults
from txbroker_sdk.client import Client
from txbroker_sdk.errors import TablesMissing
from txbroker_sdk.preflight import TablesChecked, shown_url
from txbroker_sdk.supervision import TRANSIENT_MAX_S, LoopHealth
from txbroker_sdk.tables import OUTBOX, db_now

__all__ = ["Relay"]

log = logging.getLogger(__name__)

MAX_BATCH: Final = 1000  # ids go into IN (...) lists: keep them well under bind-parameter limits
# A row held back behind another relay's batch is looked at again this soon: that relay
# commits within one batch's round trips, and it does not notify anyone when it does.
HELD_RETRY_S: Final = 0.05
DEFAULT_SHUTDOWN_TIMEOUT_S: Final = 5.0
# The relay holds SQLite's write lock while it publishes a batch; others wait this long for it.
_SQLITE_BUSY: Final = text("PRAGMA busy_timeout = 10000")
_NAMESPACE: Final = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


@dataclass
class _Round:
    claimed: int = 0
    published: int = 0
    held: int = 0  # waiting behind an earlier row of their key in another relay's hands
    failed: int = 0
    error: TxbError | None = None  # the first failed send's


class Relay:
    """Publishes the outbox of ``engine``'s database through ``client``. ``namespace`` names
    that database in idempotency keys (row ids are unique only within one database).

    It sends each row with the idempotency key ``outbox:<namespace>:<id>``, marks it published and
    commits. Several relays may run: on PostgreSQL the claim locks its rows (``FOR UPDATE SKIP
    LOCKED``), on SQLite it holds the database's write lock, so a row is in one relay's hands at a
    time. A relay that dies between a send and its mark sends the row again and the broker answers
    with the original receipt (``duplicate``), so no second copy is stored, as long as the resend
    comes within the broker's ``dedup_window_ms`` (24 h by default): a row left unmarked longer
    than that is stored twice.

    With ``ordered`` (the default) rows of one key are published in id order, also across relays: a
    row waits while an earlier unpublished row of its key is outside this relay's batch. It wakes on
    PostgreSQL's NOTIFY (sent by :func:`txbroker_outbox.add` when its transaction commits) and
    polls on SQLite.

    With tracing on, each send is a PRODUCER span ``send {topic}``, the child of the span the row
    was written in (its ``traceparent`` header), and the message carries the relay span's
    ``traceparent`` instead, so a consumer's ``process`` span is the relay span's child.

    Stopping is bounded by ``shutdown_timeout_s``: a round in progress when ``stop`` is set gets
    that long to finish (with the broker gone it would keep reconnecting), then is cancelled; its
    rows stay unpublished, and any it had sent are sent again later under the same idempotency
    keys, so the broker stores them once.
    """

    def __init__(
        self,
        client: Client,
        engine: AsyncEngine,
        *,
        namespace: str,
        batch_size: int = 100,
        ordered: bool = True,
        poll_interval_s: float = 1.0,
        shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
    ) -> None:
        if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
            raise InvalidArgument(
                f"outbox namespace must be 1-128 characters from A-Z a-z 0-9 _ . - "
                f"(it names this database in idempotency keys), not {namespace!r}"
            )
        if not 1 <= batch_size <= MAX_BATCH:
            raise InvalidArgument(f"batch_size must be 1-{MAX_BATCH}, not {batch_size}")
        if not poll_interval_s > 0:
            raise InvalidArgument(f"poll_interval_s must be positive, not {poll_interval_s}")
        if not shutdown_timeout_s > 0:
            raise InvalidArgument(f"shutdown_timeout_s must be positive, not {shutdown_timeout_s}")
        if engine.dialect.name not in ("postgresql", "sqlite"):
            raise InvalidArgument(f"unsupported database {engine.dialect.name!r}")
        self._client = client
        self._engine = engine
        self.namespace = namespace
        self.batch_size = batch_size
        self.ordered = ordered
        self.poll_interval_s = poll_interval_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self._pg = engine.dialect.name == "postgresql"
        self._wake = asyncio.Event()
        self.listening = asyncio.Event()  # set while a PostgreSQL LISTEN is in place
        # The outbox table is looked for before the first round (again after a failed look):
        # a database never migrated stops the relay saying to run `txbroker db upgrade`.
        self._tables = TablesChecked(engine, OUTBOX)
        self.published = 0  # rows this relay marked published (duplicates included)
        self.duplicates = 0  # of those, sends the broker already had (a resend)
        self.failed = 0  # sends that failed (the row stays for a later round)
        self.errors = 0  # rounds that failed as a whole (database or broker unreachable)
        self.rounds = 0
        # Failures logged once per cause with what to do; read by TxbService's readiness.
        self.health = LoopHealth(f"outbox relay {namespace}")
        self._announced = False

    def idempotency_key(self, row_id: int) -> str:
        return f"outbox:{self.namespace}:{row_id}"

    async def publish_pending(self) -> int:
        """One claim → publish → mark round; returns how many rows it published."""
        return (await self._round()).published

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until ``stop`` is set; a round in progress gets ``shutdown_timeout_s`` to
        finish first."""
        if not self._announced:
            self._announced = True
            log.info(
                "outbox relay started namespace=%s db=%s server=%s batch=%d ordered=%s",
                self.namespace,
                shown_url(self._engine.url),
                self._client.url,
                self.batch_size,
                "yes" if self.ordered else "no",
            )
        stopper = asyncio.create_task(stop.wait())
        stopper.add_done_callback(lambda _: self._wake.set())
        listener = asyncio.create_task(self._listen()) if self._pg else None
        try:
            while not stop.is_set():
                self._wake.clear()
                try:
                    r = await self._round_unless_stopped(stopper)
                    if r is None:
                        break  # stopped, the round cut short
                except TablesMissing:
                    raise  # no outage to outlive: nothing works until the tables exist
                except Exception as e:  # the relay must outlive a database or broker outage
                    self.errors += 1
                    # A wake-up must not cut a backoff short: only the stop does.
                    await _sleep(stop, self.health.failed(e))
                    continue
                if r.error is not None:
                    # A refused row holds back its own key only: the other rows are not made to
                    # wait out the slow retry of a cause that needs a person (a missing topic).
                    await _sleep(stop, min(self.health.failed(r.error), TRANSIENT_MAX_S))
                    continue
                self.health.ok()
                if r.published == self.batch_size:
                    continue  # probably more waiting
                await _sleep(self._wake, HELD_RETRY_S if r.held else self.poll_interval_s)
        finally:
            for task in (stopper, listener):
                if task is not None:
                    task.cancel()
            await asyncio.gather(stopper, *([listener] if listener else []), return_exceptions=True)

    async def _round_unless_stopped(self, stopper: asyncio.Task[Any]) -> _Round | None:
        """One round; once ``stopper`` is done it gets ``shutdown_timeout_s``, then is cancelled
        (None): with the broker or the database gone a round could wait on its reconnects
        for longer than any shutdown may take."""
        round_ = asyncio.ensure_future(self._round())
        try:
            await asyncio.wait({round_, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not round_.done():
                await asyncio.wait({round_}, timeout=self.shutdown_timeout_s)
        finally:
            if not round_.done():  # past the grace, or run() itself was cancelled
                round_.cancel()
                await asyncio.gather(round_, return_exceptions=True)
        if round_.cancelled():
            log.warning(
                "outbox round still running %s s after the stop: cancelled (rows it sent are "
                "sent again later under the same idempotency keys)",
                self.shutdown_timeout_s,
            )
            return None
        return round_.result()

    async def _round(self) -> _Round:
        if not self._tables.done:
            await self._tables()
        if not self._client.connected:
            # Reconnect before claiming, not while holding row locks (or SQLite's write lock).
            await self._client.ping()
        self.rounds += 1
        async with self._engine.connect() as conn:
            if not self._pg:
                await conn.execute(_SQLITE_BUSY)
                # Polling must not take the write lock (and block the service) when idle.
                if await conn.scalar(_pending()) is None:
                    await conn.rollback()
                    return _Round()
            rows = sorted((await conn.execute(self._claim())).all(), key=lambda r: r.id)
            r = _Round(claimed=len(rows))
            if not rows:
                await conn.commit()
                return r
            lanes = await self._lanes(conn, rows, r)
            sent: list[tuple[int, bool]] = []  # (row id, duplicate)
            async with asyncio.TaskGroup() as tg:
                for lane in lanes:
                    tg.create_task(self._publish_lane(lane, sent, r))
            if sent:
                ids = [row_id for row_id, _ in sent]
                await conn.execute(
                    update(OUTBOX).where(OUTBOX.c.id.in_(ids)).values(published_at=db_now())
                )
            await conn.commit()
        r.published = len(sent)
        self.published += len(sent)
        self.duplicates += sum(1 for _, dup in sent if dup)
        return r

    def _claim(self) -> Any:
        head: Any = (
            select(OUTBOX.c.id)
            .where(OUTBOX.c.published_at.is_(None))
            .order_by(OUTBOX.c.id)
            .limit(self.batch_size)
        )
        if self._pg:
            # A CTE evaluated once. As a plain IN (subquery), PostgreSQL may rescan it for each
            # row it updates, each rescan skipping the rows this statement just updated, so
            # the LIMIT slides along and claims far more than a batch.
            head = head.with_for_update(skip_locked=True).cte("claimed").prefix_with("MATERIALIZED")
            head = select(head.c.id)
        # SQLite: no CTE, since Python's sqlite3 opens its implicit transaction only before a
        # statement that starts with UPDATE/INSERT/DELETE/REPLACE; one starting with WITH
        # would run (and commit) on its own, releasing the claim at once. And an UPDATE, so
        # the round's first statement takes the write lock (waiting its turn) rather than
        # reading first and failing to upgrade. attempts counts the claims of a row.
        return (
            update(OUTBOX)
            .where(OUTBOX.c.id.in_(head), OUTBOX.c.published_at.is_(None))
            .values(attempts=OUTBOX.c.attempts + 1)
            .returning(
                OUTBOX.c.id,
                OUTBOX.c.topic,
                OUTBOX.c.key,
                OUTBOX.c.tags,
                OUTBOX.c.headers,
                OUTBOX.c.body,
            )
        )

    async def _lanes(
        self, conn: AsyncConnection, rows: list[Row[Any]], r: _Round
    ) -> list[list[Row[Any]]]:
        """Rows that go one after the other: one lane per key (in id order) when ordered, else
        one per row. Rows behind an earlier unpublished row of their key outside this batch
        (another relay's, or one that failed) are left for a later round."""
        if not self.ordered:
            return [[row] for row in rows]
        keys = {row.key for row in rows if row.key is not None}
        first_outside: dict[str, int] = {}
        if keys:
            blockers = (
                select(OUTBOX.c.key, func.min(OUTBOX.c.id))
                .where(
                    OUTBOX.c.published_at.is_(None),
                    OUTBOX.c.key.in_(keys),
                    OUTBOX.c.id.notin_([row.id for row in rows]),
                )
                .group_by(OUTBOX.c.key)
            )
            first_outside = {k: i for k, i in (await conn.execute(blockers)).all()}
        lanes: dict[str, list[Row[Any]]] = {}
        out: list[list[Row[Any]]] = []
        for row in rows:
            if row.key is None:
                out.append([row])  # no key, no order
            elif row.id > first_outside.get(row.key, row.id):
                r.held += 1
            else:
                lanes.setdefault(row.key, []).append(row)
        return out + list(lanes.values())

    async def _publish_lane(
        self, lane: list[Row[Any]], sent: list[tuple[int, bool]], r: _Round
    ) -> None:
        for row in lane:
            headers = row.headers
            span = self._start_send(row) if tracing_on() else None
            if span is not None and (tp := tr.traceparent(span)) is not None:
                headers = {**(row.headers or {}), TRACEPARENT: tp}  # consumers continue from it
            try:
                receipt = await self._client.send(
                    row.topic,
                    row.body,
                    key=row.key,
                    tags=row.tags,
                    headers=headers,
                    idempotency_key=self.idempotency_key(row.id),
                )
            except TxbError as e:
                if span is not None:
                    span.set_attribute(tr.ERROR_TYPE, e.code)
                    span.set_status(Status(StatusCode.ERROR, str(e)[:200]))
                    span.end()
                r.failed += 1
                self.failed += 1
                r.error = r.error or e  # the round's health report (logged once per cause)
                log.debug("outbox row %s to %r not sent (%r); retrying later", row.id, row.topic, e)
                return  # the rest of this key waits for this row
            if span is not None:
                span.set_attribute(tr.MESSAGE_ID, receipt.message_id)
                span.set_attribute(tr.PARTITION, str(receipt.queue_id))
                span.set_attribute(tr.SEND_DUPLICATE, receipt.duplicate)
                span.end()
            faults.point("relay_after_send")
            sent.append((row.id, receipt.duplicate))

    def _start_send(self, row: Row[Any]) -> Span:
        """The relay's PRODUCER span of one row, in the trace the row was written in."""
        attrs: dict[str, AttributeValue] = {
            tr.SYSTEM: tr.MESSAGING_SYSTEM,
            tr.DESTINATION: row.topic,
            tr.OPERATION_TYPE: "send",
            tr.OPERATION_NAME: "send",
            tr.OUTBOX_ID: row.id,
            tr.OUTBOX_NAMESPACE: self.namespace,
        }
        return tr.tracer(__name__).start_span(
            f"send {row.topic}",
            context=tr.context_from((row.headers or {}).get(TRACEPARENT)),
            kind=SpanKind.PRODUCER,
            attributes=attrs,
        )

    async def _listen(self) -> None:
        """Keep a LISTEN on the outbox channel; re-establish it when its connection drops.
        Notifications can be lost (while reconnecting, say): the poll covers that."""
        while True:
            try:
                await self._listen_once()
            except Exception as e:  # PostgreSQL away: poll meanwhile, try again later
                log.warning("outbox LISTEN failed (%r); polling until it is back", e)
            await asyncio.sleep(self.poll_interval_s)

    async def _listen_once(self) -> None:
        async with self._engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None
            lost = asyncio.Event()
            driver.add_termination_listener(lambda _c: lost.set())
            await driver.add_listener(CHANNEL, self._notified)
            self.listening.set()
            self._wake.set()  # anything committed before the LISTEN was missed
            try:
                await lost.wait()
            finally:
                self.listening.clear()
                if not driver.is_closed():
                    with contextlib.suppress(Exception):
                        await driver.remove_listener(CHANNEL, self._notified)

    def _notified(self, *_: object) -> None:
        self._wake.set()


def _pending() -> Select[tuple[int]]:
    return select(OUTBOX.c.id).where(OUTBOX.c.published_at.is_(None)).limit(1)


async def _sleep(event: asyncio.Event, timeout_s: float) -> None:
    """Wait for ``event``, at most ``timeout_s``."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
