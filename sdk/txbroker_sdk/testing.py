"""Throwaway PostgreSQL databases, for the demo, the service bench and the tests.

Each run gets a database of its own on the server a URL names, so nothing an earlier run left
behind can count in this one, and dropping it afterwards leaves the server as it was.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from sqlalchemy import text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from txbroker.errors import InvalidArgument
from txbroker_sdk.database import async_url

__all__ = ["create_database", "drop_database", "postgresql_server", "scratch_database"]


def postgresql_server(url: str) -> URL:
    """``url`` parsed; InvalidArgument unless it is PostgreSQL."""
    server = make_url(url)
    if server.get_backend_name() != "postgresql":
        raise InvalidArgument(f"expected a postgresql:// URL, not {url!r}")
    return server


def _admin(url: URL) -> AsyncEngine:
    # CREATE/DROP DATABASE cannot run inside a transaction.
    return create_async_engine(
        async_url(url.render_as_string(hide_password=False)), isolation_level="AUTOCOMMIT"
    )


async def _execute(url: URL, ddl: str, name: str) -> None:
    admin = _admin(url)
    # CREATE/DROP DATABASE take no bind parameters: the name is quoted as an identifier.
    quoted = admin.dialect.identifier_preparer.quote(name)
    try:
        async with admin.connect() as conn:
            await conn.execute(text(ddl.format(quoted)))
    finally:
        await admin.dispose()


async def create_database(server_url: str, prefix: str) -> str:
    """Create an empty database ``<prefix>_<12 hex>`` on the server ``server_url`` names (any
    database there we may connect to); return its URL, with ``server_url``'s driver."""
    server = postgresql_server(server_url)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    await _execute(server, "CREATE DATABASE {}", name)
    return server.set(database=name).render_as_string(hide_password=False)


async def drop_database(url: str) -> None:
    """Drop the database ``url`` names, closing its connections (connected to its server's
    ``postgres`` database, since a database cannot drop itself)."""
    db = postgresql_server(url)
    assert db.database is not None
    await _execute(
        db.set(database="postgres"), "DROP DATABASE IF EXISTS {} WITH (FORCE)", db.database
    )


@contextlib.asynccontextmanager
async def scratch_database(
    server_url: str, prefix: str, *, keep: bool = False
) -> AsyncIterator[str]:
    """A new database for the duration (its URL), dropped afterwards unless ``keep``."""
    url = await create_database(server_url, prefix)
    try:
        yield url
    finally:
        if not keep:
            await drop_database(url)
