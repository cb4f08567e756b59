"""A database that was never migrated fails each component's start with what to do (run
`txbroker db upgrade --url ...`), not with SQL errors per transaction or per message; the look
is made once, and repeated after a failure (the tables may have been created since)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import Connection
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tests.conftest import IN_CI
from tests.databases import PG_URL
from txbroker_checkback.contract import CheckRequest, CheckStatus
from txbroker_outbox import Relay
from txbroker_sdk import Client, ConsumedMessage, Subscribers, TxPublisher, preflight
from txbroker_sdk.barrier import BarrierResolver
from txbroker_sdk.database import create_engine
from txbroker_sdk.errors import TablesMissing
from txbroker_sdk.schema import upgrade
from txbroker_sdk.testing import create_database, drop_database

NOWHERE = "txb://127.0.0.1:1"  # never reached: the tables are looked for first


@pytest.fixture(params=["sqlite", "postgresql"])
async def bare_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A database without the txb_* tables (a PostgreSQL one with a password in its URL, which
    the error must not show)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'bare.db'}"
        return
    try:
        url = await create_database(PG_URL, "txb_bare")
    except (OSError, SQLAlchemyError) as e:
        if IN_CI:
            raise
        pytest.skip(f"PostgreSQL not available at {PG_URL}: {e}")
    try:
        # trust auth ignores it; it stands for a real deployment's secret
        yield make_url(url).set(password="s3cret").render_as_string(hide_password=False)
    finally:
        await drop_database(url)


def _expected(url: str) -> str:
    shown = make_url(url).render_as_string(hide_password=True)
    assert "s3cret" not in shown
    return f"the txbroker tables are missing in {shown}: run `txbroker db upgrade --url {shown}`"


async def _fails(run: asyncio.Future[object] | object, url: str, table: str) -> None:
    with pytest.raises(TablesMissing) as err:
        await asyncio.wait_for(run, 30)  # type: ignore[arg-type]
    assert str(err.value).startswith(_expected(url)), err.value
    assert err.value.missing == (table,) and "s3cret" not in str(err.value)


async def test_each_component_names_the_command_that_creates_the_tables(bare_url: str) -> None:
    engine = create_engine(bare_url)
    sessions = async_sessionmaker(engine)
    client = Client(NOWHERE)
    try:
        publisher = TxPublisher(
            client, sessions, producer_group="orders-svc", check_url="http://x/txb/check"
        )
        ran: list[str] = []

        @publisher.transactional("orders")
        async def place(session: AsyncSession, item: str) -> str:
            ran.append(item)
            return item

        await _fails(place("book"), bare_url, "txb_local_tx")
        assert ran == []  # refused before the business code ran

        subscribers = Subscribers(client, sessions)

        @subscribers.subscriber("orders", group="billing")
        async def charge(session: AsyncSession, msg: ConsumedMessage) -> None:
            pass

        await _fails(subscribers.run(asyncio.Event()), bare_url, "txb_inbox")

        check = CheckRequest("tx-1", "orders", "orders-svc", 1)
        await _fails(BarrierResolver(engine)(check), bare_url, "txb_local_tx")

        relay = Relay(client, engine, namespace="orders-db")
        await _fails(relay.run(asyncio.Event()), bare_url, "txb_outbox")
        assert relay.errors == 0  # not an outage to retry: the relay stops
    finally:
        await client.close()
        await engine.dispose()


async def test_the_look_is_made_once_and_again_after_the_tables_appear(
    bare_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[list[str]] = []
    real = preflight._missing

    def counting(conn: Connection, names: list[str]) -> list[str]:
        looks.append(names)
        return real(conn, names)

    monkeypatch.setattr(preflight, "_missing", counting)
    engine: AsyncEngine = create_engine(bare_url)
    try:
        resolver = BarrierResolver(engine)
        check = CheckRequest("tx-1", "orders", "orders-svc", 1)
        with pytest.raises(TablesMissing):
            await resolver(check)
        await asyncio.to_thread(upgrade, bare_url)
        answers = await asyncio.gather(*(resolver(check) for _ in range(5)))
        assert answers == [CheckStatus.ROLLBACK] * 5  # no barrier row: rolled back
        assert await resolver(check) is CheckStatus.ROLLBACK
        assert looks == [["txb_local_tx"], ["txb_local_tx"]]  # the failed look, then one
    finally:
        await engine.dispose()
