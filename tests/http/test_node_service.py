"""A service in another language gets the guarantee over the HTTP API alone: the Node.js orders
service of tests/http/node (``pg`` and Node's standard library, no txbroker code) places orders
through a real broker, and a Python ``@subscriber`` billing service applies each once.

It is killed (SIGKILL) after its local commit and before its commit call: the broker's
back-check, answered from its barrier table, commits the order's message. It is killed before
its local commit: the back-check rolls the message back. A back-check that answered ROLLBACK
before the order's barrier row was written fences that order: its local commit fails instead
of racing the answer. Then ``txbroker reconcile`` over both services' tables and the broker's
log finds nothing wrong.

Needs Node.js (``make node`` installs the service's packages with ``npm ci``), PostgreSQL
(tests/databases.py) and Spark (tests/reconcile/conftest.py): by hand the test skips without
them; with CI=true it must run.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from tests.conftest import IN_CI, ROOT, BrokerProcess, spark_children
from tests.databases import PG_URL, run_async
from txbroker_sdk import Client, Subscribers
from txbroker_sdk.consumer import ConsumedMessage
from txbroker_sdk.database import async_url
from txbroker_sdk.testing import create_database, drop_database

SERVICE = ROOT / "tests" / "http" / "node"
GROUP, SECRET, TOPIC = "orders-svc", "node-orders-secret", "orders"
# The first back-check comes this long after a PREPARE: long enough for the service to commit
# by itself, short enough for the test.
TX_TIMEOUT_MS = 1000
INVOICES = sa.Table(
    "invoices",
    sa.MetaData(),
    sa.Column("order_id", sa.String(64), primary_key=True),
    sa.Column("amount", sa.Integer, nullable=False),
)


def _needs(why: str) -> None:
    if IN_CI:
        pytest.fail(f"the Node service test needs {why} under CI=true")
    pytest.skip(f"the Node service test needs {why}")


@pytest.fixture(scope="module")
def node() -> str:
    path = shutil.which("node")
    if path is None:
        _needs("Node.js 20 (node on PATH)")
    assert path is not None
    if not (SERVICE / "node_modules" / "pg").is_dir():
        _needs("its packages: make node (npm ci in tests/http/node)")
    return path


@pytest.fixture
def databases() -> Iterator[tuple[str, str]]:
    """The orders and billing services' databases, each its own, migrated by the command line
    (``txbroker db upgrade``), dropped afterwards."""
    made: list[str] = []
    try:
        for prefix in ("txb_node_orders", "txb_node_billing"):
            try:
                url = run_async(create_database(PG_URL, prefix))
            except (OSError, SQLAlchemyError) as e:
                _needs(f"PostgreSQL at {PG_URL} ({e})")
            made.append(url)
            subprocess.run(
                [sys.executable, "-m", "txbroker.cli", "db", "upgrade", "--url", url],
                check=True,
                capture_output=True,
                timeout=120,
            )
        yield made[0], made[1]
    finally:
        for url in made:
            run_async(drop_database(url))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class OrdersService:
    """The Node.js service as a child process, started again on the same port (its check URL,
    registered with every PREPARE) after each kill."""

    def __init__(self, node: str, broker: BrokerProcess, database_url: str, log: Path) -> None:
        self.node = node
        self.port = _free_port()
        self.log = log
        self.env = {
            **os.environ,
            "TXB_URL": broker.http,
            "TXB_TOPIC": TOPIC,
            "TXB_GROUP": GROUP,
            "TXB_SECRET": SECRET,
            "TXB_TX_TIMEOUT_MS": str(TX_TIMEOUT_MS),
            "DATABASE_URL": database_url,
            "PORT": str(self.port),
        }
        self.proc: asyncio.subprocess.Process | None = None
        self._log = open(log, "a")  # noqa: SIM115  # every start's stderr, closed by close()
        self.url = f"http://127.0.0.1:{self.port}"

    async def start(self, pause_at: str = "") -> None:
        self.proc = await asyncio.create_subprocess_exec(
            self.node,
            str(SERVICE / "orders.js"),
            cwd=SERVICE,
            env={**self.env, "TXB_PAUSE_AT": pause_at},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
        )
        assert (await self.line("READY")).split()[1] == str(self.port)

    async def line(self, prefix: str, timeout_s: float = 30) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        async with asyncio.timeout(timeout_s):
            while True:
                raw = await self.proc.stdout.readline()
                if not raw:
                    raise AssertionError(f"the service exited; see {self.log}")
                if raw.decode().startswith(prefix):
                    return raw.decode().strip()

    async def paused(self, point: str) -> str:
        """The transaction id of the order paused at ``point``."""
        words = (await self.line("PAUSED")).split()
        assert words[1] == point, words
        return words[2]

    def go_on(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"go on\n")

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        assert await self.proc.wait() == -signal.SIGKILL

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await self.proc.wait()

    def close(self) -> None:
        self._log.close()


@pytest.fixture
async def orders_service(
    node: str, databases: tuple[str, str], tmp_path: Path
) -> AsyncIterator[tuple[OrdersService, BrokerProcess]]:
    broker = BrokerProcess(
        tmp_path / "broker", "--tx-secret", f"{GROUP}={SECRET}", "--check-backoff-base-ms", "500"
    ).start()
    service = OrdersService(node, broker, databases[0], tmp_path / "orders-node.log")
    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic(TOPIC, queues=2)
        yield service, broker
    finally:
        await service.stop()
        service.close()
        broker.stop()


async def _tx(
    http: httpx.AsyncClient, broker: BrokerProcess, tx_id: str, state: str
) -> dict[str, str]:
    """The transaction once it is in ``state`` (waited for: a back-check decides it)."""
    until = time.monotonic() + 30
    while True:
        r = await http.get(f"{broker.http}/v1/transactions/{tx_id}")
        if r.status_code == 200 and r.json()["state"] == state:
            shown: dict[str, str] = r.json()
            return shown
        assert time.monotonic() < until, r.text
        await asyncio.sleep(0.1)


async def _rows(engine: AsyncEngine, query: str) -> set[tuple[object, ...]]:
    async with engine.connect() as conn:
        return {tuple(row) for row in (await conn.execute(sa.text(query))).all()}


@spark_children  # ends with txbroker reconcile: a Spark job in a child process
async def test_the_node_service_gets_both_or_neither_applied_once(
    orders_service: tuple[OrdersService, BrokerProcess],
    databases: tuple[str, str],
    tmp_path: Path,
) -> None:
    service, broker = orders_service
    orders_db = create_async_engine(async_url(databases[0]))
    billing_db = create_async_engine(async_url(databases[1]))
    async with billing_db.begin() as conn:
        await conn.run_sync(INVOICES.metadata.create_all)

    async def bill(session: AsyncSession, msg: ConsumedMessage) -> None:
        order = json.loads(msg.body)
        await session.execute(
            INVOICES.insert().values(order_id=order["order_id"], amount=order["amount"])
        )

    stop = asyncio.Event()
    async with await Client.connect(broker.url) as c, httpx.AsyncClient(timeout=60) as http:
        subscribers = Subscribers(c, async_sessionmaker(billing_db))
        subscribers.subscriber(TOPIC, group="billing")(bill)
        billing = asyncio.create_task(subscribers.run(stop))

        async def place(order_id: str, amount: int) -> httpx.Response:
            body = {"order_id": order_id, "amount": amount}
            return await http.post(f"{service.url}/orders", json=body)

        # Killed after its local commit, before its commit call: the back-check commits.
        await service.start(pause_at="after-local-commit")
        placing = asyncio.create_task(place("order-a", 10))
        tx_a = await service.paused("after-local-commit")
        await service.kill()
        with pytest.raises(httpx.TransportError):
            await placing
        await service.start()
        assert (await _tx(http, broker, tx_a, "committed"))["resolved_by"] == "check"

        # Killed before its local commit (its barrier row written, not committed): the
        # database rolls the order back, and the back-check rolls the message back.
        await service.stop()
        await service.start(pause_at="before-local-commit")
        placing = asyncio.create_task(place("order-b", 20))
        tx_b = await service.paused("before-local-commit")
        await service.kill()
        with pytest.raises(httpx.TransportError):
            await placing
        await service.start()
        assert (await _tx(http, broker, tx_b, "rolled_back"))["resolved_by"] == "check"

        # A back-check answered ROLLBACK before the order's barrier row was written: the
        # order's own insert then fails on the key, and it rolls back instead of committing.
        await service.stop()
        await service.start(pause_at="before-barrier")
        placing = asyncio.create_task(place("order-c", 30))
        tx_c = await service.paused("before-barrier")
        assert (await _tx(http, broker, tx_c, "rolled_back"))["resolved_by"] == "check"
        service.go_on()
        fenced = await placing
        assert fenced.status_code == 409 and fenced.json()["tx_id"] == tx_c, fenced.text

        # Nothing in the way: committed by the service itself.
        await service.stop()
        await service.start()
        r = await place("order-d", 40)
        assert r.status_code == 201 and r.json()["state"] == "committed", r.text
        assert (await _tx(http, broker, r.json()["tx_id"], "committed"))[
            "resolved_by"
        ] == "producer"

        until = time.monotonic() + 30
        while await _rows(billing_db, "SELECT order_id FROM invoices") != {
            ("order-a",),
            ("order-d",),
        }:
            assert time.monotonic() < until, await _rows(
                billing_db, "SELECT order_id FROM invoices"
            )
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)  # anything more (a duplicate) would have been applied by now
        stop.set()
        await asyncio.wait_for(billing, 15)
    assert subscribers.applied == 2

    assert await _rows(orders_db, "SELECT order_id FROM orders") == {("order-a",), ("order-d",)}
    assert await _rows(orders_db, "SELECT tx_id, state FROM txb_local_tx") == {
        (tx_a, "committed"),
        (tx_b, "rolled_back"),
        (tx_c, "rolled_back"),
        (r.json()["tx_id"], "committed"),
    }
    await orders_db.dispose()
    await billing_db.dispose()
    await service.stop()
    assert broker.stop() == 0

    # The independent proof over both services' tables and the broker's log.
    _spark_or_skip()
    report = tmp_path / "report"
    with open(tmp_path / "reconcile.log", "w") as log:  # noqa: ASYNC230  # before it runs
        job = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "txbroker.cli", "reconcile",
            "--service", f"orders={databases[0]}", "--service", f"billing={databases[1]}",
            "--log", str(broker.data_dir), "--out", str(report),
            "--grace", "0s", "--master", "local[2]", "--quiet",
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        code = await asyncio.wait_for(job.wait(), 600)
    assert code == 0, (tmp_path / "reconcile.log").read_text()[-6000:]
    summary = json.loads((report / "summary.json").read_text())
    assert summary["clean"] is True
    # It judged what happened: both services' rows, and the two orders' messages.
    assert summary["inputs"]["services"]["orders"]["local_tx"] == 4
    assert summary["inputs"]["services"]["billing"]["inbox"] == 2
    [orders] = [t for t in summary["topics"] if t["topic"] == TOPIC]
    assert (orders["messages"], orders["transactional"]) == (2, 2)


def _spark_or_skip() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        _needs("pyspark for txbroker reconcile (pip install -e '.[reconcile]')")
    if shutil.which("java") is None:
        _needs("Java for txbroker reconcile")
