"""The latest reconciliation: the newest ``summary.json`` the reconcile job wrote where the
broker was told reports live (``--reconcile-reports``), or why there is none to show."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from txbroker.console.context import Context
from txbroker.server.reconciliation import latest_summary

__all__ = ["routes"]

# Anomaly examples listed: the report page has them all.
EXAMPLES_SHOWN: Final = 20
KINDS: Final = ("lost", "phantom", "duplicate", "stuck")


def _e2e(topic: dict[str, Any]) -> dict[str, Any]:
    latency = topic.get("latency")
    leg = latency.get("commit → processed") if isinstance(latency, dict) else None
    return leg if isinstance(leg, dict) else {}


def routes(ctx: Context) -> list[Route]:
    reports = ctx.deps.settings.reconcile_reports

    async def reconciliation(request: Request) -> Response:
        summary = await asyncio.to_thread(latest_summary, reports) if reports else None
        doc = summary.document if summary is not None else {}
        topics = [t for t in doc.get("topics", []) if isinstance(t, dict)]
        context = {
            "reports": reports,
            "summary": summary,
            "kinds": KINDS,
            "topics": [(t, _e2e(t)) for t in topics],
            "by_reason": [r for r in doc.get("by_reason", []) if isinstance(r, dict)],
            "examples": [e for e in doc.get("examples", []) if isinstance(e, dict)][
                :EXAMPLES_SHOWN
            ],
            "active": "reconciliation",
        }
        return ctx.render(request, "reconciliation.html", context)

    return [Route("/reconciliation", ctx.page(reconciliation), name="reconciliation")]
