"""``@subscriber``: apply each message exactly once in the consumer's own database.

    subscribers = Subscribers(client, sessionmaker)

    @subscribers.subscriber("orders", group="billing")
    async def charge(session: AsyncSession, msg: ConsumedMessage) -> None:
        await session.execute(payments.insert().values(order=msg.body))

    await subscribers.run(stop)  # until the stop event is set

Per message, in one database transaction: insert ``txb_inbox(group, message_id)``, run the
handler, commit; then acknowledge. A redelivery (the process died after its commit, before its
ack) finds the inbox row and is acknowledged without running the handler again. A handler that
raises rolls its transaction back and the message is nacked: retried after a delay, then
dead-lettered. Messages of one queue are handled in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy import Executable
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from sdk import faults
from sdk.client import Client
from sdk.consumer import ConsumedMessage, Consumer
from sdk.tables import INBOX
from txbroker.errors import TxbError

__all__ = ["Handler", "Subscribers", "apply_once"]

log = logging.getLogger(__name__)

Handler = Callable[[AsyncSession, ConsumedMessage], Awaitable[None]]


async def apply_once(
    sessions: async_sessionmaker[AsyncSession], group: str, msg: ConsumedMessage, handler: Handler
) -> bool:
    """Run ``handler`` for ``msg`` unless this group already applied it; True if it ran.
    The inbox row and the handler's writes commit together or not at all."""
    async with sessions() as session, session.begin():
        row = {"consumer_group": group, "message_id": msg.msg.message_id}
        stmt: Executable
        if session.get_bind().dialect.name == "postgresql":
            stmt = pg_insert(INBOX).values(row).on_conflict_do_nothing()
        else:
            stmt = sqlite_insert(INBOX).values(row).on_conflict_do_nothing()
        if (await session.execute(stmt)).rowcount == 0:  # type: ignore[attr-defined]
            return False  # applied before: a redelivery
        await handler(session, msg)
        return True


@dataclass
class _Subscription:
    topic: str
    group: str
    handler: Handler


class Subscribers:
    def __init__(self, client: Client, sessionmaker: async_sessionmaker[AsyncSession]) -> None:
        self._client = client
        self._sessions = sessionmaker
        self._subs: list[_Subscription] = []
        self.applied = 0
        self.skipped = 0
        self.failed = 0

    def subscriber(self, topic: str, *, group: str) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self._subs.append(_Subscription(topic, group, fn))
            return fn

        return register

    async def run(self, stop: asyncio.Event) -> None:
        """Consume every subscription until ``stop`` is set; in-flight messages finish first."""
        await asyncio.gather(*(self._run_one(s, stop) for s in self._subs))

    async def _run_one(self, sub: _Subscription, stop: asyncio.Event) -> None:
        async with Consumer(self._client, sub.group, sub.topic, hold_ms=1000) as consumer:
            while not stop.is_set():
                for msg in await consumer.fetch():
                    await self._handle(sub, msg)  # in order, one at a time per subscription
            await consumer.commit()

    async def _handle(self, sub: _Subscription, msg: ConsumedMessage) -> None:
        try:
            ran = await apply_once(self._sessions, sub.group, msg, sub.handler)
        except Exception as e:  # the handler (or its transaction) failed: retry later
            self.failed += 1
            log.warning("handler for %s failed (%r); nacking it", msg.msg.message_id, e)
            try:
                await msg.nack()
            except TxbError:
                log.exception("nack of %s failed; it will be redelivered", msg.msg.message_id)
            return
        faults.point("after_inbox_commit")
        if ran:
            self.applied += 1
        else:
            self.skipped += 1
        msg.ack()
