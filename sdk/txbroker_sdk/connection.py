"""One connection to the broker: pipelined requests matched to answers by correlation id,
errors raised as the same typed exceptions the broker raised, connecting (with a deadline, each
failed attempt logged) and reconnecting. :class:`~txbroker_sdk.client.Client` adds the
broker's requests by name.

Answers are decoded in the connection's protocol callback as their bytes arrive, not by a reader
task: a reader task costs two coroutines, a future and a trip through the event loop per read,
a real share of what messaging adds to a CPU-bound service's business transaction.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import ssl
import time
from pathlib import Path
from typing import Any, Final, Self

from txbroker.errors import ConnectionLimit, InvalidArgument, TxbError, WrongPort, error_class
from txbroker.protocol.codec import Frame, encode_frame
from txbroker.protocol.frames import FrameKind, Opcode
from txbroker.protocol.messages import (
    Empty,
    Hello,
    HelloOk,
    decode_error,
    decode_response,
    encode_body,
)
from txbroker.protocol.wrongport import first_line, tcp_port_named
from txbroker.runtime.tls import client_context
from txbroker.runtime.turnwriter import TurnWriter
from txbroker_sdk.errors import BrokerUnreachable, ConnectionClosed, RequestTimeout, TlsFailed
from txbroker_sdk.requests import DEFAULT_PORT, parse_server_url, uses_tls
from txbroker_sdk.wire import Wire

__all__ = [
    "DEFAULT_CONNECT_DEADLINE_S",
    "DEFAULT_KEEPALIVE_S",
    "PROBE_S",
    "SWEEP_INTERVAL_S",
    "Connection",
]

log = logging.getLogger(__name__)
# Each failed connection attempt, on a logger of its own: a program that reports the final
# failure itself (the CLI without -v) quiets the attempts without losing the other warnings.
attempts_log = logging.getLogger(f"{__name__}.attempts")

# How long the first connection is retried by default: long enough for a broker that starts
# beside the service (compose, a test), short enough that a wrong address fails the start.
DEFAULT_CONNECT_DEADLINE_S: Final = 10.0
# A connection silent this long sends a PING: a fifth of the broker's default idle timeout
# (300 s), so a PING lost or late still leaves four more chances.
DEFAULT_KEEPALIVE_S: Final = 60.0
# The attempt made at the connect deadline still gets this long: a reachable broker accepts and
# answers HELLO in milliseconds, so this only bounds how long a stalled attempt holds the caller.
LAST_ATTEMPT_S: Final = 0.5
# Deadlines are checked this often: a timeout fires at most this much late.
SWEEP_INTERVAL_S = 0.05
# After a request timed out, the broker must be heard from (the probe's PING answered, or any
# other answer) within this long (or the client's timeout_s, if shorter), else the connection
# is closed as dead. A broker answers PING at once, beside requests still waiting (a sync
# write), in milliseconds, so a second is hundreds of times that, and still short against TCP's
# retransmission back-off that would otherwise keep a healed link silent: after a 20 s cut the
# next retransmission is about 7 s away.
PROBE_S: Final = 1.0
# The enum members read on every request and answer, as plain ints: on Python 3.11 reading a
# member from its enum class (``Opcode.STREAM``) goes through the class's ``__getattr__``, about
# 170 ns each, several per request.
_REQUEST: Final = int(FrameKind.REQUEST)
_ERROR: Final = int(FrameKind.ERROR)
_STREAM: Final = int(Opcode.STREAM)


class Connection:
    """One connection to the broker, made by :meth:`connect` or by the first request. The first
    connection is tried for up to ``connect_deadline_s`` (a broker still starting is waited
    for; 0: one attempt), each failed attempt logged as a WARNING (on ``attempts_log``), then
    :class:`BrokerUnreachable` names the address. An address that answers in HTTP (the broker's
    HTTP port) raises :class:`WrongPort` at once, naming the TCP port when the broker's HTTP port
    told it; a token given to a broker that checks none is logged once as a WARNING. When the
    connection drops, requests in flight fail with :class:`ConnectionClosed` (their outcome is
    unknown: resend with an idempotency key); the next request reconnects, backing off
    exponentially, for up to ``reconnect_s`` seconds. A connection that sent nothing for
    ``keepalive_s`` pings the broker (0: never), so the broker's idle timeout does not close it.

    A request that times out (:class:`RequestTimeout`) leaves the connection open, but makes it
    suspect: a PING probes it, and if nothing comes back from the broker within ``PROBE_S``
    (1 s, at most ``timeout_s``), the connection is closed as dead, its requests in flight fail
    with :class:`ConnectionClosed`, and the next request connects again. A partition drops
    packets without a reset, and TCP retransmits what a connection sent with an exponential
    back-off, so a connection kept across a long cut would carry nothing until its next
    retransmission, seconds after the link healed; a new connection works at once. A broker that
    is only slow answers the probe and keeps the connection, with every request on it.

    Why the keep-alive: the broker closes authenticated connections that stay silent for its
    ``idle_timeout_ms`` (5 minutes by default), and a service that publishes rarely should not find
    its connection gone, and its next request failed, because of a quiet hour. A connection limit of
    the broker (``ConnectionLimit``: idle, too many connections, over the frame rate) closes the
    connection as ``ConnectionClosed``, so the next request connects again.

    A ``txbs://`` URL connects with TLS (``txbroker.runtime.tls.client_context``): the broker's
    certificate is checked against ``tls_ca`` (default: the system's CAs) and must name the URL's
    host; ``tls_cert`` and ``tls_key`` answer a broker that asks for a client certificate. A failed
    handshake raises :class:`TlsFailed` at once (retrying would fail the same way).
    """

    def __init__(
        self,
        url: str,
        *,
        auth_token: str | None = None,
        timeout_s: float = 10.0,
        reconnect_s: float = 30.0,
        connect_deadline_s: float = DEFAULT_CONNECT_DEADLINE_S,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
    ) -> None:
        for name, value in (
            ("connect_deadline_s", connect_deadline_s),
            ("reconnect_s", reconnect_s),
            ("keepalive_s", keepalive_s),
        ):
            if not value >= 0:
                raise InvalidArgument(f"{name} must be >= 0 seconds, got {value!r}")
        self.url = url
        self._host, self._port = parse_server_url(url)
        self._ssl: ssl.SSLContext | None = None
        if uses_tls(url):
            self._ssl = client_context(tls_ca, tls_cert, tls_key)
        elif tls_ca is not None or tls_cert is not None:
            raise InvalidArgument(f"TLS files given for {url!r}: a TLS broker's URL is txbs://")
        self._token = auth_token
        self._timeout_s = timeout_s
        self._reconnect_s = reconnect_s
        self.connect_deadline_s = connect_deadline_s
        self._keepalive_s = keepalive_s
        self._keepalive: asyncio.TimerHandle | None = None
        self._quiet = False  # nothing sent since the keepalive last looked
        self._connected_once = False  # later connections are reconnects (``reconnect_s``)
        self._token_told = False  # warned that the broker checks no tokens
        self._probe: asyncio.Future[Any] | None = None  # the PING sent after a request timed out
        self._heard = False  # anything answered since the probe was sent
        self._pending: dict[int, tuple[int, asyncio.Future[Any]]] = {}
        # Request deadlines are checked by one sweeper task rather than a timer per request:
        # a timer per request cost as much as the request itself in the client's profile.
        self._deadlines: dict[int, tuple[float, float]] = {}  # corr -> (deadline, timeout_s)
        self._sweeper: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._closed: TxbError | None = ConnectionClosed("not connected yet")
        self._user_closed = False
        self._wire: Wire | None = None  # the current connection
        self._out: TurnWriter | None = None  # one per connection
        self._unanswered: set[asyncio.Future[Any]] = set()  # requests nobody awaits
        # Requests sent by post(): corr -> (opcode, request, note); no future at all.
        self._posted: dict[int, tuple[int, Any, str]] = {}
        self._posted_empty: asyncio.Future[None] | None = None  # drain() waits on it
        # Kept, not looked up per request: get_running_loop() is a getpid() system call.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connect_lock = asyncio.Lock()
        self.reconnects = 0
        self.server_version: str | None = None  # the broker's, from its answer to HELLO

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        auth_token: str | None = None,
        timeout_s: float = 10.0,
        reconnect_s: float = 30.0,
        connect_deadline_s: float = DEFAULT_CONNECT_DEADLINE_S,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
    ) -> Self:
        """Connect now, retrying a broker that is not there yet (still starting) for up to
        ``connect_deadline_s``, each failed attempt logged as a WARNING; 0 tries once. Then
        :class:`BrokerUnreachable` names the address."""
        client = cls(
            url,
            auth_token=auth_token,
            timeout_s=timeout_s,
            reconnect_s=reconnect_s,
            connect_deadline_s=connect_deadline_s,
            keepalive_s=keepalive_s,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
        )
        try:
            await client._dial(connect_deadline_s)
        except BaseException:
            await client.close()  # the caller has no handle on it: nothing is left behind
            raise
        return client

    async def _open(self, limit_s: float) -> None:
        """One connection attempt: TCP (and TLS), then HELLO (which checks the auth token),
        each within ``limit_s``."""
        loop = asyncio.get_running_loop()
        wire = Wire(self, loop)
        where = f"{self._host}:{self._port}"
        try:
            async with asyncio.timeout(limit_s):
                transport, _ = await loop.create_connection(
                    lambda: wire,
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except ssl.SSLCertVerificationError as e:
            raise TlsFailed(
                f"the broker at {where} did not prove who it is ({e.verify_message}): pass "
                "tls_ca=<the CA file that signed its certificate>, and connect by a name or "
                "address its certificate holds"
            ) from e
        except ssl.SSLError as e:
            raise TlsFailed(
                f"TLS handshake with {where} failed ({e.reason or e}); does the broker serve "
                "TLS on this port? (a plain one is txb://)"
            ) from e
        except TimeoutError as e:
            raise ConnectionClosed(f"cannot connect to {where}: no answer in {limit_s:g} s") from e
        except OSError as e:
            raise ConnectionClosed(f"cannot connect to {where}: {e}") from e
        self._wire = wire
        self._loop = loop
        self._out = TurnWriter(loop, transport.write)
        self._closed = None
        try:
            hello: HelloOk = await self._send_request(
                Opcode.HELLO, Hello("python-sdk", self._token), limit_s
            )
        except WrongPort as e:
            await self._drop()
            self._closed = WrongPort(self._wrong_port(e.seen), e.seen)
            raise self._closed from e
        except ConnectionClosed as e:
            await self._drop()
            if self._ssl is None:
                raise
            # Under TLS 1.3 the broker checks a client certificate after the client's side of
            # the handshake is done: its refusal ends the connection during HELLO.
            if isinstance(e.__cause__, ssl.SSLError):
                raise TlsFailed(
                    f"the broker at {where} refused the TLS connection "
                    f"({e.__cause__.reason or e.__cause__}); does it require a client "
                    "certificate (tls_cert, tls_key)?"
                ) from e
            raise ConnectionClosed(
                f"{e} (during HELLO over TLS: does the broker require a client certificate? "
                "pass tls_cert and tls_key)"
            ) from e
        except BaseException:
            await self._drop()
            raise
        self._connected_once = True
        self.server_version = hello.server_version
        if self._keepalive_s:
            self._keepalive = loop.call_later(self._keepalive_s, self._keep_alive, wire)
        if self._token is not None and hello.auth_required is False and not self._token_told:
            self._token_told = True  # once per client, not on every reconnect
            log.warning(
                "an auth token was given, but the broker at %s checks none (it has no tokens): "
                "the token is ignored, and the broker serves anyone who can reach it",
                where,
            )

    def _wrong_port(self, seen: bytes) -> str:
        """What to say when this address answered HELLO in HTTP (``seen``: the answer's head)."""
        where = f"{self._host}:{self._port}"
        line = first_line(seen)
        tcp = tcp_port_named(seen)
        if tcp is None:
            return (
                f"{where} answered in HTTP ({line}): that is an HTTP port (the broker's HTTP "
                f"port?), not a broker's TCP port; the TCP port is the broker's --port "
                f"({DEFAULT_PORT} unless set)"
            )
        scheme = "txbs" if self._ssl is not None else "txb"
        host = f"[{self._host}]" if ":" in self._host else self._host
        return (
            f"{where} is the broker's HTTP port (it answered in HTTP: {line}); the TCP port is "
            f"{tcp}: {scheme}://{host}:{tcp}"
        )

    def _keep_alive(self, wire: Wire) -> None:
        """Every ``keepalive_s`` while ``wire`` is the connection: a PING if nothing was sent
        since the last look (its answer, or failure, matters to nobody)."""
        if self._wire is not wire or self._closed is not None or self._loop is None:
            return  # that connection is gone; a new one has its own timer
        if self._quiet:
            _, fut = self._submit(Opcode.PING, Empty(), self._timeout_s)
            fut.add_done_callback(_ignore)
        self._quiet = True
        self._keepalive = self._loop.call_later(self._keepalive_s, self._keep_alive, wire)

    async def _ensure_connected(self) -> None:
        if self._closed is None:
            return
        if self._user_closed:
            raise self._closed
        # A refusal (a wrong token, a stream the broker could not read) ended the connection:
        # this request tries a new one, once (the dial below retries only ConnectionClosed).
        # A token fixed at the broker, or a broker restarted without one, is then taken up by
        # the next request, and a loop retrying its requests decides how often to ask.
        async with self._connect_lock:
            if self.connected:
                return  # another request reconnected meanwhile
            if not self._connected_once:  # the first connection, made by the first request
                await self._dial(self.connect_deadline_s)
                return
            await self._dial(self._reconnect_s)
            self.reconnects += 1

    async def _dial(self, deadline_s: float) -> None:
        """Connect, retrying for up to ``deadline_s`` with a backoff from 50 ms doubling to 2 s
        (a broker restart takes seconds); each failure is logged, so a wrong or down address
        shows at once in the service's log rather than as a silent wait. No attempt runs past
        the deadline (0: one attempt, within ``timeout_s``)."""
        deadline = time.monotonic() + deadline_s
        backoff, attempt = 0.05, 0
        while True:
            attempt += 1
            limit = self._timeout_s
            if deadline_s > 0:
                left = round(deadline - time.monotonic(), 3)  # to the ms: said in errors
                limit = min(limit, max(left, LAST_ATTEMPT_S))
            try:
                await self._open(limit)
                return
            except ConnectionClosed as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    if attempt == 1:
                        raise BrokerUnreachable(str(e)) from e
                    raise BrokerUnreachable(
                        f"cannot connect to {self._host}:{self._port} within {deadline_s:g} s "
                        f"({attempt} attempts; is the broker running there?): {e.__cause__ or e}"
                    ) from e
                pause = min(backoff, left)
                attempts_log.warning(
                    "broker %s:%s: attempt %d failed (%s); retrying in %.2f s",
                    self._host,
                    self._port,
                    attempt,
                    e.__cause__ or e,  # the OS's or the broker's reason, without the address
                    pause,
                )
            await asyncio.sleep(pause)
            backoff = min(backoff * 2, 2.0)

    @property
    def connected(self) -> bool:
        return self._closed is None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection, first waiting (at most the client's ``timeout_s``) for the
        answers to requests sent without waiting (:meth:`submit`)."""
        if self._closed is None:
            await self.drain(self._timeout_s)
        self._user_closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._fail(ConnectionClosed("the client closed the connection"))
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await self._drop()

    async def _drop(self) -> None:
        """Close the connection and wait (bounded) until its transport has let go."""
        wire = self._wire
        if wire is not None:
            wire.close()
            await asyncio.wait([wire.lost], timeout=self._timeout_s)

    async def request(self, opcode: Opcode, body: Any, *, timeout_s: float | None = None) -> Any:
        """Send a request and await its answer: :class:`RequestTimeout` after ``timeout_s``
        (default: the client's ``timeout_s``) without one, its outcome unknown."""
        # The request's own code, not its helpers' coroutines: each coroutine awaited costs a
        # frame on every request and again on every resumption of the awaiting task.
        if self._closed is not None:
            await self._ensure_connected()
        corr, fut = self._submit(opcode, body, timeout_s)
        try:
            return await fut
        except BaseException:
            # Cancelled: its entries go now. An answer, an error answer, a timeout or a dropped
            # connection removed them before completing the future.
            self._forget(corr)
            raise

    async def _send_request(self, opcode: Opcode, body: Any, timeout_s: float | None) -> Any:
        corr, fut = self._submit(opcode, body, timeout_s)
        try:
            return await fut
        finally:
            self._forget(corr)

    def _submit(
        self, opcode: Opcode, body: Any, timeout_s: float | None
    ) -> tuple[int, asyncio.Future[Any]]:
        """Queue the request's frame; its answer (or error) will complete the future."""
        corr = self._send_frame(opcode, body, timeout_s)
        assert self._loop is not None  # connected
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._pending[corr] = (opcode, fut)
        return corr, fut

    def _send_frame(self, opcode: Opcode, body: Any, timeout_s: float | None) -> int:
        """Queue a request's frame under a new correlation id, with its deadline (``timeout_s``,
        else the client's: a request to a peer gone silent must fail, not wait for TCP to give
        up); the id. The frame is encoded first, so a request refused here (too large) leaves
        nothing behind."""
        if self._closed is not None:
            raise self._closed
        loop, out = self._loop, self._out
        assert loop is not None and out is not None  # connected
        corr = next(self._ids) & 0xFFFFFFFF
        frame = encode_frame(_REQUEST, opcode, corr, encode_body(body))
        self._quiet = False
        if timeout_s is None:
            timeout_s = self._timeout_s
        self._deadlines[corr] = (time.monotonic() + timeout_s, timeout_s)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = loop.create_task(self._sweep())
        out.add(frame)
        return corr

    def _forget(self, corr: int) -> None:
        self._pending.pop(corr, None)
        self._deadlines.pop(corr, None)

    def submit(
        self,
        opcode: Opcode,
        body: Any,
        *,
        timeout_s: float | None = None,
        drained: bool = True,
    ) -> asyncio.Future[Any]:
        """Send a request without waiting for its answer: the returned future gets the answer
        (or the error). It leaves with the other frames of this turn of the event loop, so the
        caller can overlap it with other I/O. Not connected: a task reconnects and sends it
        (the future is that task). :meth:`drain` and :meth:`close` wait for these requests,
        unless ``drained`` is false (for a caller that awaits the future itself)."""
        fut: asyncio.Future[Any]
        if self._closed is not None:
            fut = asyncio.get_running_loop().create_task(
                self.request(opcode, body, timeout_s=timeout_s)
            )
        else:
            _, fut = self._submit(opcode, body, timeout_s)  # answers clean up after themselves
        if drained:
            self._unanswered.add(fut)
            fut.add_done_callback(self._unanswered.discard)
        return fut

    def post(
        self, opcode: Opcode, body: Any, *, note: str = "", timeout_s: float | None = None
    ) -> None:
        """Send a request whose answer nobody awaits (as RocketMQ's producer sends its
        end-transaction one-way): no future is made for it, which in a CPU-bound service is
        worth having. A failure, or no answer within ``timeout_s``, is logged with ``note``
        (what happens next). :meth:`drain` and :meth:`close` wait for the answers."""
        if self._closed is not None:
            fut = self.submit(opcode, body, timeout_s=timeout_s)
            fut.add_done_callback(functools.partial(_posted_done, opcode, body, note))
            return
        self._posted[self._send_frame(opcode, body, timeout_s)] = (opcode, body, note)

    def _posted_answered(self, corr: int, err: Exception | None) -> None:
        opcode, body, note = self._posted.pop(corr)
        if err is not None:
            _posted_failed(opcode, body, note, err)
        waiter = self._posted_empty
        if not self._posted and waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def unanswered(self) -> int:
        """Requests sent by :meth:`submit` or :meth:`post` whose answers have not arrived."""
        return len(self._unanswered) + len(self._posted)

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait (at most ``timeout_s``) until every request sent by :meth:`submit` or
        :meth:`post` is answered or has failed."""
        waits: set[asyncio.Future[Any]] = set(self._unanswered)
        if self._posted:
            if self._posted_empty is None or self._posted_empty.done():
                self._posted_empty = asyncio.get_running_loop().create_future()
            waits.add(self._posted_empty)
        if waits:
            await asyncio.wait(waits, timeout=timeout_s)

    async def _sweep(self) -> None:
        """Fail requests past their deadline with RequestTimeout (their outcome is unknown)."""
        while self._deadlines:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now = time.monotonic()
            suspect = False
            for corr, (deadline, timeout_s) in list(self._deadlines.items()):
                if deadline <= now:
                    del self._deadlines[corr]
                    if (entry := self._pending.pop(corr, None)) is not None:
                        suspect = suspect or entry[1] is not self._probe
                        if not entry[1].done():
                            entry[1].set_exception(_timed_out(entry[0], timeout_s))
                    elif (posted := self._posted.get(corr)) is not None:
                        suspect = True
                        self._posted_answered(corr, _timed_out(posted[0], timeout_s))
            if suspect:
                self._send_probe()

    def _send_probe(self) -> None:
        """A request timed out: PING, unless a probe is out already (see the class docstring)."""
        if self._closed is not None or (self._probe is not None and not self._probe.done()):
            return
        self._heard = False
        _, probe = self._submit(Opcode.PING, Empty(), min(self._timeout_s, PROBE_S))
        self._probe = probe
        probe.add_done_callback(functools.partial(self._probed, self._wire))

    def _probed(self, wire: Wire | None, probe: asyncio.Future[Any]) -> None:
        """The probe ended: nothing heard from the broker in time closes ``wire`` as dead."""
        if probe.cancelled() or not isinstance(probe.exception(), RequestTimeout):
            return  # answered, or the connection is gone already
        if self._heard or self._wire is not wire or wire is None or self._closed is not None:
            return
        where = f"{self._host}:{self._port}"
        err = ConnectionClosed(
            f"the connection to {where} is presumed dead: a request got no answer, and then "
            f"nothing came back to a PING within {min(self._timeout_s, PROBE_S):g} s; the next "
            "request connects again"
        )
        log.warning("%s", err)
        self._fail(err)
        wire.abort()  # nothing queued for a dead link is worth flushing before the close

    def _answered(self, frames: list[Frame]) -> None:
        """Hand each answer to its request (called by the connection as frames arrive, with
        those it did not hand over itself: see the wire module's docstring)."""
        self._heard = True
        pending, deadlines = self._pending, self._deadlines
        for frame in frames:
            if frame.opcode == _STREAM:
                err = decode_error(frame.body)
                cause = error_class(err.code)(err.message)
                if isinstance(cause, ConnectionLimit):  # the next request connects again
                    cause = ConnectionClosed(
                        f"the broker closed the connection ({cause.code}): {cause}"
                    )
                self._fail(cause)
                if self._wire is not None:
                    self._wire.close()
                return
            corr = frame.corr_id
            deadlines.pop(corr, None)
            entry = pending.pop(corr, None)
            if entry is None:
                if corr in self._posted:  # its answer is only looked at for an error
                    failure = None
                    if frame.kind == _ERROR:
                        body = decode_error(frame.body)
                        failure = error_class(body.code)(body.message)
                    self._posted_answered(corr, failure)
                continue  # else the request timed out; its answer is dropped
            opcode, fut = entry
            if fut.done():
                continue  # cancelled by its caller
            if frame.kind == _ERROR:
                err = decode_error(frame.body)
                fut.set_exception(error_class(err.code)(err.message))
                continue
            try:
                fut.set_result(decode_response(opcode, frame.body))
            except TxbError as e:  # an unreadable answer fails its request, not the connection
                fut.set_exception(e)

    def _fail(self, err: TxbError) -> None:
        if self._closed is None:
            self._closed = err
        if self._out is not None:
            self._out.clear()  # their requests fail below; a new connection must not send them
        pending, self._pending = self._pending, {}
        self._deadlines.clear()
        for _, fut in pending.values():
            if not fut.done():
                fut.set_exception(err)
        for corr in list(self._posted):
            self._posted_answered(corr, err)


def _ignore(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved: a failed keepalive PING is nobody's error


def _timed_out(opcode: int, timeout_s: float) -> RequestTimeout:
    return RequestTimeout(
        f"{Opcode(opcode).name} got no answer within {timeout_s:g} s (its outcome is unknown)"
    )


def _posted_failed(opcode: int, body: Any, note: str, err: BaseException) -> None:
    log.warning("%s %s not confirmed (%s); %s", Opcode(opcode).name, body, err, note)


def _posted_done(opcode: int, body: Any, note: str, fut: asyncio.Future[Any]) -> None:
    """A posted request sent by a reconnecting task (:meth:`Client.post`) has ended."""
    if not fut.cancelled() and (err := fut.exception()) is not None:
        _posted_failed(opcode, body, note, err)
