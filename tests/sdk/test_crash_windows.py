"""Crash windows of @transactional and @subscriber, with real service processes killed by
SIGKILL at the SDK's named crash points (TXB_FAULTS), a real broker process, and real SQLite
and PostgreSQL. The crashed service cannot answer its back-checks, so the test process plays
another replica of it: a check-back endpoint with a BarrierResolver on the same database."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.ext.asyncio import create_async_engine as create_engine
from starlette.applications import Starlette
from starlette.routing import Route

from tests.conftest import ROOT, BrokerProcess
from tests.httpserver import serve_app
from tests.sdk.service_child import ORDERS, PAYMENTS, TOPIC
from tests.tx.conftest import FAST, GROUP, SECRET, tx_broker
from txbroker_checkback import CheckbackEndpoint, CheckRequest, CheckStatus
from txbroker_sdk import Client, Consumer, transactional
from txbroker_sdk.barrier import BarrierResolver, TransactionFenced
from txbroker_sdk.database import async_url
from txbroker_sdk.tables import INBOX, LOCAL_TX
from txbroker_sdk.transactional import TxPublisher

# A killed consumer never leaves its group; its queue moves on once its session expires.
# 5 s still leaves two seconds over the SDK's 3 s heartbeat for a live one on a busy machine.
SETTINGS = FAST + "session_timeout_ms = 5000\n"
CHILD_TIMEOUT_S = 30.0
KILLED = -signal.SIGKILL


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    return url


@dataclass
class Service:
    """The surviving replica: its engine, its check-back endpoint's answers, the broker."""

    db: str
    engine: AsyncEngine
    broker: BrokerProcess
    check_url: str
    answers: list[tuple[str, CheckStatus]] = field(default_factory=list)
    check_arrived: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def svc(db_url: str, tmp_path: Path) -> AsyncIterator[Service]:
    engine = create_engine(async_url(db_url))
    resolver = BarrierResolver(engine)
    svc: Service

    async def answer(check: CheckRequest) -> CheckStatus:
        svc.check_arrived.set()
        status = await resolver(check)
        svc.answers.append((check.tx_id, status))
        return status

    app = Starlette(
        routes=[Route("/txb/check", CheckbackEndpoint(answer, {GROUP: SECRET}), methods=["POST"])]
    )
    broker = tx_broker(tmp_path / "broker", settings=SETTINGS).start()
    try:
        async with serve_app(app) as base:
            svc = Service(db_url, engine, broker, base + "/txb/check")
            async with await Client.connect(broker.url) as c:
                await c.create_topic(TOPIC, queues=1)  # one queue: a deterministic order
            yield svc
    finally:
        broker.stop()
        await engine.dispose()


@dataclass
class Exited:
    returncode: int
    lines: list[str]
    stderr: str


@contextlib.asynccontextmanager
async def _child(*args: str, faults: str = "") -> AsyncIterator[asyncio.subprocess.Process]:
    """A service process; killed on the way out if it is still running."""
    env = {k: v for k, v in os.environ.items() if k != "TXB_FAULTS"}
    if faults:
        env["TXB_FAULTS"] = faults
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.sdk.service_child",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await asyncio.wait_for(proc.wait(), 10)


async def _run_child(*args: str, faults: str = "") -> Exited:
    async with _child(*args, faults=faults) as proc:
        out, err = await asyncio.wait_for(proc.communicate(), CHILD_TIMEOUT_S)
    assert proc.returncode is not None
    return Exited(proc.returncode, out.decode().splitlines(), err.decode())


async def _place(svc: Service, orders: int, faults: str) -> Exited:
    args = ("--db", svc.db, "--broker", svc.broker.url, "--check-url", svc.check_url)
    return await _run_child("place", *args, "--orders", str(orders), faults=faults)


async def _consume(svc: Service, until: int, faults: str = "") -> Exited:
    args = ("--db", svc.db, "--broker", svc.broker.url, "--group", "billing")
    return await _run_child("consume", *args, "--until", str(until), faults=faults)


async def _resolved(c: Client, within_s: float = 15) -> None:
    """Wait for the broker (another process) to settle every transaction by its back-checks."""
    deadline = time.monotonic() + within_s
    while (await c.list_transactions()).total:
        assert time.monotonic() < deadline, "the back-check never resolved the transaction"
        await asyncio.sleep(0.05)


async def _delivered(c: Client, quiet_ms: int = 800) -> Counter[str]:
    """Everything a fresh consumer group gets, until the topic is quiet."""
    out: Counter[str] = Counter()
    async with Consumer(c, "audit", TOPIC) as consumer:
        while batch := await consumer.fetch(timeout_ms=quiet_ms):
            for m in batch:
                out[m.body.decode()] += 1
                m.ack()
    return out


async def _column(engine: AsyncEngine, column: sa.Column[Any]) -> list[Any]:
    async with engine.connect() as conn:
        return list((await conn.scalars(sa.select(column).order_by(column))).all())


async def _barrier(engine: AsyncEngine) -> list[tuple[str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(LOCAL_TX.c.tx_id, LOCAL_TX.c.state))
        return sorted((r.tx_id, r.state) for r in rows)


async def test_crash_before_the_db_commit_leaves_no_row_and_no_message(svc: Service) -> None:
    child = await _place(svc, 1, faults="before_db_commit=@1")
    assert child.returncode == KILLED, child.stderr
    assert child.lines == []
    assert await _column(svc.engine, ORDERS.c.id) == []
    assert await _barrier(svc.engine) == []  # the barrier row died with its transaction
    async with await Client.connect(svc.broker.url) as c:
        await _resolved(c)
        [(tx_id, state)] = await _barrier(svc.engine)
        assert state == "rolled_back"  # written by the check, which found no row
        assert (tx_id, CheckStatus.ROLLBACK) in svc.answers
        assert await _delivered(c) == Counter()
    assert await _column(svc.engine, ORDERS.c.id) == []


async def test_crash_after_the_db_commit_is_committed_by_the_check(svc: Service) -> None:
    child = await _place(svc, 2, faults="after_db_commit=@2")
    assert child.returncode == KILLED, child.stderr
    assert child.lines == ["o1"]  # the second call never returned: its END_TX was never sent
    assert await _column(svc.engine, ORDERS.c.id) == ["o1", "o2"]
    async with await Client.connect(svc.broker.url) as c:
        await _resolved(c)
        assert await _delivered(c) == Counter({"o1": 1, "o2": 1})
    assert [s for _, s in await _barrier(svc.engine)] == ["committed", "committed"]
    assert svc.answers and all(s is CheckStatus.COMMIT for _, s in svc.answers)


@contextlib.contextmanager
def _held_before_barrier_insert() -> Iterator[tuple[asyncio.Event, ...]]:
    """Hold the business transaction just before its barrier insert, until released: the only
    place where a back-check can find no barrier row while the transaction is still open (the
    business function itself runs before PREPARE, so the broker cannot check it yet). The
    PREPARE is on its way meanwhile (it overlaps the insert), so the broker can check."""
    reached, release = asyncio.Event(), asyncio.Event()
    real = transactional.record_with_commit

    async def held(*args: Any) -> None:
        reached.set()
        await release.wait()
        await real(*args)

    transactional.record_with_commit = held
    try:
        yield reached, release
    finally:
        transactional.record_with_commit = real


async def test_a_check_while_the_db_transaction_is_open(svc: Service) -> None:
    """PostgreSQL: the check finds no barrier row, records ROLLBACK, and the business
    transaction is then fenced. SQLite: the business transaction holds the write lock, so the
    check waits for it and answers what it committed. Either way the two agree."""
    business = create_engine(async_url(svc.db))  # the replica that placed the order
    try:
        async with await Client.connect(svc.broker.url) as c:
            pub = TxPublisher(
                c, async_sessionmaker(business), producer_group=GROUP, check_url=svc.check_url
            )

            @pub.transactional(TOPIC)
            async def place(session: AsyncSession, oid: str) -> str:
                await session.execute(ORDERS.insert().values(id=oid, item="book"))
                return oid

            async with business.begin() as conn:
                await conn.run_sync(ORDERS.metadata.create_all)
            with _held_before_barrier_insert() as (reached, release):
                call = asyncio.ensure_future(place("o1"))
                try:
                    await asyncio.wait_for(reached.wait(), 10)
                    if business.dialect.name == "postgresql":
                        await _resolved(c)  # the check answered while the call is held
                    else:
                        await asyncio.wait_for(svc.check_arrived.wait(), 10)
                    release.set()
                    if business.dialect.name == "postgresql":
                        with pytest.raises(TransactionFenced, match="rolled back by a back-check"):
                            await asyncio.wait_for(call, 10)
                        expected: Counter[str] = Counter()
                    else:
                        assert await asyncio.wait_for(call, 10) == "o1"
                        expected = Counter({"o1": 1})
                finally:
                    release.set()
                    call.cancel()
                    await asyncio.gather(call, return_exceptions=True)
            await _resolved(c)
            assert await _delivered(c) == expected
        rows = await _column(svc.engine, ORDERS.c.id)
        [(tx_id, state)] = await _barrier(svc.engine)
        answered = {s for t, s in svc.answers if t == tx_id}
        if business.dialect.name == "postgresql":
            assert (rows, state, answered) == ([], "rolled_back", {CheckStatus.ROLLBACK})
        else:
            assert (rows, state) == (["o1"], "committed")
            assert answered == {CheckStatus.COMMIT}  # it waited for the open transaction
    finally:
        await business.dispose()


async def test_consumer_killed_after_its_db_commit_applies_once(svc: Service) -> None:
    async with await Client.connect(svc.broker.url) as c:
        for i in range(10):
            await c.send(TOPIC, f"o{i}".encode())
    first = await _consume(svc, 10, faults="after_inbox_commit=@3")
    assert first.returncode == KILLED, first.stderr
    # Committed three, acknowledged at most two (and maybe committed none of those offsets).
    assert await _column(svc.engine, PAYMENTS.c.order_id) == ["o0", "o1", "o2"]
    second = await _consume(svc, 10)
    assert second.returncode == 0, second.stderr
    counters = json.loads(second.lines[-1])
    assert counters["skipped"] >= 1  # the third message at least came back, and was skipped
    assert counters["applied"] == 7 and counters["failed"] == 0
    assert await _column(svc.engine, PAYMENTS.c.order_id) == [f"o{i}" for i in range(10)]
    assert len(await _column(svc.engine, INBOX.c.message_id)) == 10
