"""The billing service: one payment per order, exactly once, in billing's own database.

    python -m examples.billing --db sqlite:///billing.db --broker txb://127.0.0.1:9876

``payments.order_id`` is deliberately not unique: exactly-once comes from the inbox, and the
demo counts duplicates instead of having the schema hide them. ``--fail-rate`` makes the
handler fail after its insert (a flaky card processor), to show the rollback and the retries.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from examples.common import run_subscriber_service, service_parser
from txbroker_sdk import ConsumedMessage, Subscribers

__all__ = ["PAYMENTS", "register"]

metadata = sa.MetaData()
PAYMENTS = sa.Table(
    "payments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("order_id", sa.String(64), nullable=False, index=True),
    sa.Column("amount_cents", sa.Integer, nullable=False),
)


class CardDeclinedTemporarily(Exception):
    pass


def register(subscribers: Subscribers, fail_rate: float = 0.0) -> None:
    @subscribers.subscriber("orders", group="billing", concurrency=4)
    async def charge(session: AsyncSession, msg: ConsumedMessage) -> None:
        order = json.loads(msg.body)
        await session.execute(
            PAYMENTS.insert().values(order_id=order["id"], amount_cents=order["amount_cents"])
        )
        if random.random() < fail_rate:  # after the insert: it must roll back with the rest
            raise CardDeclinedTemporarily(f"card processor timed out on {order['id']}")


def main() -> int:
    p = service_parser("the billing service (examples)")
    p.add_argument("--fail-rate", type=float, default=0.0, help="handler failure probability")
    args = p.parse_args()
    return asyncio.run(
        run_subscriber_service(
            "billing", args, metadata, lambda subs: register(subs, args.fail_rate)
        )
    )


if __name__ == "__main__":
    sys.exit(main())
