"""Direct routes (runtime/httpdirect.py): answered by the HTTP server itself, with everything
about the connection as for an app's request: keep-alive, pipelining in order with the app's
requests, chunked bodies, Expect: 100-continue, a body over the limit refused before it is all
read, HTTP/1.0, a failing endpoint, a client gone mid-body, the graceful shutdown. Over real
sockets, against the real server."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from txbroker.runtime.httpdirect import BodyTooLarge, DirectEndpoint, DirectRequest, DirectRoute
from txbroker.runtime.httpserve import HttpServer

LIMIT = 1000


class Endpoints:
    def __init__(self) -> None:
        self.calls = 0
        self.called = asyncio.Event()  # set once /echo is called (before its body is read)
        self.held = asyncio.Event()  # /hold waits for it
        self.holding = asyncio.Event()  # set once /hold waits

    async def echo(self, request: DirectRequest) -> Response:
        self.calls += 1
        self.called.set()
        try:
            body = await request.read(LIMIT)
        except BodyTooLarge:
            return PlainTextResponse("too large", 413)
        name = request.params["name"]
        return PlainTextResponse(f"{name}:{request.header(b'x-tag')}:{len(body)}:{body[:20]!r}")

    async def hold(self, request: DirectRequest) -> Response:
        self.holding.set()
        await self.held.wait()
        return PlainTextResponse("held")

    async def broken(self, request: DirectRequest) -> Response:
        raise RuntimeError("a bug in a direct endpoint")

    async def bad_header(self, request: DirectRequest) -> Response:
        return PlainTextResponse("split", headers={"x-split": "a\r\nx-injected: 1"})

    async def cancelled(self, request: DirectRequest) -> Response:
        raise asyncio.CancelledError  # not an Exception: past the route's failed


def check(request: DirectRequest) -> None:
    if request.header(b"x-deny") is not None:
        raise PermissionError("denied before the endpoint")


def failed(error: Exception, request: DirectRequest) -> Response:
    return PlainTextResponse(f"{request.path} failed: {error}", 418)


def direct(path: str, endpoint: DirectEndpoint) -> DirectRoute:
    return DirectRoute(path, endpoint, methods=["POST"], check=check, failed=failed)


async def plain(request: Request) -> Response:
    return PlainTextResponse("from the app")


@pytest.fixture
async def served() -> AsyncIterator[tuple[Endpoints, HttpServer]]:
    e = Endpoints()
    app = Starlette(
        routes=[
            direct("/echo/{name}", e.echo),
            direct("/hold", e.hold),
            direct("/broken", e.broken),
            direct("/cancelled", e.cancelled),
            direct("/bad-header", e.bad_header),
            Route("/plain", plain),
        ]
    )
    server = HttpServer(app)
    await server.start()
    try:
        yield e, server
    finally:
        e.held.set()
        await server.stop()


async def _connect(server: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.lower()] = value.strip()
        status = int(status_line.split(" ")[1])
        if status == 100:
            return status, headers, b""
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def _exchange(
    server: HttpServer, requests: bytes, answers: int = 1
) -> list[tuple[int, dict[str, str], bytes]]:
    """``requests`` written on a new connection, and their first ``answers`` answers."""
    reader, writer = await _connect(server)
    try:
        writer.write(requests)
        return [await _answer(reader) for _ in range(answers)]
    finally:
        writer.close()


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: t", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def test_keep_alive_and_the_servers_headers(served: tuple[Endpoints, HttpServer]) -> None:
    e, server = served
    reader, writer = await _connect(server)
    for i in range(3):
        writer.write(_post(f"/echo/n{i}", b"x" * i, "X-Tag: t1", "X-Tag: t2"))
        status, headers, body = await _answer(reader)
        assert (status, body) == (200, f"n{i}:t1:{i}:{b'x' * i!r}".encode())
        assert headers["content-type"] == "text/plain; charset=utf-8"
        assert "date" in headers and headers["server"] == "uvicorn"  # as the app's answers
        assert "connection" not in headers
    assert e.calls == 3
    writer.close()


async def test_an_upgrade_not_taken_up_is_answered_by_the_route(
    served: tuple[Endpoints, HttpServer], caplog: pytest.LogCaptureFixture
) -> None:
    e, server = served
    with caplog.at_level(logging.ERROR):
        # As curl --http2 asks over http://; an upgrade's bytes after the headers are not the
        # request's body to the parser, so it has none.
        [(status, _, body)] = await _exchange(
            server, _post("/echo/up", b"", "Connection: Upgrade", "Upgrade: h2c")
        )
    assert (status, body) == (200, b"up:None:0:b''")
    assert e.calls == 1
    assert caplog.records == []


async def test_pipelined_requests_are_answered_in_order_with_the_apps(
    served: tuple[Endpoints, HttpServer],
) -> None:
    _, server = served
    answers = await _exchange(
        server,
        _post("/echo/a", b"1")
        + b"GET /plain HTTP/1.1\r\nHost: t\r\n\r\n"
        + _post("/echo/b", b"22")
        + _post("/echo/%C3%A9", b""),  # the path decoded, as the app's router sees it
        4,
    )
    assert [b for _, _, b in answers] == [
        b"a:None:1:b'1'",
        b"from the app",
        b"b:None:2:b'22'",
        "é:None:0:b''".encode(),
    ]


async def test_a_chunked_body(served: tuple[Endpoints, HttpServer]) -> None:
    e, server = served
    reader, writer = await _connect(server)
    writer.write(
        b"POST /echo/c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    )
    async with asyncio.timeout(10):
        await e.called.wait()  # the endpoint reads the body before the rest of it is sent
    writer.write(b"2\r\nde\r\n0\r\n\r\n")
    assert (await _answer(reader))[2] == b"c:None:5:b'abcde'"
    writer.close()


async def test_expect_100_continue_is_answered_when_the_body_is_read(
    served: tuple[Endpoints, HttpServer],
) -> None:
    _, server = served
    reader, writer = await _connect(server)
    writer.write(
        b"POST /echo/e HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"
    )
    status, _, _ = await _answer(reader)
    assert status == 100
    writer.write(b"body")
    assert (await _answer(reader))[2] == b"e:None:4:b'body'"
    writer.close()


async def test_a_declared_length_over_the_limit_is_refused_before_the_body(
    served: tuple[Endpoints, HttpServer],
) -> None:
    _, server = served
    reader, writer = await _connect(server)
    writer.write(
        f"POST /echo/big HTTP/1.1\r\nHost: t\r\nContent-Length: {LIMIT + 1}\r\n\r\n".encode()
    )
    status, _, body = await _answer(reader)  # no body sent at all
    assert (status, body) == (413, b"too large")
    writer.write(b"y" * (LIMIT + 1) + _post("/echo/next", b"ok"))  # read and dropped, then on
    assert (await _answer(reader))[2] == b"next:None:2:b'ok'"
    writer.close()


async def test_a_chunked_body_over_the_limit_is_refused_as_it_passes_it(
    served: tuple[Endpoints, HttpServer],
) -> None:
    _, server = served
    reader, writer = await _connect(server)
    chunk = b"%x\r\n%s\r\n" % (600, b"z" * 600)
    writer.write(b"POST /echo/big HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    writer.write(chunk + chunk)  # past the limit: answered without the end of the body
    assert (await _answer(reader))[:2][0] == 413
    writer.write(chunk + b"0\r\n\r\n" + _post("/echo/next", b"ok"))
    assert (await _answer(reader))[2] == b"next:None:2:b'ok'"
    writer.close()


async def test_another_method_is_the_apps_405_and_http_10_closes(
    served: tuple[Endpoints, HttpServer],
) -> None:
    _, server = served
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
        r = await client.get("/echo/x")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
    reader, writer = await _connect(server)
    writer.write(b"POST /echo/old HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi")
    status, headers, body = await _answer(reader)
    assert (status, headers["connection"], body) == (200, "close", b"old:None:2:b'hi'")
    async with asyncio.timeout(10):
        assert await reader.read() == b""  # closed after the answer
    writer.close()


async def test_the_check_and_the_endpoints_exceptions_are_the_routes_to_answer(
    served: tuple[Endpoints, HttpServer],
) -> None:
    e, server = served
    broken, denied = await _exchange(
        server, _post("/broken", b"") + _post("/echo/x", b"", "X-Deny: yes"), 2
    )
    status, headers, body = broken
    assert (status, body) == (418, b"/broken failed: a bug in a direct endpoint")
    assert "connection" not in headers  # an answer like any other: the connection stays
    status, _, body = denied
    assert (status, body) == (418, b"/echo/x failed: denied before the endpoint")
    assert e.calls == 0  # refused before the endpoint ran


async def test_what_escapes_an_endpoint_is_logged_and_answered_500(
    served: tuple[Endpoints, HttpServer], caplog: pytest.LogCaptureFixture
) -> None:
    _, server = served
    with caplog.at_level(logging.ERROR):
        [(status, headers, body)] = await _exchange(server, _post("/cancelled", b""))
    assert (status, headers["connection"], body) == (500, "close", b"Internal Server Error")
    assert "Exception in direct route /cancelled" in caplog.text
    with caplog.at_level(logging.ERROR):
        # A header value that would split the answer.
        [(status, headers, body)] = await _exchange(server, _post("/bad-header", b""))
    assert (status, headers["connection"], body) == (500, "close", b"Internal Server Error")
    assert "x-injected" not in headers
    assert "Exception in direct route /bad-header" in caplog.text


async def test_a_client_gone_mid_body_leaves_nothing_behind(
    served: tuple[Endpoints, HttpServer], caplog: pytest.LogCaptureFixture
) -> None:
    e, server = served
    _, writer = await _connect(server)
    with caplog.at_level(logging.ERROR):
        writer.write(b"POST /echo/gone HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        async with asyncio.timeout(10):
            await e.called.wait()  # it waits for the rest of the body
        tasks = set(server._server.server_state.tasks)
        assert tasks
        writer.close()
        async with asyncio.timeout(10):
            await asyncio.wait(tasks)  # its task ends, with nothing to answer
    assert caplog.records == []


async def test_the_graceful_shutdown_answers_a_request_being_served_first(
    served: tuple[Endpoints, HttpServer],
) -> None:
    e, server = served
    reader, writer = await _connect(server)
    writer.write(_post("/hold", b""))
    async with asyncio.timeout(10):
        await e.holding.wait()
    stopping = asyncio.create_task(server.stop())
    done, _ = await asyncio.wait([stopping], timeout=0.3)
    assert not done  # it waits for the answer in flight
    e.held.set()
    status, headers, body = await _answer(reader)
    assert (status, headers["connection"], body) == (200, "close", b"held")
    async with asyncio.timeout(10):
        await stopping
    writer.close()


async def test_an_app_served_elsewhere_refuses_its_direct_routes() -> None:
    e = Endpoints()
    app = Starlette(routes=[direct("/echo/{name}", e.echo)])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        with pytest.raises(RuntimeError, match="DirectRoute"):
            await client.post("/echo/x", content=b"")
    assert e.calls == 0
