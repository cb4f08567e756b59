"""Topics: the first page (every topic with its queues, offsets and rate, and the broker's
totals) and one topic's page (its queues, the groups reading it, its newest messages)."""

from __future__ import annotations

from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from txbroker.console.context import Context
from txbroker.console.messages import MessageView

__all__ = ["routes"]

# Newest messages shown on a topic's page: a screenful.
NEWEST_SHOWN: Final = 20


def routes(ctx: Context) -> list[Route]:
    deps = ctx.deps

    async def overview(request: Request) -> Response:
        topics = [deps.admin.topic_info(t) for t in deps.topics.list()]
        groups = deps.admin.groups()
        open_txs = deps.tx.counts()
        totals = {
            "topics": len(topics),
            "messages": sum(t.messages for t in topics),
            "pending": open_txs.pending,
            "parked": open_txs.parked,
            "groups": len(groups),
            "lag": sum(g.lag for g in groups),
        }
        context = {
            "topics": topics,
            "totals": totals,
            "store": deps.store.state.value,
            "active": "overview",
        }
        return ctx.render(request, "overview.html", context)

    async def topic(request: Request) -> Response:
        t = deps.topics.get(request.path_params["topic"])
        info = deps.admin.topic_info(t)
        per_queue = max(1, -(-NEWEST_SHOWN // t.queues))  # ceil: a fair share of each queue
        newest = []
        for o in info.offsets:
            start = max(o.min_offset, o.max_offset - per_queue)
            if start < o.max_offset:
                got = await deps.store.get_messages(t.name, o.queue, start, per_queue)
                newest += got.messages
        newest.sort(key=lambda m: m.store_timestamp_ms, reverse=True)
        context = {
            "topic": info,
            "groups": deps.admin.groups(topic=t.name),
            "messages": [MessageView.of(m) for m in newest[:NEWEST_SHOWN]],
            "active": "overview",
        }
        return ctx.render(request, "topic.html", context)

    return [
        Route("/", ctx.page(overview), name="overview"),
        Route("/topics/{topic}", ctx.page(topic), name="topic"),
    ]
