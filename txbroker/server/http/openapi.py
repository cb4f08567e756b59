"""``GET /v1/openapi.json``: the messaging API as an OpenAPI 3.1 document, generated from the
msgspec types the endpoints decode and answer with (``types.py``), so the schema cannot drift
from what the broker accepts; each operation has an ``operationId`` for client generators."""

from __future__ import annotations

from typing import Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from txbroker import __version__
from txbroker.server.http.problems import CONTENT_TYPE as PROBLEM
from txbroker.server.http.problems import ProblemBody
from txbroker.server.http.types import (
    CheckAnswered,
    CheckRequest,
    ExtendRequest,
    NackReceipts,
    PrepareTransaction,
    PublishBatch,
    PublishMessage,
    PullChecks,
    PulledChecks,
    Receipt,
    ReceiptList,
    Receipts,
    ReceivedMessage,
    ReceivedMessages,
    ReceiveRequest,
    Settled,
    TxEndResponse,
    TxPrepareResponse,
)

__all__ = ["PATH", "openapi_document", "openapi_route"]

PATH: Final = "/v1/openapi.json"
REF: Final = "#/components/schemas/{name}"
_TYPES: Final = (
    PublishMessage,
    PublishBatch,
    Receipt,
    Receipts,
    PrepareTransaction,
    TxPrepareResponse,
    TxEndResponse,
    PullChecks,
    CheckRequest,
    PulledChecks,
    CheckAnswered,
    ReceiveRequest,
    ReceivedMessage,
    ReceivedMessages,
    ReceiptList,
    NackReceipts,
    ExtendRequest,
    Settled,
    ProblemBody,
)
# The errors every operation may answer; each operation adds its own.
_COMMON_ERRORS: Final = {
    "400": "malformed JSON, an unknown field, a wrong type, bad base64",
    "401": "a missing or wrong bearer token",
    "403": "the token lacks the produce role on the topic",
    "415": "a body that is not application/json",
    "422": "a request the broker refuses as invalid (a key with a space, a reused key)",
    "503": "not the group's master and no master known, or the store in trouble",
}


def _ref(t: type) -> dict[str, str]:
    return {"$ref": REF.format(name=t.__name__)}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _operation(
    op_id: str,
    summary: str,
    ok: tuple[str, str, dict[str, Any]],
    errors: dict[str, str],
    body: dict[str, Any] | None = None,
    params: tuple[str, ...] = (),
    headers: tuple[tuple[str, str], ...] = (),
) -> dict[str, Any]:
    status, what, schema = ok
    problems = {**_COMMON_ERRORS, **errors}
    out: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "parameters": [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
            for p in params
        ]
        + [
            {
                "name": h,
                "in": "header",
                "required": False,
                # Empty is refused (an empty Idempotency-Key names nothing).
                "schema": {"type": "string", "minLength": 1},
                "description": why,
            }
            for h, why in headers
        ],
        "responses": {
            status: {"description": what, **_json_body(schema)},
            "307": {"description": "not the group's master: the same request at the master"},
            **{
                code: {
                    "description": why,
                    "content": {PROBLEM: {"schema": _ref(ProblemBody)}},
                }
                for code, why in sorted(problems.items())
            },
        },
    }
    if body is not None:
        out["requestBody"] = {"required": True, **_json_body(body)}
    return out


def openapi_document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(_TYPES, ref_template=REF)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "txbroker HTTP API",
            "version": __version__,
            "description": "Publishing, two-phase messages (back-checked by pull when asked) and "
            "receiving by receipt over HTTP (docs/http-api.md).",
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
        "paths": {
            "/v1/topics/{topic}/messages": {
                "post": _operation(
                    "publishMessages",
                    "Publish one message, or a batch all or nothing",
                    (
                        "201",
                        "stored, as durable as the flush mode says",
                        {"oneOf": [_ref(Receipt), _ref(Receipts)]},
                    ),
                    {
                        "404": "no such topic",
                        "409": "a request with this Idempotency-Key is still in flight",
                        "413": "the request or a message over its limit",
                    },
                    body={"oneOf": [_ref(PublishMessage), _ref(PublishBatch)]},
                    params=("topic",),
                    headers=(("Idempotency-Key", "a single message's idempotency key"),),
                )
            },
            "/v1/transactions": {
                "post": _operation(
                    "prepareTransaction",
                    "Store a half message: invisible until committed, back-checked if neither "
                    "decision comes in time",
                    ("201", "the half message is stored", _ref(TxPrepareResponse)),
                    {
                        "404": "no such topic",
                        "409": "a transaction with this tx_id exists or has ended",
                        "413": "the message over its limit",
                    },
                    body=_ref(PrepareTransaction),
                    headers=(("traceparent", "W3C trace context kept with the half message"),),
                )
            },
            **{
                f"/v1/transactions/{{tx_id}}/{decision}": {
                    "post": _operation(
                        f"{decision}Transaction",
                        f"The producer's decision: {decision} (again: the same answer)",
                        ("200", "decided", _ref(TxEndResponse)),
                        {
                            "404": "no such transaction",
                            "409": "it ended the other way (state says how)",
                        },
                        params=("tx_id",),
                    )
                }
                for decision in ("commit", "rollback")
            },
            "/v1/producer-groups/{group}/checks": {
                "post": _operation(
                    "pullChecks",
                    "Long-poll the back-checks due to a producer group whose transactions were "
                    'prepared with "check_url": "pull"; answer each by commit, rollback or unknown',
                    (
                        "200",
                        "the checks taken (none when wait_ms passed first)",
                        _ref(PulledChecks),
                    ),
                    {"404": "transactions are not enabled on this broker"},
                    body=_ref(PullChecks),
                    params=("group",),
                )
            },
            "/v1/transactions/{tx_id}/unknown": {
                "post": _operation(
                    "answerCheckUnknown",
                    "Answer a pulled back-check UNKNOWN: counted, due again after the backoff",
                    ("200", "counted", _ref(CheckAnswered)),
                    {
                        "404": "no such transaction",
                        "409": "no pulled check of it is waiting for an answer (state says how "
                        "it is)",
                    },
                    params=("tx_id",),
                )
            },
            **_receiving(),
        },
    }


# What receiving adds to, or says otherwise than, the common errors.
_RECEIVING_ERRORS: Final = {
    "400": "malformed JSON, an unknown field, a wrong type, a number out of its bounds, a "
    "malformed receipt",
    "403": "the token lacks the consume role on the topic",
    "404": "no such topic",
    "422": "a group or topic name the broker refuses (an internal topic, a bad character)",
}


def _receiving() -> dict[str, Any]:
    prefix = "/v1/groups/{group}/topics/{topic}"
    settled = ("200", "what it applied to, and the receipts already stale", _ref(Settled))
    ops = {
        "receive": (
            "receiveMessages",
            "Receive up to max messages, waiting up to wait_ms; each invisible for invisible_ms",
            ("200", "the messages (none when the wait ran out)", _ref(ReceivedMessages)),
            ReceiveRequest,
        ),
        "ack": (
            "ackMessages",
            "Acknowledge by receipt: done with them (again: stale, not an error)",
            settled,
            ReceiptList,
        ),
        "nack": (
            "nackMessages",
            "Hand messages back: delivered again after delay_ms (or the group's retry delay), "
            "dead-lettered past the retry limit",
            settled,
            NackReceipts,
        ),
        "extend": (
            "extendMessages",
            "Keep messages invisible for invisible_ms from now; receipts do not change",
            settled,
            ExtendRequest,
        ),
    }
    return {
        f"{prefix}/{action}": {
            "post": _operation(
                op_id, summary, ok, _RECEIVING_ERRORS, body=_ref(body), params=("group", "topic")
            )
        }
        for action, (op_id, summary, ok, body) in ops.items()
    }


def openapi_route() -> Route:
    """The document, made once (it depends on nothing but the types); public, like a
    service's own API description, so a client generator needs no token."""
    encoded = msgspec.json.encode(openapi_document())

    async def endpoint(_: Request) -> Response:
        return Response(encoded, media_type="application/json")

    return Route(PATH, endpoint)
