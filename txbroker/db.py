"""`txbroker db upgrade`: apply the SDK's migrations to a service's database."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

from txbroker.errors import InvalidArgument

__all__ = ["async_url", "upgrade"]

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


def upgrade(url: str, revision: str = "heads") -> None:
    """Bring the txbroker tables in ``url``'s database up to ``revision`` (default: latest).

    Safe to call from inside a running event loop: the migrations (which run their own loop
    for the async drivers) then run in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        _upgrade(url, revision)
        return
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(_upgrade, url, revision).result()


def _upgrade(url: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    import migrations

    root = Path(migrations.__file__).resolve().parent
    cfg = Config()
    cfg.set_main_option("script_location", str(root))
    cfg.set_main_option("sqlalchemy.url", async_url(url).replace("%", "%%"))
    command.upgrade(cfg, revision)
