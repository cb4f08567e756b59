"""The broker side of a check-back: sign, POST, and read the answer strictly.

Anything but a 2xx response whose JSON body is an object with a ``status`` of exactly
``COMMIT``, ``ROLLBACK`` or ``UNKNOWN`` counts as UNKNOWN: a timeout, a refused connection, a
500, an HTML error page, ``{"status": "commit"}``, ``{}``. A misconfigured endpoint that answers
200 to everything therefore never commits a transaction.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

import httpx
import msgspec

from txbroker_checkback.contract import CheckRequest, CheckStatus
from txbroker_checkback.signing import HEADER_SIGNATURE, HEADER_TIMESTAMP, sign

__all__ = ["CheckOutcome", "CheckResult", "call_check"]

_decoder = msgspec.json.Decoder(dict[str, object])


class CheckOutcome(enum.StrEnum):
    ANSWERED = "answered"  # the endpoint answered (COMMIT, ROLLBACK or UNKNOWN in status)
    BAD_ANSWER = "bad_answer"  # answered, but not per the contract: counts as UNKNOWN
    TIMEOUT = "timeout"  # sent, no answer in time: counts as UNKNOWN
    UNREACHABLE = "unreachable"  # never sent (refused, DNS, ...): UNKNOWN, not counted as a check


@dataclass(frozen=True, slots=True)
class CheckResult:
    status: CheckStatus
    outcome: CheckOutcome
    reason: str
    seconds: float
    http_status: int | None = None  # the response's status code, when one came

    @property
    def sent(self) -> bool:
        """Whether the request reached the endpoint (only those count towards parking)."""
        return self.outcome is not CheckOutcome.UNREACHABLE


async def call_check(
    client: httpx.AsyncClient,
    url: str,
    request: CheckRequest,
    secret: str,
    traceparent: str | None,
    timeout_s: float,
) -> CheckResult:
    body = msgspec.json.encode(request)
    ts = time.time_ns() // 1_000_000
    headers = {
        "content-type": "application/json",
        HEADER_TIMESTAMP: str(ts),
        HEADER_SIGNATURE: sign(secret, ts, body),
    }
    if traceparent:  # not signed (the signature covers the timestamp and the body only)
        headers["traceparent"] = traceparent
    t0 = time.perf_counter()

    def result(
        status: CheckStatus, outcome: CheckOutcome, reason: str, code: int | None = None
    ) -> CheckResult:
        return CheckResult(status, outcome, reason, time.perf_counter() - t0, code)

    try:
        resp = await client.post(url, content=body, headers=headers, timeout=timeout_s)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
        # Nothing reached the endpoint: not a check that was asked.
        return result(CheckStatus.UNKNOWN, CheckOutcome.UNREACHABLE, f"unreachable: {e!r}")
    except httpx.TimeoutException:
        return result(CheckStatus.UNKNOWN, CheckOutcome.TIMEOUT, f"no answer within {timeout_s} s")
    except httpx.TransportError as e:
        # Sent, then the connection broke (reset, closed before answering): it was asked.
        return result(CheckStatus.UNKNOWN, CheckOutcome.BAD_ANSWER, f"connection failed: {e!r}")
    if not 200 <= resp.status_code < 300:
        code = resp.status_code
        return result(CheckStatus.UNKNOWN, CheckOutcome.BAD_ANSWER, f"HTTP {code}", code)
    try:
        data = _decoder.decode(resp.content)
        raw = data["status"]
        if not isinstance(raw, str):
            raise TypeError("status is not a string")
        status = CheckStatus(raw)  # exact: "commit" or "Commit" is not COMMIT
    except (msgspec.DecodeError, KeyError, ValueError, TypeError):
        snippet = resp.content[:80]
        reason = f"unreadable body {snippet!r}"
        return result(CheckStatus.UNKNOWN, CheckOutcome.BAD_ANSWER, reason, resp.status_code)
    return result(status, CheckOutcome.ANSWERED, f"answered {status.value}", resp.status_code)
