"""Background loops that never stop in silence: each reports how it is doing to its
:class:`LoopHealth`, and a :class:`Supervisor` restarts the ones that fail.

    health = LoopHealth("outbox relay")
    delay_s = health.failed(e)   # logged once per cause with what to do, counted, classified
    health.ok()                  # working (again): "working again" logged after a failure

A failure is either *transient* (the broker restarting, the database away: retried with a
backoff doubling from 100 ms to 5 s, and the service stays ready, since restarting it would not
help) or *blocked*: something only a person can fix (the broker refuses the token, the tables
or a topic are missing, TLS settings, a bug). Blocked loops are retried every
``blocked_retry_s`` and make the service not ready. :class:`TxbService` serves the report as
``/txb/ready``; docs/sdk.md ("Supervision") has the table of causes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from opentelemetry.metrics import Counter, MeterProvider, get_meter_provider
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError

from txbroker.errors import (
    BadRequest,
    Forbidden,
    InvalidArgument,
    InvalidName,
    MessageTooLarge,
    NotFound,
    ProtocolError,
    TxbError,
    Unauthenticated,
)
from txbroker_sdk.errors import TablesMissing, TlsFailed

__all__ = [
    "BLOCKED_RETRY_S",
    "TRANSIENT_MAX_S",
    "Diagnosis",
    "LoopHealth",
    "LoopState",
    "Policy",
    "Supervisor",
    "diagnose",
    "unless_stopped",
]

log = logging.getLogger(__name__)

# A transient failure is retried after 100 ms, doubling up to this: a broker restart takes
# seconds, and an attempt costs one connection.
TRANSIENT_MIN_S: Final = 0.1
TRANSIENT_MAX_S: Final = 5.0
# A blocked loop is tried again this often: a person fixing the cause (a token, a migration)
# sees it working within a probe period or two (Kubernetes probes every 10 s by default).
BLOCKED_RETRY_S: Final = 30.0
# What an error's text may take in a log line or the readiness answer: its cause, not a dump.
ERROR_CHARS_MAX: Final = 300
METER_NAME: Final = "txbroker_sdk"


class LoopState(enum.StrEnum):
    STARTING = "starting"  # not yet working: not ready
    RUNNING = "running"
    RETRYING = "retrying"  # a transient failure: retried soon; still ready
    BLOCKED = "blocked"  # needs a person (``action`` says what): not ready
    STOPPED = "stopped"  # the service is stopping: not ready


# Which state may follow which (STARTING again: a lifespan started once more).
_NEXT: Final[dict[LoopState, frozenset[LoopState]]] = {
    LoopState.STARTING: frozenset(LoopState) - {LoopState.STARTING},
    LoopState.RUNNING: frozenset(LoopState) - {LoopState.STARTING},
    LoopState.RETRYING: frozenset(LoopState) - {LoopState.STARTING},
    LoopState.BLOCKED: frozenset(LoopState) - {LoopState.STARTING},
    LoopState.STOPPED: frozenset({LoopState.STARTING, LoopState.STOPPED}),
}
_READY: Final = frozenset({LoopState.RUNNING, LoopState.RETRYING})


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What an error means for a loop: its cause (for once-per-cause logging and the metric),
    whether retrying soon can fix it, and what a person should do."""

    cause: str  # the error's code, or its class name
    blocked: bool
    action: str
    traceback: bool = False  # unexpected: the traceback is logged too (once)


def diagnose(e: BaseException) -> Diagnosis:
    """The one place that says what each error of a background loop means."""
    cause = e.code if isinstance(e, TxbError) else type(e).__name__
    if isinstance(e, Unauthenticated):
        return Diagnosis(
            cause,
            True,
            "the broker refused this service's auth token: restart the service with "
            "TXB_AUTH_TOKEN (or auth_token=) set to a token the broker holds, or give the "
            "broker this one",
        )
    if isinstance(e, Forbidden):
        return Diagnosis(
            cause,
            True,
            "the token lacks a role this loop needs on its topic: give its [[tokens]] entry "
            "the role (consume for a subscriber, produce for a relay) on that topic",
        )
    if isinstance(e, TablesMissing):
        return Diagnosis(
            cause, True, f"run `txbroker db upgrade --url {e.url}` (or start with migrate=True)"
        )
    if isinstance(e, NotFound):
        return Diagnosis(
            cause,
            True,
            "create the topic (`txbroker topic create NAME`); a service creates the topics it "
            "names at start only when its token is admin",
        )
    if isinstance(e, TlsFailed):
        return Diagnosis(
            cause, True, "check TXB_TLS_CA, TXB_TLS_CLIENT_CERT and TXB_TLS_CLIENT_KEY"
        )
    if isinstance(e, MessageTooLarge):
        return Diagnosis(
            cause,
            True,
            "a message over the broker's size limits: make it smaller, or raise the limit",
        )
    if isinstance(e, BadRequest | InvalidName | ProtocolError):
        return Diagnosis(
            cause,
            True,
            "the broker refuses the request itself: check the names this service uses and "
            "that the broker's version matches the SDK's",
        )
    if isinstance(e, TxbError):  # the connection, a timeout, the broker's own trouble (a store
        # error, an entry it cannot read: InvalidOffset), which it may get over
        return Diagnosis(
            cause,
            False,
            "retrying; if it lasts, check that the broker runs at TXB_SERVER and its log",
        )
    if isinstance(e, OperationalError | InterfaceError | OSError | TimeoutError) or (
        isinstance(e, DBAPIError) and e.connection_invalidated
    ):
        return Diagnosis(cause, False, "retrying; if it lasts, check that the database is up")
    if isinstance(e, SQLAlchemyError):
        return Diagnosis(
            cause,
            True,
            "the database refused the statement: check the service's database user and schema",
        )
    return Diagnosis(
        cause, True, "an unexpected error (see the traceback): report it", traceback=True
    )


def _text(e: BaseException) -> str:
    reason = getattr(e, "orig", None) or e  # a driver's message, without SQLAlchemy's SQL
    text = f"{type(e).__name__}: {reason}"
    return text if len(text) <= ERROR_CHARS_MAX else text[: ERROR_CHARS_MAX - 3] + "..."


class Policy:
    """What the loops of one service share: the slow retry, the failure counter
    (``txbroker.service.loop.failures``) and who hears of a blocked loop."""

    def __init__(
        self,
        *,
        blocked_retry_s: float = BLOCKED_RETRY_S,
        meter_provider: MeterProvider | None = None,
        on_blocked: Callable[[LoopHealth], None] | None = None,
    ) -> None:
        if not blocked_retry_s > 0:
            raise InvalidArgument(f"blocked_retry_s must be > 0, not {blocked_retry_s!r}")
        self.blocked_retry_s = blocked_retry_s
        meter = (meter_provider or get_meter_provider()).get_meter(METER_NAME)
        self.failures: Counter = meter.create_counter(
            "txbroker.service.loop.failures",
            unit="{failure}",
            description="Failures of a service's background loops, by loop and error type.",
        )
        self.on_blocked = on_blocked


_default_policy: Policy | None = None


def _default() -> Policy:
    global _default_policy
    if _default_policy is None:  # made on first use: the global meter provider is set by then
        _default_policy = Policy()
    return _default_policy


class LoopHealth:
    """How one background loop is doing: its :class:`LoopState`, since when, its failures,
    the last one and what to do about it. The loop calls :meth:`ok` when it works (cheap: on
    every fetch) and :meth:`failed` when it does not, and waits the delay that returns."""

    def __init__(self, name: str, policy: Policy | None = None) -> None:
        self.name = name
        self.policy = policy
        self.state = LoopState.STARTING
        self.since = datetime.now(UTC)
        self.failures = 0
        self.last_error: str | None = None
        self.action: str | None = None
        self._logged: str | None = None  # the cause logged since the loop last worked
        self._backoff_s = 0.0
        self._retry_at: float | None = None  # time.monotonic() of the next attempt

    @property
    def ready(self) -> bool:
        return self.state in _READY

    def _to(self, state: LoopState) -> None:
        if state is self.state:
            return
        assert state in _NEXT[self.state], f"{self.name}: {self.state} -> {state}"
        self.state = state
        self.since = datetime.now(UTC)

    def ok(self) -> None:
        if self.state is LoopState.RUNNING:
            return
        if self._logged is not None:
            log.info("%s: working again (after %d failures)", self.name, self.failures)
        self._logged = None
        self._backoff_s = 0.0
        self._retry_at = None
        self._to(LoopState.RUNNING)

    def failed(self, e: BaseException) -> float:
        """Record ``e``; return how long to wait before the next attempt."""
        policy = self.policy or _default()
        d = diagnose(e)
        self.failures += 1
        self.last_error = _text(e)
        self.action = d.action
        policy.failures.add(1, {"txbroker.loop": self.name, "error.type": d.cause})
        if d.blocked:
            delay_s = policy.blocked_retry_s
        else:
            self._backoff_s = min(max(self._backoff_s * 2, TRANSIENT_MIN_S), TRANSIENT_MAX_S)
            delay_s = self._backoff_s
        self._retry_at = time.monotonic() + delay_s
        was = self.state
        self._to(LoopState.BLOCKED if d.blocked else LoopState.RETRYING)
        if d.cause != self._logged:
            self._logged = d.cause
            log.error(
                "%s failed: %s. What to do: %s%s",
                self.name,
                self.last_error,
                d.action,
                f" (retried every {delay_s:g} s; the service is not ready until it works)"
                if d.blocked
                else "",
                exc_info=e if d.traceback else None,
            )
        else:
            log.debug("%s failed again: %s", self.name, self.last_error)
        if d.blocked and was is not LoopState.BLOCKED and policy.on_blocked is not None:
            policy.on_blocked(self)
        return delay_s

    def stopped(self) -> None:
        self._retry_at = None
        self._to(LoopState.STOPPED)

    def report(self) -> dict[str, Any]:
        """This loop in the readiness answer."""
        retry_in_s = None
        if self._retry_at is not None and self.state in (LoopState.RETRYING, LoopState.BLOCKED):
            retry_in_s = round(max(self._retry_at - time.monotonic(), 0.0), 1)
        return {
            "name": self.name,
            "state": self.state.value,
            "ready": self.ready,
            "since": self.since.isoformat(timespec="seconds"),
            "failures": self.failures,
            "last_error": self.last_error,
            "action": self.action if self.state is not LoopState.RUNNING else None,
            "retry_in_s": retry_in_s,
        }


Loop = Callable[[asyncio.Event], Awaitable[None]]
T = TypeVar("T")


async def unless_stopped(step: Awaitable[T], stop: asyncio.Event) -> T | None:
    """``step``'s result, or None once ``stop`` is set first: a step can wait long (a long
    poll, or reconnecting to a broker that is gone) and must not hold up a shutdown."""
    stepping = asyncio.ensure_future(step)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({stepping, stopped}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        stepping.cancel()
        raise
    finally:
        stopped.cancel()
    if stepping.done():
        return stepping.result()
    stepping.cancel()
    await asyncio.gather(stepping, return_exceptions=True)
    return None


class Supervisor:
    """Runs loops until a stop event, each restarted when it raises: after the delay its
    :class:`LoopHealth` gives (slow when blocked), forever. A loop that reports its own
    health (``ok``, ``failed``) is ready once it says so; one that does not is counted as
    running while it runs. With ``exit_when_blocked``, a blocked loop calls ``exit`` instead
    (the service exits, for a process supervisor to restart it)."""

    def __init__(
        self,
        *,
        blocked_retry_s: float = BLOCKED_RETRY_S,
        meter_provider: MeterProvider | None = None,
        exit_when_blocked: Callable[[LoopHealth], None] | None = None,
    ) -> None:
        self.policy = Policy(
            blocked_retry_s=blocked_retry_s,
            meter_provider=meter_provider,
            on_blocked=exit_when_blocked,
        )
        self.loops: list[LoopHealth] = []
        self.tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()

    def start(self, run: Loop, health: LoopHealth | str) -> LoopHealth:
        """Run ``run(stop)`` under supervision; ``health`` is the loop's own (it reports) or,
        given as a name, made here (it does not)."""
        reports = isinstance(health, LoopHealth)
        h = health if isinstance(health, LoopHealth) else LoopHealth(health)
        h.policy = self.policy
        h._to(LoopState.STARTING)
        self.loops.append(h)
        task = asyncio.create_task(self._supervise(run, h, reports), name=f"txbroker {h.name}")
        self.tasks.append(task)
        return h

    @property
    def ready(self) -> bool:
        return all(h.ready for h in self.loops)

    @property
    def live(self) -> bool:
        """Every supervisor task is there while the service runs (a dead one is a bug)."""
        return self._stop.is_set() or not any(t.done() for t in self.tasks)

    def report(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "live": self.live,
            "loops": [h.report() for h in self.loops],
        }

    async def _supervise(self, run: Loop, h: LoopHealth, reports: bool) -> None:
        stop = self._stop
        try:
            while not stop.is_set():
                if not reports:
                    h.ok()  # it says nothing itself: running while it runs
                try:
                    await run(stop)
                    if stop.is_set():
                        break
                    raise RuntimeError(f"{h.name} returned before the service stopped")
                except Exception as e:
                    if stop.is_set():
                        log.warning("%s failed while stopping: %s", h.name, _text(e))
                        break
                    delay_s = h.failed(e)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay_s)
        finally:
            h.stopped()

    async def stop(self, timeout_s: float) -> None:
        """Set the stop event; wait for the loops (at most ``timeout_s``), then cancel."""
        self._stop.set()
        if not self.tasks:
            return
        _, late = await asyncio.wait(self.tasks, timeout=max(timeout_s, 0.001))
        for task in late:
            log.warning("shutdown: %s did not stop in time; cancelling it", task.get_name())
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=1.0)  # cancelled: their cleanup is short
