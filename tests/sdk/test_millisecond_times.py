"""The SDK's time columns keep milliseconds on SQLite as on PostgreSQL, and `txbroker db upgrade`
gives tables made by the first revision (whole seconds on SQLite) the same without losing a
row: on real SQLite files and a real PostgreSQL database."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.conftest import IN_CI, run_cli
from tests.databases import PG_URL, run_async
from txbroker_sdk.database import async_url
from txbroker_sdk.schema import upgrade
from txbroker_sdk.tables import INBOX, LOCAL_TX, OUTBOX, db_now
from txbroker_sdk.testing import create_database, drop_database

FIRST, HEAD = "txb_0001", "txb_0002"
# Text SQLite holds for a default time: seconds with three decimals.
MILLISECOND_TEXT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}$")
WHOLE_SECOND_TEXT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")
TABLES = ("txb_local_tx", "txb_inbox", "txb_outbox")


async def _write_defaults(engine: AsyncEngine) -> None:
    """One row per table with the database's clock, as the SDK writes them: barrier and inbox
    by their defaults, an outbox row published by the relay's statement."""
    async with engine.begin() as conn:
        await conn.execute(LOCAL_TX.insert().values(tx_id="tx-new", state="committed"))
        await conn.execute(INBOX.insert().values(consumer_group="g", message_id="m-new"))
        row_id = (
            await conn.execute(OUTBOX.insert().values(topic="t", body=b"x").returning(OUTBOX.c.id))
        ).scalar_one()
        await conn.execute(
            OUTBOX.update().where(OUTBOX.c.id == row_id).values(published_at=db_now())
        )


async def _times(engine: AsyncEngine) -> list[datetime]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                sa.select(
                    sa.select(LOCAL_TX.c.created_at)
                    .where(LOCAL_TX.c.tx_id == "tx-new")
                    .scalar_subquery(),
                    sa.select(INBOX.c.processed_at)
                    .where(INBOX.c.message_id == "m-new")
                    .scalar_subquery(),
                    sa.select(OUTBOX.c.created_at)
                    .order_by(OUTBOX.c.id.desc())
                    .limit(1)
                    .scalar_subquery(),
                    sa.select(OUTBOX.c.published_at)
                    .order_by(OUTBOX.c.id.desc())
                    .limit(1)
                    .scalar_subquery(),
                )
            )
        ).one()
    return [t if t.tzinfo else t.replace(tzinfo=UTC) for t in row]  # SQLite's text is UTC


def _within_the_write(engine: AsyncEngine) -> list[datetime]:
    """Write the rows; their times, checked to lie between the clock before and after (to a
    millisecond's rounding)."""

    async def go() -> list[datetime]:
        before = datetime.now(UTC)
        await _write_defaults(engine)
        after = datetime.now(UTC)
        times = await _times(engine)
        for t in times:
            assert before - timedelta(milliseconds=1) <= t <= after + timedelta(milliseconds=1)
        await engine.dispose()
        return times

    return run_async(go())


def test_sqlite_keeps_milliseconds(sqlite_url: str) -> None:
    engine = create_async_engine(async_url(sqlite_url))
    _within_the_write(engine)
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        texts = conn.execute(
            "SELECT created_at FROM txb_local_tx UNION ALL SELECT processed_at FROM txb_inbox "
            "UNION ALL SELECT created_at FROM txb_outbox UNION ALL SELECT published_at FROM "
            "txb_outbox"
        ).fetchall()
    assert len(texts) == 4
    for (text,) in texts:
        assert MILLISECOND_TEXT.match(text), text


def _sqlite_at_first_revision(path: Path) -> str:
    """A SQLite file whose tables the first revision made, with rows its defaults wrote."""
    url = f"sqlite:///{path}"
    upgrade(url, FIRST)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO txb_local_tx (tx_id, state, topic) VALUES ('a', 'committed', 't')"
        )
        conn.execute("INSERT INTO txb_local_tx (tx_id, state) VALUES ('b', 'rolled_back')")
        conn.execute("INSERT INTO txb_inbox (consumer_group, message_id) VALUES ('g', 'm1')")
        for n in range(3):
            conn.execute(
                "INSERT INTO txb_outbox (topic, key, headers, body, published_at, attempts) "
                "VALUES ('t', ?, '{\"h\": 1}', ?, CURRENT_TIMESTAMP, 1)",
                (f"k{n}", bytes([n])),
            )
        conn.execute("DELETE FROM txb_outbox WHERE id = 1")  # ids need not start at 1
    return url


def _dump(path: Path) -> dict[str, list[tuple[object, ...]]]:
    with sqlite3.connect(path) as conn:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in TABLES}


def _indexes(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'").fetchall()
    return {name for (name,) in rows if name.startswith("ix_")}


def test_upgrading_sqlite_tables_of_the_first_revision_keeps_every_row(tmp_path: Path) -> None:
    path = tmp_path / "svc.db"
    url = _sqlite_at_first_revision(path)
    before, indexes = _dump(path), _indexes(path)
    assert WHOLE_SECOND_TEXT.match(str(before["txb_inbox"][0][2]))  # the old default
    assert indexes == {
        "ix_txb_local_tx_created",
        "ix_txb_inbox_processed",
        "ix_txb_outbox_unpublished",
    }

    out = run_cli("db", "upgrade", "--url", url, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"upgraded the txbroker tables from revision {FIRST} to {HEAD}"

    assert _dump(path) == before  # every row, every value, byte for byte
    assert _indexes(path) == indexes
    engine = create_async_engine(async_url(url))
    _within_the_write(engine)
    with sqlite3.connect(path) as conn:
        (text,) = conn.execute(
            "SELECT processed_at FROM txb_inbox WHERE message_id = 'm-new'"
        ).fetchone()
        ids = [r[0] for r in conn.execute("SELECT id FROM txb_outbox ORDER BY id")]
    assert MILLISECOND_TEXT.match(text), text
    assert ids == [2, 3, 4]  # the rowid carries on from the copied rows


@pytest.fixture
def pg_first_revision() -> Iterator[str]:
    try:
        url = run_async(create_database(PG_URL, "txb_ms"))
    except (OSError, SQLAlchemyError) as e:
        if IN_CI:
            raise
        pytest.skip(f"PostgreSQL not available at {PG_URL}: {e}")
    try:
        upgrade(url, FIRST)
        yield url
    finally:
        run_async(drop_database(url))


def test_postgresql_upgrades_and_keeps_microseconds(pg_first_revision: str) -> None:
    url = pg_first_revision

    async def old_row() -> None:
        engine = create_async_engine(async_url(url))
        async with engine.begin() as conn:
            await conn.execute(LOCAL_TX.insert().values(tx_id="a", state="committed"))
        await engine.dispose()

    run_async(old_row())
    before = run_async(_rows(url, "a"))
    assert len(before) == 1
    result = upgrade(url)
    assert (result.before, result.after) == (FIRST, HEAD)
    times = _within_the_write(create_async_engine(async_url(url)))
    # now() is the transaction's start, to the microsecond: the columns written in one
    # transaction share it, and it is not a whole second (one chance in a million).
    assert len(set(times)) == 1 and times[0].microsecond != 0
    assert run_async(_rows(url, "a")) == before


async def _rows(url: str, tx_id: str) -> list[tuple[object, ...]]:
    engine = create_async_engine(async_url(url))
    async with engine.connect() as conn:
        rows = (await conn.execute(sa.select(LOCAL_TX).where(LOCAL_TX.c.tx_id == tx_id))).all()
    await engine.dispose()
    return [tuple(r) for r in rows]
