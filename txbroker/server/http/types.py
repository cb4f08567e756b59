"""The JSON bodies of the messaging API, as msgspec types: decoded strictly (an unknown field
is an error, not ignored) and the source of ``/v1/openapi.json``. Answers reuse the TCP
protocol's types where the fields are the same (:class:`TxPrepareResponse`,
:class:`TxEndResponse`), and a pulled back-check is the check-back contract's
:class:`CheckRequest`, the body a check sent over HTTP carries."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from txbroker.protocol.messages import TxEndResponse, TxPrepareResponse
from txbroker.server.receipts import (
    MAX_INVISIBLE_MS,
    MAX_NACK_DELAY_MS,
    MAX_RECEIPTS,
    MAX_RECEIVE,
    MAX_WAIT_MS,
    MIN_INVISIBLE_MS,
    RECEIPT_PATTERN,
    Settled,
)
from txbroker_checkback import CheckRequest

__all__ = [
    "PULL_CHECKS_MAX",
    "PULL_WAIT_MS_MAX",
    "CheckAnswered",
    "CheckRequest",
    "Encoding",
    "ExtendRequest",
    "NackReceipts",
    "PrepareTransaction",
    "PublishBatch",
    "PublishMessage",
    "PullChecks",
    "PulledChecks",
    "Receipt",
    "ReceiptList",
    "Receipts",
    "ReceiveRequest",
    "ReceivedMessage",
    "ReceivedMessages",
    "Settled",
    "TxEndResponse",
    "TxPrepareResponse",
]

# A poll takes at most as many checks as a consumer's pull takes messages, and is held at most
# as long as a consumer's long poll (txbroker.server.consumer: 1,024 and 30 s).
PULL_CHECKS_MAX: Final = 1024
PULL_WAIT_MS_MAX: Final = 30_000

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
    ``check_url`` (docs/checkback.md) if neither commit nor rollback comes in time, or, when
    it is ``pull``, holds the check for the producer group's pollers."""

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


# --- receiving ---

InvisibleMs = Annotated[
    int,
    msgspec.Meta(
        ge=MIN_INVISIBLE_MS,
        le=MAX_INVISIBLE_MS,
        description="how long the messages stay invisible to other receives unless acknowledged",
    ),
]
ReceiptText = Annotated[
    str,
    msgspec.Meta(
        pattern=RECEIPT_PATTERN,
        description="names one delivery of one message; valid until acked or delivered again",
    ),
]
ReceiptTexts = Annotated[list[ReceiptText], msgspec.Meta(min_length=1, max_length=MAX_RECEIPTS)]


class ReceiveRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``POST /v1/groups/{group}/topics/{topic}/receive``."""

    max: Annotated[int, msgspec.Meta(ge=1, le=MAX_RECEIVE, description="messages at most")]
    wait_ms: Annotated[
        int,
        msgspec.Meta(ge=0, le=MAX_WAIT_MS, description="how long to wait when none is there"),
    ]
    invisible_ms: InvisibleMs


class ReceivedMessage(msgspec.Struct, frozen=True):
    """One message received. ``topic`` is the topic it was published to; ``queue`` and
    ``offset`` say where this delivery was read: the topic's queue the first time, the group's
    retry queue when it comes again. ``delivery_attempt``: 1 the first time."""

    message_id: str
    topic: str
    queue: int
    offset: int
    key: str | None
    tags: str | None
    headers: dict[str, str]
    body: Body
    encoding: Encoding
    receipt: str
    delivery_attempt: int


class ReceivedMessages(msgspec.Struct, frozen=True):
    messages: list[ReceivedMessage]


class ReceiptList(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``.../ack``: the receipts of the messages done with."""

    receipts: ReceiptTexts


class NackReceipts(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``.../nack``: messages to deliver again after ``delay_ms`` (without it,
    after the group's retry delay for the attempt), or to dead-letter past the maximum."""

    receipts: ReceiptTexts
    delay_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_NACK_DELAY_MS)] | None = None


class ExtendRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``.../extend``: keep the messages invisible for ``invisible_ms`` from now;
    their receipts do not change."""

    receipts: ReceiptTexts
    invisible_ms: InvisibleMs


# --- back-checks by pull ---


class PullChecks(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A poll for the back-checks due to a producer group: the body of ``POST
    /v1/producer-groups/{group}/checks``."""

    max: Annotated[int, msgspec.Meta(ge=1, le=PULL_CHECKS_MAX)] = 100
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=PULL_WAIT_MS_MAX)] = 0


class PulledChecks(msgspec.Struct, frozen=True):
    """The checks taken, each to answer within ``answer_within_ms`` by commit, rollback or
    unknown; an unanswered one counts as a check that timed out and is offered again."""

    checks: list[CheckRequest]
    answer_within_ms: int


class CheckAnswered(msgspec.Struct, frozen=True):
    """A pulled check answered UNKNOWN: counted; ``next_check_ms`` says when it is due again
    (state ``parked`` when that was the last check ``max_checks`` allows)."""

    tx_id: str
    state: str
    checks: int
    next_check_ms: int
