"""A bare TCP client of the wire protocol, for tests that must behave as no SDK client does:
stay silent, skip HELLO, flood frames; and read how the broker ended the connection."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from txbroker.protocol.codec import Frame, FrameDecoder, encode_frame
from txbroker.protocol.frames import FrameKind, Opcode
from txbroker.protocol.messages import ErrorBody, Hello, decode_error, encode_body
from txbroker_sdk.requests import parse_server_url

__all__ = ["RawClient", "open_idle_sockets"]


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._decoder = FrameDecoder()
        self._corr = 0

    @classmethod
    async def open(cls, url: str) -> RawClient:
        host, port = parse_server_url(url)
        async with asyncio.timeout(10):
            reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    def send(self, opcode: Opcode, body: Any, *, times: int = 1) -> None:
        """Queue ``times`` copies of a request, in one write."""
        frames = []
        for _ in range(times):
            self._corr += 1
            frames.append(encode_frame(FrameKind.REQUEST, opcode, self._corr, encode_body(body)))
        self._writer.write(b"".join(frames))

    async def request(self, opcode: Opcode, body: Any, timeout_s: float = 10) -> Frame:
        self.send(opcode, body)
        corr = self._corr
        async with asyncio.timeout(timeout_s):
            while True:
                data = await self._reader.read(65536)
                assert data, "the broker closed the connection"
                for frame in self._decoder.feed(data):
                    if frame.corr_id == corr or frame.opcode == Opcode.STREAM:
                        return frame

    async def hello(self, token: str | None = None) -> None:
        frame = await self.request(Opcode.HELLO, Hello("raw-test", token))
        assert frame.kind == FrameKind.RESPONSE, decode_error(frame.body)

    async def ended_with(self, timeout_s: float = 10) -> ErrorBody | None:
        """Read until the broker closes the connection (at most ``timeout_s``): the error it
        sent on the STREAM opcode, None if it closed without one."""
        frames: list[Frame] = []
        async with asyncio.timeout(timeout_s):
            while data := await self._reader.read(65536):
                frames += self._decoder.feed(data)
        errors = [f for f in frames if f.opcode == Opcode.STREAM]
        return decode_error(errors[-1].body) if errors else None

    async def close(self) -> None:
        self._writer.close()
        try:
            async with asyncio.timeout(5):
                await self._writer.wait_closed()
        except (OSError, TimeoutError):
            pass  # already reset by the broker: nothing to wait for


def open_idle_sockets(url: str, n: int) -> list[socket.socket]:
    """``n`` connections that never send a byte (blocking connects: run it in a thread)."""
    host, port = parse_server_url(url)
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            socks.append(socket.create_connection((host, port), timeout=10))
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks
