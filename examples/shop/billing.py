"""The billing service: one invoice per order, applied exactly once (the inbox).

Run it beside the broker and the orders service with
`uvicorn examples.shop.billing:app --port 8001`. Settings: the CLI's TXB_SERVER,
TXB_AUTH_TOKEN, ... (docs/sdk.md) and BILLING_DB below.
"""

import json
import os
from typing import Annotated

import sqlalchemy as sa
from fastapi import Depends, FastAPI
from sqlalchemy.ext.asyncio import AsyncSession

from txbroker_sdk import ConsumedMessage, TxbService

invoices = sa.Table(
    "invoices",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    # Not unique on purpose: exactly once comes from the inbox, not from the schema.
    sa.Column("order_id", sa.String(64), nullable=False, index=True),
    sa.Column("amount_cents", sa.Integer, nullable=False),
)

txb = TxbService(
    database=os.environ.get("BILLING_DB", "sqlite:///billing.db"),  # or postgresql://...
    migrate=True,  # txbroker's tables (production: `txbroker db upgrade`)
    create_tables=invoices.metadata,
)
app = FastAPI(lifespan=txb.lifespan)  # starting it starts the subscriber below


@txb.subscriber("orders", group="billing")
async def invoice(session: AsyncSession, msg: ConsumedMessage) -> None:
    order = json.loads(msg.body)  # the inbox row commits with this insert, or neither does
    await session.execute(
        invoices.insert().values(order_id=order["id"], amount_cents=order["amount_cents"])
    )


@app.get("/invoices/{order_id}")
async def get_invoices(
    order_id: str, session: Annotated[AsyncSession, Depends(txb.session)]
) -> list[dict[str, object]]:
    rows = await session.execute(sa.select(invoices).where(invoices.c.order_id == order_id))
    return [dict(row) for row in rows.mappings()]
