"""`txbroker db upgrade`: apply the SDK's migrations to a service's database."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
from pathlib import Path

from txbroker.errors import InvalidArgument
from txbroker_sdk.database import async_url

__all__ = ["upgrade"]


def migrations_dir() -> Path:
    """Where the Alembic scripts are: the ``txbroker_migrations`` package's folder, found by name
    rather than imported, because its env.py imports this package's tables (the scripts are this
    package's data; they sit in their own folder, ``migrations/``, as the design card lays out)."""
    spec = importlib.util.find_spec("txbroker_migrations")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidArgument("the txbroker_migrations package is not installed")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


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

    root = migrations_dir()
    cfg = Config()
    cfg.set_main_option("script_location", str(root))
    cfg.set_main_option("sqlalchemy.url", async_url(url).replace("%", "%%"))
    command.upgrade(cfg, revision)
