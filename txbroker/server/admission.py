"""Connection limits: who gets a connection slot, how long a slot is kept without HELLO or
without traffic, and how fast one connection may send frames.

Slots with a reserve for authenticated connections (a flood of sockets that never say HELLO
pushes out its own oldest members), a handshake deadline, an idle deadline, and a token bucket
of frames per connection. The hot path reads no clock: a connection marks itself heard and takes
tokens as frames arrive, and one sweeper does the rest (:class:`Admission` draws the states).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass
from typing import Any, Final, Protocol

from txbroker.errors import HandshakeTimeout, IdleTimeout, InvalidArgument, TxbError

__all__ = [
    "FILES_MARGIN",
    "HANDSHAKE_TIMEOUT_MS",
    "IDLE_TIMEOUT_MS",
    "MAX_CONNECTIONS",
    "MAX_FRAMES_PER_S",
    "REASONS",
    "Admission",
    "Guarded",
    "Limits",
    "checked_limits",
    "fit_limits",
]

log = logging.getLogger(__name__)

# Why the broker refused or closed a connection (the ``reason`` of the refused counter).
REASONS: Final = (
    "max_connections",  # every slot held by authenticated connections: refused at accept
    "handshake_evicted",  # a connection still without HELLO, closed to make room for a newer one
    "handshake_timeout",  # no HELLO within handshake_timeout_ms
    "unauthenticated",  # wrong or missing auth token
    "idle_timeout",  # an authenticated connection silent for idle_timeout_ms
    "frame_rate",  # over max_frames_per_s
)
# The default limits, a broker's (ServerConfig, which says why each) and the NameServer's.
MAX_CONNECTIONS: Final = 10_000
HANDSHAKE_TIMEOUT_MS: Final = 5_000
IDLE_TIMEOUT_MS: Final = 300_000
MAX_FRAMES_PER_S: Final = 200_000
# Handshake deadlines are kept to this precision; idle connections and buckets once a second.
HANDSHAKE_SWEEP_S: Final = 0.1
PASS_S: Final = 1.0
# A bucket holds this many seconds of the rate: a burst a client may send after a quiet spell.
BURST_S: Final = 2.0
# Descriptors kept free beside the connections when the open-file limit caps them: the store's
# files created while running (a segment, consume-queue and index files), HTTP admin clients,
# the flush helper's pipes. The back-check client's pool (check_concurrency) comes on top.
FILES_MARGIN: Final = 256


class Guarded(Protocol):
    """What the admission needs of a connection (``connection.py``)."""

    heard: bool  # set by the connection when bytes arrive; cleared by the sweeper
    tokens: float  # frames the connection may still send; it takes one a frame

    @property
    def inflight(self) -> int: ...

    def refuse(self, err: TxbError) -> None:
        """Send ``err`` on the STREAM opcode and close now."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int
    reserved: int  # slots only authenticated connections may take
    handshake_timeout_s: float
    idle_timeout_s: float  # 0: never
    max_frames_per_s: int  # 0: no limit

    def __post_init__(self) -> None:
        assert self.max_connections >= 1 and 0 <= self.reserved < self.max_connections
        assert self.handshake_timeout_s > 0 and self.idle_timeout_s >= 0
        assert self.max_frames_per_s >= 0

    @property
    def bucket(self) -> float:
        """A fresh connection's tokens (also the most a bucket holds)."""
        return self.max_frames_per_s * BURST_S if self.max_frames_per_s else float("inf")


class Admission:
    """The broker's connection slots, deadlines and frame buckets.

    A connection is in one of two states here, and moves forward only::

        HANDSHAKE ──HELLO (or, without an auth token, a first request)──▶ OPEN
            │                                                              │
            └── handshake deadline, eviction ──▶ closed ◀── idle, rate ────┘

    - **Slots.** At most ``max_connections`` are open. Connections in HANDSHAKE may hold all but
      ``reserved`` of them, so authenticated clients always have ``reserved`` slots to themselves.
      When a new connection finds the handshake slots (or all slots) full, the *oldest* connection
      still in HANDSHAKE is closed to make room: a flood of sockets that never say HELLO keeps
      pushing out its own oldest members, while a real client, which sends HELLO in its first
      round trip, is through the handshake long before the flood's newer sockets reach it. Only
      when every slot is held by authenticated connections is a new one refused.
    - **Deadlines.** A connection must complete HELLO within ``handshake_timeout_s``; an OPEN one
      with no request in flight (a held long poll *is* in flight) that sends nothing for
      ``idle_timeout_s`` is closed.
    - **Frame rate.** A token bucket per connection: ``max_frames_per_s`` tokens a second, holding
      up to twice that (a burst). A connection that sends faster is told ``RATE_LIMITED`` and
      closed.

    One sweeper refills the buckets and looks for idle connections once a second, and expires
    handshakes ten times a second, starting from the oldest and stopping at the first still within
    its deadline.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._handshake_max = limits.max_connections - limits.reserved
        # HANDSHAKE connections by when they were accepted, oldest first (insertion order).
        self._handshaking: dict[Guarded, float] = {}
        # OPEN connections by when they were last heard (as seen by the once-a-second pass).
        self._open: dict[Guarded, float] = {}
        self.refused: collections.Counter[str] = collections.Counter(dict.fromkeys(REASONS, 0))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def open_count(self) -> int:
        return len(self._handshaking) + len(self._open)

    @property
    def handshaking(self) -> int:
        return len(self._handshaking)

    @property
    def authenticated(self) -> int:
        return len(self._open)

    # --- the connection's events ---

    def admit(self, conn: Guarded) -> bool:
        """A connection was accepted: True if it may stay (in HANDSHAKE). False: every slot
        is held by an authenticated connection, and the caller refuses it."""
        if self._handshaking and (
            len(self._handshaking) >= self._handshake_max
            or self.open_count >= self.limits.max_connections
        ):
            oldest = next(iter(self._handshaking))
            self._close(
                oldest,
                "handshake_evicted",
                HandshakeTimeout(
                    "closed to make room for newer connections: send HELLO right after connecting"
                ),
            )
        if self.open_count >= self.limits.max_connections:
            self.refused["max_connections"] += 1
            return False
        conn.heard, conn.tokens = False, self.limits.bucket
        self._handshaking[conn] = self._now()
        return True

    def opened(self, conn: Guarded) -> None:
        """HANDSHAKE -> OPEN: the connection completed HELLO (or, with no auth token, sent a
        first request)."""
        accepted = self._handshaking.pop(conn, None)
        assert accepted is not None, "only a connection in HANDSHAKE can be opened"
        self._open[conn] = self._now()

    def lost(self, conn: Guarded) -> None:
        """The connection is gone, for whatever reason."""
        self._handshaking.pop(conn, None)
        self._open.pop(conn, None)

    def count(self, reason: str) -> None:
        """A refusal the connection itself decided (an unauthenticated or over-rate one)."""
        assert reason in self.refused, reason
        self.refused[reason] += 1

    # --- the sweeper ---

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._sweeper = self._loop.create_task(self._sweep(), name="txb-admission")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)

    async def _sweep(self) -> None:
        last_pass = self._now()
        while True:
            await asyncio.sleep(HANDSHAKE_SWEEP_S)
            now = self._now()
            self.expire_handshakes(now)
            if now - last_pass >= PASS_S:
                self.pass_open(now, now - last_pass)
                last_pass = now

    def expire_handshakes(self, now: float) -> None:
        deadline = now - self.limits.handshake_timeout_s
        while self._handshaking:
            conn, accepted = next(iter(self._handshaking.items()))
            if accepted > deadline:
                return  # the rest are younger
            self._close(
                conn,
                "handshake_timeout",
                HandshakeTimeout(
                    f"no HELLO within {self.limits.handshake_timeout_s:g} s of connecting"
                ),
            )

    def pass_open(self, now: float, elapsed_s: float) -> None:
        """Refill every bucket for ``elapsed_s`` and close connections idle too long."""
        idle_s, rate = self.limits.idle_timeout_s, self.limits.max_frames_per_s
        refill, bucket = rate * elapsed_s, self.limits.bucket
        for conn, heard_at in list(self._open.items()):
            if rate:
                conn.tokens = min(conn.tokens + refill, bucket)
            if conn.heard or conn.inflight:
                conn.heard = False
                self._open[conn] = now
            elif idle_s and now - heard_at >= idle_s:
                self._close(
                    conn,
                    "idle_timeout",
                    IdleTimeout(f"nothing received for {idle_s:g} s; connect again to go on"),
                )

    # ---

    def _close(self, conn: Guarded, reason: str, err: TxbError) -> None:
        self.lost(conn)
        self.refused[reason] += 1
        conn.refuse(err)

    def _now(self) -> float:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.time()

    def info(self) -> dict[str, Any]:
        """For /healthz and the admin API: the limits, what is open now, and the refusals."""
        lim = self.limits
        return {
            "open": self.open_count,
            "authenticated": len(self._open),
            "handshaking": len(self._handshaking),
            "max": lim.max_connections,
            "reserved": lim.reserved,
            "handshake_timeout_ms": round(lim.handshake_timeout_s * 1000),
            "idle_timeout_ms": round(lim.idle_timeout_s * 1000),
            "max_frames_per_s": lim.max_frames_per_s,
            "refused": dict(self.refused),
        }


def checked_limits(
    max_connections: int = MAX_CONNECTIONS,
    reserved_connections: int | None = None,
    handshake_timeout_ms: int = HANDSHAKE_TIMEOUT_MS,
    idle_timeout_ms: int = IDLE_TIMEOUT_MS,
    max_frames_per_s: int = MAX_FRAMES_PER_S,
) -> Limits:
    """The limits of these settings (a broker's or a NameServer's), each checked with an error
    that names it; ``reserved_connections`` None: a tenth of ``max_connections``."""
    if max_connections < 2:
        raise InvalidArgument(f"max_connections must be at least 2, got {max_connections}")
    if reserved_connections is None:
        reserved_connections = max(1, max_connections // 10)
    elif not 0 <= reserved_connections < max_connections:
        raise InvalidArgument(
            f"reserved_connections must be 0..max_connections-1 "
            f"({max_connections - 1}), got {reserved_connections}"
        )
    if handshake_timeout_ms <= 0:
        raise InvalidArgument(f"handshake_timeout_ms must be positive, got {handshake_timeout_ms}")
    if idle_timeout_ms != 0 and idle_timeout_ms < 1_000:
        # Idle connections are looked for once a second: a shorter limit cannot be kept.
        raise InvalidArgument(
            f"idle_timeout_ms must be 0 (never) or at least 1000, got {idle_timeout_ms}"
        )
    if max_frames_per_s < 0:
        raise InvalidArgument(
            f"max_frames_per_s must be 0 (no limit) or positive, got {max_frames_per_s}"
        )
    return Limits(
        max_connections,
        reserved_connections,
        handshake_timeout_ms / 1000,
        idle_timeout_ms / 1000,
        max_frames_per_s,
    )


def fit_limits(max_connections: int, reserved: int, files_free: int) -> tuple[int, int]:
    """``max_connections`` and ``reserved`` lowered to fit ``files_free`` descriptors (at least
    two connections, one reserved when any was asked for), the reserve in proportion."""
    if files_free >= max_connections:
        return max_connections, reserved
    fitted = max(2, files_free)
    return fitted, min(max(reserved * fitted // max_connections, min(reserved, 1)), fitted - 1)
