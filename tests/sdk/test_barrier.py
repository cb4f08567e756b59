"""The barrier on real databases (SQLite file and PostgreSQL): a check-back never disagrees
with what the service's database holds, even when it races an open business transaction."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import run_cli
from txbroker_checkback import CheckRequest, CheckStatus
from txbroker_sdk.barrier import BarrierResolver, TransactionFenced, record_commit
from txbroker_sdk.tables import LOCAL_TX


def _check(tx_id: str) -> CheckRequest:
    return CheckRequest(tx_id=tx_id, topic="orders", producer_group="orders", check_count=0)


async def test_committed_row_answers_commit(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await record_commit(conn, "t1", "orders", "o1")
    assert await BarrierResolver(engine)(_check("t1")) is CheckStatus.COMMIT


async def test_absent_row_is_rolled_back_and_fences_the_business_transaction(
    engine: AsyncEngine,
) -> None:
    resolver = BarrierResolver(engine)
    assert await resolver(_check("t2")) is CheckStatus.ROLLBACK
    assert await resolver(_check("t2")) is CheckStatus.ROLLBACK  # stable on repeat
    with pytest.raises(TransactionFenced):
        async with engine.begin() as conn:
            await record_commit(conn, "t2", "orders", None)
    async with engine.connect() as conn:
        state = await conn.scalar(select(LOCAL_TX.c.state).where(LOCAL_TX.c.tx_id == "t2"))
    assert state == "rolled_back"


async def test_a_check_racing_an_open_transaction_waits_for_it(engine: AsyncEngine) -> None:
    resolver = BarrierResolver(engine)
    async with engine.connect() as business:
        tx = await business.begin()
        await record_commit(business, "t3", "orders", None)  # inserted, not yet committed
        check = asyncio.create_task(resolver(_check("t3")))
        await asyncio.sleep(0.3)  # give the check every chance to answer early (it must not)
        assert not check.done()
        await tx.commit()
    assert await asyncio.wait_for(check, 10) is CheckStatus.COMMIT


async def test_a_check_racing_a_transaction_that_rolls_back(engine: AsyncEngine) -> None:
    resolver = BarrierResolver(engine)
    async with engine.connect() as business:
        tx = await business.begin()
        await record_commit(business, "t4", "orders", None)
        check = asyncio.create_task(resolver(_check("t4")))
        await asyncio.sleep(0.3)
        assert not check.done()
        await tx.rollback()  # the business transaction failed
    assert await asyncio.wait_for(check, 10) is CheckStatus.ROLLBACK


def test_db_upgrade_cli_is_idempotent(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import sqlite3

    db = tmp_path / "svc.db"
    for _ in range(2):  # a second run finds everything up to date
        out = run_cli("db", "upgrade", "--url", f"sqlite:///{db}", timeout=60)
        assert out.returncode == 0, out.stderr
    tables = {
        r[0]
        for r in sqlite3.connect(db).execute("select name from sqlite_master where type='table'")
    }
    assert {"txb_local_tx", "txb_inbox", "txb_outbox", "txb_alembic_version"} <= tables
    bad = run_cli("db", "upgrade", "--url", "mysql://x/y", timeout=60)
    assert bad.returncode == 2 and "unsupported database" in bad.stderr


async def test_mounted_endpoint_refuses_forged_and_stale_checks_and_writes_nothing(
    engine: AsyncEngine,
) -> None:
    """Crash window (8): only a correctly signed, fresh check may write the barrier."""
    import time

    import httpx
    import msgspec
    from starlette.applications import Starlette

    from tests.httpserver import serve_app
    from txbroker_checkback import HEADER_SIGNATURE, HEADER_TIMESTAMP, sign
    from txbroker_sdk.barrier import mount

    app = Starlette()
    path = mount(app, engine, {"orders": "s3cret"})
    body = msgspec.json.encode(_check("t5"))
    now = int(time.time() * 1000)
    stale = now - 10 * 60 * 1000

    def headers(secret: str, ts: int) -> dict[str, str]:
        return {HEADER_TIMESTAMP: str(ts), HEADER_SIGNATURE: sign(secret, ts, body)}

    async with serve_app(app) as base, httpx.AsyncClient(base_url=base) as http:
        for bad in (headers("forged", now), headers("s3cret", stale), {}):
            assert (await http.post(path, content=body, headers=bad)).status_code == 401
        async with engine.connect() as conn:
            rows = await conn.scalar(select(func.count()).select_from(LOCAL_TX))
        assert rows == 0  # nothing resolved: no rolled_back row was recorded
        good = await http.post(path, content=body, headers=headers("s3cret", now))
        assert good.status_code == 200 and good.json() == {"status": "ROLLBACK"}
