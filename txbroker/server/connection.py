"""One client connection: frames in, handler calls, frames out.

The protocol object owns only I/O concerns: the sans-IO decoder, the auth gate, per-connection
bounds and error frames. Each request is decoded, checked (``access.py``, then the broker's
``Role``), and handed to its handler, called at once: it returns the response body or a
:class:`Deferred`, answered when that settles. Any failure becomes an error frame for that
request; a malformed stream gets one STREAM error frame and the connection is closed.
Connection limits are ``admission.py``'s; the connection reports its lifecycle and spends one
token per frame.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, cast

from txbroker.errors import (
    BadRequest,
    Internal,
    ProtocolError,
    RateLimited,
    TooManyConnections,
    TxbError,
    Unauthenticated,
    WrongPort,
)
from txbroker.protocol.codec import Frame, FrameDecoder, encode_frame
from txbroker.protocol.frames import FrameKind, Opcode
from txbroker.protocol.messages import ErrorBody, Hello, decode_request, encode_body
from txbroker.protocol.wrongport import first_line, http_refusal
from txbroker.runtime.turnwriter import TurnWriter
from txbroker.server.access import Access
from txbroker.server.admission import Admission
from txbroker.server.role import Role
from txbroker.server.tokens import Principal, TokenTable

__all__ = ["Connection", "Deferred", "Handler", "later", "settle"]

log = logging.getLogger(__name__)

# A handler takes the decoded request and returns the response body, or a Deferred.
Handler = Callable[[Any], Any]

_RESULT: Final[Any] = object()  # Deferred.answer: the answer is ``when``'s result
# What every request's path compares with, as plain ints: compiled, a Final int is a constant,
# where reading an enum's member goes through its class's attribute lookup (hundreds of
# instructions a time).
_REQUEST: Final = int(FrameKind.REQUEST)
_RESPONSE: Final = int(FrameKind.RESPONSE)
_HELLO: Final = int(Opcode.HELLO)


class Deferred:
    """An answer settled later: sent once ``when`` resolves, or an error frame if it fails.

    ``answer`` is the body when it is known now (a send's receipt, held until its group commit
    is durable); by default the body is ``when``'s result. A ``shared`` future (a group commit
    many requests wait for) is never cancelled here; a request's own (a task, a transaction's
    answer) is cancelled when its connection is lost: the answer goes, the outcome stays.

    A plain class, made once per deferred request: compiled, its construction is a C call,
    where a frozen dataclass's ``__init__`` runs as Python code.
    """

    __slots__ = ("answer", "shared", "when")

    def __init__(self, when: asyncio.Future[Any], answer: Any = _RESULT, shared: bool = False):
        self.when: Final = when
        self.answer: Final = answer
        self.shared: Final = shared


def later(coro: Coroutine[Any, Any, Any]) -> Deferred:
    """The answer of a handler that must wait or read: ``coro`` runs as a task."""
    return Deferred(asyncio.get_running_loop().create_task(coro))


def settle(answer: Any) -> Awaitable[Any]:
    """The body a handler's answer comes to, to await (for a caller that wraps a handler).
    A shared future is waited for through one of the caller's own, with the body as its
    result, so cancelling the caller never cancels what others wait for (asyncio.shield,
    without its second callback and frame)."""
    if type(answer) is not Deferred:
        return _now(answer)
    if not answer.shared:
        return _own(answer)
    mine = answer.when.get_loop().create_future()
    answer.when.add_done_callback(functools.partial(_relay, mine, answer.answer))
    return mine


async def _now(body: Any) -> Any:
    return body


async def _own(answer: Deferred) -> Any:
    body = await answer.when  # the request's own: cancelling the caller cancels it
    return body if answer.answer is _RESULT else answer.answer


def _relay(mine: asyncio.Future[Any], answer: Any, shared: asyncio.Future[Any]) -> None:
    if mine.done():  # its waiter was cancelled
        return
    if shared.cancelled():
        mine.cancel()
    elif (error := shared.exception()) is not None:
        mine.set_exception(error)
    else:
        mine.set_result(shared.result() if answer is _RESULT else answer)


# A client may pipeline this many requests before the server stops reading its socket: bounds
# the memory one connection can pin (each request holds at most one 16 MiB frame).
MAX_INFLIGHT_PER_CONNECTION: Final = 256
# After an error that ends the stream the connection half-closes and reads on (discarding) for
# up to this long before it closes: closing a socket with unread input makes the kernel send a
# reset, which can destroy the error frame before the client reads it. One second covers a
# round trip on any network the broker is meant for.
LINGER_S: Final = 1.0


class Connection(asyncio.Protocol):
    def __init__(
        self,
        handlers: dict[int, Handler],
        *,
        access: Access | None = None,
        hello: Callable[[Hello], Any],
        connections: set[Connection],
        role: Role | None = None,
        admission: Admission | None = None,
        http_port: int = 0,
    ) -> None:
        self._handlers = handlers
        self._http_port = http_port  # named to a client that speaks HTTP here (0: none)
        self._role = role or Role()
        self._access = access or Access(TokenTable(), lambda _: None)
        self._hello = hello
        self._connections = connections
        self._decoder = FrameDecoder()
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # get_running_loop() is a getpid()
        self._out: TurnWriter | None = None
        # Who this connection is: set by HELLO; everyone at once on a broker without tokens.
        self._principal: Principal | None = self._access.tokens.authenticate(None)
        self._checked = self._principal is None or not self._principal.superuser
        self._admission = admission
        self._opened = False  # past HELLO (admission.py's OPEN state)
        self.heard = False  # bytes arrived since the admission's last look
        self.tokens = float("inf")  # frames this connection may still send (admission.py)
        # Deferred answers by what they wait for, in arrival order; and how many there are.
        self._deferred: dict[asyncio.Future[Any], list[tuple[Frame, Deferred]]] = {}
        self._deferred_n = 0
        self._reading_paused = False
        self._writing_paused = False
        self.closing = False

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        self._transport = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()
        self._out = TurnWriter(self._loop, self._write_now)
        self._connections.add(self)
        if self._admission is not None and not self._admission.admit(self):
            limit = self._admission.limits.max_connections
            self._fatal(
                TooManyConnections(f"all {limit} connections are in use; try again later"),
                linger=False,
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._connections.discard(self)
        if self._admission is not None:
            self._admission.lost(self)
        for when, waiting in self._deferred.items():
            if not waiting[0][1].shared:
                when.cancel()  # long polls and the like: nobody is there to answer
        self._deferred.clear()  # a shared one is other connections' too: dropped, not cancelled
        self._deferred_n = 0

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.heard = True
        try:
            frames = self._decoder.feed(data)
        except WrongPort as e:
            self._refuse_http(e)
            return
        except ProtocolError as e:
            self._fatal(e)
            return
        self.tokens -= len(frames)
        if self.tokens < 0:
            assert self._admission is not None  # without one the bucket is infinite
            self._admission.count("frame_rate")
            rate = self._admission.limits.max_frames_per_s
            self._fatal(RateLimited(f"over {rate} frames a second on one connection"))
            return
        for frame in frames:
            self._dispatch(frame)

    # --- requests ---

    def _dispatch(self, frame: Frame) -> None:
        if frame.kind != _REQUEST:
            self._fatal(ProtocolError(f"clients send requests, not frame kind {frame.kind}"))
            return
        if frame.opcode == _HELLO:
            self._on_hello(frame)
            return
        who = self._principal
        if who is None:
            self._refused_auth("this broker requires HELLO with an auth token first")
            return
        if not self._opened:  # no auth token: a first request completes the handshake
            self._open()
        handler = self._handlers.get(frame.opcode)
        if handler is None:
            # A known opcode this broker does not serve: the stream itself is fine, so answer
            # this request and keep the connection (unknown opcodes never get here: the decoder
            # refuses them and the connection closes).
            self._reply_error(frame, BadRequest(f"opcode {frame.opcode} is not served"))
            return
        try:
            req = decode_request(frame.opcode, frame.body)
            if self._checked:
                self._access.check(who, frame.opcode, req)  # Forbidden: this request only
            if frame.opcode in self._role.refused:
                self._role.check(frame.opcode)
            answer = handler(req)
            if self._checked and self._access.filters(frame.opcode):
                answer = _filtered(answer, self._access, who, frame.opcode)
        except Exception as e:
            self._reply_failure(frame, e)
            return
        if type(answer) is Deferred:
            self._defer(frame, answer)
        else:
            self._answer(frame, answer)

    def _on_hello(self, frame: Frame) -> None:
        try:
            req = decode_request(Opcode.HELLO, frame.body)
        except TxbError as e:
            self._fatal(e)
            return
        if self._access.tokens.required:
            who = self._access.tokens.authenticate(req.auth_token)
            if who is None:
                self._refused_auth("wrong or missing auth token")
                return
            self._principal = who
            self._checked = not who.superuser
        if not self._opened:
            self._open()
        self._write(FrameKind.RESPONSE, Opcode.HELLO, frame.corr_id, encode_body(self._hello(req)))

    def _open(self) -> None:
        self._opened = True
        if self._admission is not None:
            self._admission.opened(self)

    def _refused_auth(self, why: str) -> None:
        if self._admission is not None:
            self._admission.count("unauthenticated")
        self._fatal(Unauthenticated(why))

    def _defer(self, frame: Frame, d: Deferred) -> None:
        waiting = self._deferred.get(d.when)
        if waiting is None:
            waiting = self._deferred[d.when] = []
            d.when.add_done_callback(self._release)
        waiting.append((frame, d))
        self._deferred_n += 1
        if self._deferred_n >= MAX_INFLIGHT_PER_CONNECTION:
            self._update_reading()

    def _release(self, when: asyncio.Future[Any]) -> None:
        """``when`` resolved: send the answers that waited for it (or its error for each)."""
        waiting = self._deferred.pop(when, None)
        if waiting is None:  # the connection was lost meanwhile
            if not when.cancelled():
                when.exception()  # nobody answers it now: not "never retrieved" either
            return
        self._deferred_n -= len(waiting)
        if when.cancelled():
            if not waiting[0][1].shared:  # its own: cancelled with the broker's stop
                self._update_reading()
                return
            # Nobody cancels a shared one; if someone did, say so, never answer "ok".
            e: BaseException | None = Internal("the wait for the group commit was cancelled")
        else:
            e = when.exception()
        for frame, d in waiting:
            if e is not None:
                self._reply_failure(frame, e)
            else:
                self._answer(frame, when.result() if d.answer is _RESULT else d.answer)
        self._update_reading()

    # --- output ---

    def _write(self, kind: int, opcode: int, corr_id: int, body: bytes) -> None:
        self._send(encode_frame(kind, opcode, corr_id, body))

    def _send(self, frame: bytes) -> None:
        if self._out is not None:  # connected
            self._out.add(frame)

    def _write_now(self, data: bytes) -> None:
        """The TurnWriter's output; what reaches a closing transport (or one half-closed after
        a fatal error) is dropped."""
        if self.closing:
            return
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _flush(self) -> None:
        if self._out is not None:
            self._out.flush()

    def _answer(self, frame: Frame, result: Any) -> None:
        # Encoded inside the error handling: an answer too large for a frame is answered as
        # FRAME_TOO_LARGE instead of never.
        try:
            out = encode_frame(_RESPONSE, frame.opcode, frame.corr_id, encode_body(result))
        except Exception as e:
            self._reply_failure(frame, e)
            return
        self._send(out)

    def _reply_failure(self, frame: Frame, e: BaseException) -> None:
        """An error frame for a request that failed: its own error, or Internal for a bug."""
        if not isinstance(e, TxbError):  # a bug: answer, log, keep serving
            log.error("handler for %s failed", Opcode(frame.opcode).name, exc_info=e)
            e = Internal(f"{type(e).__name__}: {e}")
        self._reply_error(frame, e)

    def _reply_error(self, frame: Frame, err: TxbError) -> None:
        body = encode_body(ErrorBody(err.code, str(err), err.retriable))
        self._write(FrameKind.ERROR, frame.opcode, frame.corr_id, body)

    def _refuse_http(self, err: WrongPort) -> None:
        """An HTTP request at this port (curl, a browser, a health check pointed here): answered
        in HTTP, which they show, naming the HTTP port; logged, since a misdirected health
        check or proxy keeps coming back until someone fixes its port."""
        peer = self._transport.get_extra_info("peername") if self._transport else None
        log.warning(
            "an HTTP request (%s) from %s at the TCP port: answered 400, naming the HTTP port %s",
            first_line(err.seen),
            peer,
            self._http_port or "(none)",
        )
        self._fatal(err, answer=http_refusal(self._http_port))

    def _fatal(self, err: TxbError, *, linger: bool = True, answer: bytes | None = None) -> None:
        """Answer once on the STREAM opcode (or with ``answer``'s bytes), then close: the stream
        cannot be trusted. With ``linger``, half-close first and discard what still arrives
        (LINGER_S); without, close at once (a connection that sent nothing, whose descriptor is
        wanted back now)."""
        if self._admission is not None:
            self._admission.lost(self)  # its slot is free; no limit looks at it again
        if answer is None:
            body = encode_body(ErrorBody(err.code, str(err), err.retriable))
            answer = encode_frame(FrameKind.ERROR, Opcode.STREAM, 0, body)
        self._send(answer)
        self._flush()  # before the close: the answers so far, then this error, then EOF
        self.closing = True
        t = self._transport
        if t is None or t.is_closing():
            return
        if linger and t.can_write_eof() and self._loop is not None:
            t.write_eof()
            if self._reading_paused:
                t.resume_reading()
                self._reading_paused = False
            self._loop.call_later(LINGER_S, t.close)
        else:
            t.close()

    def refuse(self, err: TxbError) -> None:
        """Closed by a connection limit (admission.py): the error, then close now."""
        self._fatal(err, linger=False)

    @property
    def inflight(self) -> int:
        return self._deferred_n

    def _update_reading(self) -> None:
        if self.closing or self._transport is None or self._transport.is_closing():
            return
        want_pause = self._writing_paused or self.inflight >= MAX_INFLIGHT_PER_CONNECTION
        if want_pause and not self._reading_paused:
            self._transport.pause_reading()
            self._reading_paused = True
        elif not want_pause and self._reading_paused:
            self._transport.resume_reading()
            self._reading_paused = False

    def close(self) -> None:
        self._flush()  # answers of this turn, if any, before the close
        self.closing = True
        if self._transport is not None:
            self._transport.close()

    async def drain_requests(self) -> None:
        """Wait for this connection's in-flight requests (graceful shutdown)."""
        pending = set(self._deferred)
        if pending:
            await asyncio.wait(pending)


def _filtered(answer: Any, access: Access, who: Principal, opcode: int) -> Any:
    """A listing's answer cut to what ``who`` may see."""
    if type(answer) is Deferred:
        return later(_filtered_later(answer, access, who, opcode))
    return access.filter(who, opcode, answer)


async def _filtered_later(answer: Deferred, access: Access, who: Principal, opcode: int) -> Any:
    return access.filter(who, opcode, await settle(answer))
