"""Consumer groups: for each group and topic, its live members, its rate and its lag per
queue (the queue's end offset against the group's committed offset)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from txbroker.console.context import Context

__all__ = ["routes"]


def routes(ctx: Context) -> list[Route]:
    async def groups(request: Request) -> Response:
        found = ctx.deps.admin.groups()
        return ctx.render(request, "groups.html", {"groups": found, "active": "groups"})

    return [Route("/groups", ctx.page(groups), name="groups")]
