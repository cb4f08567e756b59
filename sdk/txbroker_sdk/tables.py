"""The tables txbroker keeps in a service's own database (SQLAlchemy Core, one MetaData).

``txb_local_tx`` is the transaction barrier: one row per transactional message, written in
the business transaction (``committed``) or by a back-check that got there first
(``rolled_back``). ``txb_inbox`` records each message a consumer group applied, so a
redelivery is recognised and skipped. ``txb_outbox`` holds messages written in the business
transaction until the relay publishes them.

The schema is created by the Alembic migrations in ``migrations/`` (``txbroker db upgrade``).
Times are the database's clock (:func:`db_now`), to the millisecond on SQLite as on PostgreSQL,
so the reconciliation's latencies mean the same on both.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    func,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.functions import FunctionElement

from txbroker.errors import InvalidArgument

__all__ = ["INBOX", "LOCAL_TX", "OUTBOX", "SQLITE_NOW", "db_now", "insert_if_absent", "metadata"]

metadata: Final = MetaData()

# SQLite's CURRENT_TIMESTAMP has whole seconds, which turns every latency measured from these
# columns into a multiple of 1,000 ms. strftime's %f is seconds with three decimals, and the
# text is the form SQLAlchemy reads back as a datetime (and orders like the older rows' text).
SQLITE_NOW: Final = "strftime('%Y-%m-%d %H:%M:%f', 'now')"


class _DbNow(FunctionElement[datetime]):
    type = DateTime(timezone=True)
    name = "db_now"
    inherit_cache = True


@compiles(_DbNow)
def _now(_element: _DbNow, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(func.now(), **kw)  # PostgreSQL's now() keeps microseconds


@compiles(_DbNow, "sqlite")
def _now_sqlite(_element: _DbNow, _compiler: SQLCompiler, **_kw: Any) -> str:
    return SQLITE_NOW


def db_now() -> _DbNow:
    """The database's current time, to the millisecond or better: ``now()`` on PostgreSQL,
    :data:`SQLITE_NOW` on SQLite. The time columns' default, and what the relay stamps
    ``published_at`` with::

        update(OUTBOX).values(published_at=db_now())
    """
    return _DbNow()


# Ids are UUIDv7 hex (32 characters) by default; 64 leaves room for a service's own scheme.
_ID: Final = 64

LOCAL_TX: Final = Table(
    "txb_local_tx",
    metadata,
    Column("tx_id", String(_ID), primary_key=True),
    Column("state", String(16), nullable=False),  # committed | rolled_back
    Column("topic", String(127), nullable=True),
    Column("key", String(1024), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=db_now()),
)

INBOX: Final = Table(
    "txb_inbox",
    metadata,
    Column("consumer_group", String(127), primary_key=True),
    Column("message_id", String(_ID), primary_key=True),
    Column("processed_at", DateTime(timezone=True), nullable=False, server_default=db_now()),
)

OUTBOX: Final = Table(
    "txb_outbox",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("topic", String(127), nullable=False),
    Column("key", String(1024), nullable=True),
    Column("tags", String(1024), nullable=True),
    Column("headers", JSON, nullable=True),
    Column("body", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=db_now()),
    Column("published_at", DateTime(timezone=True), nullable=True),
    Column("attempts", Integer, nullable=False, server_default="0"),
)

# The relay scans unpublished rows in id order; retention scans old rows by time.
Index("ix_txb_outbox_unpublished", OUTBOX.c.published_at, OUTBOX.c.id)
Index("ix_txb_local_tx_created", LOCAL_TX.c.created_at)
Index("ix_txb_inbox_processed", INBOX.c.processed_at)


@functools.cache
def insert_if_absent(table: Table, dialect: str) -> Insert:
    """``INSERT ... ON CONFLICT DO NOTHING`` into ``table`` for ``dialect``, built once (it is on
    every message's and check's path); execute it with the row as parameters: rowcount 1 if
    this call inserted the row, 0 if a row with its key was there. The barrier and the inbox
    both decide "first one wins" this way."""
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    raise InvalidArgument(f"unsupported database {dialect!r}: use postgresql or sqlite")
