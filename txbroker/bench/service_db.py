"""The service bench's database: a throwaway database per run, its two tables, the sanity check.

``bench_orders`` is the business table every mode inserts into; ``bench_applied`` is what the
subscriber writes, one row per message it applied (no unique key on ``order_id``, so that a
message applied twice shows up as two rows instead of failing the subscriber's insert).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from sqlalchemy import (
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    func,
    select,
)
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import text

from txbroker.errors import InvalidArgument, TxbError
from txbroker_sdk import testing as scratchdb
from txbroker_sdk.database import create_engine
from txbroker_sdk.schema import upgrade

__all__ = [
    "APPLIED",
    "ORDERS",
    "BenchFailed",
    "check_connections",
    "create_tables",
    "postgresql_server",
    "throwaway_database",
    "verify",
]

metadata: Final = MetaData()

ORDERS: Final = Table(
    "bench_orders",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("mode", String(16), nullable=False),
    Column("item", String(64), nullable=False),
    Column("qty", Integer, nullable=False),
    Column("amount_cents", Integer, nullable=False),
)

APPLIED: Final = Table(
    "bench_applied",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("order_id", String(64), nullable=False),
    Column("mode", String(16), nullable=False),
)
Index("ix_bench_applied_order", APPLIED.c.order_id)


class BenchFailed(TxbError):
    """The run broke a guarantee (an order not applied, or applied twice): no figures."""

    code = "BENCH_FAILED"


async def check_connections(url: str, needed: int, flag: str) -> None:
    """InvalidArgument, naming ``flag``, unless the PostgreSQL server at ``url`` can take
    ``needed`` more connections: found out now, not as a "too many clients" error mid-run."""
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        async with engine.connect() as conn:
            limit, reserved, superuser, in_use = (await conn.execute(_CAPACITY)).one()
    finally:
        await engine.dispose()
    others = in_use - 1  # this check's own connection is closed by now
    free = limit - (0 if superuser else reserved) - others
    if needed > free:
        raise InvalidArgument(
            f"{flag} needs up to {needed} connections to PostgreSQL, and the server has "
            f"{free} free (max_connections={limit}, {others} in use by others): lower it, "
            "or raise the server's max_connections"
        )


_CAPACITY: Final = text(
    "SELECT current_setting('max_connections')::int, "
    "current_setting('superuser_reserved_connections')::int, "
    "(SELECT rolsuper FROM pg_roles WHERE rolname = current_user), "
    "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
)


async def create_tables(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)


def postgresql_server(url: str) -> URL:
    """``url`` parsed; InvalidArgument (worded for the bench's flag) unless it is PostgreSQL."""
    try:
        # Annotated: mypy may see the lazily loaded txbroker_sdk.testing as Any.
        server: URL = scratchdb.postgresql_server(url)
        return server
    except InvalidArgument:
        raise InvalidArgument(
            f"--database-url must be postgresql://...; leave it out for SQLite, not {url!r}"
        ) from None


@contextlib.asynccontextmanager
async def throwaway_database(url: str | None, data_root: Path | None) -> AsyncIterator[str]:
    """A fresh, migrated database for one run (plain URL), removed afterwards: a SQLite file
    in a temporary directory when ``url`` is None, else a new ``txb_bench_<hex>`` database on
    ``url``'s PostgreSQL server (``url`` names any database there we may connect to)."""
    if url is None:
        root = Path(tempfile.mkdtemp(prefix="txb-bench-service-", dir=data_root))
        try:
            db_url = f"sqlite:///{root / 'service.db'}"
            upgrade(db_url)
            yield db_url
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    postgresql_server(url)
    async with scratchdb.scratch_database(url, "txb_bench") as db_url:
        upgrade(db_url)
        yield db_url


async def verify(engine: AsyncEngine, mode: str, placed: int, *, messaging: bool) -> None:
    """Raise BenchFailed unless ``mode`` committed ``placed`` orders and, with ``messaging``,
    each has exactly one applied row and no applied row lacks its order (without, none)."""
    applied_per_order = (
        select(APPLIED.c.order_id, func.count().label("n"))
        .where(APPLIED.c.mode == mode)
        .group_by(APPLIED.c.order_id)
        .subquery()
    )
    async with engine.connect() as conn:
        committed = await conn.scalar(
            select(func.count()).select_from(ORDERS).where(ORDERS.c.mode == mode)
        )
        not_once = await conn.scalar(
            select(func.count())
            .select_from(
                ORDERS.outerjoin(applied_per_order, ORDERS.c.id == applied_per_order.c.order_id)
            )
            .where(ORDERS.c.mode == mode, func.coalesce(applied_per_order.c.n, 0) != 1)
        )
        orphans = await conn.scalar(
            select(func.count())
            .select_from(APPLIED)
            .where(APPLIED.c.mode == mode, APPLIED.c.order_id.not_in(select(ORDERS.c.id)))
        )
        applied = await conn.scalar(
            select(func.count()).select_from(APPLIED).where(APPLIED.c.mode == mode)
        )
    if committed != placed:
        raise BenchFailed(f"{mode}: {placed} orders placed but {committed} committed")
    if messaging and (not_once or orphans):
        raise BenchFailed(
            f"{mode}: {not_once} of {committed} orders not applied exactly once, "
            f"{orphans} applied rows without their order"
        )
    if not messaging and applied:
        raise BenchFailed(f"{mode}: {applied} applied rows, but it publishes nothing")
