"""The orders service: place an order and publish it, both or neither.

    python -m examples.orders --db sqlite:///orders.db --broker txb://127.0.0.1:9876 \\
        --port 8000 --secret s3cret

``POST /orders`` commits the order row and publishes ``orders`` with ``@transactional``
(:func:`create_app` lists its answers). The handler's transaction also puts an ``inventory``
message in the outbox, which the relay (``txbroker outbox relay``) publishes for the inventory
service.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from examples.common import StatsFile, service_parser, stop_on_signals
from txbroker_outbox import add as outbox_add
from txbroker_sdk import Client, TxPublisher, create_engine, mount
from txbroker_sdk.errors import TransactionFenced, TxbError
from txbroker_sdk.web import HttpServer

__all__ = ["ORDERS", "PRODUCER_GROUP", "create_app"]

PRODUCER_GROUP = "orders-svc"

ORDERS = sa.Table(
    "orders",
    sa.MetaData(),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("item", sa.String(64), nullable=False),
    sa.Column("qty", sa.Integer, nullable=False),
    sa.Column("amount_cents", sa.Integer, nullable=False),
)


class Declined(Exception):
    """A business rule said no: the order is not placed (nothing written, nothing sent)."""


def create_app(
    engine: AsyncEngine, client: Client, *, secret: str, public_url: str
) -> tuple[Starlette, dict[str, int]]:
    """The service's HTTP app and its counters. ``public_url`` is where the broker reaches it.

    ``POST /orders {"id": "o1", "item": "lamp", "qty": 1, "amount_cents": 1999}``:

    * 201 with the order: the row is committed and the ``orders`` message will be delivered;
    * 409: an order with this id exists already (a retried request whose first attempt
      committed);
    * 422: the order breaks a business rule (qty not in 1..10): no row, no message;
    * 503: the broker could not be reached, or a back-check fenced this attempt: retry it.
    """
    counters = {"placed": 0, "duplicates": 0, "declined": 0, "fenced": 0, "unavailable": 0}
    app = Starlette()
    # One line: the broker's check-backs are answered from the barrier table.
    check_path = mount(app, engine, {PRODUCER_GROUP: secret})
    publisher = TxPublisher(
        client,
        async_sessionmaker(engine, expire_on_commit=False),
        producer_group=PRODUCER_GROUP,
        check_url=public_url + check_path,
    )

    @publisher.transactional("orders", key=lambda order: order["id"])
    async def place_order(session: AsyncSession, order: dict[str, Any]) -> dict[str, Any]:
        if not 1 <= order["qty"] <= 10:
            raise Declined(f"qty must be 1..10, not {order['qty']}")
        await session.execute(ORDERS.insert().values(**order))
        reservation = {"order_id": order["id"], "item": order["item"], "qty": order["qty"]}
        await outbox_add(session, "inventory", reservation, key=order["item"])
        return order  # the `orders` message's body

    async def post_order(request: Request) -> JSONResponse:
        try:
            data = await request.json()
            order = {
                "id": str(data["id"]),
                "item": str(data["item"]),
                "qty": int(data["qty"]),
                "amount_cents": int(data["amount_cents"]),
            }
        except (ValueError, KeyError, TypeError) as e:
            return JSONResponse({"error": f"bad order: {e!r}"}, status_code=400)
        try:
            placed = await place_order(order)
        except Declined as e:
            counters["declined"] += 1
            return JSONResponse({"error": str(e)}, status_code=422)
        except IntegrityError:
            counters["duplicates"] += 1
            return JSONResponse({"error": f"order {order['id']} exists"}, status_code=409)
        except TransactionFenced as e:
            counters["fenced"] += 1
            return JSONResponse({"error": str(e)}, status_code=503)
        except TxbError as e:  # the broker is unreachable: nothing was committed
            counters["unavailable"] += 1
            return JSONResponse({"error": str(e)}, status_code=503)
        counters["placed"] += 1
        return JSONResponse(placed, status_code=201)

    app.router.routes.append(Route("/orders", post_order, methods=["POST"]))
    return app, counters


async def main() -> int:
    p = service_parser("the orders service (examples)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--secret", required=True, help="the orders-svc check-back secret")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s orders %(message)s")
    engine = create_engine(args.db)
    async with engine.begin() as conn:
        await conn.run_sync(ORDERS.metadata.create_all)
    client = await Client.connect(args.broker)  # it reconnects by itself when dropped
    stop = stop_on_signals()
    app, counters = create_app(
        engine, client, secret=args.secret, public_url=f"http://127.0.0.1:{args.port}"
    )
    server = HttpServer(app, port=args.port)
    await server.start()
    print(f"ready orders http://127.0.0.1:{server.port}", flush=True)
    stats = StatsFile(args.stats, "orders", lambda: counters)
    await stats.run(stop)
    await server.stop()
    await client.close()
    await engine.dispose()
    stats.write()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
