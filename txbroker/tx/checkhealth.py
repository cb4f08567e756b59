"""Back-check failures told to a person: :class:`CheckHealth`.

Per endpoint (what the fair lanes limit: scheme, host and port; for back-checks by pull, the
producer group), the current *run* of failing checks: one that got no answer by the contract
(unreachable, timed out, an HTTP error, a refused signature, an unreadable body). A run is told
once when it starts, at most every ``REPEAT_S`` while it lasts, and once when an answer of any
kind (UNKNOWN included) ends it, with how long it lasted and how many checks failed of which
cause. The metrics count every check; the log is for a person, so it stays a few lines an hour
per broken endpoint however many transactions wait on it.

It also remembers whether an endpoint's last check was unreachable, so the checker can date the
transactions waiting for it (``Tx.unreached``): those queued behind an open breaker are never
sent, yet wait on an endpoint nobody reaches. Pure bookkeeping without a clock of its own
(callers pass monotonic seconds) that returns the lines to log, so every rule is tested directly.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from txbroker.runtime.timetext import duration_text

__all__ = ["REPEAT_S", "TRACKED_MAX", "CheckHealth"]

# A failing endpoint is told again at most every 5 minutes: often enough that a person reading
# the log now sees it is still down, rare enough that 100 broken endpoints are a few lines a
# minute. The checks in between are counted in the next line and in /metrics.
REPEAT_S: Final = 300.0
# Failing endpoints remembered at once (each a few hundred bytes); past it a new one is not
# logged until some recover, which is said once. Endpoints are scheme, host and port, so only a
# producer naming thousands of hosts gets near it.
TRACKED_MAX: Final = 10_000


@dataclass(slots=True)
class _Run:
    since_s: float  # the first failure of the run
    told_s: float  # the last line logged about it
    last: str  # the last failure's reason
    unreachable: bool  # the last failure was one that never reached the endpoint
    causes: Counter[str] = field(default_factory=Counter)


class CheckHealth:
    """The runs of failing back-checks, by endpoint."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._overflow_told = False

    def failed(
        self, endpoint: str, cause: str, reason: str, *, unreachable: bool, now_s: float
    ) -> str | None:
        """A check to ``endpoint`` failed with ``cause`` (a few words to count it under:
        "connection refused", "HTTP 500") and ``reason`` (what a person needs to fix it);
        ``unreachable``: it never reached the endpoint. The line to log (a warning), or None
        when it is not time to say more."""
        run = self._runs.get(endpoint)
        if run is None:
            if len(self._runs) >= TRACKED_MAX:
                if self._overflow_told:
                    return None
                self._overflow_told = True
                return (
                    f"back-checks are failing at more than {TRACKED_MAX} endpoints: those "
                    f"failing from now on ({endpoint}: {reason}) are not logged until some "
                    "recover (txbroker_tx_checks_total counts every check)"
                )
            run = self._runs[endpoint] = _Run(now_s, now_s, reason, unreachable)
            run.causes[cause] += 1
            return f"back-checks to {endpoint} started failing: {reason}"
        run.causes[cause] += 1
        run.last, run.unreachable = reason, unreachable
        if now_s - run.told_s < REPEAT_S:
            return None
        run.told_s = now_s
        return (
            f"back-checks to {endpoint} still failing after "
            f"{duration_text(now_s - run.since_s)}: {_counts(run)}; last: {reason}"
        )

    def answered(self, endpoint: str, now_s: float) -> str | None:
        """A check to ``endpoint`` got an answer: the line to log (info) if that ends a run."""
        run = self._runs.pop(endpoint, None)
        if run is None:
            return None
        if len(self._runs) < TRACKED_MAX:
            self._overflow_told = False
        return (
            f"back-checks to {endpoint} recovered after {duration_text(now_s - run.since_s)}: "
            f"{_counts(run)} meanwhile"
        )

    def unreachable(self, endpoint: str) -> bool:
        """Whether the last check to ``endpoint`` could not reach it."""
        run = self._runs.get(endpoint)
        return run is not None and run.unreachable

    @property
    def failing(self) -> int:
        """Endpoints in a run of failures now."""
        return len(self._runs)


def _counts(run: _Run) -> str:
    n = sum(run.causes.values())
    by = ", ".join(f"{cause}: {k}" for cause, k in run.causes.most_common())
    return f"{n} check{'s' if n != 1 else ''} failed ({by})"
