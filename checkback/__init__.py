"""The HTTP check-back contract: the endpoint a service mounts, request signing, and the
broker-side caller. The barrier-backed resolver lives in ``checkback.barrier`` (it needs the
``sdk`` extra: SQLAlchemy and a database driver)."""

from checkback.caller import CheckOutcome, CheckResult, call_check
from checkback.contract import CheckRequest, CheckResponse, CheckStatus
from checkback.endpoint import CheckbackEndpoint, Resolver
from checkback.signing import HEADER_SIGNATURE, HEADER_TIMESTAMP, sign, verify

__all__ = [
    # contract
    "CheckRequest",
    "CheckResponse",
    "CheckStatus",
    # service side
    "CheckbackEndpoint",
    "Resolver",
    # broker side
    "CheckOutcome",
    "CheckResult",
    "call_check",
    # signing
    "HEADER_SIGNATURE",
    "HEADER_TIMESTAMP",
    "sign",
    "verify",
]
