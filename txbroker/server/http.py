"""The HTTP admin API (Starlette), served by uvicorn inside the broker's event loop.

Health, topics, groups, messages by key or id, transactions and ``/metrics`` (the routes are
listed in :func:`build_http_app`). Errors are JSON ``{"error": {"code", "message"}}`` with a
status that fits the error class (a method an endpoint does not take too: 405
``METHOD_NOT_ALLOWED``). With tokens (``tokens.py``), every endpoint but ``/healthz`` needs
``Authorization: Bearer <token>`` (401 without a valid one) and the ``read`` role on what it
shows; resolving a transaction needs ``admin`` on its topic (403 ``FORBIDDEN`` otherwise).
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from txbroker.errors import (
    Forbidden,
    InvalidArgument,
    NotFound,
    TransactionConflict,
    TxbError,
    Unauthenticated,
)
from txbroker.server.admin import Admin
from txbroker.server.delay import DelayScheduler
from txbroker.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from txbroker.server.metrics import BrokerMetrics
from txbroker.server.producer import HEADER_PREFIX
from txbroker.server.tokens import ANYONE, Principal, Role, TokenTable
from txbroker.server.topics import TopicRegistry
from txbroker.store import KeyKind, MessageStore, StoredMessage
from txbroker.tx.checker import BackChecker
from txbroker.tx.coordinator import TxCoordinator, tx_info
from txbroker.tx.state import Decision, Resolver, TxState

__all__ = ["build_http_app"]

_STATUS: dict[type[TxbError], int] = {
    NotFound: 404,
    InvalidArgument: 400,
    TransactionConflict: 409,
    Unauthenticated: 401,
    Forbidden: 403,
}
MAX_LOOKUP: int = 100


def _status(err: TxbError) -> int:
    for cls in type(err).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 503 if err.retriable else 500


def _error(err: TxbError) -> JSONResponse:
    return JSONResponse({"error": {"code": err.code, "message": str(err)}}, _status(err))


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


def _who(request: Request) -> Principal:
    """The request's principal (set by the guard; everyone on a broker without tokens)."""
    who: Principal = request.scope.get("txb_principal", ANYONE)
    return who


def _need(request: Request, role: Role, topic: str | None) -> None:
    """Forbidden unless the request's token holds ``role`` on ``topic`` (None: a transaction
    the broker does not hold; the role itself is enough to be told it is not found)."""
    who = _who(request)
    ok = who.has(role) if topic is None else who.may(role, topic)
    if not ok:
        where = f" on topic {topic!r}" if topic is not None else ""
        raise Forbidden(f"this needs the {role.value} role{where}; token {who.name!r} lacks it")


def build_http_app(
    store: MessageStore,
    topics: TopicRegistry,
    admin: Admin,
    scheduler: DelayScheduler,
    metrics: BrokerMetrics | None = None,
    tokens: TokenTable | None = None,
    tx: TxCoordinator | None = None,
    checker: BackChecker | None = None,
    connections: Callable[[], dict[str, Any]] | None = None,
    extra_routes: Sequence[BaseRoute] = (),
) -> Starlette:
    """The admin API's app; ``extra_routes`` are mounted beside it (the console, from above:
    the server does not import what it serves there).

    ::

        GET /healthz                       liveness, store state, connections and their limits
        GET /v1/topics                     topics with per-queue offsets
        GET /v1/groups                     consumer groups with lag per queue
        GET /v1/messages?topic=T&key=K     messages of a topic by business key
        GET /v1/messages/{message_id}      one message by id
        GET /metrics                       OpenTelemetry metrics in Prometheus text (metrics.py)

    Listings show only the topics the token may read.
    """
    table = tokens or TokenTable()

    def guarded(fn: Callable[[Request], Any], *, public: bool = False) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            if not public:
                scheme, _, given = request.headers.get("authorization", "").partition(" ")
                who = table.authenticate(given if scheme.lower() == "bearer" else None)
                if who is None:
                    err = Unauthenticated("send Authorization: Bearer <a token of this broker>")
                    return JSONResponse({"error": {"code": err.code, "message": str(err)}}, 401)
                if not who.has(Role.READ):
                    return _error(Forbidden(f"token {who.name!r} lacks the read role"))
                request.scope["txb_principal"] = who
            try:
                result: Response = await fn(request)
                return result
            except TxbError as e:
                return _error(e)

        return endpoint

    async def healthz(_: Request) -> Response:
        out: dict[str, Any] = {"status": "ok", "store": store.state.value}
        if connections is not None:  # counts and limits only: no addresses, nothing secret
            out["connections"] = connections()
        return JSONResponse(out)

    async def list_topics(request: Request) -> Response:
        who = _who(request)
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
        who = _who(request)
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
            raise InvalidArgument("give both ?topic= and ?key=")
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
            message = "metrics need the OpenTelemetry SDK: pip install 'txbroker[otel]'"
            return JSONResponse({"error": {"code": "unavailable", "message": message}}, 503)
        return Response(text, media_type=METRICS_CONTENT_TYPE)

    def coordinator() -> TxCoordinator:
        if tx is None:
            raise NotFound("transactions are not enabled on this broker")
        return tx

    async def list_transactions(request: Request) -> Response:
        raw = request.query_params.get("state")
        if raw not in (None, "", "prepared", "parked"):
            raise InvalidArgument("state must be prepared or parked")
        state = TxState(raw) if raw else None
        who = _who(request)
        found = coordinator().list(state, request.query_params.get("topic"))
        found = [t for t in found if who.may(Role.READ, t.topic)]
        return JSONResponse(
            {
                "transactions": [msgspec.to_builtins(tx_info(t)) for t in found[:1000]],
                "total": len(found),
            }
        )

    async def show_transaction(request: Request) -> Response:
        t = coordinator().get(request.path_params["tx_id"])
        _need(request, Role.READ, t.topic)
        return JSONResponse(msgspec.to_builtins(tx_info(t)))

    async def resolve_transaction(request: Request) -> Response:
        tx_id, action = request.path_params["tx_id"], request.path_params["action"]
        c = coordinator()
        found = c.find(tx_id)
        _need(request, Role.ADMIN, found.topic if found is not None else None)
        if action == "resume":
            res = await c.resume(tx_id)
        elif action in ("commit", "rollback"):
            res = await c.end(tx_id, Decision(action), Resolver.OPERATOR, "resolved over HTTP")
        else:
            raise NotFound(f"no action {action!r}: use commit, rollback or resume")
        return JSONResponse(msgspec.to_builtins(res))

    async def check_endpoints(_: Request) -> Response:
        if checker is None:
            raise NotFound("transactions are not enabled on this broker")
        found = [dataclasses.asdict(e) for e in checker.endpoints()]
        return JSONResponse({"endpoints": found})

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(NotFound(f"no such endpoint: {request.method} {request.url.path}"))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        # Starlette's own answer is plain text; every error of this API is JSON. The Allow
        # header Starlette computed is kept.
        why = f"{request.method} is not allowed on {request.url.path}"
        headers = getattr(exc, "headers", None)
        body = {"error": {"code": "METHOD_NOT_ALLOWED", "message": why}}
        return JSONResponse(body, 405, headers=headers)

    return Starlette(
        routes=[
            Route("/healthz", guarded(healthz, public=True)),
            Route("/v1/topics", guarded(list_topics)),
            Route("/v1/groups", guarded(list_groups)),
            Route("/v1/messages", guarded(messages_by_key)),
            Route("/v1/messages/{message_id}", guarded(message_by_id)),
            Route("/metrics", guarded(metrics_text)),
            Route("/v1/transactions", guarded(list_transactions)),
            Route("/v1/checks/endpoints", guarded(check_endpoints)),
            Route("/v1/transactions/{tx_id}", guarded(show_transaction)),
            Route(
                "/v1/transactions/{tx_id}/{action}",
                guarded(resolve_transaction),
                methods=["POST"],
            ),
            *extra_routes,
        ],
        exception_handlers={404: not_found, 405: not_allowed},
    )
