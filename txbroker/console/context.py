"""What every page and action shares: the broker's parts it reads, the templates, the sessions,
and the two wrappers that put the rules of ``guard.py`` in front of each endpoint.

``page`` (GET): a session is needed (signed in, when the broker has a token; otherwise an
anonymous one is made on the spot); the answer is the rendered template.
``action`` (POST): same origin, a session whose token is admin on every topic, the form's CSRF
token, and without tokens the broker's own host; then the action runs and the browser is sent
back (303) to the page it came from, with a notice of what happened.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from txbroker import __version__
from txbroker.cluster import Coordinator
from txbroker.console import guard
from txbroker.console.render import templates
from txbroker.console.session import COOKIE, FLASH_COOKIE, SESSION_TTL_S, Session, Sessions
from txbroker.errors import NotFound, StoreError, TxbError
from txbroker.server.admin import Admin
from txbroker.server.groups import GroupCoordinator
from txbroker.server.rates import WINDOW_S
from txbroker.server.retry import RetryService
from txbroker.server.tokens import Role, TokenTable
from txbroker.server.topics import TopicRegistry
from txbroker.store import MessageStore
from txbroker.tx.coordinator import TxCoordinator

__all__ = ["ActionFn", "ClusterLink", "Context", "Deps", "PageFn", "Settings"]

log = logging.getLogger("txbroker.console")

PREFIX: Final = "/console"
NAV: Final = (
    ("overview", "", "Topics"),
    ("groups", "/groups", "Consumer groups"),
    ("transactions", "/transactions", "Transactions"),
    ("deadletters", "/deadletters", "Dead letters"),
    ("reconciliation", "/reconciliation", "Reconciliation"),
    ("cluster", "/cluster", "Cluster"),
)
# How the pages name the span a rate is measured over (rates.py).
RATE_WINDOW: Final = f"last {WINDOW_S:g} s"
# A notice lives until the page it was meant for is shown (or a minute passes).
FLASH_MAX_AGE_S: Final = 60


@dataclass(frozen=True, slots=True)
class Settings:
    tokens: TokenTable | None = None  # None or empty: no sign-in
    trace_url: str | None = None  # with {trace_id} in it
    reconcile_reports: Path | None = None


@dataclass(frozen=True, slots=True)
class ClusterLink:
    """Where this broker's group is registered (``--coordinator``, ``--group``) and which broker
    it is there: the id is known once it registered (by default it is derived from the port).
    ``session``: the broker's own etcd session (its membership's), None while it is not
    registered; the Cluster page reads through it rather than connecting per view."""

    coordinator: str  # etcd://host:port[,...]
    group: str
    broker_id: Callable[[], str | None]
    session: Callable[[], Coordinator | None]


@dataclass(frozen=True, slots=True)
class Deps:
    store: MessageStore
    topics: TopicRegistry
    groups: GroupCoordinator
    admin: Admin
    retry: RetryService
    tx: TxCoordinator
    settings: Settings
    cluster: ClusterLink | None = None  # None: a broker of no group


PageFn = Callable[[Request], Awaitable[Response]]
ActionFn = Callable[[Request, Mapping[str, str]], Awaitable[str]]


def safe_return(path: object) -> str:
    """A console path to send the browser back to; anything else (another site, a scheme,
    ``//host``) becomes the console's first page."""
    if (
        isinstance(path, str)
        and (path == PREFIX or path.startswith(PREFIX + "/"))
        and "//" not in path
        and "\\" not in path
        and len(path) <= 1000
    ):
        return path
    return PREFIX


class Context:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.sessions = Sessions(deps.settings.tokens)
        self.templates = templates()

    # --- rendering ---

    def render(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        session: Session | None = request.scope.get("txb_session")
        notice = self.sessions.unseal(request.cookies.get(FLASH_COOKIE))
        common = {
            "base": PREFIX,
            "nav": NAV,
            "version": __version__,
            "session": session,
            "csrf": self.sessions.csrf_token(session) if session else "",
            "token_required": self.sessions.required,
            # Whether to show the action buttons: a read-only session gets none (the action
            # itself is refused anyway, in ``action``).
            "can_act": not self.sessions.required
            or (
                session is not None
                and session.who is not None
                and session.who.may(Role.ADMIN, None)
            ),
            "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            "notice": notice,
            "active": "",  # the page's entry in NAV, if it has one
            "query": "",  # what the header's search box holds
            "rate_window": RATE_WINDOW,
        }
        response = self.templates.TemplateResponse(
            request, name, {**common, **context}, status_code=status
        )
        if notice is not None:
            response.delete_cookie(FLASH_COOKIE, path=PREFIX)
        return response

    def refused(self, request: Request, status: int, why: str) -> Response:
        return self.render(request, "refused.html", {"status": status, "why": why}, status)

    def set_session(self, request: Request, response: Response, cookie: str) -> None:
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=SESSION_TTL_S,
            path=PREFIX,
            httponly=True,
            samesite="strict",
            # Secure when the broker serves TLS itself (--tls-cert); behind a TLS proxy, the
            # proxy adds it.
            secure=request.url.scheme == "https",
        )

    # --- wrappers ---

    def page(self, fn: PageFn) -> PageFn:
        async def endpoint(request: Request) -> Response:
            session = self.sessions.verify(request.cookies.get(COOKIE))
            fresh = None
            if session is None:
                if self.sessions.required:
                    target = safe_return(request.url.path)
                    return RedirectResponse(f"{PREFIX}/login?next={quote(target)}", 303)
                fresh, session = self.sessions.issue()
            request.scope["txb_session"] = session
            try:
                response = await fn(request)
            except NotFound as e:
                response = self.refused(request, 404, str(e))
            except StoreError as e:  # the broker's trouble, not the request's
                response = self.refused(request, 503, str(e))
            except TxbError as e:
                response = self.refused(request, 400 if not e.retriable else 503, str(e))
            if fresh is not None:
                self.set_session(request, response, fresh)
            return response

        return endpoint

    def action(self, fn: ActionFn) -> PageFn:
        async def endpoint(request: Request) -> Response:
            problem = guard.cross_site(request)
            if problem is not None:
                return self.refused(request, 403, problem)
            session = self.sessions.verify(request.cookies.get(COOKIE))
            if session is None:
                if self.sessions.required:
                    why = "sign in with the broker's admin token to act (no session, or it expired)"
                    return self.refused(request, 401, why)
                why = "no console session (the broker restarted?): reload the page and try again"
                return self.refused(request, 403, why)
            who = session.who
            if self.sessions.required and (who is None or not who.may(Role.ADMIN, None)):
                why = (
                    f"token {session.name!r} may look but not act: actions need the admin role "
                    "on every topic (*)"
                )
                return self.refused(request, 403, why)
            request.scope["txb_session"] = session
            form = await guard.read_form(request)
            if form is None:
                return self.refused(request, 400, "not a console form (or far too large for one)")
            if not self.sessions.csrf_ok(session, form.get("csrf")):
                why = "the form's CSRF token is not this session's: reload the page and try again"
                return self.refused(request, 403, why)
            if not self.sessions.required:
                problem = guard.local_only(request)
                if problem is not None:
                    return self.refused(request, 403, problem)
            back = safe_return(form.get("back"))
            try:
                kind, text = "ok", await fn(request, form)
            except TxbError as e:
                kind, text = "error", str(e)
            peer = request.client.host if request.client else "?"
            log.info("console action %s from %s: %s", request.url.path, peer, text)  # audit
            response = RedirectResponse(back, 303)
            response.set_cookie(
                FLASH_COOKIE,
                self.sessions.seal(kind, text),
                max_age=FLASH_MAX_AGE_S,
                path=PREFIX,
                httponly=True,
                samesite="strict",
            )
            return response

        return endpoint
