"""One TCP connection of a :class:`~txbroker_sdk.connection.Connection`, as an asyncio protocol.

Frames are decoded in ``data_received`` as their bytes arrive and handed to the client there,
not by a reader task (see the connection module's docstring for why). The answers that complete
a waiting request, nearly all of them, complete it here, in compiled code; what else arrives
(error answers, answers to posted requests, the broker's word on the connection itself) the
connection's ``_answered`` handles.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final, cast

from txbroker.errors import ProtocolError, TxbError
from txbroker.protocol.codec import FrameDecoder
from txbroker.protocol.frames import FrameKind, Opcode
from txbroker.protocol.messages import RESPONSE_DECODERS, decode_response
from txbroker_sdk.errors import ConnectionClosed

if TYPE_CHECKING:
    from txbroker_sdk.connection import Connection

__all__ = ["Wire"]

# As plain ints: compiled, a Final int is a constant, where an enum member is looked up.
_RESPONSE: Final = int(FrameKind.RESPONSE)
_STREAM: Final = int(Opcode.STREAM)


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
        client = self._client
        client._heard = True
        pending, deadlines = client._pending, client._deadlines
        n = len(frames)
        i = 0
        while i < n:
            frame = frames[i]
            if frame.kind != _RESPONSE or frame.opcode == _STREAM:
                break
            corr = frame.corr_id
            entry = pending.get(corr)
            if entry is None:
                break  # a posted request's, or one that timed out
            del pending[corr]
            deadlines.pop(corr, None)
            i += 1
            opcode, fut = entry
            if fut.done():
                continue  # cancelled by its caller
            dec = RESPONSE_DECODERS.get(opcode)
            if dec is not None:
                try:
                    answer = dec.decode(frame.body)  # the decoder's own call, no wrapper
                except Exception:
                    pass  # decode_response below says what is wrong, as it says everywhere
                else:
                    fut.set_result(answer)
                    continue
            try:
                fut.set_result(decode_response(opcode, frame.body))
            except TxbError as e:  # an unreadable answer fails its request, not the connection
                fut.set_exception(e)
        if i < n:
            client._answered(frames[i:] if i else frames)

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
