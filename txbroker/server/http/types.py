"""The JSON bodies of the messaging API, as msgspec types: decoded strictly (an unknown field
is an error, not ignored) and the source of ``/v1/openapi.json``. Answers reuse the TCP
protocol's types where the fields are the same (:class:`TxPrepareResponse`,
:class:`TxEndResponse`)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from txbroker.protocol.messages import TxEndResponse, TxPrepareResponse

__all__ = [
    "Encoding",
    "PrepareTransaction",
    "PublishBatch",
    "PublishMessage",
    "Receipt",
    "Receipts",
    "TxEndResponse",
    "TxPrepareResponse",
]

Encoding = Literal["utf-8", "base64"]
Body = Annotated[
    str,
    msgspec.Meta(description="the message body: text, or base64 when encoding is base64"),
]


class PublishMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One message to publish: the body of ``POST /v1/topics/{topic}/messages``, or one item of
    a batch."""

    body: Body
    encoding: Encoding = "utf-8"
    key: str | None = None
    tags: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    deliver_at_ms: int | None = None
    idempotency_key: str | None = None  # in a batch; a single message takes the header too


class PublishBatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Messages published all or nothing, in one group commit."""

    messages: list[PublishMessage]


class Receipt(msgspec.Struct, frozen=True):
    """Where a published message is stored; ``duplicate``: its idempotency key was stored
    before, and this is that message's receipt (nothing new was stored)."""

    message_id: str
    topic: str
    queue: int
    offset: int  # -1 for a delayed message, until it is delivered
    duplicate: bool


class Receipts(msgspec.Struct, frozen=True):
    receipts: list[Receipt]


class PrepareTransaction(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A half message: stored, invisible to consumers until committed; the broker calls
    ``check_url`` (docs/checkback.md) if neither commit nor rollback comes in time."""

    topic: str
    body: Body
    producer_group: str
    check_url: str
    encoding: Encoding = "utf-8"
    tx_id: str | None = None
    key: str | None = None
    tags: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    timeout_ms: int | None = None
