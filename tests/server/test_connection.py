"""The connection's two ways to run a request (a task of its handler, or a direct handler that
answers now, with a future, or hands over to the task), each answering every failure with an
error frame. Stand-in handlers make the failures certain; the server and client are real
(asyncio TCP in this process, the SDK client)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from txbroker.errors import BadRequest, FrameTooLarge, Internal
from txbroker.protocol.frames import MAX_FRAME_BYTES, Opcode
from txbroker.protocol.messages import Empty, HelloOk
from txbroker.server.connection import Connection
from txbroker_sdk import Client

TOO_LARGE = b"x" * (MAX_FRAME_BYTES + 1)


class _Handlers:
    """PING and TOPIC_CREATE by task, TOPIC_LIST direct (answered later through a future), SEND
    direct with a bug, TOPIC_DELETE direct handing over to its task; each answers what its test
    sets."""

    def __init__(self) -> None:
        self.answer: Any = Empty()
        self.handed_over = 0

    async def by_task(self, _: Any) -> Any:
        return self.answer

    def later(self, _: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, self.answer)
        return fut

    def buggy(self, _: Any) -> Any:
        raise ZeroDivisionError("a bug in a direct handler")

    def hand_over(self, _: Any) -> None:
        self.handed_over += 1
        return None


@pytest.fixture
async def served() -> AsyncIterator[tuple[_Handlers, str]]:
    h = _Handlers()
    handlers = {
        Opcode.PING: h.by_task,
        Opcode.TOPIC_LIST: h.by_task,
        Opcode.SEND: h.by_task,
        Opcode.TOPIC_CREATE: h.by_task,
        Opcode.TOPIC_DELETE: h.by_task,
    }
    direct = {Opcode.TOPIC_LIST: h.later, Opcode.SEND: h.buggy, Opcode.TOPIC_DELETE: h.hand_over}
    server = await asyncio.get_running_loop().create_server(
        lambda: Connection(
            handlers,
            hello=lambda _: HelloOk("test", 1),
            connections=set(),
            direct=direct,
        ),
        "127.0.0.1",
        0,
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield h, f"txb://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def test_an_answer_too_large_for_a_frame_is_refused_on_either_path(
    served: tuple[_Handlers, str],
) -> None:
    h, url = served
    h.answer = TOO_LARGE
    async with await Client.connect(url) as c:
        with pytest.raises(FrameTooLarge):
            await c.request(Opcode.PING, Empty(), timeout_s=10)  # task
        with pytest.raises(FrameTooLarge):
            await c.request(Opcode.TOPIC_LIST, Empty(), timeout_s=10)  # direct, via a future
        h.answer = Empty()
        await c.request(Opcode.PING, Empty(), timeout_s=10)  # the connection still serves


async def test_a_direct_handler_bug_or_hand_over_still_answers(
    served: tuple[_Handlers, str],
) -> None:
    h, url = served
    async with await Client.connect(url) as c:
        with pytest.raises(Internal, match="ZeroDivisionError"):
            await c.request(Opcode.SEND, {"topic": "t", "body": b"x"}, timeout_s=10)
        # None from the direct handler: the request runs as a task of its handler instead.
        await c.request(Opcode.TOPIC_DELETE, {"topic": "t"}, timeout_s=10)
        assert h.handed_over == 1


async def test_an_unreadable_answer_fails_its_request_and_not_the_connection(
    served: tuple[_Handlers, str],
) -> None:
    _, url = served
    async with await Client.connect(url) as c:
        # TOPIC_CREATE is answered with an empty body here, not the TopicInfo it promises.
        with pytest.raises(BadRequest, match="malformed TOPIC_CREATE response"):
            await c.request(Opcode.TOPIC_CREATE, {"topic": "t", "queues": 1}, timeout_s=10)
        await c.request(Opcode.PING, Empty(), timeout_s=10)
