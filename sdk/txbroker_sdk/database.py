"""An async engine for a service's database, set up the way the SDK's guarantees need it.

    engine = create_engine("sqlite:///orders.db")        # or postgresql://user@host/db

Plain URLs map to the async drivers (asyncpg, aiosqlite). SQLite gets WAL (readers never block
the writer, and a crash loses nothing committed) and a busy timeout: a service, its check-back
endpoint and an outbox relay write to one file from several connections and processes, and
the driver's default (5 s) lets the loser of a write-lock race under load fail with "database
is locked" instead of waiting its turn.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from txbroker.errors import InvalidArgument

__all__ = ["async_url", "create_engine"]

_ASYNC_DRIVERS = {
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
}


def async_url(url: str) -> str:
    """Map a plain database URL to the async driver the SDK uses (asyncpg, aiosqlite)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise InvalidArgument(f"not a database URL: {url!r} (e.g. postgresql://user@host/db)")
    if "+" in scheme:
        return url
    if scheme not in _ASYNC_DRIVERS:
        raise InvalidArgument(f"unsupported database {scheme!r}: use postgresql or sqlite")
    return f"{_ASYNC_DRIVERS[scheme]}://{rest}"


SQLITE_BUSY_TIMEOUT_S = 30.0


def create_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An AsyncEngine for ``url`` (postgresql:// or sqlite://); ``kwargs`` go to SQLAlchemy."""
    full = async_url(url)
    if not full.startswith("sqlite"):
        return create_async_engine(full, **kwargs)
    connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_S, **kwargs.pop("connect_args", {})}
    engine = create_async_engine(full, connect_args=connect_args, **kwargs)

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")  # a committed barrier row survives power loss
        cur.close()

    return engine
