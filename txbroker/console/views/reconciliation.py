"""The latest reconciliation: the newest ``summary.json`` the reconcile job wrote where the
broker was told reports live (``--reconcile-reports``), or why there is none to show.

Each example's id links to what the broker holds of it: the timeline of a transaction it knows
(open, recently ended, or with a decision record), otherwise a search for the id (an outbox
key, a message id, an idempotency key, or a transaction the broker never saw)."""

from __future__ import annotations

import asyncio
from typing import Any, Final
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from txbroker.console.context import PREFIX, Context, Deps
from txbroker.errors import TxbError
from txbroker.server.reconciliation import latest_summary
from txbroker.store import KeyKind

__all__ = ["routes"]

# Anomaly examples listed: the report page has them all.
EXAMPLES_SHOWN: Final = 20
KINDS: Final = ("lost", "phantom", "duplicate", "stuck")


def _e2e(topic: dict[str, Any]) -> dict[str, Any]:
    latency = topic.get("latency")
    leg = latency.get("commit → processed") if isinstance(latency, dict) else None
    return leg if isinstance(leg, dict) else {}


async def link_for(deps: Deps, id_: str) -> str:
    """Where an example id leads: its transaction's timeline, or a search for it."""
    if deps.tx.find(id_) is not None:
        return f"{PREFIX}/transactions/{quote(id_, safe='')}"
    try:
        if await deps.store.lookup(KeyKind.INTERNAL, f"txend:{id_}", limit=1):
            return f"{PREFIX}/transactions/{quote(id_, safe='')}"
    except TxbError:
        pass  # the store is closing: a search says what can be found
    return f"{PREFIX}/search?{urlencode({'q': id_})}"


def routes(ctx: Context) -> list[Route]:
    reports = ctx.deps.settings.reconcile_reports

    async def reconciliation(request: Request) -> Response:
        summary = await asyncio.to_thread(latest_summary, reports) if reports else None
        doc = summary.document if summary is not None else {}
        topics = [t for t in doc.get("topics", []) if isinstance(t, dict)]
        examples = [e for e in doc.get("examples", []) if isinstance(e, dict)][:EXAMPLES_SHOWN]
        context = {
            "reports": reports,
            "summary": summary,
            "kinds": KINDS,
            "topics": [(t, _e2e(t)) for t in topics],
            "by_reason": [r for r in doc.get("by_reason", []) if isinstance(r, dict)],
            "examples": [
                (e, await link_for(ctx.deps, str(e["id"])) if e.get("id") else None)
                for e in examples
            ],
            "active": "reconciliation",
        }
        return ctx.render(request, "reconciliation.html", context)

    return [Route("/reconciliation", ctx.page(reconciliation), name="reconciliation")]
