"""One TCP connection of a :class:`~txbroker_sdk.connection.Connection`, as an asyncio protocol.

Frames are decoded in ``data_received`` as their bytes arrive and handed to the client there,
not by a reader task (see the connection module's docstring for why).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from txbroker.errors import ProtocolError
from txbroker.protocol.codec import FrameDecoder
from txbroker_sdk.errors import ConnectionClosed

if TYPE_CHECKING:
    from txbroker_sdk.connection import Connection

__all__ = ["Wire"]


class Wire(asyncio.Protocol):
    """One TCP connection of a :class:`Connection`: decodes frames as bytes arrive and hands them
    to the client, and fails the client's requests when the connection ends. A connection the
    client has already replaced reports nothing."""

    def __init__(self, client: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._decoder = FrameDecoder()
        self._transport: asyncio.BaseTransport | None = None
        self.lost: asyncio.Future[None] = loop.create_future()

    def _current(self) -> bool:
        return self._client._wire is self

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Close now, dropping what is still buffered to send."""
        if self._transport is not None:
            cast("asyncio.Transport", self._transport).abort()  # a TCP (or TLS) transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if not self._current():
            return
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as e:
            self._client._fail(e)
            self.close()
            return
        self._client._answered(frames)

    def eof_received(self) -> bool:
        if self._current():
            self._client._fail(ConnectionClosed("the broker closed the connection"))
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._current():
            reason = f"connection lost: {exc}" if exc is not None else "the connection closed"
            err = ConnectionClosed(reason)
            err.__cause__ = exc  # an ssl.SSLError tells the client why TLS ended
            self._client._fail(err)
        if not self.lost.done():
            self.lost.set_result(None)
