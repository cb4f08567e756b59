"""A history of client operations and its checker, for the partition scenarios.

Every attempt of a write is recorded as an :class:`Op`: when it was invoked, when it completed
and how: ``ok`` (acknowledged), ``fail`` (refused before anything was stored: NotMaster, no
route, nothing reachable) or ``unknown`` (a timeout, a connection lost mid-way, too few slaves
in time: it may or may not be stored). After the partition is healed, :func:`check` compares the
history with what the group's master holds (every message read back by a fresh consumer group)
and what a consumer group read during the run, and reports:

- **lost**: acknowledged writes not in the log (must be 0 with sync replication);
- **duplicated**: writes in the log more than once (each write carries an idempotency key);
- **delivered twice**: writes one consumer group received twice with no nack behind it;
- **out of order**: per ordering key, a write in the log before one its writer made earlier
  (a writer sends its key's writes one after another, each acknowledged before the next);
- **phantoms**: messages in the log no client ever wrote, or whose every attempt was refused;
- **vanished**: writes a consumer received that the log no longer holds;
- **unavailable windows**: gaps between acknowledgements longer than ``UNAVAILABLE_MIN_S``;
- **acknowledgement latency**: each acknowledged attempt's time from invoke to acknowledgement,
  by when it began (before the cut, during the fault, after the heal): p50, p99 and max;
- **the loss window**: when each lost write was acknowledged, relative to the cut (with async
  replication a master acknowledges before its slaves have a write: losses are its price,
  reported there rather than failed).

Two-phase traffic has a checker of its own, :func:`check_transactions`: the transactions a
producer's database committed (and those it was told were committed) against the messages of
their topic the log holds and the effects a consumer's database applied, once everything has
settled. It reports:

- **vanished**: transactions committed (or acknowledged to their caller) whose message the log
  does not hold, or which no consumer applied;
- **phantoms**: messages of the topic, or effects applied, of no committed transaction: never
  prepared, or rolled back;
- **duplicated** and **applied twice**: a transaction's message in the log more than once, or
  its effect applied more than once;
- **acknowledged, not committed**: a caller told "committed" of a transaction its own database
  does not hold;
- **open**: transactions the brokers still hold undecided.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from txbroker.errors import InvalidArgument, NotFound, NotMaster, TxbError
from txbroker_sdk.errors import BrokerUnreachable

__all__ = [
    "Delivery",
    "History",
    "Op",
    "Outcome",
    "Report",
    "Stored",
    "TxReport",
    "check",
    "check_transactions",
    "quantiles",
    "windows_p50_max",
]

# A gap between two acknowledgements longer than this counts as unavailability: writers send
# one after another with a round trip of about a millisecond here, so a healthy group acknowledges
# many times within it.
UNAVAILABLE_MIN_S: Final = 0.5
# Refused before anything was appended: retrying these cannot duplicate and did not store.
_DEFINITE: Final = (NotMaster, NotFound, InvalidArgument, BrokerUnreachable)


class Outcome(StrEnum):
    OK = "ok"
    FAIL = "fail"
    UNKNOWN = "unknown"


@dataclass(slots=True)
class Op:
    """One attempt of the write ``write_id`` (seconds since the history began)."""

    process: int
    write_id: str
    invoke_s: float
    complete_s: float = 0.0
    outcome: Outcome | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class Stored:
    """A message as the log holds it: its write and where."""

    write_id: str
    ordering_key: str
    queue_id: int
    queue_offset: int


@dataclass(frozen=True, slots=True)
class Delivery:
    write_id: str
    reconsume_count: int


def outcome_of(e: BaseException) -> Outcome:
    return Outcome.FAIL if isinstance(e, _DEFINITE) else Outcome.UNKNOWN


class History:
    """The operations of a run, in the order they were invoked."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._t0 = time.monotonic()
        self.cut_s: float | None = None  # when the fault began (:meth:`now`): the loss window's 0
        self.heal_s: float | None = None  # when it was healed (:meth:`now`)

    def now(self) -> float:
        return time.monotonic() - self._t0

    @contextlib.asynccontextmanager
    async def op(self, process: int, write_id: str) -> AsyncIterator[Op]:
        """Record the block as one attempt: ``ok`` if it returns, else the error's outcome
        (swallowed; read ``op.outcome``). Errors other than the broker's and timeouts pass."""
        op = Op(process, write_id, self.now())
        self.ops.append(op)
        try:
            yield op
        except (TxbError, TimeoutError) as e:
            op.outcome, op.error = outcome_of(e), type(e).__name__
        else:
            op.outcome = Outcome.OK
        finally:
            op.complete_s = self.now()
            if op.outcome is None:  # something else ended the block: nobody knows
                op.outcome = Outcome.UNKNOWN


@dataclass
class Report:
    writes: int = 0  # distinct writes invoked
    attempts: int = 0
    acknowledged: int = 0
    unknown: int = 0  # never acknowledged, at least one attempt of unknown outcome
    unknown_stored: int = 0  # of those, found in the log
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    delivered_twice: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    unavailable_s: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    # When each lost write was first acknowledged, seconds after the cut (before it: negative);
    # empty when nothing was lost or the history has no cut.
    lost_acked_s: list[float] = field(default_factory=list)
    # Acknowledged attempts' latency in seconds, [p50, p99, max], by when the attempt began:
    # "before" the cut (the whole run when it has none), "during" the fault, "after" the heal;
    # a phase without an acknowledgement has none.
    ack_latency_s: dict[str, list[float]] = field(default_factory=dict)

    @property
    def anomalies(self) -> int:
        """What must be 0 with sync replication (everything but unavailability and the
        at-least-once redeliveries)."""
        return sum(
            len(x) for x in (self.lost, self.duplicated, self.out_of_order, self.phantoms)
        ) + len(self.vanished)

    @property
    def losses(self) -> int:
        """Acknowledged writes lost and writes read that the log no longer holds: what async
        replication may cost when its master goes (each other anomaly is a fault in any mode)."""
        return len(self.lost) + len(self.vanished)

    def unavailable_p50_max(self) -> tuple[float, float]:
        """The median and the longest unavailable window, in seconds (0 when there was none)."""
        return windows_p50_max(self.unavailable_s)

    def loss_window(self) -> tuple[float, float] | None:
        """The first and the last acknowledgement of a lost write, seconds after the cut; None
        when nothing acknowledged was lost."""
        if not self.lost_acked_s:
            return None
        return self.lost_acked_s[0], self.lost_acked_s[-1]

    def summary(self) -> str:
        windows = self.unavailable_s
        median, longest = (f"{s:.2f}" for s in self.unavailable_p50_max())
        return (
            f"{self.writes} writes ({self.attempts} attempts), {self.acknowledged} acknowledged, "
            f"{self.unknown} unknown ({self.unknown_stored} stored), lost {len(self.lost)}, "
            f"duplicated {len(self.duplicated)}, delivered twice {len(self.delivered_twice)}, "
            f"out of order {len(self.out_of_order)}, phantoms {len(self.phantoms)}, vanished "
            f"{len(self.vanished)}; unavailable {len(windows)} windows, p50 {median} s, max "
            f"{longest} s; acknowledged in (p50 / p99 / max s) {self._latencies()}; "
            f"errors {dict(self.errors)}"
        )

    def _latencies(self) -> str:
        return ", ".join(
            f"{phase} {' / '.join(f'{x:.3f}' for x in q)}"
            for phase, q in self.ack_latency_s.items()
        )


def check(
    history: History,
    log: Iterable[Stored],
    deliveries: Iterable[Delivery],
    order: dict[str, list[str]],
) -> Report:
    """The report of a healed run. ``order`` is each ordering key's writes in the order their
    writer made them."""
    r = Report()
    by_write: dict[str, list[Op]] = {}
    for op in history.ops:
        by_write.setdefault(op.write_id, []).append(op)
        if op.error:
            r.errors[op.error] += 1
    r.writes, r.attempts = len(by_write), len(history.ops)
    acked = {w for w, ops in by_write.items() if any(o.outcome is Outcome.OK for o in ops)}
    refused = {w for w, ops in by_write.items() if all(o.outcome is Outcome.FAIL for o in ops)}
    unknown = set(by_write) - acked - refused
    r.acknowledged, r.unknown = len(acked), len(unknown)

    stored = sorted(log, key=lambda s: (s.queue_id, s.queue_offset))
    in_log = Counter(s.write_id for s in stored)
    r.lost = sorted(acked - set(in_log))
    r.duplicated = sorted(w for w, n in in_log.items() if n > 1)
    r.phantoms = sorted(w for w in in_log if w not in by_write or w in refused)
    r.unknown_stored = len(unknown & set(in_log))

    rank = {w: i for writes in order.values() for i, w in enumerate(writes)}
    last: dict[str, tuple[int, str]] = {}
    for s in stored:
        i = rank.get(s.write_id)
        if i is None:
            continue
        prev = last.get(s.ordering_key)
        if prev is not None and i < prev[0]:
            r.out_of_order.append(f"{s.write_id} after {prev[1]}")
        if prev is None or i > prev[0]:
            last[s.ordering_key] = (i, s.write_id)

    seen: Counter[str] = Counter()
    vanished = set()
    for d in deliveries:
        if d.reconsume_count == 0:
            seen[d.write_id] += 1
        if d.write_id not in in_log:
            vanished.add(d.write_id)
    r.delivered_twice = sorted(w for w, n in seen.items() if n > 1)
    r.vanished = sorted(vanished)

    oks = sorted(o.complete_s for o in history.ops if o.outcome is Outcome.OK)
    r.unavailable_s = [
        round(b - a, 3) for a, b in itertools.pairwise(oks) if b - a > UNAVAILABLE_MIN_S
    ]
    r.ack_latency_s = _latencies(history)
    if history.cut_s is not None:
        cut_s = history.cut_s
        r.lost_acked_s = sorted(
            round(min(o.complete_s for o in by_write[w] if o.outcome is Outcome.OK) - cut_s, 3)
            for w in r.lost
        )
    return r


@dataclass
class TxReport:
    committed: int = 0  # transactions the producer's database committed
    acknowledged: int = 0  # transactions whose caller was told they committed
    in_log: int = 0  # messages of their topic in the log
    vanished: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    applied_twice: list[str] = field(default_factory=list)
    acknowledged_not_committed: list[str] = field(default_factory=list)
    open: int = 0

    @property
    def anomalies(self) -> int:
        return self.open + sum(
            len(x)
            for x in (
                self.vanished,
                self.phantoms,
                self.duplicated,
                self.applied_twice,
                self.acknowledged_not_committed,
            )
        )

    def summary(self) -> str:
        return (
            f"{self.committed} transactions committed ({self.acknowledged} acknowledged), "
            f"{self.in_log} in the log; vanished {len(self.vanished)}, phantoms "
            f"{len(self.phantoms)}, duplicated {len(self.duplicated)}, applied twice "
            f"{len(self.applied_twice)}, acknowledged not committed "
            f"{len(self.acknowledged_not_committed)}, open {self.open}"
            + (f": {self.examples()}" if self.anomalies else "")
        )

    def examples(self, n: int = 5) -> str:
        found = {
            "vanished": self.vanished,
            "phantoms": self.phantoms,
            "duplicated": self.duplicated,
            "applied twice": self.applied_twice,
            "acknowledged not committed": self.acknowledged_not_committed,
        }
        return "; ".join(f"{what} {ids[:n]}" for what, ids in found.items() if ids)


def check_transactions(
    committed: Iterable[str],
    acknowledged: Iterable[str],
    log: Iterable[str],
    applied: Counter[str],
    open_transactions: int,
) -> TxReport:
    """The report of settled two-phase traffic, each transaction named by its message's id
    (here: the order id it carries): ``committed`` by the producer's database, ``acknowledged``
    to the producer's callers, its messages as ``log`` holds them (one entry per copy), its
    effects as ``applied`` counts them, and the transactions the brokers hold open."""
    done, told = set(committed), set(acknowledged)
    in_log = Counter(log)
    r = TxReport(len(done), len(told), sum(in_log.values()), open=open_transactions)
    r.vanished = sorted(
        [f"{t} (not in the log)" for t in (done | told) - set(in_log)]
        + [f"{t} (never applied)" for t in (done | told) & set(in_log) - set(applied)]
    )
    r.phantoms = sorted(
        [f"{t} (in the log)" for t in set(in_log) - done]
        + [f"{t} (applied)" for t in set(applied) - done]
    )
    r.duplicated = sorted(t for t, n in in_log.items() if n > 1)
    r.applied_twice = sorted(t for t, n in applied.items() if n > 1)
    r.acknowledged_not_committed = sorted(told - done)
    return r


def _latencies(history: History) -> dict[str, list[float]]:
    cut = history.cut_s if history.cut_s is not None else float("inf")
    heal = history.heal_s if history.heal_s is not None else float("inf")
    phases: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    for o in history.ops:
        if o.outcome is Outcome.OK:
            phase = "before" if o.invoke_s < cut else "during" if o.invoke_s < heal else "after"
            phases[phase].append(o.complete_s - o.invoke_s)
    return {phase: quantiles(took) for phase, took in phases.items() if took}


def quantiles(samples: Iterable[float]) -> list[float]:
    """[p50, p99, max] of ``samples`` (nearest rank), rounded to the microsecond."""
    s = sorted(samples)
    return [round(s[min(len(s) - 1, math.ceil(q * len(s)) - 1)], 6) for q in (0.5, 0.99, 1.0)]


def windows_p50_max(windows: Iterable[float]) -> tuple[float, float]:
    """The median (the upper one of an even count) and the longest of ``windows``; (0, 0) for
    none."""
    ordered = sorted(windows)
    if not ordered:
        return 0.0, 0.0
    return ordered[len(ordered) // 2], ordered[-1]
