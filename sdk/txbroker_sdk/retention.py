"""Retention of the SDK's tables: delete old barrier, inbox and published outbox rows.

    report = await clean_up(engine, keep=timedelta(days=7))  # once (``txbroker db clean``)
    await Retention(engine, keep=timedelta(days=7)).run(stop)  # every 10 minutes until stop

Rows go in batches of ``batch_size``, each its own short transaction, so clean-up never holds
locks for long; on PostgreSQL it skips rows another transaction has locked (they go next round).
``keep`` is a safety horizon, not a tidiness setting: :func:`clean_up` says why for each table.
On SQLite the times are UTC text (:func:`~txbroker_sdk.tables.db_now`), compared with a UTC cut-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Column, ColumnElement, Table, delete, func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from txbroker.errors import InvalidArgument
from txbroker_sdk.tables import INBOX, LOCAL_TX, OUTBOX

__all__ = ["CleanupReport", "Retention", "clean_up", "clean_up_url"]

log = logging.getLogger(__name__)

DEFAULT_KEEP = timedelta(days=7)


@dataclass(frozen=True)
class CleanupReport:
    """Rows deleted per table."""

    local_tx: int = 0
    inbox: int = 0
    outbox: int = 0

    @property
    def total(self) -> int:
        return self.local_tx + self.inbox + self.outbox


async def clean_up(
    engine: AsyncEngine,
    *,
    keep: timedelta = DEFAULT_KEEP,
    batch_size: int = 1000,
    now: datetime | None = None,
) -> CleanupReport:
    """Delete barrier and inbox rows older than ``keep`` and outbox rows published longer than
    ``keep`` ago (never unpublished ones), ``batch_size`` rows per transaction.

    ``keep`` is a safety horizon; each table has its reason:

    * ``txb_local_tx`` (the barrier) must outlive every back-check the broker may still send. A
      check that finds no row records ``rolled_back`` and answers ROLLBACK
      (:class:`txbroker_sdk.barrier.BarrierResolver`), so deleting the ``committed`` row of a
      transaction whose END_TX never arrived turns a committed business transaction into a
      discarded message. With the broker's defaults checks stop after about 45 minutes, but a
      transaction whose check endpoint is unreachable is checked for as long as that lasts, and a
      parked one stays open until an operator resumes it (which checks again at once): ``keep``
      must exceed the age of the oldest open transaction (``txbroker tx list``).
    * ``txb_inbox`` must outlive every redelivery, or a redelivered message is applied twice. A
      message is redelivered after a crash between commit and ack once its queue is read again (a
      group down for days redelivers days later), and retried messages come back for up to the
      retry schedule (about 1 h 46 min with the defaults).
    * ``txb_outbox``: a published row is not needed any more; an unpublished one is never deleted,
      however old (deleting it would lose the message). The row with the highest id stays too:
      SQLite would hand a deleted highest id out again, and the relay's idempotency key is made of
      the id, so the broker would take the new message for the old one and drop it.
    """
    _check(keep, batch_size)
    current = now or datetime.now(UTC)
    if current.tzinfo is None:
        current = current.replace(tzinfo=UTC)  # a naive time is taken as UTC, like SQLite's
    cutoff = (current - keep).astimezone(UTC)
    if engine.dialect.name == "sqlite":
        cutoff = cutoff.replace(tzinfo=None)  # SQLite stores naive UTC text

    newest_outbox = select(func.max(OUTBOX.c.id)).scalar_subquery()
    return CleanupReport(
        local_tx=await _delete_batches(
            engine, LOCAL_TX, [LOCAL_TX.c.tx_id], LOCAL_TX.c.created_at < cutoff, batch_size
        ),
        inbox=await _delete_batches(
            engine,
            INBOX,
            [INBOX.c.consumer_group, INBOX.c.message_id],
            INBOX.c.processed_at < cutoff,
            batch_size,
        ),
        outbox=await _delete_batches(
            engine,
            OUTBOX,
            [OUTBOX.c.id],
            # published_at IS NULL compares as unknown, so unpublished rows never match.
            (OUTBOX.c.published_at < cutoff) & (OUTBOX.c.id < newest_outbox),
            batch_size,
        ),
    )


def _check(keep: timedelta, batch_size: int) -> None:
    if not isinstance(keep, timedelta) or keep <= timedelta(0):
        raise InvalidArgument(f"keep must be a positive timedelta, got {keep!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgument(f"batch_size must be an integer >= 1, got {batch_size!r}")


async def _delete_batches(
    engine: AsyncEngine,
    table: Table,
    key: list[Column[Any]],
    old: ColumnElement[bool],
    batch_size: int,
) -> int:
    """DELETE ... WHERE key IN (SELECT key ... WHERE old LIMIT batch), until a batch is short."""
    deleted = 0
    while True:
        async with engine.begin() as conn:
            n = await _delete_one_batch(conn, table, key, old, batch_size)
        deleted += n
        if n < batch_size:
            return deleted


async def _delete_one_batch(
    conn: AsyncConnection,
    table: Table,
    key: list[Column[Any]],
    old: ColumnElement[bool],
    batch_size: int,
) -> int:
    batch = select(*key).where(old).limit(batch_size)
    if conn.dialect.name == "postgresql":
        # Rows a writer holds (a relay marking them, a check inserting) are left for next time.
        batch = batch.with_for_update(skip_locked=True)
    pk = key[0] if len(key) == 1 else tuple_(*key)
    result = await conn.execute(delete(table).where(pk.in_(batch)))
    return int(result.rowcount)


async def clean_up_url(
    url: str, *, keep: timedelta = DEFAULT_KEEP, batch_size: int = 1000
) -> CleanupReport:
    """:func:`clean_up` on a database URL (postgresql:// or sqlite://), for the CLI."""
    from txbroker_sdk.database import create_engine

    engine = create_engine(url)  # SQLite: WAL and the SDK's busy timeout
    try:
        return await clean_up(engine, keep=keep, batch_size=batch_size)
    finally:
        await engine.dispose()


class Retention:
    """Clean up every ``interval_s`` until stopped; a failed round is logged and the next round
    tries again, so a database hiccup never takes the service down."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        keep: timedelta = DEFAULT_KEEP,
        interval_s: float = 600.0,
        batch_size: int = 1000,
    ) -> None:
        _check(keep, batch_size)  # here, not at every round: a bad value would never pass
        if not interval_s > 0:
            raise InvalidArgument(f"interval_s must be > 0, got {interval_s!r}")
        self._engine = engine
        self._keep = keep
        self._interval_s = interval_s
        self._batch_size = batch_size
        self.rounds = 0  # rounds that completed
        self.errors = 0  # rounds that failed
        self.deleted = CleanupReport()  # over all rounds

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                report = await clean_up(self._engine, keep=self._keep, batch_size=self._batch_size)
            except Exception:
                self.errors += 1
                log.exception("retention round failed; trying again in %.0f s", self._interval_s)
            else:
                self.rounds += 1
                self.deleted = CleanupReport(
                    self.deleted.local_tx + report.local_tx,
                    self.deleted.inbox + report.inbox,
                    self.deleted.outbox + report.outbox,
                )
                if report.total:
                    log.info("retention deleted %s", report)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)
