"""Request signing for check-back calls: HMAC-SHA256 over ``<timestamp>.<body>``.

The broker signs each check with the producer group's secret; the service verifies the
signature and that the timestamp is fresh, so a captured request cannot be replayed later and
nobody without the secret can make a service answer (or learn its transactions' outcomes).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

__all__ = ["HEADER_SIGNATURE", "HEADER_TIMESTAMP", "MAX_SKEW_MS", "sign", "verify"]

HEADER_TIMESTAMP: Final = "X-Txb-Timestamp"
HEADER_SIGNATURE: Final = "X-Txb-Signature"
# Five minutes either way: generous for clock drift between hosts, short for a replay.
MAX_SKEW_MS: Final = 5 * 60 * 1000


def sign(secret: str, timestamp_ms: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp_ms}.".encode() + body, hashlib.sha256)
    return mac.hexdigest()


def verify(
    secret: str,
    timestamp: str,
    body: bytes,
    signature: str,
    now_ms: int,
    max_skew_ms: int = MAX_SKEW_MS,
) -> str | None:
    """None if the request is authentic and fresh, else why not (for the 401 body and logs)."""
    try:
        ts = int(timestamp)
    except ValueError:
        return "timestamp is not an integer"
    if abs(now_ms - ts) > max_skew_ms:
        return f"timestamp is {abs(now_ms - ts) // 1000} s away from now (stale or replayed)"
    if not hmac.compare_digest(sign(secret, ts, body), signature.strip().lower()):
        return "signature does not match"
    return None
