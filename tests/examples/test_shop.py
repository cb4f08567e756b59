"""examples/shop end to end, as the README runs it: a real broker process with an auth token, the
orders and billing services as real uvicorn processes, unchanged, their token and secret from
the environment (TXB_AUTH_TOKEN, TXB_CHECK_SECRET), each on its own PostgreSQL database, orders
placed over HTTP.

Both services must report ready (``/txb/ready``) and say in their logs that they connected,
subscribed and started the relay; an order whose id is too long for its column gets 422; billing
must apply every placed order exactly once, the outbox's ``audit`` message must reach the
broker, and a crash of the orders service between PREPARE and END_TX must be settled by the
broker's back-check, answered by the restarted service's check-back endpoint: COMMIT when the
database had committed, ROLLBACK when it had not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import IN_CI, BrokerProcess, free_port
from tests.databases import PG_URL
from tests.serviceproc import STOP_TIMEOUT_S, ServiceProcess
from txbroker_sdk import Client, Consumer, create_engine
from txbroker_sdk.tables import LOCAL_TX
from txbroker_sdk.testing import create_database, drop_database

SECRET = "shop-secret"
TOKEN = "shop-token"
# Back-checks soon after a PREPARE left open, and often while the service is down (an endpoint
# that cannot be reached is retried, never parked).
BROKER_SETTINGS = """
tx_timeout_ms = 1000
check_backoff_base_ms = 200
check_backoff_cap_ms = 500
check_timeout_ms = 2000
"""
SETTLE_TIMEOUT_S = 60.0
INVOICES = sa.table("invoices", sa.column("order_id"))
ORDERS = sa.table("orders", sa.column("id"))
T = TypeVar("T")


class Shop:
    def __init__(
        self, broker: BrokerProcess, orders: ServiceProcess, billing: ServiceProcess
    ) -> None:
        self.broker = broker
        self.orders = orders
        self.billing = billing
        self.orders_db: AsyncEngine | None = None
        self.billing_db: AsyncEngine | None = None

    async def place(
        self, order_id: str, amount_cents: int = 1999, timeout_s: float = 30
    ) -> httpx.Response:
        order = {"id": order_id, "item": "lamp", "amount_cents": amount_cents}
        async with httpx.AsyncClient(timeout=timeout_s) as http:
            return await http.post(f"{self.orders.url}/orders", json=order)

    async def until(self, what: str, check: Callable[[], Awaitable[bool]]) -> None:
        """Wait (bounded) until ``check`` is true; the services' logs if it never is."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while not await check():
            logs = f"orders:\n{self.orders.log()}\nbilling:\n{self.billing.log()}"
            assert time.monotonic() < deadline, f"not within {SETTLE_TIMEOUT_S} s: {what}\n{logs}"
            await asyncio.sleep(0.1)  # polling another process's database, not a synchronisation

    async def invoices(self) -> dict[str, int]:
        """Invoices in the billing database, counted by order id."""
        assert self.billing_db is not None
        q = sa.select(INVOICES.c.order_id, sa.func.count()).group_by(INVOICES.c.order_id)
        async with self.billing_db.connect() as conn:
            return {order_id: n for order_id, n in (await conn.execute(q)).all()}


@pytest.fixture
def databases() -> Iterator[tuple[str, str]]:
    """Two fresh, empty PostgreSQL databases (the services migrate their own), dropped after."""

    def run(coro: Coroutine[Any, Any, T]) -> T:
        # Its own thread and loop: this fixture is set up beside the test's running loop.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coro).result()

    urls: list[str] = []
    try:
        for prefix in ("shop_orders", "shop_billing"):
            urls.append(run(create_database(PG_URL, prefix)))
    except (OSError, SQLAlchemyError) as e:
        if IN_CI:
            raise
        pytest.skip(f"PostgreSQL not available at {PG_URL}: {e}")
    try:
        yield urls[0], urls[1]
    finally:
        for url in urls:
            run(drop_database(url))


@pytest.fixture
async def shop(tmp_path: Path, databases: tuple[str, str]) -> AsyncIterator[Shop]:
    settings = tmp_path / "broker.toml"
    settings.write_text(BROKER_SETTINGS)
    broker = BrokerProcess(
        tmp_path / "broker",
        "--config",
        str(settings),
        "--tx-secret",
        f"orders-svc={SECRET}",
        "--auth-token",
        TOKEN,
    )
    broker.start()
    orders_port = billing_port = free_port()
    while billing_port == orders_port:
        billing_port = free_port()
    common = {
        **os.environ,
        "TXB_SERVER": broker.url,
        "TXB_AUTH_TOKEN": TOKEN,
        "TXB_CHECK_SECRET": SECRET,
    }
    orders = ServiceProcess(
        "examples.shop.orders:app",
        {**common, "ORDERS_DB": databases[0], "ORDERS_URL": f"http://127.0.0.1:{orders_port}"},
        tmp_path / "orders.log",
        name="orders",
        port=orders_port,
    )
    billing = ServiceProcess(
        "examples.shop.billing:app",
        {**common, "BILLING_DB": databases[1]},
        tmp_path / "billing.log",
        name="billing",
        port=billing_port,
    )
    shop = Shop(broker, orders, billing)
    try:
        billing.start()
        shop.orders_db, shop.billing_db = create_engine(databases[0]), create_engine(databases[1])
        yield shop
    finally:
        for engine in (shop.orders_db, shop.billing_db):
            if engine is not None:
                await engine.dispose()
        codes = {s.name: s.stop() for s in (orders, billing)}
        broker.stop()
    # Both shut down cleanly on SIGTERM (the lifespan stopped everything within its bound);
    # uvicorn re-raises the signal once it is done, so the exit says SIGTERM, not SIGKILL.
    for service in (orders, billing):
        if service.proc is not None:
            assert codes[service.name] in (0, -signal.SIGTERM), service.log()
            assert "Application shutdown complete" in service.log(), service.log()


def _wait_killed(service: ServiceProcess) -> None:
    """Until ``service`` dies of the SIGKILL its TXB_FAULTS fault sends itself."""
    assert service.proc is not None
    assert service.proc.wait(STOP_TIMEOUT_S) == -signal.SIGKILL, service.log()


async def _audited(broker: BrokerProcess, expected: set[str]) -> set[str]:
    """The order ids in ``audit`` messages (the outbox's), consumed until all are seen."""
    seen: set[str] = set()
    async with (
        Client(broker.url, auth_token=TOKEN) as client,
        Consumer(client, "shop-test", "audit", hold_ms=500) as consumer,
    ):
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            while not expected <= seen:
                for msg in await consumer.fetch():
                    seen.add(json.loads(msg.body)["id"])
                    msg.ack()
    return seen


async def _ready(shop: Shop, service: ServiceProcess) -> dict[str, Any]:
    """``service``'s answer at /txb/ready once it is 200."""
    answer: dict[str, Any] = {}

    async def ready() -> bool:
        async with httpx.AsyncClient(timeout=30) as http:
            res = await http.get(f"{service.url}/txb/ready")
        answer.update(res.json())
        return res.status_code == 200

    await shop.until(f"{service.name} reports ready", ready)
    return answer


async def test_each_order_is_billed_once_and_audited(shop: Shop) -> None:
    shop.orders.start()
    # Both ready, each of their loops working, against a broker that wants a token.
    orders, billing = await _ready(shop, shop.orders), await _ready(shop, shop.billing)
    assert [(loop["name"], loop["state"]) for loop in orders["loops"]] == [
        ("publisher", "running"),
        ("outbox relay orders", "running"),
    ]
    assert [(loop["name"], loop["state"]) for loop in billing["loops"]] == [
        ("subscriber orders (group billing)", "running")
    ]
    # What a person reads: connected (where, which version), subscribed, the relay started.
    for service in (shop.orders, shop.billing):
        assert f"connected to the broker at {shop.broker.url} (txbroker " in service.log()
        assert "with an auth token)" in service.log()
    assert "subscribed: group billing, topic orders, queues 0,1,2,3" in shop.billing.log()
    assert "outbox relay started namespace=orders" in shop.orders.log()

    # An id longer than its column: refused before anything is written or sent.
    long_id = "o-" + "x" * 78
    res = await shop.place(long_id)
    assert res.status_code == 422, res.text
    [problem] = res.json()["detail"]
    assert problem["loc"] == ["body", "id"] and "at most 64 characters" in problem["msg"]

    ids = {f"o-{i}" for i in range(10)}
    for order_id in sorted(ids):
        res = await shop.place(order_id)
        assert res.status_code == 201, res.text
        assert res.json() == {"id": order_id, "item": "lamp", "amount_cents": 1999}
    assert (
        await shop.place("o-0")
    ).status_code == 409  # a retry of a committed order: nothing sent

    async def all_billed() -> bool:
        return ids <= set(await shop.invoices())

    await shop.until("every order invoiced", all_billed)
    assert await shop.invoices() == dict.fromkeys(ids, 1)
    assert await _audited(shop.broker, ids) == ids
    # The billing service's read route, through its session dependency.
    async with httpx.AsyncClient(timeout=30) as http:
        res = await http.get(f"{shop.billing.url}/invoices/o-3")
        too_long = await http.get(f"{shop.billing.url}/invoices/{long_id}")
    assert [(r["order_id"], r["amount_cents"]) for r in res.json()] == [("o-3", 1999)]
    assert (too_long.status_code, too_long.json()) == (200, [])  # none: not a server error
    assert shop.orders_db is not None
    async with shop.orders_db.connect() as conn:
        assert long_id not in set((await conn.scalars(sa.select(ORDERS.c.id))).all())


async def test_a_crash_between_prepare_and_end_tx_is_settled_by_the_back_check(
    shop: Shop,
) -> None:
    assert shop.orders_db is not None
    # Killed before its database commit, with the half message prepared: ROLLBACK.
    shop.orders.start(TXB_FAULTS="before_db_commit=@1")
    with pytest.raises(httpx.TransportError):
        await shop.place("lost")
    _wait_killed(shop.orders)
    # Killed after its database commit, before END_TX: COMMIT.
    shop.orders.start(TXB_FAULTS="after_db_commit=@1")
    with pytest.raises(httpx.TransportError):
        await shop.place("kept")
    _wait_killed(shop.orders)
    # Nothing reaches billing while the only service that can answer for them is down.
    assert await shop.invoices() == {}

    shop.orders.start()  # its check-back endpoint answers the broker's retried back-checks
    assert (await shop.place("after")).status_code == 201

    async def barrier() -> dict[str, str]:
        assert shop.orders_db is not None
        async with shop.orders_db.connect() as conn:
            rows = await conn.execute(sa.select(LOCAL_TX.c.key, LOCAL_TX.c.state))
            return {key: state for key, state in rows.all()}

    async def settled() -> bool:
        return "lost" in await barrier() and {"kept", "after"} <= set(await shop.invoices())

    await shop.until("both transactions settled and the committed orders invoiced", settled)
    assert await barrier() == {"lost": "rolled_back", "kept": "committed", "after": "committed"}
    async with shop.orders_db.connect() as conn:
        assert set((await conn.scalars(sa.select(ORDERS.c.id))).all()) == {"kept", "after"}
    assert await shop.invoices() == {"kept": 1, "after": 1}
    assert await _audited(shop.broker, {"kept", "after"}) == {"kept", "after"}


async def test_an_order_placed_while_the_broker_is_down_is_refused_with_503(shop: Shop) -> None:
    shop.orders.start()
    await _ready(shop, shop.orders)
    shop.broker.stop()
    # The SDK tries to reconnect for its reconnect_s (30 s) before the request fails.
    res = await shop.place("o-down", timeout_s=90)
    # Something to retry, not a server error: nothing was committed.
    assert res.status_code == 503, res.text
    assert res.json()["detail"].startswith("messaging unavailable: "), res.text
    assert shop.orders_db is not None
    async with shop.orders_db.connect() as conn:
        assert (await conn.scalars(sa.select(ORDERS.c.id))).all() == []
