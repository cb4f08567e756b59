"""HTTP met where txbroker frames belong, and the words that name the right port.

A broker has two ports: TCP (``txb://``, frames) and HTTP (the API and the console). People
remember the console's URL, so its port is given where the TCP port belongs, and the TCP port
gets curled. The two cannot be mistaken for each other: HTTP starts with an ASCII letter, which
read as a frame's u32 length is over ``MAX_FRAME_BYTES``, so the decoder looks for HTTP where it
would refuse the length, and nowhere else (nothing is added to a well-formed stream's path).

The broker's HTTP port adds :func:`http_port_note` to its 400 answer to bytes that are not
HTTP, and a client reads the TCP port back with :func:`tcp_port_named`; the broker's TCP port
answers an HTTP request with :func:`http_refusal`, plain HTTP that curl or a browser shows.
"""

from __future__ import annotations

import re
from typing import Final

from txbroker.errors import WrongPort

__all__ = [
    "SEEN_BYTES_MAX",
    "first_line",
    "http_met",
    "http_port_note",
    "http_refusal",
    "tcp_port_named",
]

# What an HTTP stream's first four bytes are: an answer's status line, or a request's method
# (RFC 9110's methods, and HTTP/2's connection preface "PRI * HTTP/2.0").
_ANSWER: Final = b"HTTP"
_REQUESTS: Final = frozenset(
    {b"GET ", b"HEAD", b"POST", b"PUT ", b"DELE", b"PATC", b"OPTI", b"CONN", b"TRAC", b"PRI "}
)
# The head of an HTTP stream kept for the error: an answer's status line, headers and a short
# text fit in it (uvicorn's 400 is under 200 bytes).
SEEN_BYTES_MAX: Final = 1024
# A status or request line is shown cut to this many characters.
_LINE_CHARS_MAX: Final = 80

_NOTE: Final = "This is a txbroker HTTP port; the broker's TCP port is {port}."
_NOTE_PATTERN: Final = re.compile(
    rb"This is a txbroker HTTP port; the broker's TCP port is (\d{1,5})\."
)


def http_met(head: bytes | bytearray | memoryview) -> WrongPort | None:
    """The error for a stream whose first bytes (``head``, at least four) are HTTP's; None for
    anything else (then a too-large length is just that)."""
    start = bytes(head[:4])
    if start != _ANSWER and start not in _REQUESTS:
        return None
    seen = bytes(head[:SEEN_BYTES_MAX])
    if start == _ANSWER:
        return WrongPort(
            f"an HTTP answer ({first_line(seen)}) where txbroker frames belong: the address is "
            "an HTTP port, not a broker's TCP port",
            seen,
        )
    return WrongPort(
        f"an HTTP request ({first_line(seen)}) at a txbroker TCP port, which speaks txbroker "
        "frames, not HTTP",
        seen,
    )


def first_line(seen: bytes) -> str:
    """An HTTP stream's first line, printable and cut short."""
    line = seen.split(b"\r\n", 1)[0].split(b"\n", 1)[0][:_LINE_CHARS_MAX]
    return "".join(c if c.isprintable() else "?" for c in line.decode("ascii", "replace"))


def http_port_note(tcp_port: int) -> str:
    """What the broker's HTTP port adds to its 400 answer to bytes that are not HTTP (ASCII)."""
    return _NOTE.format(port=tcp_port)


def tcp_port_named(answer: bytes) -> int | None:
    """The TCP port an HTTP answer names with :func:`http_port_note`, if it does."""
    m = _NOTE_PATTERN.search(answer)
    return int(m.group(1)) if m else None


def http_refusal(http_port: int) -> bytes:
    """The TCP port's whole answer to an HTTP request, naming the HTTP port (0: none known)."""
    where = (
        f"this broker's HTTP port (API, console) is {http_port}"
        if http_port
        else "a broker serves HTTP on its --http-port"
    )
    body = (
        f"This is a txbroker TCP port: it speaks txbroker's binary protocol (txb://), not HTTP; "
        f"{where}.\n"
    ).encode()
    head = (
        "HTTP/1.1 400 Bad Request\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body
