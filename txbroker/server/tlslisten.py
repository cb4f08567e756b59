"""The broker's TCP listener when it serves TLS: a plain client is told so, in plain bytes.

``loop.create_server(ssl=...)`` would answer a client that speaks plain frames with a failed
handshake and a closed socket, and the client would retry for no reason it can see. This
listener peeks at each socket's first byte: a TLS handshake record goes to the event loop as a
TLS connection; anything else gets one ``TLS_REQUIRED`` error frame and is closed. Sockets that
have not sent their first byte are bounded like connections without HELLO (admission.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Final

from txbroker.errors import TlsRequired
from txbroker.protocol.codec import encode_frame
from txbroker.protocol.frames import FrameKind, Opcode
from txbroker.protocol.messages import ErrorBody, encode_body
from txbroker.runtime.tls import TLS_HANDSHAKE_RECORD

__all__ = ["TlsListener"]

log = logging.getLogger(__name__)

# Sockets accepted per wake-up of the listening socket: others wait for the next turn, so a
# connect flood cannot hold the event loop.
ACCEPT_BATCH: Final = 64
# After EMFILE (no descriptor left), accepting pauses this long, as asyncio's own server does.
ACCEPT_PAUSE_S: Final = 1.0
# A refused plain client's socket is kept (its input discarded) this long before it closes:
# as connection.py's LINGER_S.
LINGER_S: Final = 1.0

# What a plain client is told (a NameServer names its own scheme).
BROKER_REFUSAL: Final = (
    "this broker serves TLS on this port: connect with txbs://host:port (docs/client.md, 'TLS')"
)


def _refusal(note: str) -> bytes:
    return encode_frame(
        FrameKind.ERROR, Opcode.STREAM, 0, encode_body(ErrorBody(TlsRequired.code, note))
    )


class TlsListener:
    """Serves TLS on ``host:port`` to what ``factory`` makes (see the module docstring). Looks
    like an ``asyncio.Server`` to the broker: ``sockets``, ``close``, ``wait_closed``.

    The first byte is read without consuming it (``MSG_PEEK``): 0x16, a TLS handshake record, is
    handed over with ``connect_accepted_socket``, the handshake bounded by the HELLO deadline;
    anything else gets a ``STREAM`` error frame and is closed after the lingering the plain
    connection does too (closing with unread input would reset it and lose the error). At most
    ``pending_max`` sockets wait for their first byte, the oldest closed to make room, each for
    at most the HELLO deadline. From the handshake on, a connection is an ordinary
    ``Connection``."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        context: ssl.SSLContext,
        *,
        handshake_timeout_s: float,
        pending_max: int,
        refusal: str = BROKER_REFUSAL,
    ) -> None:
        self._factory = factory
        self._refusal = _refusal(refusal)
        self._ctx = context
        self._timeout_s = handshake_timeout_s
        self._pending_max = max(1, pending_max)
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._pending: dict[socket.socket, asyncio.TimerHandle] = {}
        self._handshakes: set[asyncio.Task[None]] = set()
        self.refused_plain = 0  # plain clients told to use TLS
        self.failed_handshakes = 0

    @property
    def sockets(self) -> list[socket.socket]:
        return [self._sock] if self._sock is not None else []

    def listen(self, host: str, port: int, backlog: int) -> None:
        sock = socket.create_server((host, port), backlog=backlog)
        sock.setblocking(False)
        self._sock = sock
        self._loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        assert self._sock is not None
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE, ENFILE, ENOBUFS: wait for descriptors to come back
                log.warning("TLS listener: cannot accept (%s); pausing %.0f s", e, ACCEPT_PAUSE_S)
                fd = self._sock.fileno()
                self._loop.remove_reader(fd)
                self._loop.call_later(ACCEPT_PAUSE_S, self._resume_accepting, self._sock)
                return
            conn.setblocking(False)
            while len(self._pending) >= self._pending_max:
                self._drop(next(iter(self._pending)))  # the oldest silent socket
            self._pending[conn] = self._loop.call_later(self._timeout_s, self._drop, conn)
            self._loop.add_reader(conn.fileno(), self._first_byte, conn)

    def _resume_accepting(self, sock: socket.socket) -> None:
        if self._sock is sock:
            self._loop.add_reader(sock.fileno(), self._accept)

    def _forget(self, conn: socket.socket) -> bool:
        timer = self._pending.pop(conn, None)
        if timer is None:
            return False
        timer.cancel()
        self._loop.remove_reader(conn.fileno())
        return True

    def _drop(self, conn: socket.socket) -> None:
        if self._forget(conn):
            conn.close()

    def _first_byte(self, conn: socket.socket) -> None:
        try:
            head = conn.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return  # spurious wake-up: still registered
        except OSError:
            self._drop(conn)
            return
        self._forget(conn)
        if not head:
            conn.close()
        elif head[0] == TLS_HANDSHAKE_RECORD:
            task = self._loop.create_task(self._handshake(conn))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)
        else:
            self.refused_plain += 1
            self._refuse(conn)

    async def _handshake(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(
                self._factory, conn, ssl=self._ctx, ssl_handshake_timeout=self._timeout_s
            )
        except (OSError, ssl.SSLError, TimeoutError) as e:
            self.failed_handshakes += 1
            # The reason only (no certificate contents, nothing the client sent).
            log.info("TLS handshake failed: %s", getattr(e, "reason", None) or type(e).__name__)
            conn.close()

    def _refuse(self, conn: socket.socket) -> None:
        """One plain error frame, then lingering: discard what arrives, close after LINGER_S."""
        try:
            conn.send(self._refusal)  # 100-odd bytes into an empty send buffer: never short
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            conn.close()
            return
        fd = conn.fileno()

        def discard() -> None:
            try:
                if conn.recv(65536):
                    return
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                pass
            close()

        def close() -> None:
            if conn.fileno() != -1:
                self._loop.remove_reader(fd)
                conn.close()

        self._loop.add_reader(fd, discard)
        self._loop.call_later(LINGER_S, close)

    def close(self) -> None:
        if self._sock is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        for conn in list(self._pending):
            self._drop(conn)
        for task in self._handshakes:
            task.cancel()

    async def wait_closed(self) -> None:
        if self._handshakes:
            await asyncio.gather(*self._handshakes, return_exceptions=True)
