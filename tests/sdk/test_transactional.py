"""@transactional end to end: a real broker, a real database (SQLite and PostgreSQL), and the
service's real check-back endpoint backed by the barrier."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from starlette.applications import Starlette
from starlette.routing import Route

from tests.conftest import BrokerProcess
from tests.httpserver import serve_app
from tests.tx.conftest import GROUP, SECRET, tx_broker
from txbroker.errors import NotFound
from txbroker.protocol.frames import Opcode
from txbroker_checkback import CheckbackEndpoint
from txbroker_sdk import Client, Consumer
from txbroker_sdk.barrier import BarrierResolver
from txbroker_sdk.errors import ConnectionClosed
from txbroker_sdk.tables import LOCAL_TX
from txbroker_sdk.transactional import TxPublisher

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
    submit = Client.submit

    def lost(self: Client, opcode: Opcode, body: object, **kw: Any) -> asyncio.Future[Any]:
        if opcode != Opcode.TX_END:
            return submit(self, opcode, body, **kw)
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        answer.set_exception(ConnectionClosed("the service died right after its database commit"))
        return answer

    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=1)
        _, place = _order_placer(c, engine, check_url)
        monkeypatch.setattr(Client, "submit", lost)
        assert await place("o9") == "o9"  # the service saw its commit succeed
        monkeypatch.undo()
        await _settled_by_the_check(c)
        assert await _rows(engine) == ["o9"]
        assert await _delivered(c) == [b"o9"]


def _order_placer(
    c: Client, engine: AsyncEngine, check_url: str, topic: str = "orders"
) -> tuple[TxPublisher, Callable[[str], Awaitable[str]]]:
    """A publisher and its @transactional order insert, whose message body is the order id."""
    pub = TxPublisher(c, async_sessionmaker(engine), producer_group=GROUP, check_url=check_url)

    @pub.transactional(topic)
    async def place(session: AsyncSession, oid: str) -> str:
        await session.execute(ORDERS.insert().values(id=oid, item="lamp"))
        return oid

    return pub, place


async def _settled_by_the_check(c: Client, timeout_s: float = 15) -> None:
    """Wait (bounded) until the broker has no open transaction: the back-check resolved it."""
    deadline = time.monotonic() + timeout_s
    while (await c.list_transactions()).total:
        assert time.monotonic() < deadline, "the back-check never resolved it"
        await asyncio.sleep(0.1)  # polling the broker: it has no event for a check's outcome


async def test_the_call_returns_before_end_tx_is_answered_and_flush_waits(
    service: tuple[BrokerProcess, str, AsyncEngine],
) -> None:
    """END_TX is sent, not awaited: when the call returns, its answer may still be on its way;
    flush() waits for it, after which no transaction is open."""
    broker, check_url, engine = service
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=2)
        pub, place = _order_placer(c, engine, check_url)
        placed = await asyncio.gather(*(place(f"o{i}") for i in range(20)))
        assert c.unanswered  # the END_TXs are still in flight
        await pub.flush(timeout_s=10)
        assert c.unanswered == 0
        assert (await c.list_transactions()).total == 0  # every END_TX answered: none open
        assert sorted(await _delivered(c)) == sorted(p.encode() for p in placed)


async def test_a_refused_prepare_rolls_the_database_back(
    service: tuple[BrokerProcess, str, AsyncEngine],
) -> None:
    """The PREPARE overlaps the barrier insert; when the broker refuses it (no such topic), the
    database transaction, barrier row included, rolls back."""
    broker, check_url, engine = service
    async with await Client.connect(broker.url) as c:
        _, place = _order_placer(c, engine, check_url, topic="no-such-topic")
        with pytest.raises(NotFound, match="no-such-topic"):
            await place("o1")
        assert await _rows(engine) == []
        async with engine.connect() as conn:
            assert await conn.scalar(sa.select(sa.func.count()).select_from(LOCAL_TX)) == 0
        assert (await c.list_transactions()).total == 0


async def test_a_function_that_writes_nothing_still_records_its_barrier(
    service: tuple[BrokerProcess, str, AsyncEngine],
) -> None:
    """No statement ran, so no transaction is open on the driver yet: the barrier row goes
    through SQLAlchemy (which opens it) instead of straight to the driver, and commits."""
    broker, check_url, engine = service
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=1)
        pub = TxPublisher(c, async_sessionmaker(engine), producer_group=GROUP, check_url=check_url)

        @pub.transactional("orders")
        async def announce(session: AsyncSession) -> str:
            return "hello"

        assert await announce() == "hello"
        async with engine.connect() as conn:
            states = (await conn.scalars(sa.select(LOCAL_TX.c.state))).all()
        assert states == ["committed"]
        assert await _delivered(c) == [b"hello"]


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
        await _settled_by_the_check(c)
        assert await _rows(engine) == ["o7"]
        assert await _delivered(c) == [b"o7"]  # committed order, delivered message


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
async def test_on_postgresql_the_barrier_row_takes_no_round_trip_of_its_own(
    service: tuple[BrokerProcess, str, AsyncEngine],
) -> None:
    """The barrier row is inserted by the COMMIT's own query: the decorated transaction sends
    PostgreSQL as many queries as the same transaction without messaging."""
    broker, check_url, shared = service
    engine = create_async_engine(shared.url, pool_size=1, max_overflow=0)
    try:
        sessions = async_sessionmaker(engine)
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=1)
            pub = TxPublisher(c, sessions, producer_group=GROUP, check_url=check_url)

            async def insert(session: AsyncSession, oid: str) -> str:
                await session.execute(ORDERS.insert().values(id=oid, item="lamp"))
                return oid

            place = pub.transactional("orders", key=lambda oid: oid)(insert)
            await place("warm")  # prepares the statements and checks the tables
            queries: list[str] = []
            async with engine.connect() as conn:  # the pool's one connection
                raw = await conn.get_raw_connection()
                raw.driver_connection.add_query_logger(lambda q: queries.append(q.query))
            async with sessions() as session, session.begin():
                await insert(session, "plain")
            plain, queries[:] = len(queries), []
            assert await place("o1") == "o1"
            assert len(queries) == plain, queries
            assert await _rows(engine) == ["o1", "plain", "warm"]
            assert sorted(await _delivered(c)) == [b"o1", b"warm"]
    finally:
        await engine.dispose()


async def test_a_commit_fenced_by_a_check_rolls_back_and_the_connection_serves_on(
    service: tuple[BrokerProcess, str, AsyncEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A back-check's row already there fails the commit (TransactionFenced): no order, no
    message, and the connection goes back to the pool usable (no transaction left open on it);
    keys with quotes and backslashes are recorded as they are."""
    from txbroker_sdk import transactional
    from txbroker_sdk.errors import TransactionFenced

    broker, check_url, shared = service
    engine = create_async_engine(shared.url, pool_size=1, max_overflow=0)
    try:
        async with engine.begin() as conn:
            await conn.execute(
                LOCAL_TX.insert().values(tx_id="fenced-1", state="rolled_back", topic="orders")
            )
        ids = iter(["fenced-1", "free-2"])
        monkeypatch.setattr(transactional, "new_id", lambda: next(ids))
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=1)
            pub = TxPublisher(
                c, async_sessionmaker(engine), producer_group=GROUP, check_url=check_url
            )

            @pub.transactional("orders", key=lambda oid: f"it's\\{oid}'ü")
            async def place(session: AsyncSession, oid: str) -> str:
                await session.execute(ORDERS.insert().values(id=oid, item="lamp"))
                return oid

            with pytest.raises(TransactionFenced, match="rolled back by a back-check"):
                await place("o1")
            assert await place("o2") == "o2"
            assert await _rows(engine) == ["o2"]
            assert await _delivered(c) == [b"o2"]
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    sa.select(LOCAL_TX.c.tx_id, LOCAL_TX.c.state, LOCAL_TX.c.key).order_by(
                        LOCAL_TX.c.tx_id
                    )
                )
            ).all()
        assert [tuple(r) for r in rows] == [
            ("fenced-1", "rolled_back", None),
            ("free-2", "committed", "it's\\o2'ü"),
        ]
    finally:
        await engine.dispose()
