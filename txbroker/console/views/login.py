"""Signing in with a token, and out (see ``session.py``). The console is for operators: a token
signs in when it holds the read or admin role on every topic (``*``); its actions need admin.

The sign-in form has no session to bind a CSRF token to yet; it is guarded by the same-origin
check alone (a page elsewhere cannot post it) and by a limit on failed attempts.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from txbroker.console import guard
from txbroker.console.context import PREFIX, Context, safe_return
from txbroker.console.session import COOKIE
from txbroker.server.tokens import Role

__all__ = ["routes"]


def routes(ctx: Context) -> list[Route]:
    sessions = ctx.sessions

    def form(request: Request, error: str | None = None, status: int = 200) -> Response:
        target = safe_return(request.query_params.get("next"))
        context = {"next": target, "error": error, "active": ""}
        return ctx.render(request, "login.html", context, status)

    async def login_page(request: Request) -> Response:
        if not sessions.required:
            return RedirectResponse(PREFIX, 303)  # nothing to sign in with
        return form(request)

    async def login(request: Request) -> Response:
        problem = guard.cross_site(request)
        if problem is not None:
            return ctx.refused(request, 403, problem)
        if not sessions.required:
            return RedirectResponse(PREFIX, 303)
        data = await guard.read_form(request)
        if data is None:
            return ctx.refused(request, 400, "not a sign-in form (or far too large for one)")
        if sessions.throttled():
            return form(request, "too many failed sign-ins: wait a minute", 429)
        given = data.get("token")
        who = sessions.check_token(given) if isinstance(given, str) else None
        if who is None:
            sessions.failed()
            return form(request, "that is not a token of this broker", 401)
        if not who.may(Role.READ, None):
            why = (
                f"token {who.name!r} may not use the console: it needs the read or admin role "
                "on every topic (*)"
            )
            return form(request, why, 403)
        cookie, _ = sessions.issue(who)
        response = RedirectResponse(safe_return(data.get("next")), 303)
        ctx.set_session(request, response, cookie)
        return response

    async def logout(request: Request) -> Response:
        # A cross-site page cannot sign anyone out either (a nuisance, not a danger).
        problem = guard.cross_site(request)
        if problem is not None:
            return ctx.refused(request, 403, problem)
        response = RedirectResponse(f"{PREFIX}/login" if sessions.required else PREFIX, 303)
        response.delete_cookie(COOKIE, path=PREFIX)
        return response

    return [
        Route("/login", login_page, methods=["GET"], name="login_page"),
        Route("/login", login, methods=["POST"], name="login"),
        Route("/logout", logout, methods=["POST"], name="logout"),
    ]
