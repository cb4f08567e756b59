"""Checks a component makes once when it starts, so a database that was never migrated fails
at once with what to do (:class:`~txbroker_sdk.errors.TablesMissing`: run ``txbroker db
upgrade``) instead of as ``relation "txb_local_tx" does not exist`` on every transaction.

    await require_tables(engine, INBOX)          # raises TablesMissing

The publisher checks on its first transaction, the subscribers when they start, the check-back
resolver on its first check and the outbox relay when it starts; :class:`TablesChecked` is that
once: a passed check is not repeated, a failed one is (the tables may have been created since).
"""

from __future__ import annotations

import asyncio

from sqlalchemy import Connection, Table, inspect
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

from txbroker_sdk.errors import TablesMissing

__all__ = ["TablesChecked", "require_tables", "shown_url"]

Bind = AsyncEngine | async_sessionmaker[AsyncSession]


def shown_url(url: URL) -> str:
    """``url`` as a user types it for ``txbroker db upgrade --url``: the plain scheme (the
    CLI picks the async driver itself) and no password."""
    plain = url.set(drivername=url.get_backend_name())
    return plain.render_as_string(hide_password=True)


def _missing(conn: Connection, names: list[str]) -> list[str]:
    inspector = inspect(conn)
    return [name for name in names if not inspector.has_table(name)]


async def require_tables(bind: Bind, *tables: Table) -> None:
    """Raise :class:`TablesMissing` unless every one of ``tables`` exists in ``bind``'s
    database (one connection, the database's catalogue; no table is read). A database that
    cannot be reached raises SQLAlchemy's (or the driver's) error, as it would later."""
    names = [t.name for t in tables]
    if isinstance(bind, AsyncEngine):
        async with bind.connect() as conn:
            missing = await conn.run_sync(_missing, names)
            url = conn.engine.url
    else:
        async with bind() as session:

            def check(sync: Session) -> tuple[list[str], URL]:
                conn = sync.connection()
                return _missing(conn, names), conn.engine.url

            missing, url = await session.run_sync(check)
    if missing:
        raise TablesMissing(shown_url(url), missing)


class TablesChecked:
    """:func:`require_tables` once: callers test :attr:`done` (a plain attribute, so the hot
    path of a component that checked pays nothing more) and await the instance until it is."""

    def __init__(self, bind: Bind, *tables: Table) -> None:
        self._bind = bind
        self._tables = tables
        self._lock = asyncio.Lock()  # concurrent first callers share one check
        self.done = False

    async def __call__(self) -> None:
        if self.done:
            return
        async with self._lock:
            if not self.done:
                await require_tables(self._bind, *self._tables)
                self.done = True
