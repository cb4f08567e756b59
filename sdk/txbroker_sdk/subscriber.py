"""``@subscriber``: apply each message exactly once in the consumer's own database.

    @subscribers.subscriber("orders", group="billing", concurrency=8, order="key")
    async def charge(session: AsyncSession, msg: ConsumedMessage) -> None: ...

Per message, in one database transaction: insert ``txb_inbox(group, message_id)``, run the
handler, commit; then acknowledge. A redelivery finds the inbox row and is acknowledged without
running the handler again; a handler that raises rolls back and the message is nacked (retried,
then dead-lettered). :class:`Subscribers` says how concurrency, back-pressure and shutdown work.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Final, Literal

from opentelemetry.trace import SpanKind
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from txbroker.errors import (
    BadRequest,
    Forbidden,
    InvalidArgument,
    InvalidName,
    ProtocolError,
    TxbError,
    Unauthenticated,
)
from txbroker.runtime import tracing as tr
from txbroker.runtime.tracing import tracing_on
from txbroker_sdk import faults
from txbroker_sdk.client import Client
from txbroker_sdk.consumer import ConsumedMessage, Consumer
from txbroker_sdk.errors import TlsFailed
from txbroker_sdk.lanes import Lanes
from txbroker_sdk.preflight import TablesChecked
from txbroker_sdk.supervision import LoopHealth, unless_stopped
from txbroker_sdk.tables import INBOX, insert_if_absent

__all__ = [
    "COMMIT_AT_LEAST_S",
    "DEFAULT_SHUTDOWN_TIMEOUT_S",
    "Handler",
    "Order",
    "Subscribers",
    "apply_once",
    "check_handler",
]

log = logging.getLogger(__name__)

Handler = Callable[[AsyncSession, ConsumedMessage], Awaitable[None]]
Order = Literal["queue", "key"]

# Admitted (waiting + running) messages per unit of concurrency before fetching pauses: enough
# that a lane finishing finds its next message already here, small enough to bound memory.
_ADMIT_PER_SLOT: Final = 4
# Messages per pull. The broker fills a pull from one queue before the next, so with a backlog
# one big pull could fill the whole buffer from a single queue and leave the other lanes idle;
# small pulls make a full buffer span `concurrency` pulls, each starting at another queue.
_PULL: Final = _ADMIT_PER_SLOT
# Fetch errors that waiting cannot cure (credentials, access, TLS, a request this SDK built
# wrong): run() ends with them. Any other error of a fetch (the broker restarting, and its own
# failures: a store error, an entry it cannot read) is retried from the same position, which
# moves only with a successful answer, so no message is skipped, after the backoff of the
# subscription's LoopHealth (doubling from 0.1 s to 5 s).
_FATAL_FETCH: Final = (
    Unauthenticated,
    Forbidden,
    TlsFailed,
    BadRequest,
    InvalidName,
    ProtocolError,
)
DEFAULT_SHUTDOWN_TIMEOUT_S: Final = 5.0
# Committing offsets on the way out gets the rest of the grace, but at least this: handlers that
# used the whole grace must not cost the commit of the messages that did finish.
COMMIT_AT_LEAST_S: Final = 0.5


def check_handler(fn: Callable[..., object]) -> None:
    """Refuse, when it is decorated, a handler the runner could not call: it is awaited as
    ``handler(session, msg)``. Accepted later, it would fail on every message, each failure a
    retry, until the message went to the dead-letter topic."""
    call = getattr(fn, "__call__", None)  # noqa: B004 - an async __call__ counts too
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)):
        raise TypeError(
            f"@subscriber handler {_name(fn)} must be `async def handler(session, msg)`: "
            "it is awaited"
        )
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError as e:
        raise TypeError(
            f"@subscriber handler {_name(fn)} must take (session: AsyncSession, msg: "
            f"ConsumedMessage), it is called as handler(session, msg): {e}"
        ) from None
    except ValueError:
        pass  # no signature to read (a builtin): it is called and fails then, if at all


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


async def apply_once(
    sessions: async_sessionmaker[AsyncSession], group: str, msg: ConsumedMessage, handler: Handler
) -> bool:
    """Run ``handler`` for ``msg`` unless this group already applied it; True if it ran.
    The inbox row and the handler's writes commit together or not at all."""
    if tracing_on():  # a CONSUMER span, the child of the producer's (its traceparent header)
        m = msg.msg
        attrs = {
            tr.SYSTEM: tr.MESSAGING_SYSTEM,
            tr.DESTINATION: m.topic,
            tr.OPERATION_TYPE: "process",
            tr.OPERATION_NAME: "process",
            tr.MESSAGE_ID: m.message_id,
            tr.CONSUMER_GROUP: group,
            tr.PARTITION: str(m.queue_id),
        }
        with tr.tracer(__name__).start_as_current_span(
            f"process {m.topic}",
            context=tr.context_from(m.headers.get("traceparent")),
            kind=SpanKind.CONSUMER,
            attributes=attrs,
        ) as span:
            try:
                return await _apply_once(sessions, group, msg, handler)
            except Exception as e:  # recorded as an exception event too, by the span
                span.set_attribute(
                    tr.ERROR_TYPE, e.code if isinstance(e, TxbError) else type(e).__name__
                )
                raise
    return await _apply_once(sessions, group, msg, handler)


async def _apply_once(
    sessions: async_sessionmaker[AsyncSession], group: str, msg: ConsumedMessage, handler: Handler
) -> bool:
    async with sessions() as session, session.begin():
        row = {"consumer_group": group, "message_id": msg.msg.message_id}
        inbox = insert_if_absent(INBOX, session.get_bind().dialect.name)
        if (await session.execute(inbox, row)).rowcount == 0:  # type: ignore[attr-defined]
            return False  # applied before: a redelivery
        await handler(session, msg)
        return True


@dataclass(frozen=True)
class _Subscription:
    topic: str
    group: str
    handler: Handler
    concurrency: int
    order: Order
    health: LoopHealth

    def lane(self, m: ConsumedMessage) -> Hashable:
        # Retried copies all sit in queue 0 of the group's retry topic, apart from the original
        # queues; they are the only deliveries with a reconsume count (a re-drive resets it).
        queue = (m.reconsume_count > 0, m.msg.topic, m.msg.queue_id)
        if self.order == "queue":
            return queue
        if m.msg.key is None:
            return (*queue, None, m.msg.queue_offset)  # no key, no order to keep
        return (*queue, m.msg.key)


class Subscribers:
    """The subscriptions of one process, run until a stop event::

        subscribers = Subscribers(client, sessionmaker)

        @subscribers.subscriber("orders", group="billing", concurrency=8, order="key")
        async def charge(session: AsyncSession, msg: ConsumedMessage) -> None:
            await session.execute(payments.insert().values(order=msg.body))

        await subscribers.run(stop)  # until the stop event is set

    Concurrency: up to ``concurrency`` messages of a subscription are handled at once, in lanes
    (:mod:`txbroker_sdk.lanes`). ``order="queue"`` keeps one lane per queue, so a queue's messages
    are handled one after the other, in order; ``order="key"`` keeps one lane per message key
    within a queue, so only messages with the same key wait for each other (a message without a
    key has no order to keep and gets a lane of its own). Each handler holds a database
    connection, so keep ``concurrency`` within the engine's pool size. SQLite has one writer at a
    time: there the transactions of all subscriptions take turns (in this process; a handler
    waiting for SQLite's lock instead would fail after its busy timeout and be retried for
    nothing).

    Back-pressure: the runner stops fetching while ``4 * concurrency`` messages are waiting or
    running (it pulls 4 at a time), so a slow handler never makes it buffer without bound.

    Shutdown, bounded by ``shutdown_timeout_s`` (5 s by default, within ``docker stop``'s 10 s):
    once ``stop`` is set, nothing more is fetched (a fetch waiting on a broker that is gone is
    dropped at once) and nothing new starts; running handlers get the grace to finish and be
    acknowledged, then are cancelled (their transaction rolls back). Offsets are committed in what
    is left of the grace (at least :data:`COMMIT_AT_LEAST_S`), so what finished is not delivered
    again; what did not finish or never started is redelivered to the group (as is what finished,
    if the commit could not be made: the inbox skips it then).
    """

    def __init__(
        self,
        client: Client,
        sessionmaker: async_sessionmaker[AsyncSession],
        *,
        shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S,
    ) -> None:
        if not shutdown_timeout_s > 0:
            raise InvalidArgument(f"shutdown_timeout_s must be > 0, got {shutdown_timeout_s!r}")
        self._client = client
        self._sessions = sessionmaker
        self._shutdown_timeout_s = shutdown_timeout_s
        self._subs: list[_Subscription] = []
        self._lanes: list[Lanes[ConsumedMessage]] = []
        self._tables = TablesChecked(sessionmaker, INBOX)
        self._gate: asyncio.Lock | None = None
        self._dialect: str | None = None
        self.applied = 0
        self.skipped = 0
        self.failed = 0
        self.fetch_errors = 0  # fetches that failed and were retried

    def subscriber(
        self, topic: str, *, group: str, concurrency: int = 1, order: Order = "queue"
    ) -> Callable[[Handler], Handler]:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgument(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if order not in ("queue", "key"):
            raise InvalidArgument(
                f"order must be 'queue' (in order per queue) or 'key' (in order per message "
                f"key), got {order!r}"
            )

        for other in self._subs:
            if other.group == group:
                # The broker keeps one retry topic per group: a second topic's retried
                # messages would reach the first topic's handler.
                raise InvalidArgument(
                    f"group {group!r} already subscribes to {other.topic!r}: one topic per "
                    f"group (use another group name for {topic!r})"
                )

        def register(fn: Handler) -> Handler:
            check_handler(fn)
            health = LoopHealth(f"subscriber {topic} (group {group})")
            self._subs.append(_Subscription(topic, group, fn, concurrency, order, health))
            return fn

        return register

    @property
    def admitted(self) -> int:
        """Messages fetched and not yet done (waiting in a lane or being handled)."""
        return sum(lanes.admitted for lanes in self._lanes)

    def loops(self) -> list[tuple[LoopHealth, Callable[[asyncio.Event], Awaitable[None]]]]:
        """Each subscription as a loop of its own, for a supervisor (``TxbService``'s) to run
        and restart apart from the others: its health, and what :meth:`run` runs for it."""
        return [(s.health, functools.partial(self._run_subscription, s)) for s in self._subs]

    async def run(self, stop: asyncio.Event) -> None:
        """Consume every subscription until ``stop`` is set; running handlers finish first.
        A database without the inbox table fails here (:class:`TablesMissing`), not per
        message."""
        gate = await self._prepare()
        tasks = [asyncio.create_task(self._run_one(s, stop, gate)) for s in self._subs]
        try:
            await asyncio.gather(*tasks)
        finally:
            # One subscription failing (or run() cancelled) must not leave the others running.
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _prepare(self) -> asyncio.Lock | None:
        """The inbox table looked for (once it is found); on SQLite the lock all subscriptions
        take turns on."""
        await self._tables()
        if self._dialect is None:
            async with self._sessions() as session:
                self._dialect = session.get_bind().dialect.name
        if self._dialect == "sqlite" and self._gate is None:
            self._gate = asyncio.Lock()
        return self._gate

    async def _run_subscription(self, sub: _Subscription, stop: asyncio.Event) -> None:
        await self._run_one(sub, stop, await self._prepare())

    async def _run_one(
        self, sub: _Subscription, stop: asyncio.Event, gate: asyncio.Lock | None
    ) -> None:
        capacity = _ADMIT_PER_SLOT * sub.concurrency
        lanes: Lanes[ConsumedMessage] = Lanes(
            functools.partial(self._handle, sub),
            concurrency=sub.concurrency,
            capacity=capacity,
            gate=gate,
        )
        consumer = Consumer(self._client, sub.group, sub.topic, hold_ms=1000, max_messages=_PULL)
        await consumer.start()
        sub.health.ok()
        log.info(
            "subscribed: group %s, topic %s, queues %s", sub.group, sub.topic, consumer.assignment
        )
        timeout_s = 0.0  # anything but a stop: cancel the handlers at once
        self._lanes.append(lanes)
        try:
            while await _room_or_stop(lanes, stop):
                try:
                    batch = await unless_stopped(consumer.fetch(), stop)
                except TxbError as e:
                    if isinstance(e, _FATAL_FETCH):
                        raise
                    # The broker restarted or the connection dropped (the client reconnects on
                    # the next request), or the broker failed this pull: the same position is
                    # asked again, the handlers keep their messages, nothing is skipped. The
                    # health logs the first failure of its kind, with what to do.
                    self.fetch_errors += 1
                    backoff_s = sub.health.failed(e)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), backoff_s)
                    continue
                sub.health.ok()
                if batch is None or stop.is_set():
                    break  # not started, not acknowledged: redelivered to the group
                for msg in batch:
                    lanes.submit(sub.lane(msg), msg)
            timeout_s = self._shutdown_timeout_s
        finally:
            grace_ends = asyncio.get_running_loop().time() + self._shutdown_timeout_s
            await lanes.close(timeout_s)
            self._lanes.remove(lanes)
            # Closing commits the offsets of everything acknowledged above, in what is left of
            # the grace. With the broker gone it would keep reconnecting: the stop is bounded,
            # and what was applied but not committed is redelivered later, skipped by the inbox.
            left = grace_ends - asyncio.get_running_loop().time()
            try:
                async with asyncio.timeout(max(left, COMMIT_AT_LEAST_S)):
                    await consumer.close()
            except TimeoutError:
                log.warning(
                    "%s/%s: offsets not committed within the %s s shutdown grace (broker "
                    "unreachable?); the applied messages will be redelivered and skipped by "
                    "the inbox",
                    sub.group,
                    sub.topic,
                    self._shutdown_timeout_s,
                )

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


async def _room_or_stop(lanes: Lanes[ConsumedMessage], stop: asyncio.Event) -> bool:
    """Wait until the lanes can take more or ``stop`` is set; True to fetch again."""
    if stop.is_set():
        return False
    room = asyncio.ensure_future(lanes.room())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({room, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        room.cancel()
        stopped.cancel()
    return not stop.is_set()
