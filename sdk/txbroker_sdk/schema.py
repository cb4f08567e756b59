"""`txbroker db upgrade`: apply the SDK's migrations to a service's database."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from txbroker.errors import InvalidArgument
from txbroker_sdk.database import async_url

__all__ = ["UpgradeResult", "upgrade"]

# Alembic's version table for the txbroker revisions (named in txbroker_migrations/env.py).
VERSION_TABLE = "txb_alembic_version"


@dataclass(frozen=True, slots=True)
class UpgradeResult:
    """What :func:`upgrade` did: the database's txbroker revision before and after it (None:
    no txbroker tables). Several heads read as their revisions joined by commas."""

    before: str | None
    after: str | None

    @property
    def created(self) -> bool:
        """The tables did not exist and were created."""
        return self.before is None and self.after is not None

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def __str__(self) -> str:
        if self.created:
            return f"created the txbroker tables (revision {self.after})"
        if self.changed:
            return f"upgraded the txbroker tables from revision {self.before} to {self.after}"
        return f"the txbroker tables are already at revision {self.after}"


def migrations_dir() -> Path:
    """Where the Alembic scripts are: the ``txbroker_migrations`` package's folder, found by name
    rather than imported, because its env.py imports this package's tables (the scripts are this
    package's data; they sit in their own folder, ``migrations/``, as the design card lays out)."""
    spec = importlib.util.find_spec("txbroker_migrations")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidArgument("the txbroker_migrations package is not installed")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def upgrade(url: str, revision: str = "heads") -> UpgradeResult:
    """Bring the txbroker tables in ``url``'s database up to ``revision`` (default: latest);
    what it did (``str()`` of the result says it in a sentence, for a log).

    Safe to call from inside a running event loop: the migrations (which run their own loop
    for the async drivers) then run in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _upgrade(url, revision)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_upgrade, url, revision).result()


def _upgrade(url: str, revision: str) -> UpgradeResult:
    from alembic import command
    from alembic.config import Config

    full = async_url(url)
    before = asyncio.run(_revision(full))
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", full.replace("%", "%%"))
    command.upgrade(cfg, revision)
    return UpgradeResult(before, asyncio.run(_revision(full)))


async def _revision(full_url: str) -> str | None:
    """The database's txbroker revision(s), or None before the first upgrade."""
    from sqlalchemy import Connection, inspect, pool, text
    from sqlalchemy.ext.asyncio import create_async_engine

    def read(conn: Connection) -> str | None:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        rows = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
        return ",".join(sorted(rows)) or None

    engine = create_async_engine(full_url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(read)
    finally:
        await engine.dispose()
