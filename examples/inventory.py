"""The inventory service: one stock reservation per order, from the orders service's outbox.

    python -m examples.inventory --db sqlite:///inventory.db --broker txb://127.0.0.1:9876

The relay publishes ``inventory`` messages keyed by item, in order per item; reservations of
one item are applied in that order (``order="key"``) while different items go in parallel.
"""

from __future__ import annotations

import asyncio
import json
import sys

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from examples.common import run_subscriber_service, service_parser
from txbroker_sdk import ConsumedMessage, Subscribers

__all__ = ["RESERVATIONS", "register"]

metadata = sa.MetaData()
RESERVATIONS = sa.Table(
    "reservations",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("order_id", sa.String(64), nullable=False, index=True),
    sa.Column("item", sa.String(64), nullable=False),
    sa.Column("qty", sa.Integer, nullable=False),
)


def register(subscribers: Subscribers) -> None:
    @subscribers.subscriber("inventory", group="inventory", concurrency=4, order="key")
    async def reserve(session: AsyncSession, msg: ConsumedMessage) -> None:
        r = json.loads(msg.body)
        await session.execute(
            RESERVATIONS.insert().values(order_id=r["order_id"], item=r["item"], qty=r["qty"])
        )


def main() -> int:
    args = service_parser("the inventory service (examples)").parse_args()
    return asyncio.run(run_subscriber_service("inventory", args, metadata, register))


if __name__ == "__main__":
    sys.exit(main())
