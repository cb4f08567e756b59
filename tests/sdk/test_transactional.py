"""@transactional end to end: a real broker, a real database (SQLite and PostgreSQL), and the
service's real check-back endpoint backed by the barrier."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from starlette.applications import Starlette
from starlette.routing import Route

from checkback import CheckbackEndpoint
from checkback.barrier import BarrierResolver
from sdk import Client, Consumer
from sdk.client import ConnectionClosed, Transaction
from sdk.transactional import TxPublisher
from tests.conftest import BrokerProcess
from tests.httpserver import serve_app
from tests.tx.conftest import GROUP, SECRET, tx_broker

ORDERS = sa.Table(
    "orders",
    sa.MetaData(),
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("item", sa.String(64), nullable=False),
)


@pytest.fixture
async def service(
    engine: AsyncEngine, tmp_path: Path
) -> AsyncIterator[tuple[BrokerProcess, str, AsyncEngine]]:
    async with engine.begin() as conn:
        await conn.run_sync(ORDERS.metadata.create_all)
    endpoint = CheckbackEndpoint(BarrierResolver(engine), {GROUP: SECRET})
    app = Starlette(routes=[Route("/txb/check", endpoint, methods=["POST"])])
    broker = tx_broker(tmp_path / "broker").start()
    try:
        async with serve_app(app) as base:
            yield broker, base + "/txb/check", engine
    finally:
        broker.stop()


async def _delivered(c: Client, quiet_ms: int = 800) -> list[bytes]:
    out: list[bytes] = []
    async with Consumer(c, "billing", "orders") as consumer:
        while batch := await consumer.fetch(timeout_ms=quiet_ms):
            for m in batch:
                out.append(m.body)
                m.ack()
    return out


async def _rows(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return list((await conn.scalars(sa.select(ORDERS.c.id).order_by(ORDERS.c.id))).all())


async def test_commit_publishes_once_and_failure_publishes_nothing(
    service: tuple[BrokerProcess, str, AsyncEngine],
) -> None:
    broker, check_url, engine = service
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=2)
        pub = TxPublisher(c, async_sessionmaker(engine), producer_group=GROUP, check_url=check_url)

        @pub.transactional("orders", key=lambda o: o["id"])
        async def place(session: AsyncSession, oid: str, fail: bool = False) -> dict[str, str]:
            await session.execute(ORDERS.insert().values(id=oid, item="book"))
            if fail:
                raise RuntimeError("payment declined")
            return {"id": oid, "item": "book"}

        assert await place("o1") == {"id": "o1", "item": "book"}
        with pytest.raises(RuntimeError):
            await place("o2", fail=True)
        assert await _rows(engine) == ["o1"]
        assert await _delivered(c) == [b'{"id":"o1","item":"book"}']
        assert (await c.list_transactions()).total == 0


async def test_lost_end_tx_after_the_db_commit_is_committed_by_the_check(
    service: tuple[BrokerProcess, str, AsyncEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, check_url, engine = service

    async def lost(self: Transaction) -> None:
        raise ConnectionClosed("the service died right after its database commit")

    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=1)
        pub = TxPublisher(c, async_sessionmaker(engine), producer_group=GROUP, check_url=check_url)

        @pub.transactional("orders")
        async def place(session: AsyncSession, oid: str) -> str:
            await session.execute(ORDERS.insert().values(id=oid, item="lamp"))
            return oid

        monkeypatch.setattr(Transaction, "commit", lost)
        assert await place("o9") == "o9"  # the service saw its commit succeed
        monkeypatch.undo()
        deadline = time.monotonic() + 15
        while (await c.list_transactions()).total:
            assert time.monotonic() < deadline, "the back-check never resolved it"
            await asyncio_sleep(0.1)
        assert await _rows(engine) == ["o9"]
        assert await _delivered(c) == [b"o9"]


async def asyncio_sleep(s: float) -> None:
    import asyncio

    await asyncio.sleep(s)  # polling the broker for the check's outcome


async def test_a_commit_that_fails_after_taking_effect_is_settled_by_the_check(
    service: tuple[BrokerProcess, str, AsyncEngine],
) -> None:
    """The COMMIT's outcome is unknown to the SDK when it raises (here: after it took effect,
    like a connection lost before the answer). Rolling the half message back would lose the
    message of a committed order; the SDK leaves it to the back-check, which reads the barrier."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    class LostAnswer(Session):
        pass

    def boom(session: Session) -> None:
        raise ConnectionResetError("connection lost while the COMMIT's answer was on its way")

    event.listen(LostAnswer, "after_commit", boom)
    broker, check_url, engine = service
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=1)
        sessions = async_sessionmaker(engine, sync_session_class=LostAnswer)
        pub = TxPublisher(c, sessions, producer_group=GROUP, check_url=check_url)

        @pub.transactional("orders")
        async def place(session: AsyncSession, oid: str) -> str:
            await session.execute(ORDERS.insert().values(id=oid, item="desk"))
            return oid

        with pytest.raises(ConnectionResetError):
            await place("o7")
        deadline = time.monotonic() + 15
        while (await c.list_transactions()).total:
            assert time.monotonic() < deadline, "the back-check never resolved it"
            await asyncio_sleep(0.1)
        assert await _rows(engine) == ["o7"]
        assert await _delivered(c) == [b"o7"]  # committed order, delivered message
