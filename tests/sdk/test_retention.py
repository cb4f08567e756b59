"""Retention of the SDK tables on real SQLite and PostgreSQL: old rows go in batches, young
rows and unpublished outbox rows stay; the periodic runner survives failed rounds; the CLI."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.conftest import run_cli
from txbroker.errors import InvalidArgument
from txbroker_sdk.database import async_url
from txbroker_sdk.retention import CleanupReport, Retention, clean_up
from txbroker_sdk.schema import upgrade
from txbroker_sdk.tables import INBOX, LOCAL_TX, OUTBOX

NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=10)
YOUNG = NOW - timedelta(days=1)


async def _seed(
    engine: AsyncEngine,
    *,
    tx: dict[str, datetime],
    inbox: dict[str, datetime],
    outbox: list[tuple[datetime, datetime | None]],  # (created_at, published_at)
) -> None:
    async with engine.begin() as conn:
        for tx_id, at in tx.items():
            await conn.execute(
                LOCAL_TX.insert().values(tx_id=tx_id, state="committed", created_at=at)
            )
        for message_id, at in inbox.items():
            await conn.execute(
                INBOX.insert().values(consumer_group="g", message_id=message_id, processed_at=at)
            )
        for created, published in outbox:
            await conn.execute(
                OUTBOX.insert().values(
                    topic="t", body=b"x", created_at=created, published_at=published
                )
            )


async def _left(engine: AsyncEngine) -> tuple[list[str], list[str], list[int]]:
    async with engine.connect() as conn:
        tx = (await conn.scalars(sa.select(LOCAL_TX.c.tx_id).order_by(LOCAL_TX.c.tx_id))).all()
        inbox = (
            await conn.scalars(sa.select(INBOX.c.message_id).order_by(INBOX.c.message_id))
        ).all()
        outbox = (await conn.scalars(sa.select(OUTBOX.c.id).order_by(OUTBOX.c.id))).all()
    return list(tx), list(inbox), list(outbox)


async def test_old_rows_go_young_and_unpublished_rows_stay(engine: AsyncEngine) -> None:
    await _seed(
        engine,
        tx={"old1": OLD, "old2": OLD, "old3": OLD, "young1": YOUNG, "young2": YOUNG},
        inbox={"old1": OLD, "old2": OLD, "young1": YOUNG},
        outbox=[
            (OLD, OLD),  # 1: published long ago: goes
            (OLD - timedelta(days=30), None),  # 2: never published, very old: stays
            (OLD, YOUNG),  # 3: created long ago, published recently: stays
            (OLD, OLD),  # 4: goes
            (OLD - timedelta(days=30), None),  # 5: stays
        ],
    )
    report = await clean_up(engine, keep=timedelta(days=7), now=NOW)
    assert report == CleanupReport(local_tx=3, inbox=2, outbox=2) and report.total == 7
    assert await _left(engine) == (["young1", "young2"], ["young1"], [2, 3, 5])
    # Nothing else is old enough: a second pass deletes nothing.
    assert await clean_up(engine, keep=timedelta(days=7), now=NOW) == CleanupReport()


async def test_rows_written_with_the_database_clock_age_out(engine: AsyncEngine) -> None:
    # Server defaults (db_now()): the comparison must agree with their zone.
    async with engine.begin() as conn:
        await conn.execute(LOCAL_TX.insert().values(tx_id="a", state="committed"))
        await conn.execute(INBOX.insert().values(consumer_group="g", message_id="m"))
    later = datetime.now(UTC) + timedelta(hours=2)
    assert await clean_up(engine, keep=timedelta(hours=3), now=later) == CleanupReport()
    assert await clean_up(engine, keep=timedelta(hours=1), now=later) == CleanupReport(1, 1, 0)


async def test_batches_smaller_than_the_backlog_delete_everything_old(
    engine: AsyncEngine,
) -> None:
    await _seed(
        engine,
        tx={f"old{i:02}": OLD for i in range(25)} | {"young": YOUNG},
        inbox={f"old{i:02}": OLD for i in range(12)},  # a multiple of the batch: one empty batch
        outbox=[(OLD, OLD)] * 11 + [(YOUNG, None)],
    )
    report = await clean_up(engine, keep=timedelta(days=7), batch_size=4, now=NOW)
    assert report == CleanupReport(local_tx=25, inbox=12, outbox=11)
    assert await _left(engine) == (["young"], [], [12])


async def test_the_newest_outbox_row_stays_so_its_id_is_never_reused(
    engine: AsyncEngine,
) -> None:
    await _seed(engine, tx={}, inbox={}, outbox=[(OLD, OLD)] * 3)
    assert await clean_up(engine, keep=timedelta(days=7), now=NOW) == CleanupReport(outbox=2)
    assert (await _left(engine))[2] == [3]
    async with engine.begin() as conn:
        new_id = (
            await conn.execute(OUTBOX.insert().values(topic="t", body=b"y").returning(OUTBOX.c.id))
        ).scalar_one()
    assert new_id == 4  # not 3 again: the relay's idempotency key is made of the id


async def test_bad_arguments_are_refused(engine: AsyncEngine) -> None:
    for keep in (timedelta(0), timedelta(days=-1)):
        with pytest.raises(InvalidArgument, match="keep"):
            await clean_up(engine, keep=keep)
    for batch in (0, -5, True):
        with pytest.raises(InvalidArgument, match="batch_size"):
            await clean_up(engine, batch_size=batch)
    with pytest.raises(InvalidArgument, match="interval_s"):
        Retention(engine, interval_s=0)
    with pytest.raises(InvalidArgument, match="batch_size"):
        Retention(engine, batch_size=0)


async def _until(cond: object, what: object, timeout_s: float = 10) -> None:
    assert callable(cond)
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)  # watching the runner's counters


async def test_the_runner_survives_failed_rounds_and_stops_promptly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'late.db'}"
    engine = create_async_engine(async_url(url))  # no tables yet: every round fails
    retention = Retention(engine, keep=timedelta(days=7), interval_s=0.05)
    stop = asyncio.Event()
    runner = asyncio.create_task(retention.run(stop))
    try:
        await _until(lambda: retention.errors >= 2, retention.errors)
        assert retention.rounds == 0 and not runner.done()
        upgrade(url)  # the database comes good: the next round works
        await _seed(engine, tx={"old": OLD}, inbox={}, outbox=[])
        await _until(lambda: retention.deleted.local_tx == 1, retention.deleted)
        stop.set()
        await asyncio.wait_for(runner, 5)
        assert (await _left(engine))[0] == []

        # Between rounds it waits on the stop event, not out the interval.
        slow = Retention(engine, interval_s=600)
        stop = asyncio.Event()
        runner = asyncio.create_task(slow.run(stop))
        await _until(lambda: slow.rounds == 1, slow.errors)
        stop.set()
        await asyncio.wait_for(runner, 5)
    finally:
        stop.set()
        await asyncio.wait_for(runner, 5)
        await engine.dispose()


async def test_cli_db_clean(engine: AsyncEngine) -> None:
    await _seed(
        engine,
        tx={"old1": OLD, "old2": OLD, "young": YOUNG},
        inbox={"old": OLD},
        outbox=[(OLD, OLD), (OLD, None)],
    )
    url = engine.url.render_as_string(hide_password=False)
    res = await asyncio.to_thread(run_cli, "db", "clean", "--url", url, "--batch", "1")
    assert res.returncode == 0, res.stderr
    assert "txb_local_tx=2 txb_inbox=1 txb_outbox=1" in res.stdout
    assert await _left(engine) == (["young"], [], [2])

    bad = await asyncio.to_thread(run_cli, "db", "clean", "--url", url, "--keep-days", "0")
    assert bad.returncode == 2 and "must be positive" in bad.stderr
    missing = await asyncio.to_thread(run_cli, "db", "clean", env={"TXB_DATABASE_URL": ""})
    assert missing.returncode == 2 and "give --url" in missing.stderr
