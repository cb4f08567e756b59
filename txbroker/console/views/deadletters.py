"""Dead letters: each consumer group's messages that failed every retry, and re-driving them
to their topics (as `txbroker dlq redrive` does: in order, each once, remembering how far it
got)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from txbroker.console.context import Context
from txbroker.console.messages import MessageView
from txbroker.errors import InvalidArgument
from txbroker.server.retry import (
    PROP_ORIGINAL_TOPIC,
    PROP_RECONSUME,
    REDRIVE_OWNER,
    dlq_topic,
)
from txbroker.store import StoredMessage

__all__ = ["routes"]

PREFIX: Final = dlq_topic("")
# Dead letters listed per group, and re-driven per click: a page, and one bounded batch.
SHOWN_MAX: Final = 50
REDRIVE_MAX: Final = 1000


@dataclass(frozen=True, slots=True)
class DeadLetters:
    group: str
    total: int  # still kept
    waiting: int  # not yet re-driven
    redriven_before: int  # offsets below this were re-driven
    letters: list[tuple[MessageView, str, int, bool]]  # message, original topic, retries, redriven


def _letter(m: StoredMessage, redriven_before: int) -> tuple[MessageView, str, int, bool]:
    retries = m.properties.get(PROP_RECONSUME, "0")
    return (
        MessageView.of(m),
        m.properties.get(PROP_ORIGINAL_TOPIC, ""),
        int(retries) if retries.isdigit() else 0,
        m.queue_offset < redriven_before,
    )


def routes(ctx: Context) -> list[Route]:
    deps = ctx.deps

    async def deadletters(request: Request) -> Response:
        out = []
        for t in deps.topics.list(include_system=True):
            if not t.name.startswith(PREFIX):
                continue
            group = t.name[len(PREFIX) :]
            lo, hi = deps.store.queue_range(t.name, 0)
            redriven = max(deps.groups.committed(REDRIVE_OWNER, t.name, 0) or lo, lo)
            # The ones still waiting first, then as many re-driven ones as the page has room.
            start = max(lo, min(redriven, hi - SHOWN_MAX))
            got = await deps.store.get_messages(t.name, 0, start, SHOWN_MAX) if hi > lo else None
            letters = [_letter(m, redriven) for m in got.messages] if got else []
            out.append(DeadLetters(group, hi - lo, hi - redriven, redriven, letters))
        context = {"groups": out, "active": "deadletters", "redrive_max": REDRIVE_MAX}
        return ctx.render(request, "deadletters.html", context)

    async def redrive(request: Request, form: Mapping[str, str]) -> str:
        group = request.path_params["group"]
        raw = form.get("max", str(REDRIVE_MAX))
        if not isinstance(raw, str) or not raw.isdigit() or not 1 <= int(raw) <= REDRIVE_MAX:
            raise InvalidArgument(f"re-drive 1..{REDRIVE_MAX} dead letters at a time")
        res = await deps.retry.redrive(group, int(raw))
        return f"re-drove {res.redriven} dead letter(s) of group {group} to their topics"

    return [
        Route("/deadletters", ctx.page(deadletters), name="deadletters"),
        Route("/deadletters/{group}/redrive", ctx.action(redrive), methods=["POST"]),
    ]
