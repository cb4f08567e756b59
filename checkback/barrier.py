"""The local-transaction barrier: a check-back can never disagree with the service's database.

The business transaction inserts ``txb_local_tx(tx_id, 'committed')`` (:func:`record_commit`)
before it commits. A back-check inserts ``(tx_id, 'rolled_back')`` if no row exists
(:class:`BarrierResolver`):

* its row wins → the answer is ROLLBACK, and the business transaction, if it is still open,
  fails on the primary key when it commits (or at its insert): it rolls back, as answered;
* a ``committed`` row is there → COMMIT.

While the business transaction is open, the check's insert waits for it (PostgreSQL waits on
the uncommitted key; SQLite on the write lock), so the answer always matches the outcome.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from starlette.applications import Starlette
from starlette.routing import Route

from checkback.contract import CheckRequest, CheckStatus
from checkback.endpoint import CheckbackEndpoint
from sdk.tables import LOCAL_TX, insert_if_absent
from txbroker.errors import TxbError

__all__ = ["BarrierResolver", "TransactionFenced", "mount", "record_commit"]

COMMITTED = "committed"
ROLLED_BACK = "rolled_back"

# One statement, built once, with per-call parameters: building ``.values(...)`` anew on every
# call cost ~60 us of CPU per business transaction (`txbroker bench service`), about a quarter
# of what @transactional adds to a CPU-bound service.
_INSERT_BARRIER = LOCAL_TX.insert()


class TransactionFenced(TxbError):
    """A back-check already answered ROLLBACK for this transaction: the business transaction
    must roll back too (it would otherwise commit data whose message was discarded)."""

    code = "TRANSACTION_FENCED"


async def record_commit(
    conn: AsyncConnection | AsyncSession, tx_id: str, topic: str | None, key: str | None
) -> None:
    """Insert the barrier row inside the business transaction."""
    try:
        await conn.execute(
            _INSERT_BARRIER, {"tx_id": tx_id, "state": COMMITTED, "topic": topic, "key": key}
        )
    except IntegrityError as e:
        raise TransactionFenced(
            f"transaction {tx_id} was already rolled back by a back-check; roll back"
        ) from e


class BarrierResolver:
    """A check-back resolver backed by the barrier table (pass it to CheckbackEndpoint)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def __call__(self, check: CheckRequest) -> CheckStatus:
        row = {
            "tx_id": check.tx_id,
            "state": ROLLED_BACK,
            "topic": check.topic,
            "key": check.key,
        }
        async with self._engine.begin() as conn:
            result = await conn.execute(insert_if_absent(LOCAL_TX, conn.dialect.name), row)
            inserted = result.rowcount == 1
            if inserted:
                return CheckStatus.ROLLBACK
            state = await conn.scalar(
                select(LOCAL_TX.c.state).where(LOCAL_TX.c.tx_id == check.tx_id)
            )
        return CheckStatus.COMMIT if state == COMMITTED else CheckStatus.ROLLBACK


def mount(
    app: Starlette, engine: AsyncEngine, secrets: Mapping[str, str], path: str = "/txb/check"
) -> str:
    """Answer the broker's check-backs at ``path`` of ``app`` (Starlette or FastAPI) from the
    barrier table in ``engine``'s database; returns ``path`` (register it as the check URL).

        mount(app, engine, {"orders-svc": os.environ["TXB_CHECK_SECRET"]})
    """
    endpoint = CheckbackEndpoint(BarrierResolver(engine), secrets)
    # A Route, not a Mount: a Mount answers the bare path with a redirect to "path/", and the
    # broker does not follow redirects (a check must reach the service that signed up for it).
    app.router.routes.append(Route(path, endpoint, methods=["POST"]))
    return path
