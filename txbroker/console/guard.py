"""Who may change anything: the checks every POST of the console passes, in order.

1. **Same origin** (:func:`cross_site`): a page elsewhere cannot post here.
2. **A session** (``session.py``): to act, signed in with an admin token on every topic.
3. **The form's CSRF token** matches the session (checked where the form is read).
4. **Without any token**, only from the broker's own host (:func:`local_only`).

Read-only pages need only the session (signed in when there is a token), like the JSON admin
API, which needs the token to read too.
"""

from __future__ import annotations

import ipaddress
from typing import Final
from urllib.parse import parse_qsl

from starlette.requests import Request

__all__ = ["FORM_BYTES_MAX", "FORM_FIELDS_MAX", "cross_site", "local_only", "read_form"]

# A console form holds a CSRF token, a few names and numbers: far under 16 KiB and 16 fields.
FORM_BYTES_MAX: Final = 16 * 1024
FORM_FIELDS_MAX: Final = 16


def cross_site(request: Request) -> str | None:
    """Why this request may come from another site; None if it is same-origin.

    A browser names where a request comes from: ``Sec-Fetch-Site`` must be ``same-origin`` and
    ``Origin`` must be this console's own origin when they are sent (every current browser
    sends both on a form POST)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return f"a cross-site request (Sec-Fetch-Site: {site}) cannot act on this broker"
    origin = request.headers.get("origin")
    if origin is not None:
        own = f"{request.url.scheme}://{request.headers.get('host', '')}"
        if origin != own:
            return f"a request from {origin} cannot act on this broker (its origin is {own})"
    return None


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(host_header: str) -> str:
    """The host of a ``Host`` header: ``[::1]:9877`` -> ``::1``, ``localhost:9877`` ->
    ``localhost``."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    name, sep, port = host_header.rpartition(":")
    return name if sep and port.isdigit() else host_header


def local_only(request: Request) -> str | None:
    """Why this request is not from the broker's own host; None if it is.

    The peer must be a loopback address and the ``Host`` header must name a loopback address or
    ``localhost``. The second half stops DNS rebinding: a page at evil.example whose name is
    made to resolve to 127.0.0.1 sends ``Host: evil.example`` and its own origin, which would
    pass the same-origin check."""
    peer = request.client.host if request.client else ""
    host = _host_name(request.headers.get("host", "")).lower()
    if not _loopback(peer) or not (host == "localhost" or _loopback(host)):
        return (
            "this broker has no token, so the console acts only for requests from its "
            "own host (http://127.0.0.1 or http://localhost); start it with --auth-token to "
            "act from elsewhere"
        )
    return None


async def read_form(request: Request) -> dict[str, str] | None:
    """The fields of a urlencoded form POST (a browser's, as every console form is); None if
    the body is not one, or larger than a console form can be. (The standard library parses
    it: Starlette's own form parsing needs python-multipart, for uploads the console has not.)
    """
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    raw = request.headers.get("content-length", "")
    if kind != "application/x-www-form-urlencoded" or not raw.isdigit():
        return None
    if int(raw) > FORM_BYTES_MAX:
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BYTES_MAX:
            return None
    try:
        fields = parse_qsl(
            body.decode("utf-8"), keep_blank_values=True, max_num_fields=FORM_FIELDS_MAX
        )
    except (UnicodeDecodeError, ValueError):
        return None
    return dict(fields)
