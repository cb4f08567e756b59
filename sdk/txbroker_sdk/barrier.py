"""The local-transaction barrier: a check-back can never disagree with the service's database.

The business transaction inserts ``txb_local_tx(tx_id, 'committed')`` before it commits
(:func:`record_commit`), or with its COMMIT (:func:`record_with_commit`); a back-check inserts
``(tx_id, 'rolled_back')`` if no row exists (:class:`BarrierResolver`). Whichever row is there
first answers the check: a check's insert waits for an open business transaction that inserted
the row, and a check's row fails the business transaction's insert, which then rolls back; so
the answer always matches the outcome.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.exc import IntegrityError, InvalidRequestError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from starlette.applications import Starlette
from starlette.routing import Route

from txbroker.runtime import tracing as tr
from txbroker_checkback.contract import CheckRequest, CheckStatus
from txbroker_checkback.endpoint import CheckbackEndpoint
from txbroker_sdk.errors import TransactionFenced
from txbroker_sdk.preflight import TablesChecked
from txbroker_sdk.tables import LOCAL_TX, insert_if_absent

__all__ = ["BarrierResolver", "mount", "record_commit", "record_with_commit"]

COMMITTED = "committed"
ROLLED_BACK = "rolled_back"

# One statement, built once, with per-call parameters: building ``.values(...)`` anew on every
# call cost ~60 us of CPU per business transaction (`txbroker bench service`), about a quarter
# of what @transactional adds to a CPU-bound service.
_INSERT_BARRIER: Final = LOCAL_TX.insert().values(
    tx_id=bindparam("tx_id"),
    state=bindparam("state"),
    topic=bindparam("topic"),
    key=bindparam("key"),
)


@functools.cache
def _asyncpg_insert() -> tuple[str, type[Exception]]:
    """The barrier insert compiled once for asyncpg (``$n`` placeholders, in the order
    :func:`record_commit` passes them), and asyncpg's unique-violation error."""
    from asyncpg.exceptions import UniqueViolationError  # type: ignore[import-untyped]
    from sqlalchemy.dialects.postgresql.asyncpg import dialect

    compiled = _INSERT_BARRIER.compile(dialect=dialect())  # type: ignore[no-untyped-call]
    assert compiled.positiontup == ["tx_id", "state", "topic", "key"], compiled.positiontup
    return str(compiled), UniqueViolationError


async def record_commit(
    conn: AsyncConnection | AsyncSession, tx_id: str, topic: str | None, key: str | None
) -> None:
    """Insert the barrier row inside the business transaction."""
    proxied = _open_asyncpg_transaction(conn)
    if proxied is not None:
        sql, unique_violation = _asyncpg_insert()
        try:
            await proxied.driver_connection.execute(sql, tx_id, COMMITTED, topic, key)
        except unique_violation as e:
            raise _fenced(tx_id) from e
        return
    try:
        await conn.execute(
            _INSERT_BARRIER, {"tx_id": tx_id, "state": COMMITTED, "topic": topic, "key": key}
        )
    except IntegrityError as e:
        raise _fenced(tx_id) from e


async def record_with_commit(
    session: AsyncSession, tx_id: str, topic: str | None, key: str | None
) -> None:
    """Record the barrier row in the business transaction, to be committed with it: on asyncpg
    the row is inserted by the transaction's own COMMIT, in one round trip with it (one
    statement, ``INSERT ...; COMMIT``, in place of the driver's ``COMMIT``); elsewhere it is
    inserted now (:func:`record_commit`). Either way a back-check's row that got there first
    fails the commit with :class:`TransactionFenced`, and nothing commits.

    One database round trip fewer per transaction: with the driver call it saves, about half
    of the service CPU that ``@transactional`` adds (`txbroker bench service`)."""
    proxied = _open_asyncpg_transaction(session)
    if proxied is not None:
        adapter = proxied.dbapi_connection
        driver = proxied.driver_connection
        started = getattr(adapter, "_transaction", None)
        values = (tx_id, topic, key)
        # Only over the top-level transaction SQLAlchemy's adapter started (what it calls to
        # commit is swapped below); a value with NUL, which no PostgreSQL text can hold, takes
        # the parameterised insert and its error.
        if (
            type(started) is _asyncpg_transaction_class()
            and getattr(driver, "_top_xact", None) is started
            and not any(v is not None and "\x00" in v for v in values)
        ):
            sql = f"{_literal_insert_prefix()}({_literal(tx_id)}, '{COMMITTED}', " + (
                f"{_literal(topic)}, {_literal(key)}); COMMIT"
            )
            adapter._transaction = _CommitWithBarrier(driver, started, sql, tx_id)
            return
    await record_commit(session, tx_id, topic, key)


class _CommitWithBarrier:
    """Stands in for asyncpg's transaction under SQLAlchemy's asyncpg adapter, which commits
    or rolls back whatever it holds there: the commit inserts the barrier row and commits in
    one simple query; a rollback is asyncpg's own."""

    __slots__ = ("_driver", "_sql", "_started", "_tx_id")

    def __init__(self, driver: Any, started: Any, sql: str, tx_id: str) -> None:
        self._driver = driver
        self._started = started
        self._sql = sql
        self._tx_id = tx_id

    async def commit(self) -> None:
        driver = self._driver
        driver._top_xact = None  # as asyncpg's commit does first: its transaction ends here
        try:
            await driver.execute(self._sql)
        except BaseException as e:
            # A failing statement ends a query of several before its COMMIT: the transaction
            # is left open (aborted) and must not go back to the pool that way.
            await _end_failed(driver)
            _, unique_violation = _asyncpg_insert()
            if isinstance(e, unique_violation):
                raise _fenced(self._tx_id) from e
            raise

    async def rollback(self) -> None:
        await self._started.rollback()


async def _end_failed(driver: Any) -> None:
    """Roll back what a failed commit left open; if that cannot be done, close the connection
    (the server rolls back): a cancelled caller does not wait, and a connection in an unknown
    transaction state is never reused."""
    if driver.is_closed() or not driver.is_in_transaction():
        return
    try:
        await driver.execute("ROLLBACK")
    except BaseException:
        driver.terminate()
        raise


def _literal(value: str | None) -> str:
    """``value`` as a PostgreSQL string constant: an escape string (E'...'), whose meaning does
    not depend on standard_conforming_strings, with its backslashes and quotes doubled."""
    if value is None:
        return "NULL"
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


@functools.cache
def _literal_insert_prefix() -> str:
    """The asyncpg barrier insert up to its values: ``INSERT INTO ... (...) VALUES ``."""
    sql, _ = _asyncpg_insert()
    prefix, sep, _ = sql.partition("VALUES ")
    assert sep, sql
    return prefix + sep


@functools.cache
def _asyncpg_transaction_class() -> type:
    from asyncpg.transaction import Transaction  # type: ignore[import-untyped]

    return Transaction  # type: ignore[no-any-return]


def _open_asyncpg_transaction(conn: AsyncConnection | AsyncSession) -> Any:
    """The pool's connection under ``conn`` (``driver_connection``: asyncpg's) if it is asyncpg
    and its transaction is already open on it (it is, unless the business function wrote
    nothing), else None; found without any I/O.

    Writing the barrier row straight to the driver skips SQLAlchemy's execution path, and
    finding the connection without ``await session.connection()`` skips two greenlet switches
    (on CPython 3.11 each maps and unmaps a fresh frame-stack chunk): together they were about
    as much CPU as everything else @transactional adds (`txbroker bench service`)."""
    sync: Connection | None
    if isinstance(conn, AsyncSession):
        tx = conn.sync_session.get_transaction()
        if tx is None:
            return None
        try:
            # Never acquires a connection; unlike ``tx.connections`` it builds no set per call.
            sync = tx.bound_connection()
        except InvalidRequestError:  # nothing acquired yet, or no single bind to look up
            return None
    else:
        sync = conn.sync_connection
    if sync is None or sync.invalidated or sync.dialect.driver != "asyncpg":
        return None
    proxied = sync.connection
    driver = proxied.driver_connection
    return proxied if driver is not None and driver.is_in_transaction() else None


def _fenced(tx_id: str) -> TransactionFenced:
    return TransactionFenced(
        f"transaction {tx_id} was already rolled back by a back-check; roll back"
    )


class BarrierResolver:
    """A check-back resolver backed by the barrier table (pass it to CheckbackEndpoint).

    * its ``rolled_back`` row wins → the answer is ROLLBACK, and the business transaction, if it
      is still open, fails on the primary key when it commits (or at its insert): it rolls
      back, as answered;
    * a ``committed`` row is there → COMMIT.

    An open business transaction makes the check's insert wait (PostgreSQL waits on the
    uncommitted key; SQLite on the write lock)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        # Looked for on the first check (mount() runs before any event loop): a database never
        # migrated answers 500 with the error logged, saying to run `txbroker db upgrade`.
        self._tables = TablesChecked(engine, LOCAL_TX)

    async def __call__(self, check: CheckRequest) -> CheckStatus:
        if not self._tables.done:
            await self._tables()
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
    # Its SERVER span records through txbroker's tracer (use_provider's, else the global one).
    endpoint = CheckbackEndpoint(BarrierResolver(engine), secrets, tracer=tr.tracer(__name__))
    # A Route, not a Mount: a Mount answers the bare path with a redirect to "path/", and the
    # broker does not follow redirects (a check must reach the service that signed up for it).
    app.router.routes.append(Route(path, endpoint, methods=["POST"]))
    return path
