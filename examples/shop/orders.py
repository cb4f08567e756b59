"""The orders service: POST /orders writes the order and publishes it, both or neither.

Run the broker (`txbroker serve --tx-secret orders-svc=s3cret`), then this service with
`TXB_CHECK_SECRET=s3cret uvicorn examples.shop.orders:app --port 8000`. Settings: the CLI's
TXB_SERVER, TXB_AUTH_TOKEN, ... (docs/sdk.md), TXB_CHECK_SECRET and the variables below.
"""

import os

import sqlalchemy as sa
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from txbroker_outbox import Relay, add
from txbroker_sdk import TxbService
from txbroker_sdk.errors import TxbError

CHARS_MAX = 64  # the columns' width: a longer id or item gets 422, not a database error
orders = sa.Table(
    "orders",
    sa.MetaData(),
    sa.Column("id", sa.String(CHARS_MAX), primary_key=True),
    sa.Column("item", sa.String(CHARS_MAX), nullable=False),
    sa.Column("amount_cents", sa.Integer, nullable=False),
)

txb = TxbService(
    database=os.environ.get("ORDERS_DB", "sqlite:///orders.db"),  # or postgresql://...
    producer_group="orders-svc",
    public_url=os.environ.get("ORDERS_URL", "http://127.0.0.1:8000"),  # the broker calls here
    relay=lambda client, engine: Relay(client, engine, namespace="orders"),  # the outbox
    topics=["audit"],  # created at start if absent, as the decorators' topics are
    migrate=True,  # txbroker's tables (production: `txbroker db upgrade`)
    create_tables=orders.metadata,  # the service's own (production: its migrations)
)
app = FastAPI(lifespan=txb.lifespan)  # connects; mounts /txb/check, /txb/ready; runs the relay


class Order(BaseModel):
    id: str = Field(min_length=1, max_length=CHARS_MAX)
    item: str = Field(min_length=1, max_length=CHARS_MAX)
    amount_cents: int = Field(ge=0, lt=2**31)  # the INTEGER column's range


@txb.transactional("orders", key=lambda order: order["id"])
async def place_order(session: AsyncSession, order: Order) -> dict[str, object]:
    await session.execute(orders.insert().values(**order.model_dump()))
    await add(session, "audit", {"event": "order placed", "id": order.id}, key=order.id)
    return order.model_dump()  # the "orders" message: sent if and only if this commits


@app.post("/orders", status_code=201)
async def post_order(order: Order) -> dict[str, object]:
    try:
        return await place_order(order)
    except IntegrityError:  # a retried request whose first attempt committed
        raise HTTPException(409, f"order {order.id} exists") from None
    except TxbError as e:  # the broker refused or could not be reached: nothing was committed
        raise HTTPException(503, f"messaging unavailable: {e}") from None
