"""Transactions: the pending and parked ones with their actions (commit, roll back, resume),
and one transaction's timeline.

The actions are the operator's END_TX and resume, as ``txbroker tx commit|rollback|resume``
do: fenced like any decision, so a transaction that ended meanwhile answers with a conflict,
shown as the notice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from txbroker.console.context import Context
from txbroker.console.timeline import build_timeline
from txbroker.errors import NotFound
from txbroker.tx.state import Decision, Resolver, TxState

__all__ = ["routes"]

# Rows per table: what a person reads on one page; `txbroker tx list --max` shows more.
SHOWN_MAX: Final = 200
ACTIONS: Final = ("commit", "rollback", "resume")
DONE: Final = {"commit": "committed", "rollback": "rolled back", "resume": "resumed"}


def routes(ctx: Context) -> list[Route]:
    deps = ctx.deps

    async def transactions(request: Request) -> Response:
        topic = request.query_params.get("topic") or None
        pending = deps.tx.list(TxState.PREPARED, topic)
        parked = deps.tx.list(TxState.PARKED, topic)
        context = {
            "topic": topic,
            "pending": pending[:SHOWN_MAX],
            "parked": parked[:SHOWN_MAX],
            "pending_total": len(pending),
            "parked_total": len(parked),
            "active": "transactions",
        }
        return ctx.render(request, "transactions.html", context)

    async def timeline(request: Request) -> Response:
        t = await build_timeline(deps, request.path_params["tx_id"])
        configured = deps.settings.trace_url is not None
        context = {"t": t, "active": "transactions", "trace_configured": configured}
        return ctx.render(request, "timeline.html", context)

    async def act(request: Request, form: Mapping[str, str]) -> str:
        tx_id, action = request.path_params["tx_id"], request.path_params["action"]
        if action not in ACTIONS:
            raise NotFound(f"no action {action!r}: use commit, rollback or resume")
        if action == "resume":
            res = await deps.tx.resume(tx_id)
        else:
            why = "resolved in the console"
            res = await deps.tx.end(tx_id, Decision(action), Resolver.OPERATOR, why)
        again = " (it already was)" if res.duplicate else ""
        return f"transaction {tx_id} {DONE[action]}{again}"

    return [
        Route("/transactions", ctx.page(transactions), name="transactions"),
        Route("/transactions/{tx_id}", ctx.page(timeline), name="timeline"),
        Route("/transactions/{tx_id}/{action}", ctx.action(act), methods=["POST"]),
    ]
