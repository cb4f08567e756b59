"""Database fixtures: a migrated SQLite file, and a migrated throwaway PostgreSQL database.

PostgreSQL tests need the server at TXB_TEST_DATABASE_URL (default
postgresql://postgres@127.0.0.1:5432/test). By hand they skip when it is not there; with
CI=true they must run, so a missing server fails them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.conftest import IN_CI
from txbroker.db import async_url, upgrade

PG_URL = os.environ.get("TXB_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _pg_admin_url() -> str:
    base, _, _ = PG_URL.rpartition("/")
    return base + "/postgres"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'service.db'}"
    upgrade(url)
    return url


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh database, migrated, dropped after the test."""
    import asyncpg

    name = f"txb_test_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin_url().replace("postgresql://", "postgres://")

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    def admin_sql(sql: str) -> None:
        # Its own thread and loop: the fixture may be reached from inside a running loop.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, run(sql)).result()

    try:
        admin_sql(f'CREATE DATABASE "{name}"')
    except (OSError, asyncpg.PostgresError) as e:
        if IN_CI:
            raise
        pytest.skip(f"PostgreSQL not available at {PG_URL}: {e}")
    url = _pg_admin_url().rpartition("/")[0] + "/" + name
    try:
        upgrade(url)
        yield url
    finally:
        admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[AsyncEngine]:
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    eng = create_async_engine(async_url(url))
    yield eng
    await eng.dispose()
