"""The broker side of a check-back: sign, POST, and read the answer strictly.

Anything but a 2xx response whose JSON body is an object with a ``status`` of exactly
``COMMIT``, ``ROLLBACK`` or ``UNKNOWN`` counts as UNKNOWN: a timeout, a refused connection, a
500, an HTML error page, ``{"status": "commit"}``, ``{}``. A misconfigured endpoint that answers
200 to everything therefore never commits a transaction.
"""

from __future__ import annotations

import enum
import socket
import ssl
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
    # What went wrong, in a few words a person can group by ("connection refused", "TLS",
    # "HTTP 500", "signature refused", ...); "answered" when nothing did.
    cause: str = "answered"

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
        status: CheckStatus,
        outcome: CheckOutcome,
        reason: str,
        cause: str,
        code: int | None = None,
    ) -> CheckResult:
        return CheckResult(status, outcome, reason, time.perf_counter() - t0, code, cause)

    unknown = CheckStatus.UNKNOWN
    try:
        resp = await client.post(url, content=body, headers=headers, timeout=timeout_s)
    except httpx.ConnectTimeout:
        cause = "connect timeout"
        return result(
            unknown, CheckOutcome.UNREACHABLE, f"unreachable: {cause} ({timeout_s} s)", cause
        )
    except httpx.PoolTimeout:
        cause = "no free connection"
        return result(
            unknown, CheckOutcome.UNREACHABLE, f"unreachable: {cause} in {timeout_s} s", cause
        )
    except httpx.ConnectError as e:
        # Nothing reached the endpoint: not a check that was asked.
        cause, detail = _connect_failure(e)
        return result(unknown, CheckOutcome.UNREACHABLE, f"unreachable: {cause}: {detail}", cause)
    except httpx.TimeoutException:
        reason = f"no answer within {timeout_s} s"
        return result(unknown, CheckOutcome.TIMEOUT, reason, "timeout")
    except httpx.TransportError as e:
        # Sent, then the connection broke (reset, closed before answering): it was asked.
        reason = f"connection failed: {e!r}"
        return result(unknown, CheckOutcome.BAD_ANSWER, reason, "connection broken")
    code = resp.status_code
    if not 200 <= code < 300:
        if code == 401:  # what the contract's endpoint answers to a bad or stale signature
            reason = (
                "HTTP 401: the endpoint refused the signature (not the producer group's secret "
                "there, or the clocks too far apart)"
            )
            return result(unknown, CheckOutcome.BAD_ANSWER, reason, "signature refused", code)
        return result(unknown, CheckOutcome.BAD_ANSWER, f"HTTP {code}", f"HTTP {code}", code)
    try:
        data = _decoder.decode(resp.content)
        raw = data["status"]
        if not isinstance(raw, str):
            raise TypeError("status is not a string")
        status = CheckStatus(raw)  # exact: "commit" or "Commit" is not COMMIT
    except (msgspec.DecodeError, KeyError, ValueError, TypeError):
        snippet = resp.content[:80]
        reason = f"unreadable body {snippet!r}"
        return result(unknown, CheckOutcome.BAD_ANSWER, reason, "unreadable answer", code)
    return result(status, CheckOutcome.ANSWERED, f"answered {status.value}", "answered", code)


def _connect_failure(e: httpx.ConnectError) -> tuple[str, str]:
    """Why a connection could not be made, as (cause, detail): the first OS or TLS error in
    the exception's chain says it (httpx wraps httpcore's error, which wraps the socket's)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLError):  # before OSError: SSLError is one
            return "TLS", str(seen)
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused", str(seen)
        if isinstance(seen, socket.gaierror):
            return "DNS", str(seen)
        if isinstance(seen, OSError) and seen.errno is not None:
            return "connect failed", str(seen)
        seen = seen.__cause__ or seen.__context__
    return "connect failed", str(e) or repr(e)
