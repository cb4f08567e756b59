"""The connection's one answer path: a handler returns the body, or a Deferred answered when
it settles (a task through ``later``, a future of the body, a body held until a shared future
resolves); every failure is an error frame. Stand-in handlers make the failures certain; the
server and client are real (asyncio TCP in this process, the SDK client)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from txbroker.errors import BadRequest, FrameTooLarge, Internal, NotMaster
from txbroker.protocol.frames import MAX_FRAME_BYTES, Opcode
from txbroker.protocol.messages import Empty, HelloOk
from txbroker.server.connection import Connection, Deferred, later
from txbroker.server.role import WRITES, Role
from txbroker_sdk import Client

TOO_LARGE = b"x" * (MAX_FRAME_BYTES + 1)


class _Handlers:
    """PING answers now, TOPIC_CREATE through a task, TOPIC_LIST through a future of its body,
    TOPIC_DESCRIBE with a body held until a shared future resolves, SEND with a bug; each
    answers what its test sets."""

    def __init__(self) -> None:
        self.answer: Any = Empty()

    def now(self, _: Any) -> Any:
        return self.answer

    def by_task(self, _: Any) -> Deferred:
        async def run() -> Any:
            await asyncio.sleep(0)
            return self.answer

        return later(run())

    def by_future(self, _: Any) -> Deferred:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, self.answer)
        return Deferred(fut)

    def held(self, _: Any) -> Deferred:
        shared: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(shared.set_result, None)
        return Deferred(shared, self.answer, shared=True)

    def buggy(self, _: Any) -> Any:
        raise ZeroDivisionError("a bug in a handler")


@pytest.fixture
async def served() -> AsyncIterator[tuple[_Handlers, Role, str]]:
    h = _Handlers()
    handlers = {
        Opcode.PING: h.now,
        Opcode.TOPIC_CREATE: h.by_task,
        Opcode.TOPIC_LIST: h.by_future,
        Opcode.TOPIC_DESCRIBE: h.held,
        Opcode.SEND: h.buggy,
    }
    role = Role()
    server = await asyncio.get_running_loop().create_server(
        lambda: Connection(
            handlers,
            hello=lambda _: HelloOk("test", 1),
            connections=set(),
            role=role,
        ),
        "127.0.0.1",
        0,
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield h, role, f"txb://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def test_an_answer_too_large_for_a_frame_is_refused_on_every_path(
    served: tuple[_Handlers, Role, str],
) -> None:
    h, _, url = served
    h.answer = TOO_LARGE
    async with await Client.connect(url) as c:
        for op, body in (
            (Opcode.PING, Empty()),
            (Opcode.TOPIC_CREATE, {"topic": "t", "queues": 1}),
            (Opcode.TOPIC_LIST, Empty()),
            (Opcode.TOPIC_DESCRIBE, {"topic": "t"}),
        ):
            with pytest.raises(FrameTooLarge):
                await c.request(op, body, timeout_s=10)
        h.answer = Empty()
        await c.request(Opcode.PING, Empty(), timeout_s=10)  # the connection still serves


async def test_a_handler_bug_answers_internal(served: tuple[_Handlers, Role, str]) -> None:
    _, _, url = served
    async with await Client.connect(url) as c:
        with pytest.raises(Internal, match="ZeroDivisionError"):
            await c.request(Opcode.SEND, {"topic": "t", "body": b"x"}, timeout_s=10)
        await c.request(Opcode.PING, Empty(), timeout_s=10)


async def test_a_refused_opcode_never_reaches_its_handler(
    served: tuple[_Handlers, Role, str],
) -> None:
    _, role, url = served
    role.refuse(WRITES, "this broker is a slave of txb://elsewhere:1")
    async with await Client.connect(url) as c:
        # SEND's handler would answer Internal: the role refuses it first.
        with pytest.raises(NotMaster, match="txb://elsewhere:1"):
            await c.request(Opcode.SEND, {"topic": "t", "body": b"x"}, timeout_s=10)
        await c.request(Opcode.PING, Empty(), timeout_s=10)
        role.serve_all()
        with pytest.raises(Internal):
            await c.request(Opcode.SEND, {"topic": "t", "body": b"x"}, timeout_s=10)


async def test_an_unreadable_answer_fails_its_request_and_not_the_connection(
    served: tuple[_Handlers, Role, str],
) -> None:
    _, _, url = served
    async with await Client.connect(url) as c:
        # TOPIC_CREATE is answered with an empty body here, not the TopicInfo it promises.
        with pytest.raises(BadRequest, match="malformed TOPIC_CREATE response"):
            await c.request(Opcode.TOPIC_CREATE, {"topic": "t", "queues": 1}, timeout_s=10)
        await c.request(Opcode.PING, Empty(), timeout_s=10)
