"""Open transactions of a deleted topic: the broker rolls them back as the topic is deleted.

A half message belongs to its target topic and dies with it (``txbroker.store.fences``), so
its transaction can never be committed. Rolling it back at once, with an op record saying
why, is the least surprising end: the back-checks stop, the transaction leaves the parked and
open lists, and the producer's later END_TX gets a clear answer (a rollback is a duplicate; a
commit is refused with TransactionConflict, "rolled back by operator: topic deleted") rather
than landing a message in a topic created again under the name after the message's own topic
was dropped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from txbroker.errors import StoreFailed, TxbError
from txbroker.protocol.messages import TxEndResponse
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.state import Decision, Resolver

__all__ = ["REASON", "roll_back_topic"]

log = logging.getLogger(__name__)

REASON: Final = "topic deleted"


async def roll_back_topic(coord: TxCoordinator, topic: str) -> int:
    """Roll back every open (prepared or parked) transaction of ``topic``; return how many.
    Returns once the rollbacks are durable. Those ended otherwise meanwhile stay as they
    ended. If the store fails, the halves stay dead all the same (a restart does not reopen
    them); the failure is logged."""
    done = 0
    waits: list[asyncio.Future[TxEndResponse]] = []
    for tx in coord.list(None, topic):
        try:
            answer = coord.end_nowait(tx.tx_id, Decision.ROLLBACK, Resolver.OPERATOR, REASON)
        except TxbError:
            continue  # ended meanwhile (a commit that won): nothing to roll back
        if answer is None:  # being written, or its half not in memory: the slow path waits
            coro = coord.end(tx.tx_id, Decision.ROLLBACK, Resolver.OPERATOR, REASON)
            waits.append(asyncio.ensure_future(coro))
        elif isinstance(answer, asyncio.Future):
            waits.append(answer)
        else:
            done += 1
    for r in await asyncio.gather(*waits, return_exceptions=True):
        if isinstance(r, StoreFailed):
            log.error("topic %s deleted, but rolling back its transaction failed: %s", topic, r)
        elif isinstance(r, TxbError):
            continue  # ended otherwise meanwhile
        elif isinstance(r, BaseException):
            raise r
        else:
            done += 1
    return done
