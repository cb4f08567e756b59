"""JSON request and answer bodies, as every endpoint of the HTTP API reads and writes them.

:func:`read_json` takes the request's body only as ``application/json`` (``415`` otherwise)
and reads it up to :data:`BODY_BYTES_MAX` (``413`` past it, read no further); :func:`decode`
decodes it strictly into one of ``types.py``'s msgspec types (``400`` naming what does not
match); :func:`json_response` answers with one.
"""

from __future__ import annotations

from typing import Final, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from txbroker.protocol.frames import MAX_FRAME_BYTES
from txbroker.server.http.problems import BadRequest, ContentTooLarge, UnsupportedMediaType

__all__ = ["BODY_BYTES_MAX", "JSON", "decode", "json_response", "read_json"]

# A request body is read up to this and refused past it: the TCP protocol's frame bound, which
# holds a message of the largest body the store takes (4 MiB) even base64-encoded (5.4 MiB)
# and a batch of small ones. Each message is then held to the store's own limits.
BODY_BYTES_MAX: Final = MAX_FRAME_BYTES
JSON: Final = "application/json"
T = TypeVar("T")


async def read_json(request: Request) -> bytes:
    """The request's JSON body, read up to :data:`BODY_BYTES_MAX` and refused past it."""
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != JSON:
        raise UnsupportedMediaType(
            f"send the body as {JSON} (Content-Type: {JSON}), not {media or 'no content type'}"
        )
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


def _too_large() -> ContentTooLarge:
    return ContentTooLarge(
        f"the request body is over {BODY_BYTES_MAX} bytes: send fewer messages per batch"
    )


def decode(raw: bytes, kind: type[T]) -> T:
    """``raw`` as a ``kind``; ``400`` when it is not JSON or does not match the type."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as e:
        raise BadRequest(f"the body does not match {kind.__name__}: {e}") from e
    except msgspec.DecodeError as e:
        raise BadRequest(f"the body is not valid JSON: {e}") from e


def json_response(answer: msgspec.Struct, status: int) -> Response:
    """``answer`` encoded as JSON, with ``status``."""
    return Response(msgspec.json.encode(answer), status, media_type=JSON)
