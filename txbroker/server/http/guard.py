"""What every endpoint of the HTTP API shares: the bearer token, and errors as problems.

:func:`guarded` authenticates the request (401 without a valid token; the principal is put in
the request's scope for the endpoint's role checks), answers a raised :class:`Problem` or
broker error with its problem document, and logs anything else with its traceback and answers
500: an unexpected exception is a bug, never the caller's input. :func:`redirecting` answers a
write that reached a broker that is not its group's master with a 307 to the master.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from txbroker.errors import NotMaster, TxbError
from txbroker.server.http.problems import (
    Forbidden,
    InternalError,
    Problem,
    Unauthorized,
    problem_for,
)
from txbroker.server.tokens import ANYONE, Principal, Role, TokenTable

__all__ = ["Endpoint", "guarded", "principal", "redirecting"]

log = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]
PRINCIPAL_KEY = "txb_principal"


def principal(request: Request) -> Principal:
    """The request's principal (set by the guard; everyone on a broker without tokens)."""
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
                scheme, _, given = request.headers.get("authorization", "").partition(" ")
                who = tokens.authenticate(given if scheme.lower() == "bearer" else None)
                if who is None:
                    raise Unauthorized("send Authorization: Bearer <a token of this broker>")
                if role is not None and not who.has(role):
                    raise Forbidden(f"token {who.name!r} lacks the {role.value} role")
                request.scope[PRINCIPAL_KEY] = who
            return await fn(request)
        except Problem as raised:
            return raised.response()
        except TxbError as e:
            answer = problem_for(e)
            if answer.status >= 500:
                log.warning("%s %s: %s", request.method, request.url.path, e)
            return answer.response()
        except Exception:
            log.exception("%s %s failed", request.method, request.url.path)
            return InternalError(
                "the broker failed to answer this request; its log has the details"
            ).response()

    return endpoint


def redirecting(fn: Endpoint, master_http: Callable[[], str | None]) -> Endpoint:
    """``fn``, answered 307 to the master when this broker turns out not to be it;
    ``master_http``: the master's HTTP base URL when this broker knows another is master."""

    async def endpoint(request: Request) -> Response:
        try:
            return await fn(request)
        except NotMaster:
            master = master_http()
            if master is None:
                raise
            url = master.rstrip("/") + request.url.path
            if request.url.query:
                url += "?" + request.url.query
            return RedirectResponse(url, 307)

    return endpoint
