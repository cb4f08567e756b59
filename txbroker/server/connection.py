"""One client connection: frames in, handler calls, frames out.

The protocol object owns only I/O concerns: the sans-IO decoder, the auth gate, per-connection
bounds and error frames. What a request does is the broker's (``handlers.py``). A request runs
as a task of its handler, or, for TX_PREPARE and TX_END, through a *direct* handler called at
once that answers now or with a future the group commit resolves: no task, coroutine chain or
shield per request (docs/server.md, "Connections", has what that saved). A malformed
stream gets one STREAM error frame and the connection is closed; a bad request gets an error
frame for that request and the connection stays open. Nothing a client sends can take the server
down: every handler failure is turned into an error frame here.

Connection limits (slots, the HELLO deadline, idle connections, the frame rate) are
``admission.py``'s; the connection tells it when it is accepted, opened and lost, marks itself
heard and takes one token per frame as bytes arrive.

Access control is ``access.py``'s: HELLO's token names the connection's principal, and every
request of a principal that is not admin on every topic is checked before it runs (a refused
one gets ``FORBIDDEN``; the connection stays open).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, cast

from txbroker.errors import (
    BadRequest,
    Internal,
    ProtocolError,
    RateLimited,
    TooManyConnections,
    TxbError,
    Unauthenticated,
)
from txbroker.protocol.codec import Frame, FrameDecoder, encode_frame
from txbroker.protocol.frames import FrameKind, Opcode
from txbroker.protocol.messages import ErrorBody, Hello, decode_request, encode_body
from txbroker.runtime.turnwriter import TurnWriter
from txbroker.server.access import Access
from txbroker.server.admission import Admission
from txbroker.server.tokens import Principal, TokenTable

__all__ = ["Connection", "Deferred", "DirectHandler", "Handler"]

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[Any]]
# A direct handler returns the response body, a future of it, a Deferred, or None: "run the
# opcode's Handler instead" (for the cases that must wait or read before answering).
DirectHandler = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Deferred:
    """An answer known now but sent only once ``when`` resolves (a send's group commit), or an
    error frame if it fails. ``when`` is shared by many requests (``durable_together``): the
    connection adds one callback per future, not per request, and never cancels it."""

    when: asyncio.Future[None]
    answer: Any


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
        direct: dict[int, DirectHandler] | None = None,
        admission: Admission | None = None,
    ) -> None:
        self._handlers = handlers
        self._direct = direct or {}
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
        self._tasks: set[asyncio.Task[None]] = set()
        self._answers: set[asyncio.Future[Any]] = set()  # direct handlers' pending answers
        # Deferred answers by what they wait for, in arrival order; and how many there are.
        self._deferred: dict[asyncio.Future[None], list[tuple[Frame, Any]]] = {}
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
        for t in self._tasks:
            t.cancel()  # long polls and the like: nobody is there to answer
        for a in self._answers:
            a.cancel()  # only the answer: what the request does is settled without it
        self._deferred.clear()  # shared with other connections: dropped here, never cancelled
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
        if frame.kind != FrameKind.REQUEST:
            self._fatal(ProtocolError(f"clients send requests, not frame kind {frame.kind}"))
            return
        if frame.opcode == Opcode.HELLO:
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
        req = None
        if self._checked:
            try:
                req = decode_request(frame.opcode, frame.body)
                self._access.check(who, frame.opcode, req)
            except Exception as e:  # Forbidden, BadRequest: this request only
                self._reply_failure(frame, e)
                return
            if self._access.filters(frame.opcode):
                handler = functools.partial(_filtered, handler, self._access, who, frame.opcode)
        direct = self._direct.get(frame.opcode)
        if direct is not None:
            try:
                if req is None:
                    req = decode_request(frame.opcode, frame.body)
                answer = direct(req)
            except Exception as e:
                self._reply_failure(frame, e)
                return
            if type(answer) is Deferred:
                self._defer(frame, answer)
                return
            if isinstance(answer, asyncio.Future):
                self._answers.add(answer)
                answer.add_done_callback(functools.partial(self._answered, frame))
                self._update_reading()
                return
            if answer is not None:
                self._answer(frame, answer)
                return
        assert self._loop is not None  # connected
        task = self._loop.create_task(self._run(handler, frame, req))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        self._update_reading()

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

    async def _run(self, handler: Handler, frame: Frame, req: Any) -> None:
        try:
            if req is None:
                req = decode_request(frame.opcode, frame.body)
            result = await handler(req)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._reply_failure(frame, e)
        else:
            self._answer(frame, result)

    def _answered(self, frame: Frame, answer: asyncio.Future[Any]) -> None:
        self._answers.discard(answer)
        if not answer.cancelled():
            if (e := answer.exception()) is not None:
                self._reply_failure(frame, e)
            else:
                self._answer(frame, answer.result())
        self._update_reading()

    def _defer(self, frame: Frame, d: Deferred) -> None:
        waiting = self._deferred.get(d.when)
        if waiting is None:
            waiting = self._deferred[d.when] = []
            d.when.add_done_callback(self._release)
        waiting.append((frame, d.answer))
        self._deferred_n += 1
        if self._deferred_n >= MAX_INFLIGHT_PER_CONNECTION:
            self._update_reading()

    def _release(self, when: asyncio.Future[None]) -> None:
        """``when`` resolved: send the answers that waited for it (or its error for each)."""
        waiting = self._deferred.pop(when, None)
        if waiting is None:  # the connection was lost meanwhile
            return
        self._deferred_n -= len(waiting)
        if when.cancelled():  # nobody cancels it; if someone did, say so, never answer "ok"
            e: BaseException | None = Internal("the wait for the group commit was cancelled")
        else:
            e = when.exception()
        for frame, answer in waiting:
            if e is None:
                self._answer(frame, answer)
            else:
                self._reply_failure(frame, e)
        self._update_reading()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
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
            out = encode_frame(FrameKind.RESPONSE, frame.opcode, frame.corr_id, encode_body(result))
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

    def _fatal(self, err: TxbError, *, linger: bool = True) -> None:
        """Answer once on the STREAM opcode, then close: the stream cannot be trusted. With
        ``linger``, half-close first and discard what still arrives (LINGER_S); without, close
        at once (a connection that sent nothing, whose descriptor is wanted back now)."""
        if self._admission is not None:
            self._admission.lost(self)  # its slot is free; no limit looks at it again
        body = encode_body(ErrorBody(err.code, str(err), err.retriable))
        self._write(FrameKind.ERROR, Opcode.STREAM, 0, body)
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
        return len(self._tasks) + len(self._answers) + self._deferred_n

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
        pending: set[asyncio.Future[Any]] = {*self._tasks, *self._answers, *self._deferred}
        if pending:
            await asyncio.wait(pending)


async def _filtered(handler: Handler, access: Access, who: Principal, opcode: int, req: Any) -> Any:
    """A listing's handler, its answer cut to what ``who`` may see."""
    return access.filter(who, opcode, await handler(req))
