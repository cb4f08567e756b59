"""Traffic for the reconciliation to read, made by the real SDK against a real broker: orders
placed with ``@transactional`` (the barrier and a real check-back endpoint), outbox rows sent by
the relay, a consumer group applying each message once through its inbox. ``inject_*`` add one
anomaly each, the way it happens in production, and return the ids the report must list.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from starlette.applications import Starlette
from starlette.routing import Route

from tests.httpserver import serve_app
from tests.tx.conftest import GROUP, SECRET
from txbroker.protocol.ids import new_id
from txbroker_checkback import CheckbackEndpoint, CheckStatus
from txbroker_outbox import Relay, add
from txbroker_sdk import Client, Consumer
from txbroker_sdk.barrier import BarrierResolver, record_commit
from txbroker_sdk.consumer import ConsumedMessage
from txbroker_sdk.database import async_url
from txbroker_sdk.subscriber import apply_once
from txbroker_sdk.tables import LOCAL_TX, OUTBOX
from txbroker_sdk.transactional import TxPublisher

ORDERS, AUDIT = "orders", "audit"
NAMESPACE = "orders"  # the orders service's outbox namespace (its service name in the job)
PAYMENTS = sa.Table("payments", sa.MetaData(), sa.Column("order_id", sa.String(64)))
COPIES = sa.Table("copies", sa.MetaData(), sa.Column("order_id", sa.String(64)))


@dataclass
class Expected:
    """reason -> the ids the report must list for it (every other reason: none)."""

    ids: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def add(self, reason: str, *ids: str) -> None:
        self.ids[reason].update(ids)


class Services:
    """The orders service (publisher, outbox, check-back endpoint) and the billing service
    (the ``billing`` group on orders, the ``auditor`` group on audit) on one broker."""

    def __init__(self, client: Client, orders: AsyncEngine, billing: AsyncEngine, check_url: str):
        self.client = client
        self.orders = orders
        self.billing = billing
        self.check_url = check_url
        self.orders_sessions = async_sessionmaker(orders)
        self.billing_sessions = async_sessionmaker(billing)
        self.publisher = TxPublisher(
            client, self.orders_sessions, producer_group=GROUP, check_url=check_url
        )
        self.relay = Relay(client, orders, namespace=NAMESPACE)
        self.placed = 0

    async def place(self, n: int) -> None:
        @self.publisher.transactional(ORDERS, key=lambda o: o["id"])
        async def place(session: AsyncSession, oid: str) -> dict[str, str]:
            return {"id": oid}

        for _ in range(n):
            self.placed += 1
            await place(f"o{self.placed}")
        await self.publisher.flush(10)

    async def outbox(self, n: int, *, relay: bool = True) -> list[int]:
        async with self.orders_sessions() as session, session.begin():
            for _ in range(n):
                await add(session, AUDIT, {"n": n})
        if relay:
            while await self.relay.publish_pending():
                pass
        return await self.unpublished()

    async def unpublished(self) -> list[int]:
        async with self.orders.connect() as conn:
            q = sa.select(OUTBOX.c.id).where(OUTBOX.c.published_at.is_(None))
            return list((await conn.scalars(q)).all())

    async def consume(self, group: str, topic: str, *, inbox: bool = True) -> list[str]:
        """Drain ``topic`` for ``group``; with the inbox each message is applied once, without
        it each delivery inserts a copy. Returns the message ids handled."""
        seen: list[str] = []

        async def pay(session: AsyncSession, m: ConsumedMessage) -> None:
            body = m.body.decode()
            table = PAYMENTS if inbox else COPIES
            await session.execute(table.insert().values(order_id=body))

        async with Consumer(self.client, group, topic) as consumer:
            while batch := await consumer.fetch(timeout_ms=700):
                for m in batch:
                    if inbox:
                        await apply_once(self.billing_sessions, group, m, pay)
                    else:
                        async with self.billing_sessions() as s, s.begin():
                            await pay(s, m)
                    seen.append(m.msg.message_id)
                    m.ack()
        return seen


@asynccontextmanager
async def services(broker_url: str, orders_url: str, billing_url: str) -> AsyncIterator[Services]:
    orders = create_async_engine(async_url(orders_url))
    billing = create_async_engine(async_url(billing_url))
    async with billing.begin() as conn:
        await conn.run_sync(PAYMENTS.metadata.create_all)
        await conn.run_sync(COPIES.metadata.create_all)
    endpoint = CheckbackEndpoint(BarrierResolver(orders), {GROUP: SECRET})
    unsure = CheckbackEndpoint(lambda _check: CheckStatus.UNKNOWN, {GROUP: SECRET})
    app = Starlette(
        routes=[
            Route("/txb/check", endpoint, methods=["POST"]),
            Route("/txb/unknown", unsure, methods=["POST"]),
        ]
    )
    try:
        async with serve_app(app) as base, await Client.connect(broker_url) as client:
            for topic, queues in ((ORDERS, 2), (AUDIT, 1)):
                await client.create_topic(topic, queues=queues)
            yield Services(client, orders, billing, base + "/txb/check")
    finally:
        await orders.dispose()
        await billing.dispose()


async def clean_traffic(s: Services, orders: int = 12, audits: int = 6) -> None:
    await s.place(orders)
    await s.outbox(audits)


async def consume_all(s: Services) -> None:
    await s.consume("billing", ORDERS)
    await s.consume("auditor", AUDIT)


# --- anomalies, each injected the way it happens -------------------------------------------


async def inject_lost(s: Services, e: Expected) -> None:
    """The service committed its local transaction and died before END_TX, and no back-check
    has run (a long transaction timeout stands in for check-backs being off)."""
    tx_id = new_id()
    await s.client.prepare(
        ORDERS, b"lost", producer_group=GROUP, check_url=s.check_url, tx_id=tx_id,
        timeout_ms=86_400_000,
    )  # fmt: skip
    async with s.orders_sessions() as session, session.begin():
        await record_commit(session, tx_id, ORDERS, None)
    e.add("committed, no message", tx_id)


async def inject_phantoms(s: Services, e: Expected) -> None:
    """Operators commit two halves by hand: one whose local transaction was rolled back (its
    barrier says so), one the service never recorded at all."""
    rolled, unknown = new_id(), new_id()
    for tx_id in (rolled, unknown):
        await s.client.prepare(
            ORDERS, b"phantom", producer_group=GROUP, check_url=s.check_url, tx_id=tx_id,
            timeout_ms=86_400_000,
        )  # fmt: skip
    async with s.orders_sessions() as session, session.begin():
        await session.execute(
            LOCAL_TX.insert().values(tx_id=rolled, state="rolled_back", topic=ORDERS)
        )
    for tx_id in (rolled, unknown):
        await s.client.resolve_transaction(tx_id, "commit")
    e.add("local transaction rolled back", rolled)
    e.add("no local transaction", unknown)


async def inject_effect_twice(s: Services, e: Expected) -> None:
    """A consumer without the inbox gets one message twice (its first delivery is not acked,
    as when it crashed before the ack) and applies it twice."""
    async with Consumer(s.client, "copier", ORDERS) as consumer:
        first = (await consumer.fetch(timeout_ms=2000))[0]
        body = first.body.decode()
        for _ in range(2):
            async with s.billing_sessions() as session, session.begin():
                await session.execute(COPIES.insert().values(order_id=body))
    e.add("effect applied twice", body)


async def inject_parked(s: Services, e: Expected) -> None:
    """A service whose check-back endpoint cannot tell (it answers UNKNOWN): the broker checks
    until its limit and parks the transaction for an operator."""
    unsure = s.check_url.replace("/txb/check", "/txb/unknown")
    tx = await s.client.prepare(ORDERS, b"parked", producer_group=GROUP, check_url=unsure)
    deadline = time.monotonic() + 20
    while (info := await s.client.show_transaction(tx.tx_id)).state != "parked":
        assert time.monotonic() < deadline, f"{tx.tx_id} stayed {info.state}"
        await asyncio.sleep(0.05)  # polling the broker's state: the condition awaited
    e.add("transaction parked", tx.tx_id)


async def inject_undecided(s: Services, e: Expected) -> None:
    """A half message whose first back-check is due in an hour (the job runs "two hours
    later", through ``as_of_ms``)."""
    tx = await s.client.prepare(
        ORDERS, b"undecided", producer_group=GROUP, check_url=s.check_url, timeout_ms=3_600_000
    )
    e.add("half message undecided", tx.tx_id)


async def inject_unpublished(s: Services, e: Expected) -> None:
    """An outbox row written while no relay runs."""
    ids = await s.outbox(1, relay=False)
    e.add("outbox row not published", *(f"outbox:{NAMESPACE}:{i}" for i in ids))


async def inject_unprocessed(s: Services, e: Expected) -> None:
    """A message sent after the billing group stopped consuming."""
    receipt = await s.client.send(ORDERS, json.dumps({"late": True}).encode())
    e.add("not processed by the group", receipt.message_id)
