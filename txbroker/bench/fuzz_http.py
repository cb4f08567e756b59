"""The HTTP admin fuzz: requests no operator or browser should send, to /v1/*, /metrics and
/console (its pages and its forms, signed in and not).

Requests are written by hand on a raw socket, so malformed ones reach the server as sent. Every
answer must be a status below 500 whose error body is JSON or HTML (or the HTTP server's own
plain-text refusal); a 5xx, a malformed JSON body, a static file served from outside the
console's folder, no answer at all, or the broker gone is a crash.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import quote, urlsplit

from txbroker.bench.fuzz_report import FuzzReport, LogWatch, alive, rss_kib

__all__ = ["fuzz_http"]

# An answer of the admin API or the console on a small broker is far below this.
RESPONSE_MAX_BYTES: Final = 8 * 1024 * 1024
CASE_TIMEOUT_S: Final = 10.0
HUGE_BODY_MAX: Final = 16 * 1024 * 1024  # the broker's own frame limit, as an HTTP body
# What uvicorn answers itself to a request it cannot parse (no app involved); the broker adds
# its TCP port after it (for a client that sent frames here).
UNPARSEABLE: Final = b"Invalid HTTP request received."
_CSRF = re.compile(rb'name="csrf" value="([^"]*)"')

_NAMES: Final = (
    "fuzz-healthy", "fz-a", "%RETRY%g", "", ".", "..", "...", "a" * 5000, "ö", "日本語",
    "\U0001f600", "\u202e", "<script>alert(1)</script>", "' OR 1=1 --", "a/b", "a\\b",
    "../../../../etc/passwd", "..%2f..%2f..%2fetc%2fpasswd", "%2e%2e/%2e%2e/etc/passwd",
    "%00", "%ff%fe", "%", "%zz", "%0d%0aSet-Cookie:%20x=1", "null", "-1", "0", "1e309",
    "commit", "rollback", "resume", "{}", "[]", "//evil.example", "http://evil.example/",
    "/console//evil.example", "/console/\\evil.example", "/console/../../x",
)  # fmt: skip
_GET_PATHS: Final = (
    "/healthz", "/v1/topics", "/v1/groups", "/v1/messages?topic={n}&key={n}", "/v1/messages",
    "/v1/messages/{n}", "/metrics", "/v1/transactions?state={n}&topic={n}",
    "/v1/transactions/{n}", "/v1/checks/endpoints", "/console", "/console/",
    "/console/groups", "/console/transactions?topic={n}", "/console/transactions/{n}",
    "/console/deadletters", "/console/reconciliation", "/console/login?next={n}",
    "/console/topics/{n}", "/console/static/{n}", "/console/static/../../{n}", "/{n}",
    "/v1/{n}", "/console/{n}", "//{n}", "/v1/topics/{n}", "/healthz?{n}={n}",
)  # fmt: skip
_POST_PATHS: Final = (
    "/v1/transactions/{n}/{a}", "/console/login", "/console/logout",
    "/console/transactions/{n}/{a}", "/console/deadletters/{n}/redrive", "/v1/topics",
    "/console/", "/healthz", "/v1/topics/{n}/messages", "/v1/topics/fuzz-healthy/messages",
    "/v1/transactions",
)  # fmt: skip
_ACTIONS: Final = ("commit", "rollback", "resume", "delete", "", "..")
_METHODS: Final = (
    "GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "CONNECT", "FOO",
    "get", "G\u00e9T",
)  # fmt: skip
_BODIES: Final = (
    b"{", b"[1,", b'{"a":', b"null", b"\xff\xfe", b'{"topic": "\\ud800"}', b"[" * 10_000,
    b"token=&next=//evil.example", b"csrf=x&csrf=y&max=999999999999",
    b"a=%zz&b=%ff&c=" + b"%00" * 100, b"&".join(b"f%d=1" % i for i in range(100)),
)  # fmt: skip
_MALFORMED: Final = (
    b"GET\r\n\r\n", b"GET /healthz\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    b"GET /healthz HTTP/9.9\r\n\r\n", b"GET /healthz HTTP/1.1\r\nHost\r\n\r\n",
    b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: " + b"y" * 100_000 + b"\r\n\r\n",
    b"POST /console/login HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /console/login HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /console/login HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
    b"POST /console/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 3\r\n\r\nzz\r\n",
    b"POST /console/login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /v1/topics/t/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2\r\n{}\r\nzz\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
    b"GET /v1/topics\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/topics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n\r\n",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class _Crash(Exception):
    """What must not happen: the reason, for the report."""


@dataclass
class _Console:
    """A signed-in console session: its cookie and the CSRF token its forms carry."""

    cookie: str = ""
    csrf: str = ""


def _name(rng: random.Random) -> str:
    n = rng.choice(_NAMES)
    if n.isascii() and rng.random() < 0.7:
        return n  # as written: percent signs, slashes and dots reach the router raw
    return quote(n, safe="") if rng.random() < 0.8 else n  # raw UTF-8 bytes now and then


def _path(rng: random.Random, templates: tuple[str, ...]) -> str:
    path = rng.choice(templates)
    while "{n}" in path:
        path = path.replace("{n}", _name(rng), 1)
    return path.replace("{a}", rng.choice(_ACTIONS))


def _request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape") + body


def _dechunk(raw: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        end = raw.find(b"\r\n", pos)
        size = int(raw[pos:end].split(b";")[0] or b"0", 16) if end >= 0 else 0
        if size == 0:
            return bytes(out)
        out += raw[end + 2 : end + 2 + size]
        pos = end + 2 + size + 2


def _complete(data: bytes | bytearray) -> bool:
    """Whether ``data`` holds a whole answer (a request the server could not parse, sent
    without ``Connection: close``, may leave the connection open after it)."""
    head, sep, body = bytes(data).partition(b"\r\n\r\n")
    if not sep:
        return False
    fields = head.lower().split(b"\r\n")
    for line in fields:
        if line.startswith(b"content-length:"):
            size = line.partition(b":")[2].strip()
            return size.isdigit() and len(body) >= int(size)
    if b"transfer-encoding: chunked" in fields:
        return body.endswith(b"0\r\n\r\n")
    return fields[0].split(b" ")[1:2] in ([b"204"], [b"304"])


async def _send(host: str, port: int, raw: bytes) -> tuple[_Answer | None, bool]:
    """Write ``raw`` and read the answer to its end: the answer (None if the connection ended
    without one) and whether all of ``raw`` was written."""
    reader, writer = await asyncio.open_connection(host, port)
    sent = False

    async def write() -> None:
        nonlocal sent
        try:
            for i in range(0, len(raw), 1 << 20):
                writer.write(raw[i : i + (1 << 20)])
                await writer.drain()
            sent = True
        except OSError:
            pass  # the server answered and closed before reading it all: allowed

    sending = asyncio.create_task(write())
    data = bytearray()
    try:
        while len(data) < RESPONSE_MAX_BYTES and not _complete(data):
            chunk = await reader.read(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass  # a reset after the answer (the body was not read): what arrived is kept
    finally:
        sending.cancel()
        writer.close()
    head, sep, body = bytes(data).partition(b"\r\n\r\n")
    if not sep:
        return None, sent
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = _dechunk(body)
    return _Answer(int(status_line.split(" ", 2)[1]), headers, body), sent


def _judge(method: str, path: str, answer: _Answer | None, sent: bool) -> str:
    """The answer's kind (``404 json``); raises _Crash for what must not happen."""
    if answer is None:
        if not sent:
            # The server answered and closed before reading the whole body (a refusal need
            # not read it); the reset that close sends can destroy the answer in the
            # client's kernel before it is read. Not the broker's failure.
            return "reset while the body was sent"
        raise _Crash(f"{method} {path[:80]!r}: closed without an answer")
    kind = answer.headers.get("content-type", "").partition(";")[0] or "empty"
    label = {
        "application/json": "json",
        "application/problem+json": "json",  # RFC 9457: every error of the HTTP API
        "text/html": "html",
        "text/plain": "text",
    }.get(kind, kind)
    if 300 <= answer.status < 400:
        label = "redirect"
    where = f"{method} {path[:80]!r} -> {answer.status} {label}"
    if label == "redirect":
        # Every request names Host: 127.0.0.1; a redirect elsewhere would be an open redirect
        # (the console's ``next`` and ``back`` fields are fuzzed with //evil.example and such).
        target = urlsplit(answer.headers.get("location", ""))
        if target.netloc and target.hostname != "127.0.0.1":
            raise _Crash(f"{where}: a redirect off the host, to {target.geturl()[:100]!r}")
    if answer.status >= 500:
        raise _Crash(f"{where}: {answer.body[:200]!r}")
    if label == "json" and method != "HEAD":  # an answer to HEAD has headers only
        try:
            json.loads(answer.body)
        except ValueError as e:
            raise _Crash(f"{where}: not JSON: {answer.body[:100]!r}") from e
    if answer.status >= 400 and label not in ("json", "html") and method != "HEAD":
        if not answer.body.startswith(UNPARSEABLE):
            raise _Crash(f"{where}: an error that is neither JSON nor HTML: {answer.body[:100]!r}")
        label = "text (unparseable request)"
    if "/static/" in path and answer.status == 200 and b"root:" in answer.body:
        raise _Crash(f"{where}: a file from outside the console's static folder")
    return f"{answer.status} {label}"


def _auth(rng: random.Random, token: str) -> dict[str, str]:
    return {
        0: {},
        1: {"Authorization": f"Bearer {token}"},
        2: {"Authorization": rng.choice(["Bearer", "Bearer ", "bearer " + token, "Basic eDp5"])},
        3: {"Authorization": "Bearer " + token + "x" * rng.choice([1, 100, 8000])},
        4: {"Authorization": "Bearer \u00e9\u00e8", "Cookie": "txb_console=" + "A" * 300},
    }[rng.randrange(5)]


def _console_headers(rng: random.Random, console: _Console) -> dict[str, str]:
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if rng.random() < 0.7:
        headers["Cookie"] = f"txb_console={console.cookie}"
    if rng.random() < 0.2:
        headers["Origin"] = rng.choice(["http://evil.example", "null", "http://127.0.0.1"])
    if rng.random() < 0.1:
        headers["Sec-Fetch-Site"] = rng.choice(["cross-site", "same-origin", "none"])
    return headers


def _console_form(rng: random.Random, console: _Console) -> bytes:
    fields = {"csrf": console.csrf if rng.random() < 0.7 else _name(rng)}
    for key in rng.sample(["token", "next", "back", "max"], rng.randrange(5)):
        fields[key] = _name(rng)
    return "&".join(f"{k}={quote(v, safe='%')}" for k, v in fields.items()).encode()


Case = Callable[[random.Random, str, _Console], tuple[str, str, bytes]]


def _odd_path(rng: random.Random, token: str, console: _Console) -> tuple[str, str, bytes]:
    method, path = rng.choice(["GET", "GET", "HEAD"]), _path(rng, _GET_PATHS)
    return method, path, _request(method, path, _auth(rng, token))


def _bad_method(rng: random.Random, token: str, console: _Console) -> tuple[str, str, bytes]:
    method, path = rng.choice(_METHODS), _path(rng, _GET_PATHS + _POST_PATHS)
    return method, path, _request(method, path, _auth(rng, token))


def _bad_body(rng: random.Random, token: str, console: _Console) -> tuple[str, str, bytes]:
    path = _path(rng, _POST_PATHS)
    body = rng.choice(_BODIES) if rng.random() < 0.7 else rng.randbytes(rng.randrange(65536))
    headers = {**_auth(rng, token), **_console_headers(rng, console)}
    headers["Content-Type"] = rng.choice(
        ["application/json", "application/x-www-form-urlencoded", "multipart/form-data", "x/y"]
    )
    return "POST", path, _request("POST", path, headers, body)


def _huge_body(rng: random.Random, token: str, console: _Console) -> tuple[str, str, bytes]:
    path = _path(rng, _POST_PATHS)
    size = rng.choice([1 << 20, 4 << 20, HUGE_BODY_MAX]) if rng.random() < 0.2 else 256 << 10
    body = b"x=" + b"a" * size
    headers = {**_auth(rng, token), **_console_headers(rng, console)}
    return "POST", path, _request("POST", path, headers, body)


def _console_action(rng: random.Random, token: str, console: _Console) -> tuple[str, str, bytes]:
    path = _path(rng, _POST_PATHS[1:5])
    body = _console_form(rng, console)
    return "POST", path, _request("POST", path, _console_headers(rng, console), body)


def _malformed(rng: random.Random, token: str, console: _Console) -> tuple[str, str, bytes]:
    raw = rng.choice(_MALFORMED)
    return "RAW", raw[:40].decode("latin-1"), raw


CASES: Final[dict[str, Case]] = {
    "odd path": _odd_path,
    "bad method": _bad_method,
    "bad body": _bad_body,
    "huge body": _huge_body,
    "console form": _console_action,
    "malformed request": _malformed,
}


async def _sign_in(host: str, port: int, token: str) -> _Console:
    form = f"token={quote(token)}&next=/console/".encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    answer, _ = await _send(host, port, _request("POST", "/console/login", headers, form))
    cookie = answer.headers.get("set-cookie", "") if answer else ""
    value = cookie.partition("txb_console=")[2].partition(";")[0]
    cookie_header = {"Cookie": f"txb_console={value}"}
    page, _ = await _send(host, port, _request("GET", "/console/", cookie_header))
    found = _CSRF.search(page.body) if page else None
    if not value or found is None:
        raise RuntimeError("could not sign in to the console with the admin token")
    return _Console(value, found.group(1).decode())


async def fuzz_http(
    http_url: str,
    pid: int,
    token: str,
    *,
    cases: int,
    seconds: float,
    seed: int,
    concurrency: int = 4,
    log_path: Path | None = None,
) -> FuzzReport:
    """Run up to ``cases`` requests for up to ``seconds`` against the broker's HTTP port at
    ``http_url`` (process ``pid``, admin ``token``), ``concurrency`` at a time; the tracebacks
    its log at ``log_path`` gains meanwhile are counted."""
    where = urlsplit(http_url)
    host, port = where.hostname or "127.0.0.1", where.port or 80
    report = FuzzReport("http", seed)
    console = await _sign_in(host, port, token)
    report.rss_before_kib = rss_kib(pid)
    log = LogWatch(log_path)
    start = time.monotonic()
    next_case = iter(range(cases))

    async def worker() -> None:
        for case in next_case:
            if time.monotonic() - start > seconds or not alive(pid):
                return
            rng = random.Random(f"{seed}:{case}")
            kind = rng.choice(sorted(CASES))
            method, path, raw = CASES[kind](rng, token, console)
            try:
                async with asyncio.timeout(CASE_TIMEOUT_S):
                    outcome = _judge(method, path, *await _send(host, port, raw))
            except _Crash as e:
                report.crash(case, f"{kind}: {e}")
                outcome = "crash"
            except TimeoutError:
                report.crash(case, f"{kind}: {method} {path[:80]!r}: no answer in time")
                outcome = "crash"
            report.cases += 1
            report.outcomes[f"{kind}: {outcome}"] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    report.seconds = time.monotonic() - start
    if not alive(pid):
        report.crash(report.cases, "the broker process exited")
    report.rss_after_kib = rss_kib(pid)
    report.tracebacks = log.tracebacks()
    return report
