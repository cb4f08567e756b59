"""Cluster: what ``txbroker cluster status`` prints, read from etcd when the page is shown
(``txbroker/cluster/status.py``): each group's master, election holder and lease, brokers and
slowest slave's lag; every broker's role, address, flushed offset, lag, epoch and lease; the
topic routes; and which of those brokers this console belongs to.

etcd is asked on every view, through the broker's own etcd session (its membership's: one
connection per broker, however many views), within ``STATUS_TIMEOUT_S``: a console whose etcd
is down or hung says so on the page (as an answer, not an error: the broker itself still
serves) instead of waiting on it. A broker of no group says it is none and how to make it one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from txbroker.cluster import Coordinator
from txbroker.cluster.status import BrokerStatus, ClusterStatus, queue_span, read_status
from txbroker.console.context import Context
from txbroker.errors import CoordinationError

__all__ = ["STATUS_TIMEOUT_S", "routes"]

log = logging.getLogger(__name__)

# etcd answers a listing in milliseconds; a page that waits longer than this for it would only
# keep the operator from seeing that etcd is in trouble. Each listing is bounded by the
# session's request timeout (2 s) too.
STATUS_TIMEOUT_S: Final = 3.0


@dataclass(frozen=True, slots=True)
class RouteRow:
    topic: str
    queues: int
    shares: tuple[tuple[str, str], ...]  # (group, its queues as "0-3" or "0,2,5")


async def read(coordinator: Coordinator) -> ClusterStatus:
    async with asyncio.timeout(STATUS_TIMEOUT_S):
        return await read_status(coordinator)


def routes(ctx: Context) -> list[Route]:
    link = ctx.deps.cluster

    async def cluster(request: Request) -> Response:
        context: dict[str, Any] = {"link": link, "status": None, "active": "cluster"}
        if link is None:
            return ctx.render(request, "cluster.html", context)
        me = link.broker_id()
        status: ClusterStatus | None = None
        problem = None
        session = link.session()
        try:
            if session is None:  # the membership starts after the HTTP server
                raise CoordinationError("this broker has not registered in etcd yet")
            status = await read(session)
        except TimeoutError:
            problem = f"no answer within {STATUS_TIMEOUT_S:g} s"
        except CoordinationError as e:
            problem = str(e)
        except Exception as e:  # a page about etcd's trouble must not fail with it
            log.warning("cluster page: cannot read %s", link.coordinator, exc_info=True)
            problem = f"{type(e).__name__}: {e}"
        mine: BrokerStatus | None = None
        route_rows: list[RouteRow] = []
        if status is not None:
            mine = next(
                (b for b in status.brokers if b.group == link.group and b.broker == me), None
            )
            route_rows = [
                RouteRow(
                    t.topic, t.queues, tuple((s.group, queue_span(s.queues)) for s in t.shares)
                )
                for t in status.topics
            ]
        context |= {
            "me": me,
            "mine": mine,
            "status": status,
            "problem": problem,
            "route_rows": route_rows,
            "read_ms": time.time_ns() // 1_000_000,
            "timeout_s": STATUS_TIMEOUT_S,
        }
        return ctx.render(request, "cluster.html", context)

    return [Route("/cluster", ctx.page(cluster), name="cluster")]
