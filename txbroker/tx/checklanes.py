"""Fair lanes for back-checks: which due check goes out next, and to which endpoint not yet.

One broken service must not delay another's recovery. Due checks wait in one queue per
(endpoint, producer group), served round robin, and each endpoint (scheme, host, port) has its
own concurrency bound, send rate and circuit breaker on top of the checker's global lanes
(:class:`FairLanes`). Checks waiting behind a limit are not attempts: they keep their place and
count nothing toward parking. Pure bookkeeping with no I/O and no clock of its own (callers pass
``now``, monotonic seconds), so every rule is tested directly.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

__all__ = ["Breaker", "EndpointInfo", "FairLanes", "LaneSettings", "endpoint_of"]

# Openings past this do not lengthen the cool-down (2**20 times the base is past any cap).
MAX_DOUBLINGS: Final = 20
# A rate slot this close is taken now: the event loop's timers are no finer than this anyway.
SLACK_S: Final = 0.001


def endpoint_of(url: str) -> str:
    """The unit the limits apply to: scheme, host and port of a check URL."""
    u = urlsplit(url)
    return f"{u.scheme}://{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"


class Breaker(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class LaneSettings:
    endpoint_concurrency: int = 8
    rate_per_s: float = 100.0
    breaker_failures: int = 5
    breaker_base_ms: int = 5_000
    breaker_cap_ms: int = 300_000

    def __post_init__(self) -> None:
        if self.endpoint_concurrency < 1:
            raise ValueError("endpoint_concurrency must be at least 1")
        if not self.rate_per_s > 0:
            raise ValueError("rate_per_s must be positive")
        if self.breaker_failures < 1:
            raise ValueError("breaker_failures must be at least 1")
        if not 0 < self.breaker_base_ms <= self.breaker_cap_ms:
            raise ValueError("need 0 < breaker_base_ms <= breaker_cap_ms")


@dataclass(frozen=True, slots=True)
class EndpointInfo:
    """One endpoint as the admin API shows it."""

    endpoint: str
    breaker: Breaker
    inflight: int
    queued: int
    failures: int  # consecutive timeouts or connection failures
    opened: int  # consecutive openings (the cool-down doubles with each)
    retry_in_ms: int  # until an OPEN endpoint gets its probe; 0 otherwise


@dataclass(slots=True)
class _Endpoint:
    name: str
    inflight: int = 0
    queued: int = 0
    next_send: float = 0.0  # monotonic seconds: the rate's next free slot
    failures: int = 0
    breaker: Breaker = Breaker.CLOSED
    opened: int = 0
    open_until: float = 0.0
    probing: bool = False


@dataclass(slots=True)
class _Queue:
    endpoint: _Endpoint
    items: deque[str] = field(default_factory=deque)


class FairLanes:
    """Due checks by (endpoint, producer group), handed out round robin within the limits.

    Round robin over the queues, so 10,000 checks due at one endpoint and one due at another take
    turns instead of going out in due order. Each endpoint's limits:

    - at most ``endpoint_concurrency`` checks in flight, so a hanging endpoint holds a few lanes,
      never all of them;
    - at most ``rate_per_s`` sends per second, spaced evenly;
    - a circuit breaker: after ``breaker_failures`` checks in a row that timed out or could not
      connect, the endpoint is OPEN and gets nothing for a cool-down (``breaker_base_ms`` doubling
      to ``breaker_cap_ms``); then it is HALF_OPEN and gets one probe, whose outcome closes it or
      opens it again for twice as long. An answer of any kind (even a 500) closes it: the endpoint
      is there, and only hanging or unreachable ones hold lanes for long.
    """

    def __init__(self, settings: LaneSettings) -> None:
        self.settings = settings
        self._interval = 1.0 / settings.rate_per_s
        self._endpoints: dict[str, _Endpoint] = {}
        self._queues: dict[tuple[str, str], _Queue] = {}
        self._turns: deque[tuple[str, str]] = deque()  # non-empty queues, next turn first

    def __len__(self) -> int:
        return sum(len(q.items) for q in self._queues.values())

    def push(self, item: str, endpoint: str, group: str) -> None:
        key = (endpoint, group)
        q = self._queues.get(key)
        if q is None:
            ep = self._endpoints.get(endpoint)
            if ep is None:
                ep = self._endpoints[endpoint] = _Endpoint(endpoint)
            q = self._queues[key] = _Queue(ep)
        if not q.items:
            self._turns.append(key)
        q.items.append(item)
        q.endpoint.queued += 1

    def queued_at(self, endpoint: str) -> list[str]:
        """The items waiting for ``endpoint``, over all its producer groups' queues (some may
        no longer be live: :meth:`pop` drops those)."""
        ep = self._endpoints.get(endpoint)
        if ep is None or not ep.queued:
            return []
        return [i for (name, _), q in self._queues.items() if name == endpoint for i in q.items]

    def pop(self, now: float, live: Callable[[str], bool]) -> tuple[str, str] | None:
        """The next check to send, as (item, endpoint), its send recorded; None when every
        queue waits on a limit (see :meth:`next_ready`) or nothing is due. Items ``live``
        rejects (ended or rescheduled since they were queued) are dropped on the way."""
        for _ in range(len(self._turns)):
            key = self._turns[0]
            q = self._queues[key]
            ep = q.endpoint
            if not self._may_send(ep, now):
                self._turns.rotate(-1)
                continue
            item = None
            while q.items:
                candidate = q.items.popleft()
                ep.queued -= 1
                if live(candidate):
                    item = candidate
                    break
            self._turns.popleft()
            if q.items:
                self._turns.append(key)  # its next item waits for every other queue's turn
            else:
                del self._queues[key]
            if item is None:
                self._forget_if_idle(ep)
                continue
            ep.inflight += 1
            ep.next_send = max(now, ep.next_send) + self._interval
            if ep.breaker is Breaker.HALF_OPEN:
                ep.probing = True
            return item, ep.name
        return None

    def _may_send(self, ep: _Endpoint, now: float) -> bool:
        if ep.breaker is Breaker.OPEN:
            if now < ep.open_until:
                return False
            ep.breaker = Breaker.HALF_OPEN  # the cool-down is over: one probe may go
        if ep.breaker is Breaker.HALF_OPEN and ep.probing:
            return False
        return ep.inflight < self.settings.endpoint_concurrency and now + SLACK_S >= ep.next_send

    def next_ready(self, now: float) -> float | None:
        """Seconds until a waiting queue's rate slot or cool-down ends (0: something may go
        now); None when nothing waits, or only on checks in flight (their end wakes the
        caller)."""
        soonest = math.inf
        seen: set[str] = set()
        for key in self._turns:
            ep = self._queues[key].endpoint
            if ep.name in seen:
                continue
            seen.add(ep.name)
            if ep.breaker is Breaker.OPEN:
                soonest = min(soonest, ep.open_until - now)
            elif ep.probing or ep.inflight >= self.settings.endpoint_concurrency:
                continue  # waits for a check to end
            else:
                soonest = min(soonest, ep.next_send - SLACK_S - now)
        return None if soonest == math.inf else max(soonest, 0.0)

    def done(self, endpoint: str, now: float, *, failed: bool) -> None:
        """A check sent to ``endpoint`` ended. ``failed``: it timed out or could not connect
        (the breaker counts those); any answer, even an error, is a sign of life."""
        ep = self._endpoints[endpoint]
        ep.inflight -= 1
        probe = ep.probing
        ep.probing = False
        if not failed:
            ep.failures = 0
            ep.opened = 0
            ep.breaker = Breaker.CLOSED
        else:
            ep.failures += 1
            if probe or (
                ep.breaker is Breaker.CLOSED and ep.failures >= self.settings.breaker_failures
            ):
                self._open(ep, now)
        self._forget_if_idle(ep)

    def _forget_if_idle(self, ep: _Endpoint) -> None:
        if not (ep.inflight or ep.queued or ep.failures) and ep.breaker is Breaker.CLOSED:
            self._endpoints.pop(ep.name, None)  # nothing to remember

    def _open(self, ep: _Endpoint, now: float) -> None:
        s = self.settings
        cool_ms = min(s.breaker_base_ms * 2 ** min(ep.opened, MAX_DOUBLINGS), s.breaker_cap_ms)
        ep.opened += 1
        ep.breaker = Breaker.OPEN
        ep.open_until = now + cool_ms / 1000

    def info(self, now: float) -> list[EndpointInfo]:
        return [
            EndpointInfo(
                ep.name,
                ep.breaker,
                ep.inflight,
                ep.queued,
                ep.failures,
                ep.opened,
                max(int((ep.open_until - now) * 1000), 0) if ep.breaker is Breaker.OPEN else 0,
            )
            for ep in sorted(self._endpoints.values(), key=lambda e: e.name)
        ]

    def open_count(self) -> int:
        return sum(1 for ep in self._endpoints.values() if ep.breaker is not Breaker.CLOSED)
