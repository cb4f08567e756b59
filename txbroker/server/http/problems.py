"""Errors as RFC 9457 problem details (``application/problem+json``).

Every error of the HTTP API is one :class:`Problem`: ``type``, ``title``, ``status``,
``detail``, and the broker's stable error ``code`` as an extension member (the code a TCP
client sees for the same failure). One subclass per status; :func:`problem_for` maps the
broker's error tree (``txbroker/errors.py``) onto them, here and nowhere else::

    Problem                    status
    ├── BadRequest             400  malformed JSON, a body that does not match its schema
    ├── Unauthorized           401  missing or wrong bearer token
    ├── Forbidden              403  the token lacks the role
    ├── NotFound               404  topic, transaction, message or path
    ├── MethodNotAllowed       405
    ├── Conflict               409  a decision against how a transaction ended; a request
    │                               with the same Idempotency-Key still in flight
    ├── ContentTooLarge        413  the request, or a message, over its limit
    ├── UnsupportedMediaType   415  not application/json
    ├── InvalidArgument        422  well-formed, but not a valid request (a key with a space,
    │                               an Idempotency-Key reused with another body)
    ├── InternalError          500  a bug: logged with its traceback
    └── Unavailable            503  not the master, or retriable trouble (Retry-After)
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

import msgspec
from starlette.responses import Response

from txbroker import errors

__all__ = [
    "CONTENT_TYPE",
    "BadRequest",
    "Conflict",
    "ContentTooLarge",
    "Forbidden",
    "InternalError",
    "InvalidArgument",
    "MethodNotAllowed",
    "NotFound",
    "Problem",
    "ProblemBody",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "problem_for",
]

CONTENT_TYPE: Final = "application/problem+json"
# Problem types are URNs built from the broker's error code: stable, and the same names the
# TCP protocol and the SDK's exceptions use (docs/http-api.md lists them).
TYPE_PREFIX: Final = "urn:txbroker:error:"
# What a client waits before retrying a 503 (the SDK's first reconnect delay is of this order).
RETRY_AFTER_S: Final = 1


class ProblemBody(msgspec.Struct, frozen=True, omit_defaults=True):
    """The JSON of an error answer (RFC 9457, with ``code`` and, for a transaction that
    already ended, its ``state`` as extension members)."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    state: str | None = None


class Problem(Exception):
    """An HTTP error answer; raise it from an endpoint, or let :func:`problem_for` make one."""

    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal Server Error"
    code: ClassVar[str] = errors.Internal.code

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        state: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.error_code = code or self.code
        self.headers = headers or {}
        self.state = state

    def body(self) -> ProblemBody:
        return ProblemBody(
            TYPE_PREFIX + self.error_code,
            self.title,
            self.status,
            self.detail,
            self.error_code,
            self.state,
        )

    def response(self) -> Response:
        return Response(
            msgspec.json.encode(self.body()),
            self.status,
            headers=self.headers,
            media_type=CONTENT_TYPE,
        )


class BadRequest(Problem):
    status, title, code = 400, "Bad Request", errors.BadRequest.code


class Unauthorized(Problem):
    status, title, code = 401, "Unauthorized", errors.Unauthenticated.code

    def __init__(self, detail: str, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.headers.setdefault("WWW-Authenticate", 'Bearer realm="txbroker"')


class Forbidden(Problem):
    status, title, code = 403, "Forbidden", errors.Forbidden.code


class NotFound(Problem):
    status, title, code = 404, "Not Found", errors.NotFound.code


class MethodNotAllowed(Problem):
    status, title, code = 405, "Method Not Allowed", "METHOD_NOT_ALLOWED"


class Conflict(Problem):
    status, title, code = 409, "Conflict", errors.TransactionConflict.code


class ContentTooLarge(Problem):
    status, title, code = 413, "Content Too Large", errors.MessageTooLarge.code


class UnsupportedMediaType(Problem):
    status, title, code = 415, "Unsupported Media Type", "UNSUPPORTED_MEDIA_TYPE"


class InvalidArgument(Problem):
    status, title, code = 422, "Unprocessable Content", errors.InvalidArgument.code


class InternalError(Problem):
    status, title, code = 500, "Internal Server Error", errors.Internal.code


class Unavailable(Problem):
    status, title, code = 503, "Service Unavailable", "UNAVAILABLE"

    def __init__(self, detail: str, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.headers.setdefault("Retry-After", str(RETRY_AFTER_S))


# The broker's errors, most specific first where a subclass answers otherwise than its parent.
_BY_ERROR: Final[dict[type[errors.TxbError], type[Problem]]] = {
    errors.BadRequest: BadRequest,
    errors.MessageTooLarge: ContentTooLarge,
    errors.InvalidArgument: InvalidArgument,
    errors.Unauthenticated: Unauthorized,
    errors.Forbidden: Forbidden,
    errors.NotFound: NotFound,
    errors.TransactionConflict: Conflict,
    errors.ReplicationError: Unavailable,  # not the master; too few slaves had it in time
    errors.StoreError: Unavailable,  # closed, failed, locked: trouble, not a bad request
}


def problem_for(err: errors.TxbError) -> Problem:
    """The answer to a broker error: its class's problem, with the error's own code and
    message; otherwise 503 for a retriable error and 500 for any other."""
    for cls in type(err).__mro__:
        kind = _BY_ERROR.get(cls)
        if kind is not None:
            return kind(str(err), code=err.code)
    kind = Unavailable if err.retriable else InternalError
    return kind(str(err), code=err.code)
