"""Transactions: the pending and parked ones with their actions (commit, roll back, resume),
the stalled among the pending marked (``?state=stalled`` shows only those), the recently ended
ones, and one transaction's timeline.

The actions are the operator's END_TX and resume, as ``txbroker tx commit|rollback|resume``
do: fenced like any decision, so a transaction that ended meanwhile answers with a conflict,
shown as the notice. Commit and roll back are asked for on a confirmation page first, which
shows what the decision publishes; its form carries what the page showed (:func:`seen`), and
a transaction that changed since (a back-check answered, it was parked or resumed) is not
decided on that confirmation.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from txbroker.console.context import PREFIX, Context, safe_return
from txbroker.console.messages import MessageView
from txbroker.console.timeline import build_timeline
from txbroker.errors import InvalidArgument, NotFound, TransactionConflict, TxbError
from txbroker.tx.state import Decision, Resolver, Tx, TxState

__all__ = ["routes", "seen"]

# Rows per table: what a person reads on one page; `txbroker tx list --max` shows more.
SHOWN_MAX: Final = 200
# Ended transactions listed, newest first: the broker keeps the last 100,000 in memory; past a
# screenful, search finds one by its id or key.
ENDED_SHOWN: Final = 50
ACTIONS: Final = ("commit", "rollback", "resume")
DONE: Final = {"commit": "committed", "rollback": "rolled back", "resume": "resumed"}
ENDED_STATES: Final = (TxState.COMMITTED, TxState.ROLLED_BACK)


def seen(tx: Tx) -> str:
    """What a confirmation page showed of ``tx`` that its decision rests on: the state and the
    last back-check's time."""
    last = tx.history[-1].at_ms if tx.history else 0
    return f"{tx.state.value}:{last}"


def _choice(request: Request, name: str, allowed: tuple[str, ...]) -> str | None:
    raw = request.query_params.get(name) or None
    if raw is not None and raw not in allowed:
        raise InvalidArgument(
            f"no filter {name}={raw!r}: {name} is one of {', '.join(allowed)}, or absent for all"
        )
    return raw


def routes(ctx: Context) -> list[Route]:
    deps = ctx.deps

    async def transactions(request: Request) -> Response:
        topic = request.query_params.get("topic") or None
        only_stalled = _choice(request, "state", ("stalled",)) is not None
        pending = deps.tx.list(TxState.PREPARED, topic)
        parked = deps.tx.list(TxState.PARKED, topic)
        now = int(time.time() * 1000)
        stalled = {t.tx_id for t in pending if deps.tx.stalled(t, now)}
        if only_stalled:
            pending = [t for t in pending if t.tx_id in stalled]
        ended_state = _choice(request, "ended", tuple(s.value for s in ENDED_STATES))
        ended_by = _choice(request, "by", tuple(r.value for r in Resolver))
        ended = deps.tx.ended(
            ENDED_SHOWN,
            state=TxState(ended_state) if ended_state else None,
            topic=topic,
            by=Resolver(ended_by) if ended_by else None,
        )
        context = {
            "topic": topic,
            "pending": pending[:SHOWN_MAX],
            "parked": parked[:SHOWN_MAX],
            "pending_total": len(pending),
            "parked_total": len(parked),
            "ended": ended,
            "ended_state": ended_state or "",
            "ended_by": ended_by or "",
            "ended_shown": ENDED_SHOWN,
            "topics": [t.name for t in deps.topics.list()],
            "resolvers": [r.value for r in Resolver],
            "stalled": stalled,
            "only_stalled": only_stalled,
            "active": "transactions",
        }
        return ctx.render(request, "transactions.html", context)

    async def timeline(request: Request) -> Response:
        t = await build_timeline(deps, request.path_params["tx_id"])
        configured = deps.settings.trace_url is not None
        context = {"t": t, "active": "transactions", "trace_configured": configured}
        return ctx.render(request, "timeline.html", context)

    async def confirm(request: Request) -> Response:
        tx_id, action = request.path_params["tx_id"], request.path_params["action"]
        if action not in (Decision.COMMIT, Decision.ROLLBACK):
            raise NotFound(f"no confirmation for {action!r}: commit or rollback")
        tx = deps.tx.get(tx_id)
        back = safe_return(request.query_params.get("back") or f"{PREFIX}/transactions/{tx_id}")
        message, unreadable = None, None
        if not tx.ended:
            try:
                message = MessageView.of(await deps.store.read(tx.half_phys))
            except TxbError as e:  # the page says why, and that the commit will fail
                unreadable = str(e)
        try:
            groups = [g.group for g in deps.admin.groups(topic=tx.topic)]
        except NotFound:
            groups = []
        context = {
            "tx": tx,
            "action": action,
            "verb": "Commit" if action == Decision.COMMIT else "Roll back",
            "message": message,
            "unreadable": unreadable,
            "groups": groups,
            "last": tx.history[-1] if tx.history else None,
            "seen": seen(tx),
            "back": back,
            "active": "transactions",
        }
        return ctx.render(request, "confirm.html", context)

    async def act(request: Request, form: Mapping[str, str]) -> str:
        tx_id, action = request.path_params["tx_id"], request.path_params["action"]
        if action not in ACTIONS:
            raise NotFound(f"no action {action!r}: use commit, rollback or resume")
        if action == "resume":
            res = await deps.tx.resume(tx_id)
        else:
            tx = deps.tx.find(tx_id)
            if tx is not None and not tx.ended:  # an ended one: the fence answers below
                shown = form.get("seen")
                if shown is None:
                    raise InvalidArgument(
                        "the console decides a transaction from its confirmation page only, "
                        f"which shows what the decision publishes: {PREFIX}/transactions/"
                        f"{tx_id}/{action}"
                    )
                if shown != seen(tx):
                    raise TransactionConflict(
                        f"transaction {tx_id} changed since its confirmation page was shown "
                        "(a back-check answered, or it was parked or resumed): nothing was "
                        "done; look at it again"
                    )
            why = "resolved in the console"
            res = await deps.tx.end(tx_id, Decision(action), Resolver.OPERATOR, why)
        again = " (it already was)" if res.duplicate else ""
        return f"transaction {tx_id} {DONE[action]}{again}"

    return [
        Route("/transactions", ctx.page(transactions), name="transactions"),
        Route("/transactions/{tx_id}", ctx.page(timeline), name="timeline"),
        Route("/transactions/{tx_id}/{action}", ctx.page(confirm), methods=["GET"]),
        Route("/transactions/{tx_id}/{action}", ctx.action(act), methods=["POST"]),
    ]
