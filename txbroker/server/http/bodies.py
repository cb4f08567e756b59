"""JSON request and answer bodies, as every endpoint of the HTTP API reads and writes them.

:func:`read_json` takes the request's body only as ``application/json`` (``415`` otherwise)
and reads it up to :data:`BODY_BYTES_MAX` (``413`` past it, read no further), as
:func:`read_json_direct` does a direct route's; :func:`decode` decodes it strictly into one of
``types.py``'s msgspec types (``400`` naming what does not match); :func:`json_response`
answers with one.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from txbroker.protocol.frames import MAX_FRAME_BYTES
from txbroker.runtime.httpdirect import BodyTooLarge, DirectRequest
from txbroker.server.http.problems import BadRequest, ContentTooLarge, UnsupportedMediaType

__all__ = [
    "BODY_BYTES_MAX",
    "JSON",
    "decode",
    "json_response",
    "read_json",
    "read_json_direct",
    "undecodable",
]

# A request body is read up to this and refused past it: the TCP protocol's frame bound, which
# holds a message of the largest body the store takes (4 MiB) even base64-encoded (5.4 MiB)
# and a batch of small ones. Each message is then held to the store's own limits.
BODY_BYTES_MAX: Final = MAX_FRAME_BYTES
JSON: Final = "application/json"
T = TypeVar("T")


async def read_json(request: Request) -> bytes:
    """The request's JSON body, read up to :data:`BODY_BYTES_MAX` and refused past it."""
    _check_media(request.headers.get("content-type"))
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > BODY_BYTES_MAX:
        raise _too_large()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > BODY_BYTES_MAX:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_direct(request: DirectRequest) -> bytes:
    """:func:`read_json` for a direct route's request."""
    _check_media(request.header(b"content-type"))
    try:
        return await request.read(BODY_BYTES_MAX)
    except BodyTooLarge as e:
        raise _too_large() from e


def _check_media(content_type: str | None) -> None:
    media = (content_type or "").partition(";")[0].strip().lower()
    if media != JSON:
        raise UnsupportedMediaType(
            f"send the body as {JSON} (Content-Type: {JSON}), not {media or 'no content type'}"
        )


def _too_large() -> ContentTooLarge:
    return ContentTooLarge(
        f"the request body is over {BODY_BYTES_MAX} bytes: send fewer messages per batch"
    )


def decode(raw: bytes, kind: type[T]) -> T:
    """``raw`` as a ``kind``; ``400`` when it is not JSON or does not match the type."""
    try:
        return _decoder(kind).decode(raw)
    except msgspec.DecodeError as e:
        raise undecodable(e, kind) from e


def undecodable(error: msgspec.DecodeError, kind: type) -> BadRequest:
    """The ``400`` for a body msgspec could not decode as a ``kind``: not JSON, or JSON that
    does not match the type (a :class:`msgspec.ValidationError`, a DecodeError's subclass)."""
    if isinstance(error, msgspec.ValidationError):
        return BadRequest(f"the body does not match {kind.__name__}: {error}")
    return BadRequest(f"the body is not valid JSON: {error}")


# One decoder per type, made on first use: decode() is on every request.
_DECODERS: Final[dict[type, msgspec.json.Decoder[Any]]] = {}


def _decoder(kind: type[T]) -> msgspec.json.Decoder[T]:
    found = _DECODERS.get(kind)
    if found is None:
        found = _DECODERS[kind] = msgspec.json.Decoder(kind)
    return found


_encode: Final = msgspec.json.Encoder().encode


class _JsonResponse(Response):
    """A JSON answer: Starlette's Response with its two headers made directly (its generic
    header making cost as much as encoding the answer)."""

    media_type = JSON

    def __init__(self, body: bytes, status: int) -> None:
        self.status_code = status
        self.background = None
        self.body = body
        self.raw_headers = [
            (b"content-length", str(len(body)).encode()),
            (b"content-type", _JSON_BYTES),
        ]


_JSON_BYTES: Final = JSON.encode()


def json_response(answer: msgspec.Struct, status: int) -> Response:
    """``answer`` encoded as JSON, with ``status``."""
    return _JsonResponse(_encode(answer), status)
