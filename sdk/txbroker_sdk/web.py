"""FastAPI and Starlette integration: one object wires a web service to txbroker.

    txb = TxbService(broker="txb://127.0.0.1:9876", database="postgresql://app@db/orders", ...)
    app = FastAPI(lifespan=txb.lifespan)  # or Starlette(routes=..., lifespan=txb.lifespan)

The decorators may run at import time, before anything is connected: they are bound when the
app starts. :class:`TxbService` says what its lifespan starts and stops, in which order, and
which dependencies route handlers get. Only Starlette is needed here (FastAPI is a Starlette
app): the ``web`` extra adds FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from sqlalchemy import MetaData, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from starlette.applications import Starlette

from txbroker.errors import Forbidden, InvalidArgument, TxbError
from txbroker.runtime.httpserve import HttpServer, serving
from txbroker.runtime.tracing import flush_tracing, setup_tracing
from txbroker_sdk.barrier import mount
from txbroker_sdk.client import Client
from txbroker_sdk.database import create_engine
from txbroker_sdk.errors import NotStarted
from txbroker_sdk.schema import upgrade
from txbroker_sdk.subscriber import Handler, Order, Subscribers, check_handler
from txbroker_sdk.tables import INBOX, LOCAL_TX, OUTBOX
from txbroker_sdk.transactional import TxPublisher, encode_body

__all__ = [
    "TxbService",
    "Runner",
    # Serving an app from a program's own event loop, for a service not started by uvicorn's
    # command (the example services): uvicorn, with the program keeping SIGTERM and SIGINT.
    "HttpServer",
    "serving",
]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


class Runner(Protocol):
    """Something that runs until its stop event is set, e.g. ``txbroker_outbox.Relay``."""

    async def run(self, stop: asyncio.Event) -> None: ...


@dataclass
class _Transactional:
    topic: str
    fn: Callable[..., Awaitable[Any]]
    options: dict[str, Any]
    bound: Callable[..., Awaitable[Any]] | None = None


@dataclass
class _Subscription:
    topic: str
    handler: Handler
    options: dict[str, Any]


@dataclass
class _Running:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    client: Client | None = None
    publisher: TxPublisher | None = None
    runners: list[asyncio.Task[None]] = field(default_factory=list)


class TxbService:
    """The txbroker side of one web service: its database, its broker connection, its
    ``@transactional`` functions, its ``@subscriber`` handlers and, if given, an outbox relay,
    started and stopped by :meth:`lifespan`.

    ``producer_group``, ``secret`` and ``public_url`` are needed only by a service that
    publishes with ``@transactional`` (the broker signs its check-backs with ``secret`` and
    sends them to ``public_url + check_path``). ``relay`` builds the relay from the service's
    client and engine: ``lambda client, engine: Relay(client, engine, namespace="orders")``.
    ``migrate`` and ``create_tables`` are for development and examples; in production, run
    ``txbroker db upgrade`` and the service's own migrations before starting it.

    ::

        txb = TxbService(
            broker="txb://127.0.0.1:9876",
            database="postgresql://app@db/orders",
            producer_group="orders-svc",
            secret=os.environ["TXB_CHECK_SECRET"],
            public_url="http://orders:8000",  # where the broker reaches this service
        )
        app = FastAPI(lifespan=txb.lifespan)

        @txb.transactional("orders", key=lambda order: order["id"])
        async def place_order(session: AsyncSession, order: dict) -> dict: ...

        @txb.subscriber("payments", group="orders")
        async def paid(session: AsyncSession, msg: ConsumedMessage) -> None: ...

        @app.get("/orders/{order_id}")
        async def get_order(order_id: str, session: AsyncSession = Depends(txb.session)): ...

    The lifespan starts, in this order: the engine (with ``migrate``, the txbroker tables are
    upgraded; with ``create_tables``, the service's own are created); the txbroker tables checked,
    so a database without them fails here, saying to run ``txbroker db upgrade``; the broker
    connection (within ``connect_timeout_s``); the topics the decorators name (and ``topics``)
    created if absent; the check-back endpoint mounted on the app at ``check_path``; the
    :class:`~txbroker_sdk.transactional.TxPublisher` built with ``public_url + check_path`` and the
    ``@transactional`` functions bound to it; then the subscribers and the outbox relay started. At
    shutdown it undoes them in reverse order, all within ``shutdown_timeout_s``: the runners are
    stopped (running handlers finish or are cancelled, offsets committed), the functions unbound,
    the END_TX answers awaited, the endpoint unmounted, the client closed, the engine disposed.

    Route handlers get what the service opened through dependencies: ``Depends(txb.session)`` (an
    ``AsyncSession``, closed after the request), ``Depends(txb.publisher)``,
    ``Depends(txb.client)`` and ``Depends(txb.engine)``; outside FastAPI, call the same methods
    (``txb.publisher()``).
    """

    def __init__(
        self,
        *,
        broker: str,
        database: str,
        producer_group: str | None = None,
        secret: str | None = None,
        public_url: str | None = None,
        check_path: str = "/txb/check",
        auth_token: str | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        relay: Callable[[Client, AsyncEngine], Runner] | None = None,
        topics: Iterable[str] = (),
        migrate: bool = False,
        create_tables: MetaData | None = None,
        tx_timeout_ms: int | None = None,
        connect_timeout_s: float = 30.0,
        shutdown_timeout_s: float = 30.0,
    ) -> None:
        if producer_group is not None and (not secret or not public_url):
            raise InvalidArgument(
                f"producer group {producer_group!r} needs its check-back secret and the "
                "public_url the broker reaches this service at"
            )
        if not check_path.startswith("/"):
            raise InvalidArgument(f"check_path must start with '/', not {check_path!r}")
        for name, value in (("connect", connect_timeout_s), ("shutdown", shutdown_timeout_s)):
            if not value > 0:
                raise InvalidArgument(f"{name}_timeout_s must be > 0, not {value!r}")
        self.broker = broker
        self.database = database
        self.producer_group = producer_group
        self._secret = secret
        self.check_url = (public_url or "").rstrip("/") + check_path if producer_group else None
        self.check_path = check_path
        self._auth_token = auth_token
        self._tls = (tls_ca, tls_cert, tls_key)
        self._relay = relay
        self._topics = list(topics)
        self._migrate = migrate
        self._create_tables = create_tables
        self._tx_timeout_ms = tx_timeout_ms
        self.connect_timeout_s = connect_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self._transactional: list[_Transactional] = []
        self._subscriptions: list[_Subscription] = []
        self._running: _Running | None = None

    # --- decorators (at import time; bound when the app starts) ---

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
        """:meth:`TxPublisher.transactional` of the publisher this service builds at start.
        The decorated function is called without its session: ``await place_order(order)``.
        Decorated once the service runs, it is bound at once (but its topic is created at start
        only if named there: in ``topics``)."""
        if self.producer_group is None:
            raise InvalidArgument(
                "@transactional needs the service's producer_group, secret and public_url"
            )
        options: dict[str, Any] = {
            "key": key,
            "tags": tags,
            "headers": headers,
            "delay_s": delay_s,
            "encode": encode,
        }

        def decorate(
            fn: Callable[Concatenate[AsyncSession, P], Awaitable[R]],
        ) -> Callable[P, Awaitable[R]]:
            entry = _Transactional(topic, fn, options)
            self._transactional.append(entry)
            publisher = self._running.publisher if self._running is not None else None
            if publisher is not None:  # decorated while running: bound now
                entry.bound = publisher.transactional(topic, **options)(fn)

            @functools.wraps(fn)
            async def run(*args: P.args, **kwargs: P.kwargs) -> R:
                if entry.bound is None:
                    raise NotStarted(f"{fn.__qualname__}: the service has not started")
                result: R = await entry.bound(*args, **kwargs)
                return result

            return run

        return decorate

    def subscriber(
        self, topic: str, *, group: str, concurrency: int = 1, order: Order = "queue"
    ) -> Callable[[Handler], Handler]:
        """:meth:`Subscribers.subscriber` of the subscribers this service starts: apply each
        message of ``topic`` once, in the handler's transaction, for consumer ``group``."""
        if self._running is not None:
            raise InvalidArgument(
                f"subscribe to {topic!r} before the service starts: its subscribers run"
            )
        options: dict[str, Any] = {"group": group, "concurrency": concurrency, "order": order}

        def register(fn: Handler) -> Handler:
            check_handler(fn)
            self._subscriptions.append(_Subscription(topic, fn, options))
            return fn

        return register

    # --- dependencies (Depends(txb.session) etc.; plain calls outside FastAPI) ---

    def _started(self) -> _Running:
        if self._running is None:
            raise NotStarted("the service has not started (is txb.lifespan the app's lifespan?)")
        return self._running

    async def session(self) -> AsyncIterator[AsyncSession]:
        """An ``AsyncSession`` on the service's database, closed after the request."""
        async with self._started().sessions() as session:
            yield session

    def publisher(self) -> TxPublisher:
        publisher = self._started().publisher
        if publisher is None:
            raise InvalidArgument("this service has no producer_group: it has no publisher")
        return publisher

    def client(self) -> Client:
        client = self._started().client
        if client is None:
            raise NotStarted("the service is still starting: not connected yet")
        return client

    def engine(self) -> AsyncEngine:
        return self._started().engine

    # --- the lifespan ---

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Start everything (see the module's docstring), yield while the app serves, then
        stop everything in reverse order within ``shutdown_timeout_s``."""
        if self._running is not None:
            raise InvalidArgument("this service is running already (one app per TxbService)")
        deadline = _Deadline(self.shutdown_timeout_s)  # counts from the first cleanup
        setup_tracing(self.producer_group or "txbroker-service")  # only if OTEL_* asks
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(flush_tracing)  # the last spans leave before the process does
            engine = await self._open_database(stack)
            running = _Running(engine, async_sessionmaker(engine, expire_on_commit=False))
            self._running = running
            stack.callback(setattr, self, "_running", None)
            running.client = await self._connect(stack, deadline)
            if self.producer_group is not None:
                self._mount(app, engine, stack)
                running.publisher = self._bind(running, stack, deadline)
            await self._start_runners(running, stack, deadline)
            log.info(
                "txbroker service started: broker=%s check_url=%s subscriptions=%d relay=%s",
                self.broker,
                self.check_url,
                len(self._subscriptions),
                "yes" if self._relay is not None else "no",
            )
            yield

    async def _open_database(self, stack: contextlib.AsyncExitStack) -> AsyncEngine:
        if self._migrate:
            await asyncio.to_thread(upgrade, self.database)
        engine = create_engine(self.database)
        stack.push_async_callback(engine.dispose)
        shown = engine.url.render_as_string(hide_password=True)
        try:
            async with engine.begin() as conn:
                if self._create_tables is not None:
                    await conn.run_sync(self._create_tables.create_all)
                for table in (LOCAL_TX, INBOX, OUTBOX):
                    await conn.execute(select(table.c[0]).limit(1))
        except (SQLAlchemyError, OSError) as e:
            reason = getattr(e, "orig", None) or e  # the driver's message, without the SQL
            raise TxbError(
                f"cannot read txbroker's tables in {shown} ({reason}); is the database up, and "
                "migrated? run `txbroker db upgrade` on it (or start with migrate=True)"
            ) from e
        return engine

    async def _connect(self, stack: contextlib.AsyncExitStack, deadline: _Deadline) -> Client:
        ca, cert, key = self._tls
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                # Reconnects when dropped; TLS with txbs://, routed through NameServers with
                # txbns:// (a ClusterClient).
                client = await Client.connect(
                    self.broker, auth_token=self._auth_token, tls_ca=ca, tls_cert=cert, tls_key=key
                )
                stack.push_async_callback(_bounded, client.close, deadline, "closing the client")
                for topic in self._all_topics():
                    try:
                        await client.create_topic(topic, exist_ok=True)
                    except Forbidden:  # a produce or consume token: an operator made it
                        log.info("topic %s: not created (the token is not admin)", topic)
        except TimeoutError:
            raise TxbError(
                f"cannot reach the broker at {self.broker} within {self.connect_timeout_s} s"
            ) from None
        return client

    def _all_topics(self) -> list[str]:
        named = [t.topic for t in self._transactional] + [s.topic for s in self._subscriptions]
        return list(dict.fromkeys([*named, *self._topics]))  # in order, once each

    def _mount(self, app: Starlette, engine: AsyncEngine, stack: contextlib.AsyncExitStack) -> None:
        assert self.producer_group is not None and self._secret is not None
        before = list(app.router.routes)
        mount(app, engine, {self.producer_group: self._secret}, path=self.check_path)
        added = [route for route in app.router.routes if route not in before]

        def unmount() -> None:  # a restarted lifespan mounts it again
            for route in added:
                with contextlib.suppress(ValueError):
                    app.router.routes.remove(route)

        stack.callback(unmount)

    def _bind(
        self, running: _Running, stack: contextlib.AsyncExitStack, deadline: _Deadline
    ) -> TxPublisher:
        assert running.client is not None and self.producer_group and self.check_url
        publisher = TxPublisher(
            running.client,
            running.sessions,
            producer_group=self.producer_group,
            check_url=self.check_url,
            timeout_ms=self._tx_timeout_ms,
        )
        # At shutdown (in reverse): the functions unbound (a call then fails with NotStarted),
        # then the answers to the END_TX already posted awaited, before the client closes.
        stack.push_async_callback(_bounded, publisher.flush, deadline, "waiting for END_TX answers")
        stack.callback(self._unbind)
        for entry in self._transactional:
            entry.bound = publisher.transactional(entry.topic, **entry.options)(entry.fn)
        return publisher

    def _unbind(self) -> None:
        for entry in self._transactional:
            entry.bound = None

    async def _start_runners(
        self, running: _Running, stack: contextlib.AsyncExitStack, deadline: _Deadline
    ) -> None:
        assert running.client is not None
        runners: list[tuple[str, Runner]] = []
        if self._subscriptions:
            # Half the bound for running handlers, the rest for committing offsets.
            subs = Subscribers(
                running.client, running.sessions, shutdown_timeout_s=self.shutdown_timeout_s / 2
            )
            for s in self._subscriptions:
                subs.subscriber(s.topic, **s.options)(s.handler)
            runners.append(("subscribers", subs))
        if self._relay is not None:
            runners.append(("outbox relay", self._relay(running.client, running.engine)))
        if not runners:
            return
        stop = asyncio.Event()
        stack.push_async_callback(_stop_runners, running.runners, stop, deadline)
        for name, runner in runners:
            task = asyncio.create_task(runner.run(stop), name=f"txbroker {name}")
            task.add_done_callback(_log_end(name, stop))
            running.runners.append(task)


class _Deadline:
    """The shutdown's time bound, counted from the first time it is asked."""

    def __init__(self, total_s: float) -> None:
        self._total_s = total_s
        self._at: float | None = None

    def remaining(self) -> float:
        if self._at is None:
            self._at = time.monotonic() + self._total_s
        return max(self._at - time.monotonic(), 0.0)


async def _bounded(step: Callable[[], Awaitable[None]], deadline: _Deadline, what: str) -> None:
    try:
        await asyncio.wait_for(step(), max(deadline.remaining(), 0.001))
    except TimeoutError:
        log.warning("shutdown: gave up %s (out of time)", what)
    except TxbError as e:
        log.warning("shutdown: %s failed (%s)", what, e)


async def _stop_runners(
    tasks: list[asyncio.Task[None]], stop: asyncio.Event, deadline: _Deadline
) -> None:
    stop.set()
    if not tasks:
        return
    _, late = await asyncio.wait(tasks, timeout=deadline.remaining())
    for task in late:
        log.warning("shutdown: %s did not stop in time; cancelling it", task.get_name())
        task.cancel()
    if late:
        await asyncio.wait(late, timeout=1.0)  # cancelled: their cleanup is short


def _log_end(name: str, stop: asyncio.Event) -> Callable[[asyncio.Task[None]], None]:
    def done(task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        err = task.exception()
        if err is not None:
            log.error("the %s stopped: %r", name, err, exc_info=err)
        elif not stop.is_set():
            log.error("the %s stopped before the service did", name)

    return done
