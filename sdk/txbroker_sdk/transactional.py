"""``@transactional``: change the database and publish a message about it, both or neither.

Per call, in one database transaction: run the function, then PREPARE the half message (its
result is the body) and record the barrier row, and commit once both succeeded (on PostgreSQL
the COMMIT's own query inserts the row; elsewhere it goes in while the PREPARE is on its way);
then END_TX(commit), sent without waiting for its answer (``flush()`` waits). A failure before
the database commit rolls back both (or its back-check finds no barrier row: ROLLBACK). A
failure after the commit (the END_TX is lost) is left to the back-check, which finds the
committed barrier row: COMMIT. :class:`TxPublisher` shows the use.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, Final, ParamSpec, TypeVar

import msgspec
from opentelemetry.trace import SpanKind
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from txbroker.errors import TxbError
from txbroker.protocol.frames import Opcode
from txbroker.protocol.ids import new_id
from txbroker.protocol.messages import TxEndRequest
from txbroker.runtime import tracing as tr
from txbroker.runtime.tracing import tracing_on
from txbroker_sdk import faults
from txbroker_sdk.barrier import record_with_commit
from txbroker_sdk.client import Client
from txbroker_sdk.errors import TransactionFenced
from txbroker_sdk.preflight import TablesChecked
from txbroker_sdk.requests import prepare_request
from txbroker_sdk.tables import LOCAL_TX

__all__ = ["TxPublisher", "encode_body"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
_json = msgspec.json.Encoder()
# Logged with an END_TX that failed: the back-check finds the committed barrier row.
_END_TX_LOST: Final = "its back-check commits it"


def encode_body(result: object) -> bytes:
    """bytes as they are, str as UTF-8, anything else as JSON."""
    if isinstance(result, bytes | bytearray | memoryview):
        return bytes(result)
    if isinstance(result, str):
        return result.encode()
    return _json.encode(result)


class TxPublisher:
    """Publishes the result of a decorated function as a transactional message, both or neither::

    publisher = TxPublisher(client, sessionmaker, producer_group="orders-svc",
                            check_url="http://orders:8000/txb/check")

    @publisher.transactional("orders", key=lambda order: order["id"])
    async def place_order(session: AsyncSession, item: str) -> dict:
        order = {"id": new_order_id(), "item": item}
        await session.execute(orders.insert().values(**order))
        return order  # the message body (JSON), sent only if this commits
    """

    def __init__(
        self,
        client: Client,
        sessionmaker: async_sessionmaker[AsyncSession],
        *,
        producer_group: str,
        check_url: str,
        timeout_ms: int | None = None,
    ) -> None:
        self._client = client
        self._sessions = sessionmaker
        self.producer_group = producer_group
        self.check_url = check_url
        self._timeout_ms = timeout_ms
        # The barrier table is looked for once, on the first transaction (a publisher has no
        # start of its own): a database never migrated fails saying to run `db upgrade`.
        self._tables = TablesChecked(sessionmaker, LOCAL_TX)

    def transactional(
        self,
        topic: str,
        *,
        key: str | Callable[[Any], str | None] | None = None,
        tags: str | None = None,
        headers: dict[str, str] | None = None,
        delay_s: float | None = None,
        encode: Callable[[Any], bytes] = encode_body,
    ) -> Callable[
        [Callable[Concatenate[AsyncSession, P], Awaitable[R]]], Callable[P, Awaitable[R]]
    ]:
        def decorate(
            fn: Callable[Concatenate[AsyncSession, P], Awaitable[R]],
        ) -> Callable[P, Awaitable[R]]:
            @functools.wraps(fn)
            async def run(*args: P.args, **kwargs: P.kwargs) -> R:
                if not self._tables.done:
                    await self._tables()
                if tracing_on():
                    return await self._run_traced(
                        topic, fn, args, kwargs, key, tags, headers, delay_s, encode
                    )
                # The common case: no span, no traceparent, no attributes, and one coroutine
                # fewer for each of the transaction's waits to resume through.
                return await self._run_tx(
                    new_id(), None, topic, fn, args, kwargs, key, tags, headers, delay_s, encode
                )

            return run

        return decorate

    async def _run_traced(
        self,
        topic: str,
        fn: Callable[..., Awaitable[R]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: str | Callable[[Any], str | None] | None,
        tags: str | None,
        headers: dict[str, str] | None,
        delay_s: float | None,
        encode: Callable[[Any], bytes],
    ) -> R:
        tx_id = new_id()
        # The PRODUCER span covers the database transaction, the PREPARE and the END_TX post;
        # its traceparent travels with the PREPARE (the half message keeps it for consumers).
        attrs = {
            tr.SYSTEM: tr.MESSAGING_SYSTEM,
            tr.DESTINATION: topic,
            tr.OPERATION_TYPE: "send",
            tr.OPERATION_NAME: "send",
            tr.TX_ID: tx_id,
            tr.TX_PHASE: "prepare",
            tr.PRODUCER_GROUP: self.producer_group,
        }
        with tr.tracer(__name__).start_as_current_span(
            f"send {topic}", kind=SpanKind.PRODUCER, attributes=attrs
        ) as span:
            result = await self._run_tx(
                tx_id,
                tr.traceparent(),
                topic,
                fn,
                args,
                kwargs,
                key,
                tags,
                headers,
                delay_s,
                encode,
            )
            span.set_attribute(tr.TX_PHASE, "commit")  # the database committed; END_TX posted
            return result

    async def _run_tx(
        self,
        tx_id: str,
        traceparent: str | None,
        topic: str,
        fn: Callable[..., Awaitable[R]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: str | Callable[[Any], str | None] | None,
        tags: str | None,
        headers: dict[str, str] | None,
        delay_s: float | None,
        encode: Callable[[Any], bytes],
    ) -> R:
        prepared: asyncio.Future[Any] | None = None
        committing = False
        try:
            async with self._sessions() as session, session.begin():
                result = await fn(session, *args, **kwargs)
                msg_key = key(result) if callable(key) else key
                deliver_at = None
                if delay_s is not None:
                    deliver_at = time.time_ns() // 1_000_000 + int(delay_s * 1000)
                prepare = prepare_request(
                    topic,
                    encode(result),
                    producer_group=self.producer_group,
                    check_url=self.check_url,
                    tx_id=tx_id,
                    key=msg_key,
                    tags=tags,
                    headers=headers,
                    traceparent=traceparent,
                    timeout_ms=self._timeout_ms,
                    deliver_at_ms=deliver_at,
                )
                # The PREPARE must succeed before the commit below, which inserts the barrier
                # row (or the row goes in now, while the PREPARE is on its way).
                prepared = self._client.submit(Opcode.TX_PREPARE, prepare, drained=False)
                await record_with_commit(session, tx_id, topic, msg_key)
                await prepared
                faults.point("before_db_commit")
                committing = True  # leaving the block commits
            # The database committed: the message must follow.
            faults.point("after_db_commit")
            if faults.dropped("drop_end_tx"):
                log.warning("END_TX of %s dropped (TXB_FAULTS): %s", tx_id, _END_TX_LOST)
                return result
        except BaseException as e:
            # Fenced at the commit (a back-check's row was there): it did not take effect.
            if committing and not isinstance(e, TransactionFenced):
                # The COMMIT itself failed (a dropped connection, a cancellation): it may have
                # taken effect anyway. Only the barrier knows, so the back-check decides.
                log.warning("commit of %s failed; its back-check reads the barrier", tx_id)
            elif prepared is not None:  # the database did not commit: discard the half message
                await self._discard(tx_id, prepared)
            raise
        # Posted, not awaited (as RocketMQ's producer sends its end-transaction one-way): the
        # outcome is decided by the database commit above, and a lost END_TX is settled by
        # the back-check, which finds the committed barrier row. Not waiting spares the caller
        # a round trip and the broker's flush. `flush()` waits for the answers.
        self._client.post(Opcode.TX_END, TxEndRequest(tx_id, "commit"), note=_END_TX_LOST)
        return result

    async def _discard(self, tx_id: str, prepared: asyncio.Future[Any]) -> None:
        """Roll back a half message whose database transaction did not commit. Whatever is not
        confirmed here, its back-check settles: it finds no committed barrier row, ROLLBACK."""
        try:
            await prepared  # still in flight if the barrier insert failed first
        except (TxbError, asyncio.CancelledError):
            return  # not prepared, or not known to be: nothing to roll back here
        try:
            await self._client.end_transaction(tx_id, "rollback")
        except TxbError as e:
            log.warning("rollback of %s not confirmed (%s); its back-check decides", tx_id, e)

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait until the broker has answered every END_TX sent so far (``Client.close``
        waits too)."""
        await self._client.drain(timeout_s)
