"""The check-back contract, shared by the broker (caller) and services (endpoint).

POST <check_url>
X-Txb-Timestamp: <ms>   X-Txb-Signature: <hex hmac>   traceparent: <w3c trace context>
{"tx_id", "topic", "key", "message_id", "producer_group", "check_count"}

200 {"status": "COMMIT" | "ROLLBACK" | "UNKNOWN"}
"""

from __future__ import annotations

import enum
from typing import Final

import msgspec

__all__ = ["MAX_BODY_BYTES", "CheckRequest", "CheckResponse", "CheckStatus"]

# A check request is a few hundred bytes; anything far larger is not one of ours.
MAX_BODY_BYTES: Final = 64 * 1024


class CheckStatus(enum.StrEnum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


class CheckRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    tx_id: str
    topic: str
    producer_group: str
    check_count: int
    key: str | None = None
    message_id: str | None = None


class CheckResponse(msgspec.Struct, frozen=True):
    status: CheckStatus
