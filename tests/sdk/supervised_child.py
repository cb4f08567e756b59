"""A TxbService app for tests/sdk/test_supervised_service.py, run as
``uvicorn tests.sdk.supervised_child:app``: one subscriber that records each message's body.

The broker, its token and the rest come from the TXB_* variables, as for any service; the test
adds CHILD_DB (a SQLite URL), CHILD_BLOCKED_RETRY_S (the slow retry, short for a test) and
CHILD_EXIT (1: exit_when_blocked).
"""

import os

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.applications import Starlette

from txbroker_sdk import ConsumedMessage, TxbService

TOPIC = "events"
GROUP = "child"
seen = sa.Table("seen", sa.MetaData(), sa.Column("body", sa.String(64), nullable=False))

txb = TxbService(
    database=os.environ["CHILD_DB"],
    migrate=True,
    create_tables=seen.metadata,
    blocked_retry_s=float(os.environ["CHILD_BLOCKED_RETRY_S"]),
    exit_when_blocked=os.environ.get("CHILD_EXIT") == "1",
    shutdown_timeout_s=10.0,
)
app = Starlette(lifespan=txb.lifespan)


@txb.subscriber(TOPIC, group=GROUP)
async def record(session: AsyncSession, msg: ConsumedMessage) -> None:
    await session.execute(seen.insert().values(body=msg.body.decode()))
