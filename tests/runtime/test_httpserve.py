"""The HTTP server's transport: a response's writes in one turn leave in one send."""

from __future__ import annotations

import asyncio
from typing import Any

from txbroker.runtime.httpserve import _TurnTransport


class _Recorded:
    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append("close")
        self.closing = True

    def abort(self) -> None:
        self.calls.append("abort")
        self.closing = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def test_head_and_body_leave_in_one_send() -> None:
    raw = _Recorded()
    t = _TurnTransport(raw)  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 201 Created\r\n\r\n")
    t.write(b'{"ok":true}')
    t.write(b"")  # h11's end of a Content-Length message
    assert raw.calls == []
    await asyncio.sleep(0)
    assert raw.calls == [b'HTTP/1.1 201 Created\r\n\r\n{"ok":true}']
    assert t.get_extra_info("peername") == "info:peername"  # the rest is the transport's


async def test_close_sends_what_was_written_first_and_abort_drops_it() -> None:
    raw = _Recorded()
    t = _TurnTransport(raw)  # type: ignore[arg-type]
    t.write(b"400")
    t.close()
    await asyncio.sleep(0)
    assert raw.calls == [b"400", "close"]
    raw = _Recorded()
    t = _TurnTransport(raw)  # type: ignore[arg-type]
    t.write(b"half an answer")
    t.abort()
    await asyncio.sleep(0)
    assert raw.calls == ["abort"]
