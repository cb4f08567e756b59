"""The back-check scheduler: ask the producer's service about transactions nobody ended.

A prepared transaction with no END_TX by its timeout gets a signed POST to its check URL.
COMMIT and ROLLBACK resolve it through the coordinator (fenced like an END_TX); anything else
is UNKNOWN and checked again with exponential backoff. After ``max_checks`` checks that reached
the endpoint it is PARKED for an operator; one whose checks reach no one is flagged *stalled*
after a while (``Tx.unreached``) and checked on. Bounded and fair: at most ``concurrency``
checks in flight, due checks served through the fair lanes (``txbroker.tx.checklanes``), and a
total ``deadline_ms`` per check. A check with ``check_url`` = ``pull`` is queued for its
producer group's pollers instead (``txbroker.tx.pull``). Failing endpoints are logged for a
person (``txbroker.tx.checkhealth``). :class:`BackChecker` gives the rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import httpx
from opentelemetry.trace import Span

from txbroker.errors import NotMaster, ReplicationTimeout, TransactionConflict, TxbError
from txbroker.runtime import tracing as tr
from txbroker.runtime.tracing import tracing_on
from txbroker.tx import spans
from txbroker.tx.checkhealth import CheckHealth
from txbroker.tx.checklanes import EndpointInfo, FairLanes, LaneSettings, endpoint_of
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.pull import PULL_CHECK_URL, PulledCheck, PullQueues
from txbroker.tx.state import CheckRecord, Decision, Resolver, Tx, TxState
from txbroker_checkback import CheckOutcome, CheckRequest, CheckResult, CheckStatus, call_check

__all__ = ["BackChecker", "CheckSettings"]

log = logging.getLogger(__name__)

# Latency histogram buckets (seconds) for /metrics.
BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MAX_NAP_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class CheckSettings:
    # 5 s doubling to 5 min: with the defaults the 15th counted check comes about 45 minutes
    # after the first. A check counts when it reached the endpoint (answered, badly, or timed
    # out); an unreachable endpoint backs off the same way but never parks a transaction.
    backoff_base_ms: int = 5_000
    backoff_cap_ms: int = 300_000
    max_checks: int = 15
    concurrency: int = 64
    rate_per_s: float = 100.0  # per endpoint
    timeout_ms: int = 3_000  # httpx's, per phase (connect, write, each read)
    deadline_ms: int = 10_000  # the whole check, from the request to its answer
    endpoint_concurrency: int = 8
    breaker_failures: int = 5
    breaker_base_ms: int = 5_000
    breaker_cap_ms: int = 300_000

    def lanes(self) -> LaneSettings:
        return LaneSettings(
            self.endpoint_concurrency,
            self.rate_per_s,
            self.breaker_failures,
            self.breaker_base_ms,
            self.breaker_cap_ms,
        )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class BackChecker:
    """Schedules, sends and counts the back-checks of one coordinator's open transactions.

    After the n-th check that did not decide (answered UNKNOWN, failed, or unreachable) the next
    waits ``base * 2**(n-1)`` ms, capped. Only checks that reached the endpoint count towards
    ``max_checks``: an unreachable endpoint is retried with the same backoff but never parks a
    transaction by itself (nothing was asked); the transaction is dated instead
    (``Tx.unreached``), and stalled when that lasts (``TxSettings.stall_after_ms``).

    Bounded so 100k pending transactions never become a storm, and fair so one broken service
    never delays another's recovery: due checks wait in one queue per (endpoint, producer group)
    served round robin, each endpoint (scheme, host, port) with its own concurrency bound,
    ``rate_per_s`` and circuit breaker. The total ``deadline_ms`` comes besides httpx's per-phase
    ``timeout_ms``, so an endpoint that trickles bytes cannot hold a lane for long either.
    """

    def __init__(self, coordinator: TxCoordinator, settings: CheckSettings) -> None:
        self._coord = coordinator
        self.settings = settings
        self._heap: list[tuple[int, str]] = []
        self._wake = asyncio.Event()
        self._lanes = FairLanes(settings.lanes())
        self._health = CheckHealth()
        self._free = settings.concurrency  # global lanes not in use
        self._checking: set[str] = set()  # transactions whose check is out
        self._inflight: set[asyncio.Task[None]] = set()
        self._pulls = PullQueues()
        self._expiring: set[asyncio.Task[None]] = set()  # pulled checks whose window ended
        self._task: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None
        # Statistics for /metrics and the bench.
        self.outcomes: dict[str, int] = {}
        self.latency_buckets = [0] * (len(BUCKETS) + 1)
        self.latency_sum = 0.0
        # Told each check's outcome and seconds (the broker's latency histogram), if set.
        self.on_checked: Callable[[str, float], None] | None = None
        self.max_inflight = 0

    def schedule(self, tx: Tx) -> None:
        heapq.heappush(self._heap, (tx.next_check_ms, tx.tx_id))
        if self._heap[0][1] == tx.tx_id:
            self._wake.set()

    def start(self) -> None:
        limits = httpx.Limits(max_connections=self.settings.concurrency)
        self._http = httpx.AsyncClient(limits=limits, follow_redirects=False)
        self._heap.clear()  # started again after a failover: the open ones are scheduled anew
        self._pulls.clear()
        self._health = CheckHealth()  # a new term learns the endpoints' health anew
        for tx in self._coord.open.values():
            if tx.state is TxState.PREPARED:
                self.schedule(tx)
        self._task = asyncio.create_task(self._run(), name="txb-backcheck")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._pulls.wake_all()  # pollers answer that this broker no longer checks
        for t in [*self._inflight, *self._expiring]:
            t.cancel()
        await asyncio.gather(*self._inflight, *self._expiring, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def endpoints(self) -> list[EndpointInfo]:
        """Endpoints with checks queued, in flight or failing, for the admin API."""
        return self._lanes.info(time.monotonic())

    @property
    def open_endpoints(self) -> int:
        return self._lanes.open_count()

    def _due(self, tx_id: str) -> bool:
        """Whether a queued check is still wanted: ended, parked, in flight or rescheduled
        later since it was queued, it is dropped."""
        tx = self._coord.open.get(tx_id)
        return (
            tx is not None
            and tx.state is TxState.PREPARED
            and tx_id not in self._checking
            and tx.next_check_ms <= _now_ms()
        )

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now = _now_ms()
            while self._heap and self._heap[0][0] <= now:
                due_ms, tx_id = heapq.heappop(self._heap)
                tx = self._coord.open.get(tx_id)
                if tx is None or tx.state is not TxState.PREPARED:
                    if self._pulls.answered(tx_id) is not None:  # ended or parked: moot
                        self._pull_answered(tx_id)
                    continue
                if tx.next_check_ms != due_ms:
                    continue  # rescheduled since: a stale heap entry
                if tx.check_url == PULL_CHECK_URL:
                    self._offer(tx)
                else:
                    endpoint = endpoint_of(tx.check_url)
                    self._lanes.push(tx_id, endpoint, tx.producer_group)
                    # Due at an endpoint nobody reaches now: it waits for it like the others.
                    if self._health.unreachable(endpoint) and tx.unreached(now):
                        self._coord.snapshot.mark()
            while self._free > 0:
                got = self._lanes.pop(time.monotonic(), self._due)
                if got is None:
                    break
                tx_id, endpoint = got
                self._free -= 1
                self._checking.add(tx_id)
                task = asyncio.create_task(self._check(self._coord.open[tx_id], endpoint))
                self._inflight.add(task)
                self.max_inflight = max(self.max_inflight, len(self._inflight))
                task.add_done_callback(self._inflight.discard)
            nap = MAX_NAP_S
            if self._heap:
                nap = min(nap, max(self._heap[0][0] - _now_ms(), 0) / 1000)
            ready = self._lanes.next_ready(time.monotonic()) if self._free > 0 else None
            if ready is not None:
                nap = min(nap, ready)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(nap):
                    await self._wake.wait()

    # --- back-checks by pull ---

    def _offer(self, tx: Tx) -> None:
        """``tx``'s pulled check is due: its answer window ended if one is out (a timeout),
        otherwise a new check waits for the group's pollers."""
        out = self._pulls.answered(tx.tx_id)
        if out is not None and out.due_ms == tx.next_check_ms:
            task = asyncio.create_task(self._expire(tx, out))
            self._expiring.add(task)
            task.add_done_callback(self._expiring.discard)
            return
        self._pulls.push(tx.producer_group, tx.tx_id)
        # Not reached until a poller takes it (pull() clears this): with no poller, it stalls.
        if tx.unreached(_now_ms()):
            self._coord.snapshot.mark()

    async def _expire(self, tx: Tx, out: PulledCheck) -> None:
        reason = f"no answer to the pulled check within {self.settings.deadline_ms} ms"
        seconds = time.monotonic() - out.taken_s
        res = CheckResult(
            CheckStatus.UNKNOWN, CheckOutcome.TIMEOUT, reason, seconds, None, "timeout"
        )
        self._tell(_pull_endpoint(tx.producer_group), res)
        await self._answered(tx, res)

    def _pull_answered(self, tx_id: str) -> None:
        """The pulled check out for ``tx_id`` was answered by the transaction's end (its
        poller's commit or rollback) or an operator's park: its group's pollers answer."""
        tx = self._coord.find(tx_id)
        if tx is not None:
            line = self._health.answered(_pull_endpoint(tx.producer_group), time.monotonic())
            if line is not None:
                log.info("%s", line)

    def _pull_due(self, tx_id: str) -> bool:
        tx = self._coord.open.get(tx_id)
        return (
            tx is not None
            and tx.state is TxState.PREPARED
            and tx.check_url == PULL_CHECK_URL
            and self._pulls.out(tx_id) is None
            and tx.next_check_ms <= _now_ms()
        )

    async def pull(
        self, group: str, max_checks: int, wait_s: float, may: Callable[[Tx], bool]
    ) -> list[CheckRequest]:
        """Up to ``max_checks`` due checks of producer ``group``'s pulled transactions that
        ``may`` lets the poller see, waiting up to ``wait_s`` for the first. Each is out until
        answered (:meth:`answer_unknown`, or the transaction's END_TX) or until ``deadline_ms``
        passes, when it counts as timed out and is due again after the backoff."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_s
        while True:
            if self._task is None:
                raise NotMaster("this broker does not check transactions now: ask its master")
            got = self._pulls.take(
                group, max_checks, self._pull_due, lambda t: may(self._coord.open[t])
            )
            left = until - loop.time()
            if got or left <= 0:
                break
            await self._pulls.wait(group, left)
        now_ms, now_s = _now_ms(), time.monotonic()
        out: list[CheckRequest] = []
        for tx_id in got:
            tx = self._coord.open[tx_id]
            out.append(
                CheckRequest(
                    tx.tx_id, tx.topic, tx.producer_group, tx.checks, tx.key, tx.message_id
                )
            )
            # Due again when the answer window ends: saved in tx.json like any due time, so
            # after a restart the check is offered again instead of waiting for an answer
            # to a check the new process never handed out.
            tx.next_check_ms = now_ms + self.settings.deadline_ms
            tx.reached()  # a pulled check reaches the service when a poller takes it
            self._pulls.taken(tx_id, PulledCheck(tx.next_check_ms, now_s))
            self.schedule(tx)
        if got:
            self._coord.snapshot.mark()
        return out

    async def answer_unknown(self, tx_id: str) -> Tx:
        """A poller's explicit UNKNOWN to the check of ``tx_id`` out with it: counted as a
        check answered UNKNOWN (backoff, then parking at ``max_checks``). Raises
        TransactionConflict when no check of an open transaction is out (never taken,
        answered already, or its window ended: it is offered again when due)."""
        tx = self._coord.get(tx_id)
        out = self._pulls.answered(tx_id)
        if tx.state is not TxState.PREPARED:
            raise TransactionConflict(
                f"transaction {tx_id} is {tx.state.value}: no check to answer"
            )
        if out is None:
            raise TransactionConflict(
                f"no pulled check of transaction {tx_id} is out (not taken yet, answered "
                "already, or its answer window ended): it is offered again when due"
            )
        seconds = time.monotonic() - out.taken_s
        res = CheckResult(CheckStatus.UNKNOWN, CheckOutcome.ANSWERED, "answered UNKNOWN", seconds)
        self._tell(_pull_endpoint(tx.producer_group), res)
        await self._answered(tx, res)
        return tx

    async def _answered(self, tx: Tx, res: CheckResult) -> None:
        try:
            self._record(tx, res)
            await self._apply(tx, res)
        except asyncio.CancelledError:
            raise
        except Exception:  # as for a check sent: it is rescheduled, others go on
            log.exception("back-check of %s failed", tx.tx_id)
            self._reschedule(tx, "internal error during the check")

    @property
    def pull_queued(self) -> int:
        """Pulled checks due and waiting for a poller."""
        return self._pulls.queued

    async def _call(
        self,
        http: httpx.AsyncClient,
        url: str,
        req: CheckRequest,
        secret: str,
        traceparent: str | None,
        timeout_s: float,
    ) -> CheckResult:
        """call_check within the check's total deadline."""
        t0 = time.perf_counter()
        deadline_ms = self.settings.deadline_ms
        try:
            async with asyncio.timeout(deadline_ms / 1000):
                return await call_check(http, url, req, secret, traceparent, timeout_s)
        except TimeoutError:
            reason = f"no answer within the check's deadline ({deadline_ms} ms)"
            seconds = time.perf_counter() - t0
            return CheckResult(CheckStatus.UNKNOWN, CheckOutcome.TIMEOUT, reason, seconds)

    async def _check(self, tx: Tx, endpoint: str) -> None:
        failed = False  # timed out or could not connect: the endpoint's breaker counts it
        span: Span | None = None
        try:
            secret = self._coord.secret_for(tx.producer_group)
            assert self._http is not None
            if secret is None:  # the configuration changed since the PREPARE
                reason = (
                    f"no check-back secret for producer group {tx.producer_group!r} on this "
                    "broker (serve --tx-secret GROUP=SECRET)"
                )
                res = CheckResult(
                    CheckStatus.UNKNOWN, CheckOutcome.UNREACHABLE, reason, 0.0, None, "no secret"
                )
                # Told apart from the endpoint, which may be fine for other groups.
                self._tell(f"{endpoint} for producer group {tx.producer_group}", res)
            else:
                req = CheckRequest(
                    tx.tx_id, tx.topic, tx.producer_group, tx.checks, tx.key, tx.message_id
                )
                # Traced: the CLIENT span's traceparent goes out, so the service's span is its
                # child; untraced, the producer's (if any) still joins the check to its trace.
                traceparent = tx.traceparent
                if tracing_on():
                    span = spans.start_check(tx)
                    traceparent = tr.traceparent(span)
                res = await self._call(
                    self._http,
                    tx.check_url,
                    req,
                    secret,
                    traceparent,
                    self.settings.timeout_ms / 1000,
                )
                if span is not None:
                    spans.checked(span, res)
                self._tell(endpoint, res)
            self._record(tx, res)
            failed = res.outcome in (CheckOutcome.TIMEOUT, CheckOutcome.UNREACHABLE)
            await self._apply(tx, res, span)
        except asyncio.CancelledError:
            raise
        except Exception:  # keep checking others; this one is rescheduled
            log.exception("back-check of %s failed", tx.tx_id)
            self._reschedule(tx, "internal error during the check")
        finally:
            if span is not None and span.is_recording():
                span.end()  # the check failed before its answer ended the span
            self._checking.discard(tx.tx_id)
            self._lanes.done(endpoint, time.monotonic(), failed=failed)
            self._free += 1
            self._wake.set()  # a lane is free

    async def _apply(self, tx: Tx, res: CheckResult, span: Span | None = None) -> None:
        if tx.state is not TxState.PREPARED:
            return  # ended (or parked by hand) while the check was out
        if res.status in (CheckStatus.COMMIT, CheckStatus.ROLLBACK):
            decision = Decision.COMMIT if res.status is CheckStatus.COMMIT else Decision.ROLLBACK
            try:
                with spans.resolving(self._coord, tx, decision.value, span):
                    await self._coord.end(tx.tx_id, decision, Resolver.CHECK, res.reason)
            except TransactionConflict as e:
                log.warning("check of %s answered %s, but: %s", tx.tx_id, res.status.value, e)
            except ReplicationTimeout as e:  # decided all the same: it stands on this master
                log.warning(
                    "check of %s answered %s, applied here, not yet on the slaves: %s",
                    tx.tx_id,
                    res.status.value,
                    e,
                )
            except TxbError:
                log.exception("could not apply the check of %s", tx.tx_id)
                self._reschedule(tx, "could not apply the answer")
            return
        tx.attempts += 1
        if res.sent:
            tx.checks += 1
            tx.reached()
        else:
            tx.unreached(_now_ms())
        tx.last_reason = f"check {tx.checks}: {res.reason}"
        if tx.checks >= self.settings.max_checks:
            await self._coord.park(tx, f"parked after {tx.checks} checks; last: {res.reason}")
            return
        self._reschedule(tx, tx.last_reason)

    def _reschedule(self, tx: Tx, reason: str) -> None:
        if tx.state is not TxState.PREPARED:
            return
        s = self.settings
        # The wait grows with every attempt, reached or not, so an endpoint that is down is not
        # hammered every few seconds forever (it just never parks the transaction by itself).
        delay = min(s.backoff_base_ms * 2 ** min(max(tx.attempts - 1, 0), 30), s.backoff_cap_ms)
        tx.next_check_ms = _now_ms() + delay
        tx.last_reason = reason
        self._coord.snapshot.mark()
        self.schedule(tx)

    def _tell(self, endpoint: str, res: CheckResult) -> None:
        """Log what ``res`` changes about ``endpoint``'s run of failures (rate-limited), and
        when the endpoint turns unreachable, date the transactions queued for it: they wait
        on it too, and behind an open breaker they would never be sent to find out."""
        now_s = time.monotonic()
        if res.outcome is CheckOutcome.ANSWERED:
            line = self._health.answered(endpoint, now_s)
            if line is not None:
                log.info("%s", line)
            return
        unreachable = res.outcome is CheckOutcome.UNREACHABLE
        was = self._health.unreachable(endpoint)
        line = self._health.failed(
            endpoint, res.cause, res.reason, unreachable=unreachable, now_s=now_s
        )
        if line is not None:
            log.warning("%s", line)
        if unreachable and not was and self._health.unreachable(endpoint):
            now_ms, changed = _now_ms(), False
            for tx_id in self._lanes.queued_at(endpoint):
                tx = self._coord.open.get(tx_id)
                if tx is not None and tx.state is TxState.PREPARED:
                    changed = tx.unreached(now_ms) or changed
            if changed:
                self._coord.snapshot.mark()

    def _record(self, tx: Tx, res: CheckResult) -> None:
        key = res.status.value if res.outcome is CheckOutcome.ANSWERED else res.outcome.value
        tx.record_check(CheckRecord(_now_ms(), key, res.reason, res.seconds))
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        self.latency_sum += res.seconds
        for i, bound in enumerate(BUCKETS):
            if res.seconds <= bound:
                self.latency_buckets[i] += 1
                break
        else:
            self.latency_buckets[-1] += 1
        if self.on_checked is not None:
            self.on_checked(key, res.seconds)


def _pull_endpoint(group: str) -> str:
    """How the log names the pollers of a producer group's back-checks by pull."""
    return f"producer group {group}'s pollers"
