"""The console's Starlette app, mounted at ``/console`` on the broker's HTTP port.

Server-rendered pages (``views/``), one stylesheet, no JavaScript: every action is a form POST
answered by a redirect. Every answer carries headers that keep a page from being framed,
sniffed or made to run script (:data:`HEADERS`), and ``Cache-Control: no-store`` but the
stylesheet, since pages hold message bodies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from txbroker.cluster import Coordinator
from txbroker.console.context import PREFIX, ClusterLink, Context, Deps, Settings
from txbroker.console.views import (
    cluster,
    deadletters,
    groups,
    login,
    overview,
    reconciliation,
    search,
    transactions,
)

if TYPE_CHECKING:
    from txbroker.server.app import BrokerServer

__all__ = ["build_console", "console_routes"]

CSP: Final = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS: Final = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
)


class SecurityHeaders:
    """Adds :data:`HEADERS` to every answer (and ``no-store`` to all but the stylesheet)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = "/static/" in scope["path"]  # mounted or not: no other path has it

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k not in dict(HEADERS)]
                headers += HEADERS
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def build_console(deps: Deps) -> Starlette:
    ctx = Context(deps)

    async def not_found(request: Request, exc: Exception) -> Response:
        return ctx.refused(request, 404, f"no console page {request.url.path}")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return ctx.refused(request, 405, f"{request.method} is not how this page is used")

    routes: list[BaseRoute] = [
        *overview.routes(ctx),
        *groups.routes(ctx),
        *transactions.routes(ctx),
        *search.routes(ctx),
        *deadletters.routes(ctx),
        *reconciliation.routes(ctx),
        *cluster.routes(ctx),
        *login.routes(ctx),
        Mount("/static", StaticFiles(packages=[("txbroker.console", "static")]), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers={404: not_found, 405: not_allowed},
    )


def console_routes(server: BrokerServer) -> list[BaseRoute]:
    """The console mounted at ``/console``, over a started server's parts (the hook
    ``txbroker serve`` gives :class:`~txbroker.server.app.BrokerServer`)."""
    assert server.store is not None and server.tx is not None and server.retry is not None
    cfg = server.config
    link = None
    if cfg.coordinator is not None and cfg.group is not None:

        def broker_id() -> str | None:
            # The membership starts after the HTTP server: until then, the id as configured.
            membership = server.membership
            return membership.settings.broker_id if membership is not None else cfg.broker_id

        def session() -> Coordinator | None:
            membership = server.membership
            return membership.coordinator if membership is not None else None

        link = ClusterLink(cfg.coordinator, cfg.group, broker_id, session)
    deps = Deps(
        server.store,
        server.topics,
        server.groups,
        server.admin,
        server.retry,
        server.tx,
        Settings(cfg.token_table(), cfg.trace_url, cfg.reconcile_reports),
        link,
    )
    return [Mount(PREFIX, app=build_console(deps), name="console")]
