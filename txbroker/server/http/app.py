"""The broker's HTTP app (Starlette), served by uvicorn inside its event loop: the admin API
(``admin.py``), the messaging API (``messaging.py``) and its OpenAPI document, and what a layer
above adds (the console). Every error is a problem document (``problems.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from txbroker.server.access import Access
from txbroker.server.admin import Admin
from txbroker.server.http.admin import admin_routes
from txbroker.server.http.checks import PullChecking
from txbroker.server.http.messaging import Messaging, TcpRequest
from txbroker.server.http.openapi import openapi_route
from txbroker.server.http.problems import MethodNotAllowed, NotFound
from txbroker.server.http.receiving import Receiving
from txbroker.server.metrics import BrokerMetrics
from txbroker.server.producer import DEFAULT_DEDUP_WINDOW_MS
from txbroker.server.receipts import Receiver
from txbroker.server.tokens import TokenTable
from txbroker.server.topics import TopicRegistry
from txbroker.store import MessageStore
from txbroker.tx.checker import BackChecker
from txbroker.tx.coordinator import TxCoordinator

__all__ = ["build_http_app"]


def build_http_app(
    store: MessageStore,
    topics: TopicRegistry,
    admin: Admin,
    metrics: BrokerMetrics | None = None,
    tokens: TokenTable | None = None,
    tx: TxCoordinator | None = None,
    checker: BackChecker | None = None,
    connections: Callable[[], dict[str, Any]] | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    *,
    broker: TcpRequest | None = None,
    access: Access | None = None,
    dedup_window_ms: int = DEFAULT_DEDUP_WINDOW_MS,
    master_http: Callable[[], str | None] = lambda: None,
    receiver: Receiver | None = None,
) -> Starlette:
    """The app; the messaging API is served when ``broker`` (the way into the TCP request
    handlers, :func:`~txbroker.server.http.messaging.tcp_requests`) is given. ``extra_routes`` are
    mounted beside it (the console, from above: the server does not import what it serves).
    Receiving by receipt is served when ``receiver`` is given too."""
    table = access.tokens if access is not None else tokens or TokenTable()
    routes: list[BaseRoute] = [openapi_route()]
    if broker is not None:
        access = access or Access(
            table, lambda tx_id: t.topic if tx and (t := tx.find(tx_id)) else None
        )
        messaging = Messaging(
            broker,
            access,
            store,
            dedup_window_ms=dedup_window_ms,
            master_http=master_http,
        )
        routes += messaging.routes(table)  # before the admin's /v1/transactions/{id}/{action}
        pulls = PullChecking(checker, tx, access, master_http=master_http)
        routes += pulls.routes(table)  # before the admin's /v1/transactions/{id}/{action} too
        if receiver is not None:
            receiving = Receiving(receiver, access, master_http=master_http)
            routes += receiving.routes(table)
    routes += admin_routes(
        store,
        topics,
        admin,
        table,
        metrics=metrics,
        tx=tx,
        checker=checker,
        connections=connections,
    )

    async def not_found(request: Request, exc: Exception) -> Response:
        return NotFound(f"no such endpoint: {request.method} {request.url.path}").response()

    async def not_allowed(request: Request, exc: Exception) -> Response:
        # Starlette's own answer is plain text; every error of this API is a problem. The
        # Allow header Starlette computed is kept.
        headers = dict(getattr(exc, "headers", None) or {})
        why = f"{request.method} is not allowed on {request.url.path}"
        return MethodNotAllowed(why, headers=headers).response()

    return Starlette(
        routes=[*routes, *extra_routes],
        exception_handlers={404: not_found, 405: not_allowed},
    )
