"""The HTTP check-back contract: the endpoint a service mounts, request signing, and the
broker-side caller. The barrier-backed resolver lives in ``txbroker_sdk.barrier`` (it needs the
``sdk`` extra: SQLAlchemy and a database driver)."""

from typing import TYPE_CHECKING, Any

from txbroker_checkback.contract import CheckRequest, CheckResponse, CheckStatus
from txbroker_checkback.endpoint import CheckbackEndpoint, Resolver
from txbroker_checkback.signing import HEADER_SIGNATURE, HEADER_TIMESTAMP, sign, verify

if TYPE_CHECKING:
    from txbroker_checkback.caller import CheckOutcome, CheckResult, call_check

# The broker side, imported on first use: it needs httpx (and whatever httpx's own command line
# pulls in), which a service that only mounts the endpoint has no use for in its process.
_CALLER: frozenset[str] = frozenset({"CheckOutcome", "CheckResult", "call_check"})


def __getattr__(name: str) -> Any:
    if name in _CALLER:
        from txbroker_checkback import caller

        return getattr(caller, name)
    raise AttributeError(f"module 'checkback' has no attribute {name!r}")


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
