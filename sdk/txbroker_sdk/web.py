"""FastAPI and Starlette integration: one object wires a web service to txbroker.

    txb = TxbService(database="postgresql://app@db/orders", ...)  # the broker: TXB_SERVER
    app = FastAPI(lifespan=txb.lifespan)  # or Starlette(routes=..., lifespan=txb.lifespan)

The decorators may run at import time, before anything is connected: they are bound when the
app starts. :class:`TxbService` says what its lifespan starts and stops, in which order, and
which dependencies route handlers get; its background loops run supervised
(:mod:`txbroker_sdk.supervision`), and ``/txb/ready`` and ``/txb/live`` say how they are doing.
Only Starlette is needed here (FastAPI is a Starlette app): the ``web`` extra adds FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Concatenate, Final, ParamSpec, Protocol, TypeVar

from opentelemetry.metrics import MeterProvider
from sqlalchemy import MetaData, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from txbroker.errors import Forbidden, InvalidArgument, TxbError, Unauthenticated
from txbroker.runtime.httpserve import HttpServer, serving
from txbroker.runtime.tracing import flush_tracing, setup_tracing
from txbroker_sdk.barrier import mount
from txbroker_sdk.client import Client
from txbroker_sdk.database import create_engine
from txbroker_sdk.errors import NotStarted
from txbroker_sdk.preflight import TablesChecked
from txbroker_sdk.schema import upgrade
from txbroker_sdk.settings import ServiceSettings
from txbroker_sdk.subscriber import Handler, Order, Subscribers, check_handler
from txbroker_sdk.supervision import (
    BLOCKED_RETRY_S,
    LoopHealth,
    Supervisor,
    diagnose,
    unless_stopped,
)
from txbroker_sdk.tables import INBOX, LOCAL_TX, OUTBOX
from txbroker_sdk.transactional import TxPublisher, encode_body

__all__ = [
    "EXIT_BLOCKED",
    "LIVE_PATH",
    "READY_PATH",
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

READY_PATH: Final = "/txb/ready"
LIVE_PATH: Final = "/txb/live"
# The exit status of a service that exits because a loop is blocked (exit_when_blocked): not 0,
# so a supervisor restarting on failure does; not 1 (an exception), 2 (usage) or 3 (uvicorn's
# failed startup), so the log is not needed to tell them apart.
EXIT_BLOCKED: Final = 4
# The publisher's look at the broker and its barrier table: half Kubernetes' default probe
# period (10 s), so a probe sees a refused token soon after it happens.
PUBLISHER_CHECK_S: Final = 5.0
# What the service's own logs show when nothing configured logging (``uvicorn module:app``).
_LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_OWN_LOGGERS: Final = ("txbroker_sdk", "txbroker_outbox", "txbroker_checkback")


class Runner(Protocol):
    """Something that runs until its stop event is set, e.g. ``txbroker_outbox.Relay``. One
    with a ``health`` attribute (a :class:`~txbroker_sdk.supervision.LoopHealth`, as the relay
    has) reports its own failures and is ready once it says it works; any other is counted as
    running while its ``run`` runs, and failing when it raises."""

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
    supervisor: Supervisor | None = None


class TxbService:
    """The txbroker side of one web service: its database, its broker connection, its
    ``@transactional`` functions, its ``@subscriber`` handlers and, if given, an outbox relay,
    started and stopped by :meth:`lifespan`.

    ``broker``, ``database``, ``auth_token``, the ``tls_*`` files and ``secret``, when not
    passed, come from the variables the CLI reads (:mod:`txbroker_sdk.settings`):
    ``TXB_SERVER`` (default ``txb://127.0.0.1:9876``), ``TXB_DATABASE_URL``,
    ``TXB_AUTH_TOKEN``, ``TXB_TLS_CA``, ``TXB_TLS_CLIENT_CERT``, ``TXB_TLS_CLIENT_KEY`` (for a
    ``txbs://`` broker) and ``TXB_CHECK_SECRET``. ``producer_group``, ``secret`` and
    ``public_url`` are needed only by a service that publishes with ``@transactional`` (the
    broker signs its check-backs with ``secret`` and sends them to ``public_url + check_path``).
    ``relay`` builds the relay from the service's client and engine: ``lambda client, engine:
    Relay(client, engine, namespace="orders")``. ``migrate`` and ``create_tables`` are for
    development and examples; in production, run ``txbroker db upgrade`` and the service's own
    migrations before starting it.

    ::

        txb = TxbService(  # the broker, its token, the secret: TXB_SERVER, TXB_AUTH_TOKEN, ...
            database="postgresql://app@db/orders",
            producer_group="orders-svc",
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
    ``@transactional`` functions bound to it; then the background loops started under a
    :class:`~txbroker_sdk.supervision.Supervisor` (each subscription, the outbox relay, and for a
    publisher a look every 5 s at the broker and the barrier table) and the probes mounted at
    ``/txb/ready`` and ``/txb/live``. At shutdown it undoes them in reverse order, all within
    ``shutdown_timeout_s``: the loops are stopped (running handlers finish or are cancelled,
    offsets committed), the functions unbound, the END_TX answers awaited, the endpoints
    unmounted, the client closed, the engine disposed.

    A loop that fails is logged once per cause with what to do, counted
    (``txbroker.service.loop.failures`` on ``meter_provider``, else the global one) and retried:
    soon when waiting can cure it (the broker restarting), every ``blocked_retry_s`` when only a
    person can (a refused token, missing tables or topic), and then ``/txb/ready`` answers 503
    saying which loop and why. With ``exit_when_blocked`` the service exits instead (status 4),
    for a process supervisor to restart it.

    Route handlers get what the service opened through dependencies: ``Depends(txb.session)`` (an
    ``AsyncSession``, closed after the request), ``Depends(txb.publisher)``,
    ``Depends(txb.client)`` and ``Depends(txb.engine)``; outside FastAPI, call the same methods
    (``txb.publisher()``).
    """

    def __init__(
        self,
        *,
        broker: str | None = None,
        database: str | None = None,
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
        blocked_retry_s: float = BLOCKED_RETRY_S,
        exit_when_blocked: bool = False,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        settings = ServiceSettings.resolve(
            os.environ,
            server=broker,
            database=database,
            auth_token=auth_token,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            check_secret=secret,
        )
        if settings.database is None:
            raise InvalidArgument(
                "the service's database: pass database= or set TXB_DATABASE_URL "
                "(postgresql://user@host/db or sqlite:///file.db)"
            )
        if producer_group is not None and not settings.check_secret:
            raise InvalidArgument(
                f"producer group {producer_group!r} needs its check-back secret: set "
                "TXB_CHECK_SECRET (or pass secret=), the one the broker holds for the group"
            )
        if producer_group is not None and not public_url:
            raise InvalidArgument(
                f"producer group {producer_group!r} needs the public_url the broker reaches "
                "this service at"
            )
        if not check_path.startswith("/"):
            raise InvalidArgument(f"check_path must start with '/', not {check_path!r}")
        for name, value in (
            ("connect_timeout_s", connect_timeout_s),
            ("shutdown_timeout_s", shutdown_timeout_s),
            ("blocked_retry_s", blocked_retry_s),
        ):
            if not value > 0:
                raise InvalidArgument(f"{name} must be > 0, not {value!r}")
        self.settings = settings
        self.broker = settings.server
        self.database = settings.database
        self.producer_group = producer_group
        self.check_url = (public_url or "").rstrip("/") + check_path if producer_group else None
        self.check_path = check_path
        self._relay = relay
        self._topics = list(topics)
        self._migrate = migrate
        self._create_tables = create_tables
        self._tx_timeout_ms = tx_timeout_ms
        self.connect_timeout_s = connect_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.blocked_retry_s = blocked_retry_s
        self.exit_when_blocked = exit_when_blocked
        self._meter_provider = meter_provider
        self._exiting = False
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

    @property
    def ready(self) -> bool:
        """Whether every background loop works (what ``/txb/ready`` answers); False outside
        the lifespan."""
        running = self._running
        return running is not None and running.supervisor is not None and running.supervisor.ready

    # --- the lifespan ---

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Start everything (see the module's docstring), yield while the app serves, then
        stop everything in reverse order within ``shutdown_timeout_s``."""
        if self._running is not None:
            raise InvalidArgument("this service is running already (one app per TxbService)")
        _show_logs()
        deadline = _Deadline(self.shutdown_timeout_s)  # counts from the first cleanup
        setup_tracing(self.producer_group or "txbroker-service")  # only if OTEL_* asks
        try:
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
                running.supervisor = self._start_loops(running, stack, deadline)
                self._mount_probes(app, running.supervisor, stack)
                log.info(
                    "txbroker service started; background loops: %s; probes at %s and %s",
                    ", ".join(h.name for h in running.supervisor.loops) or "none",
                    READY_PATH,
                    LIVE_PATH,
                )
                yield
        finally:
            if self._exiting:
                _exit(EXIT_BLOCKED)

    async def _open_database(self, stack: contextlib.AsyncExitStack) -> AsyncEngine:
        assert self.database is not None
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
        s = self.settings
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                # Reconnects when dropped; TLS with txbs://, routed through NameServers with
                # txbns:// (a ClusterClient).
                client = await Client.connect(
                    s.server,
                    auth_token=s.auth_token,
                    tls_ca=s.tls_ca,
                    tls_cert=s.tls_cert,
                    tls_key=s.tls_key,
                )
                stack.push_async_callback(_bounded, client.close, deadline, "closing the client")
                log.info(
                    "connected to the broker at %s (txbroker %s, %s)",
                    s.server,
                    client.server_version or "version not known through NameServers",
                    "with an auth token" if s.auth_token else "without an auth token",
                )
                for topic in self._all_topics():
                    try:
                        await client.create_topic(topic, exist_ok=True)
                    except Forbidden:  # a produce or consume token: an operator made it
                        log.info("topic %s: not created (the token is not admin)", topic)
        except TimeoutError:
            raise TxbError(
                f"cannot reach the broker at {self.broker} within {self.connect_timeout_s} s"
            ) from None
        except Unauthenticated as e:
            raise Unauthenticated(f"{self.broker}: {e}; {diagnose(e).action}") from e
        return client

    def _all_topics(self) -> list[str]:
        named = [t.topic for t in self._transactional] + [s.topic for s in self._subscriptions]
        return list(dict.fromkeys([*named, *self._topics]))  # in order, once each

    def _mount(self, app: Starlette, engine: AsyncEngine, stack: contextlib.AsyncExitStack) -> None:
        group, secret = self.producer_group, self.settings.check_secret
        assert group is not None and secret is not None
        _mounted(app, stack, lambda: mount(app, engine, {group: secret}, path=self.check_path))

    def _mount_probes(
        self, app: Starlette, supervisor: Supervisor, stack: contextlib.AsyncExitStack
    ) -> None:
        broker = self.broker

        async def ready(_: Request) -> JSONResponse:
            report = {"broker": broker, **supervisor.report()}
            return JSONResponse(report, status_code=200 if report["ready"] else 503)

        async def live(_: Request) -> JSONResponse:
            ok = supervisor.live
            return JSONResponse({"live": ok}, status_code=200 if ok else 503)

        def add() -> None:
            app.router.routes.append(Route(READY_PATH, ready, methods=["GET"]))
            app.router.routes.append(Route(LIVE_PATH, live, methods=["GET"]))

        _mounted(app, stack, add)

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

    def _start_loops(
        self, running: _Running, stack: contextlib.AsyncExitStack, deadline: _Deadline
    ) -> Supervisor:
        client = running.client
        assert client is not None
        supervisor = Supervisor(
            blocked_retry_s=self.blocked_retry_s,
            meter_provider=self._meter_provider,
            exit_when_blocked=self._exit_blocked if self.exit_when_blocked else None,
        )
        stack.push_async_callback(lambda: supervisor.stop(deadline.remaining()))
        if self.producer_group is not None:
            check = _PublisherCheck(client, running.sessions)
            supervisor.start(check.run, check.health)
        if self._subscriptions:
            # Half the bound for running handlers, the rest for committing offsets.
            subs = Subscribers(
                client, running.sessions, shutdown_timeout_s=self.shutdown_timeout_s / 2
            )
            for sub in self._subscriptions:
                subs.subscriber(sub.topic, **sub.options)(sub.handler)
            for health, run in subs.loops():
                supervisor.start(run, health)
        if self._relay is not None:
            relay = self._relay(client, running.engine)
            own = getattr(relay, "health", None)
            supervisor.start(relay.run, own if isinstance(own, LoopHealth) else "outbox relay")
        return supervisor

    def _exit_blocked(self, health: LoopHealth) -> None:
        """``exit_when_blocked``: stop the service as SIGTERM does (the lifespan's shutdown
        runs), then exit with :data:`EXIT_BLOCKED`."""
        if self._exiting:
            return
        self._exiting = True
        log.error(
            "%s is blocked (%s): exiting with status %d (exit_when_blocked), for a process "
            "supervisor to restart the service",
            health.name,
            health.last_error,
            EXIT_BLOCKED,
        )
        os.kill(os.getpid(), signal.SIGTERM)


class _PublisherCheck:
    """What ``@transactional`` and the check-back endpoint need, looked at every
    :data:`PUBLISHER_CHECK_S`: the broker answers this service (its token is taken) and the
    barrier table is there. A publisher has no loop of its own: without this, a refused token
    would show only as failed requests."""

    def __init__(self, client: Client, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._client = client
        self._tables = TablesChecked(sessions, LOCAL_TX)
        self.health = LoopHealth("publisher")

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._tables()
            await unless_stopped(self._client.ping(), stop)
            if stop.is_set():
                return
            self.health.ok()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PUBLISHER_CHECK_S)


def _mounted(app: Starlette, stack: contextlib.AsyncExitStack, add: Callable[[], object]) -> None:
    """Routes ``add`` appends to ``app``, removed again at shutdown (a restarted lifespan
    mounts them again)."""
    before = list(app.router.routes)
    add()
    added = [route for route in app.router.routes if route not in before]

    def unmount() -> None:
        for route in added:
            with contextlib.suppress(ValueError):
                app.router.routes.remove(route)

    stack.callback(unmount)


def _show_logs() -> None:
    """Under ``uvicorn module:app`` nothing configures logging but uvicorn's own loggers: the
    service's INFO lines (connected, subscribed, relay started) would go nowhere and its errors
    to Python's last-resort handler, without a time. With no handler on the root logger, the
    SDK's loggers get one of their own, as uvicorn's do; a configured application is left
    alone."""
    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    for name in _OWN_LOGGERS:
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(handler)
            logger.propagate = False  # a root handler added later must not print them twice
            if logger.level == logging.NOTSET:
                logger.setLevel(logging.INFO)


def _exit(status: int) -> None:
    """Exit now, the lifespan's cleanup done: uvicorn would otherwise exit as if by SIGTERM,
    which a supervisor restarting on failure (systemd's ``on-failure``) takes for a clean stop."""
    logging.shutdown()
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(status)


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
