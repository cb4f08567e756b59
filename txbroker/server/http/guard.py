"""What every endpoint of the HTTP API shares: the bearer token, and errors as problems.

:func:`guarded` authenticates the request (401 without a valid token; the principal is put in
the request's scope for the endpoint's role checks), answers a raised :class:`Problem` or
broker error with its problem document, and logs anything else with its traceback and answers
500: an unexpected exception is a bug, never the caller's input. :func:`redirecting` answers a
write that reached a broker that is not its group's master with a 307 to the master.
:func:`direct_route` makes a route the HTTP server answers itself under the same rules.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from txbroker.errors import NotMaster, TxbError
from txbroker.runtime.httpdirect import DirectEndpoint, DirectRequest, DirectRoute
from txbroker.server.http.problems import (
    Forbidden,
    InternalError,
    Problem,
    Unauthorized,
    problem_for,
)
from txbroker.server.tokens import ANYONE, Principal, Role, TokenTable

__all__ = ["Endpoint", "direct_route", "guarded", "principal", "redirecting"]

log = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]
PRINCIPAL_KEY = "txb_principal"


def principal(request: Request | DirectRequest) -> Principal:
    """The request's principal (set by the guard; everyone on a broker without tokens)."""
    if isinstance(request, DirectRequest):
        return request.state if request.state is not None else ANYONE
    who: Principal = request.scope.get(PRINCIPAL_KEY, ANYONE)
    return who


def guarded(
    fn: Endpoint, tokens: TokenTable, *, public: bool = False, role: Role | None = Role.READ
) -> Endpoint:
    """``fn`` behind the token check; ``role``: what the token must hold on some topic before
    the endpoint looks further (None: the endpoint checks the role on what it touches)."""

    async def endpoint(request: Request) -> Response:
        try:
            if not public:
                given = request.headers.get("authorization")
                request.scope[PRINCIPAL_KEY] = _authenticated(tokens, given, role)
            return await fn(request)
        except Exception as e:
            return _failed(e, request.method, request.url.path)

    return endpoint


def redirecting(fn: Endpoint, master_http: Callable[[], str | None]) -> Endpoint:
    """``fn``, answered 307 to the master when this broker turns out not to be it;
    ``master_http``: the master's HTTP base URL when this broker knows another is master."""

    async def endpoint(request: Request) -> Response:
        try:
            return await fn(request)
        except NotMaster:
            where = request.url.path + ("?" + request.url.query if request.url.query else "")
            answer = _to_master(master_http, where)
            if answer is None:
                raise
            return answer

    return endpoint


def direct_route(
    path: str,
    endpoint: DirectEndpoint,
    tokens: TokenTable,
    master_http: Callable[[], str | None],
) -> DirectRoute:
    """A POST route the HTTP server answers itself (``runtime/httpdirect.py``), under the
    rules of :func:`guarded` and :func:`redirecting`: the token checked before ``endpoint``
    runs (which checks the role on what it touches), errors answered as problems, a write that
    reached a broker that is not its group's master answered 307 to the master."""

    def check(request: DirectRequest) -> None:
        request.state = _authenticated(tokens, request.header(b"authorization"), None)

    def failed(error: Exception, request: DirectRequest) -> Response:
        if isinstance(error, NotMaster):
            answer = _to_master(master_http, request.url)
            if answer is not None:
                return answer
        return _failed(error, request.method, request.path)

    return DirectRoute(path, endpoint, methods=["POST"], check=check, failed=failed)


def _authenticated(tokens: TokenTable, authorization: str | None, role: Role | None) -> Principal:
    """The principal of a bearer token; 401 without a valid one, 403 without ``role``."""
    if not tokens.entries:
        return ANYONE  # no tokens: everyone may do everything
    scheme, _, given = (authorization or "").partition(" ")
    who = tokens.authenticate(given if scheme.lower() == "bearer" else None)
    if who is None:
        raise Unauthorized("send Authorization: Bearer <a token of this broker>")
    if role is not None and not who.has(role):
        raise Forbidden(f"token {who.name!r} lacks the {role.value} role")
    return who


def _failed(error: Exception, method: str, path: str) -> Response:
    """The answer to an endpoint's exception: its problem, or 500 for a bug (logged with its
    traceback; the details stay in the log)."""
    if isinstance(error, Problem):
        return error.response()
    if isinstance(error, TxbError):
        answer = problem_for(error)
        if answer.status >= 500:
            log.warning("%s %s: %s", method, path, error)
        return answer.response()
    log.error("%s %s failed", method, path, exc_info=error)
    return InternalError(
        "the broker failed to answer this request; its log has the details"
    ).response()


def _to_master(master_http: Callable[[], str | None], where: str) -> Response | None:
    """A 307 to ``where`` (path and query) at the master, when this broker knows it."""
    master = master_http()
    return RedirectResponse(master.rstrip("/") + where, 307) if master is not None else None
