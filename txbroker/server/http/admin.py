"""The admin API's endpoints: listings for operators and dashboards.

Health, topics, groups, messages by key or id, transactions, back-check endpoints and
``/metrics``; the routes are listed in :func:`admin_routes`. With tokens (``tokens.py``),
every endpoint but ``/healthz`` needs ``Authorization: Bearer <token>`` (401 without a
valid one) and the ``read`` role on what it shows; resuming a transaction needs ``admin``
on its topic.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from txbroker.errors import BadRequest, Forbidden, InvalidArgument, NotFound
from txbroker.server.admin import Admin
from txbroker.server.http.guard import guarded, principal
from txbroker.server.http.problems import Unavailable
from txbroker.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from txbroker.server.metrics import BrokerMetrics
from txbroker.server.producer import HEADER_PREFIX
from txbroker.server.tokens import Role, TokenTable
from txbroker.server.topics import TopicRegistry
from txbroker.store import KeyKind, MessageStore, StoredMessage
from txbroker.tx.checker import BackChecker
from txbroker.tx.coordinator import TxCoordinator

__all__ = ["admin_routes"]

MAX_LOOKUP: int = 100


def _message_json(m: StoredMessage) -> dict[str, Any]:
    try:
        body, encoding = m.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(m.body).decode(), "base64"
    return {
        "message_id": m.message_id,
        "topic": m.topic,
        "queue": m.queue_id,
        "offset": m.queue_offset,
        "keys": m.keys,
        "tags": m.tags,
        "headers": {
            k[len(HEADER_PREFIX) :]: v
            for k, v in m.properties.items()
            if k.startswith(HEADER_PREFIX)
        },
        "born_ms": m.born_timestamp_ms,
        "store_ms": m.store_timestamp_ms,
        "body": body,
        "encoding": encoding,
    }


def _need(request: Request, role: Role, topic: str | None) -> None:
    """Forbidden unless the request's token holds ``role`` on ``topic`` (None: a transaction
    the broker does not hold; the role itself is enough to be told it is not found)."""
    who = principal(request)
    ok = who.has(role) if topic is None else who.may(role, topic)
    if not ok:
        where = f" on topic {topic!r}" if topic is not None else ""
        raise Forbidden(f"this needs the {role.value} role{where}; token {who.name!r} lacks it")


def admin_routes(
    store: MessageStore,
    topics: TopicRegistry,
    admin: Admin,
    tokens: TokenTable,
    *,
    metrics: BrokerMetrics | None = None,
    tx: TxCoordinator | None = None,
    checker: BackChecker | None = None,
    connections: Callable[[], dict[str, Any]] | None = None,
) -> list[BaseRoute]:
    """The admin endpoints, behind the token check and the ``read`` role.

    ::

        GET /healthz                       liveness, store state, connections and their limits
        GET /v1/topics                     topics with per-queue offsets
        GET /v1/groups                     consumer groups with lag per queue
        GET /v1/messages?topic=T&key=K     messages of a topic by business key
        GET /v1/messages/{message_id}      one message by id
        GET /metrics                       OpenTelemetry metrics in Prometheus text (metrics.py)
        GET /v1/transactions[/{tx_id}]     open (or recently ended) transactions
        GET /v1/checks/endpoints           back-check endpoints and their breakers
        POST /v1/transactions/{tx_id}/resume   an operator's: back-checks again for a parked one
    """

    async def healthz(_: Request) -> Response:
        out: dict[str, Any] = {"status": "ok", "store": store.state.value}
        if connections is not None:  # counts and limits only: no addresses, nothing secret
            out["connections"] = connections()
        return JSONResponse(out)

    async def list_topics(request: Request) -> Response:
        who = principal(request)
        out = [
            {
                "topic": t.name,
                "queues": msgspec.to_builtins(admin.offsets(t)),
                "created_ms": t.created_ms,
            }
            for t in topics.list()
            if who.may(Role.READ, t.name)
        ]
        return JSONResponse({"topics": out})

    async def list_groups(request: Request) -> Response:
        who = principal(request)
        out = [
            {
                "group": g.group,
                "topic": g.topic,
                "members": g.members,
                "lag": {str(q.queue): q.lag for q in g.queues},
                "total_lag": g.lag,
            }
            for g in admin.groups()
            if who.may(Role.READ, g.topic)
        ]
        return JSONResponse({"groups": out})

    async def messages_by_key(request: Request) -> Response:
        topic = request.query_params.get("topic")
        key = request.query_params.get("key")
        if not topic or not key:
            raise BadRequest("give both ?topic= and ?key=")
        _need(request, Role.READ, topic)
        topics.get(topic)
        found = await store.lookup(KeyKind.KEY, key, limit=MAX_LOOKUP)
        # Half messages and other internal copies live in internal topics: never shown here.
        return JSONResponse({"messages": [_message_json(m) for m in found if m.topic == topic]})

    async def message_by_id(request: Request) -> Response:
        mid = request.path_params["message_id"]
        for m in await store.lookup(KeyKind.MESSAGE_ID, mid, limit=8):
            if not m.topic.startswith("%"):
                _need(request, Role.READ, m.topic)
                return JSONResponse(_message_json(m))
        raise NotFound(f"no message with id {mid!r}")

    async def metrics_text(_: Request) -> Response:
        text = metrics.exposition() if metrics is not None else None
        if text is None:
            raise Unavailable("metrics need the OpenTelemetry SDK: pip install 'txbroker[otel]'")
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    def coordinator() -> TxCoordinator:
        if tx is None:
            raise NotFound("transactions are not enabled on this broker")
        return tx

    async def list_transactions(request: Request) -> Response:
        c = coordinator()
        try:
            found = c.listing(request.query_params.get("state"), request.query_params.get("topic"))
        except InvalidArgument as e:
            raise BadRequest(str(e)) from e
        who = principal(request)
        found = [t for t in found if who.may(Role.READ, t.topic)]
        return JSONResponse(
            {
                "transactions": [msgspec.to_builtins(c.info(t)) for t in found[:1000]],
                "total": len(found),
            }
        )

    async def show_transaction(request: Request) -> Response:
        c = coordinator()
        t = c.get(request.path_params["tx_id"])
        _need(request, Role.READ, t.topic)
        return JSONResponse(msgspec.to_builtins(c.info(t)))

    async def resume_transaction(request: Request) -> Response:
        # Commit and rollback have their own routes (messaging.py): a producer's decision.
        tx_id, action = request.path_params["tx_id"], request.path_params["action"]
        if action != "resume":
            raise NotFound(f"no action {action!r}: use commit, rollback or resume")
        c = coordinator()
        found = c.find(tx_id)
        _need(request, Role.ADMIN, found.topic if found is not None else None)
        return JSONResponse(msgspec.to_builtins(await c.resume(tx_id)))

    async def check_endpoints(_: Request) -> Response:
        if checker is None:
            raise NotFound("transactions are not enabled on this broker")
        found = [dataclasses.asdict(e) for e in checker.endpoints()]
        return JSONResponse({"endpoints": found})

    def route(path: str, fn: Callable[[Request], Any], **kw: Any) -> Route:
        return Route(path, guarded(fn, tokens, public=kw.pop("public", False)), **kw)

    return [
        route("/healthz", healthz, public=True),
        route("/v1/topics", list_topics),
        route("/v1/groups", list_groups),
        route("/v1/messages", messages_by_key),
        route("/v1/messages/{message_id}", message_by_id),
        route("/metrics", metrics_text),
        route("/v1/transactions", list_transactions),
        route("/v1/checks/endpoints", check_endpoints),
        route("/v1/transactions/{tx_id}", show_transaction),
        route("/v1/transactions/{tx_id}/{action}", resume_transaction, methods=["POST"]),
    ]
