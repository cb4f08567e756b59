"""Database fixtures, shared by every suite that needs a service database (registered in
tests/conftest.py): a migrated SQLite file, and a migrated throwaway PostgreSQL database.

PostgreSQL tests need the server at TXB_TEST_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/test). By hand they skip when it is not there; with
CI=true they must run, so a missing server fails them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
from collections.abc import AsyncIterator, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.conftest import IN_CI
from txbroker_sdk.database import async_url
from txbroker_sdk.schema import upgrade
from txbroker_sdk.testing import create_database, drop_database

T = TypeVar("T")
PG_URL = os.environ.get("TXB_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'service.db'}"
    upgrade(url)
    return url


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a loop of its own thread: a sync fixture may be reached from inside a
    running loop."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@contextlib.contextmanager
def scratch_pg(prefix: str = "txb_test") -> Iterator[str]:
    """A fresh PostgreSQL database, migrated, dropped afterwards (skips the test when there is
    no server, except under CI)."""
    try:
        url = run_async(create_database(PG_URL, prefix))
    except (OSError, SQLAlchemyError) as e:
        if IN_CI:
            raise
        pytest.skip(f"PostgreSQL not available at {PG_URL}: {e}")
    try:
        upgrade(url)
        yield url
    finally:
        run_async(drop_database(url))


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh database, migrated, dropped after the test."""
    with scratch_pg() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[AsyncEngine]:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    eng = create_async_engine(async_url(url))
    yield eng
    await eng.dispose()
