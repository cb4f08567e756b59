"""Search: an order id, key, message id, transaction id or header value in, every transaction
and message the broker holds under it out, each linked to its timeline (``search.py``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from txbroker.console.context import Context
from txbroker.console.search import FAILURES_SHOWN, LOOKUP_MAX, SHOWN_MAX, search

__all__ = ["routes"]


def routes(ctx: Context) -> list[Route]:
    async def search_page(request: Request) -> Response:
        found = await search(ctx.deps, request.query_params.get("q", ""))
        context = {
            "found": found,
            "query": found.query,
            "lookup_max": LOOKUP_MAX,
            "shown_max": SHOWN_MAX,
            "failures_shown": FAILURES_SHOWN,
            "active": "search",
        }
        return ctx.render(request, "search.html", context)

    return [Route("/search", ctx.page(search_page), name="search")]
