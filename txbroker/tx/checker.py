"""The back-check scheduler: ask the producer's service about transactions nobody ended.

A prepared transaction with no END_TX by its timeout is checked: a signed POST to its check
URL (see ``checkback``). COMMIT and ROLLBACK resolve it through the coordinator (fenced like an
END_TX). Anything else is UNKNOWN: the next check waits ``base * 2**(n-1)`` ms, capped. Only
checks that reached the endpoint count; after ``max_checks`` of them the transaction is PARKED
for an operator. An unreachable endpoint is retried with the same backoff but never parks a
transaction by itself (nothing was asked).

Bounded so 100k pending transactions never become a storm: at most ``concurrency`` checks in
flight, and per endpoint (scheme, host, port) at most ``rate_per_s``. Rate limiting reserves
slots in time (virtual scheduling), so a backlog spreads evenly instead of retrying in bursts.
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
from urllib.parse import urlsplit

import httpx

from txbroker.errors import TransactionConflict, TxbError
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.state import Decision, Resolver, Tx, TxState
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
    rate_per_s: float = 100.0
    timeout_ms: int = 3_000


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _endpoint(url: str) -> str:
    u = urlsplit(url)
    return f"{u.scheme}://{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"


class BackChecker:
    def __init__(self, coordinator: TxCoordinator, settings: CheckSettings) -> None:
        self._coord = coordinator
        self.settings = settings
        self._heap: list[tuple[int, str]] = []
        self._wake = asyncio.Event()
        self._slots: dict[str, float] = {}  # endpoint -> next free send time (monotonic s)
        self._booked: set[str] = set()  # deferred transactions holding a reserved slot
        self._last_send: dict[str, float] = {}  # endpoint -> when the last check went out
        self._sem = asyncio.Semaphore(settings.concurrency)
        self._inflight: set[asyncio.Task[None]] = set()
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
        for tx in self._coord.open.values():
            if tx.state is TxState.PREPARED:
                self.schedule(tx)
        self._task = asyncio.create_task(self._run(), name="txb-backcheck")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for t in list(self._inflight):
            t.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now = _now_ms()
            while self._heap and self._heap[0][0] <= now:
                due_ms, tx_id = heapq.heappop(self._heap)
                tx = self._coord.open.get(tx_id)
                if tx is None or tx.state is not TxState.PREPARED or tx.next_check_ms != due_ms:
                    if tx is None or tx.state is not TxState.PREPARED:
                        self._booked.discard(tx_id)
                    continue  # ended, parked, or rescheduled since: a stale heap entry
                if tx_id in self._booked:
                    self._booked.discard(tx_id)  # its slot was reserved when it was deferred
                else:
                    slot = self._reserve(tx.check_url)
                    if slot > 0:
                        # Over this endpoint's rate: book the next free slot, uncounted.
                        tx.next_check_ms = now + int(slot * 1000)
                        self._booked.add(tx_id)
                        heapq.heappush(self._heap, (tx.next_check_ms, tx_id))
                        continue
                await self._sem.acquire()  # bounded concurrency: wait for a free lane
                # Booked slots spread a backlog out, but a wait for a lane can bunch them up
                # again: the rate is enforced here too, at the moment of sending.
                gap = self._spacing(tx.check_url)
                if gap > 0:
                    self._sem.release()
                    tx.next_check_ms = _now_ms() + max(int(gap * 1000), 1)
                    self._booked.add(tx_id)
                    heapq.heappush(self._heap, (tx.next_check_ms, tx_id))
                    now = _now_ms()
                    continue
                task = asyncio.create_task(self._check(tx))
                self._inflight.add(task)
                self.max_inflight = max(self.max_inflight, len(self._inflight))
                task.add_done_callback(self._inflight.discard)
                now = _now_ms()
            nap = MAX_NAP_S
            if self._heap:
                nap = min(nap, max(self._heap[0][0] - _now_ms(), 0) / 1000)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(nap):
                    await self._wake.wait()

    def _spacing(self, url: str) -> float:
        """Seconds until this endpoint may be sent to (0: now, and the send is recorded)."""
        ep = _endpoint(url)
        now = time.monotonic()
        last = self._last_send.get(ep)
        interval = 1.0 / self.settings.rate_per_s
        if last is not None and now - last < interval:
            return interval - (now - last)
        self._last_send[ep] = now
        return 0.0

    def _reserve(self, url: str) -> float:
        """Seconds until this endpoint may be checked again (0: now, and the slot is taken)."""
        ep = _endpoint(url)
        now = time.monotonic()
        interval = 1.0 / self.settings.rate_per_s
        free = max(self._slots.get(ep, now), now)
        if free - now > 1e-9:
            self._slots[ep] = free + interval
            return free - now
        self._slots[ep] = now + interval
        return 0.0

    async def _check(self, tx: Tx) -> None:
        try:
            secret = self._coord.secret_for(tx.producer_group)
            assert self._http is not None
            if secret is None:
                res = CheckResult(CheckStatus.UNKNOWN, CheckOutcome.UNREACHABLE, "no secret", 0.0)
            else:
                req = CheckRequest(
                    tx.tx_id, tx.topic, tx.producer_group, tx.checks, tx.key, tx.message_id
                )
                res = await call_check(
                    self._http,
                    tx.check_url,
                    req,
                    secret,
                    tx.traceparent,
                    self.settings.timeout_ms / 1000,
                )
            self._record(res)
            await self._apply(tx, res)
        except asyncio.CancelledError:
            raise
        except Exception:  # keep checking others; this one is rescheduled
            log.exception("back-check of %s failed", tx.tx_id)
            self._reschedule(tx, "internal error during the check")
        finally:
            self._sem.release()

    async def _apply(self, tx: Tx, res: CheckResult) -> None:
        if tx.state is not TxState.PREPARED:
            return  # ended (or parked by hand) while the check was out
        if res.status in (CheckStatus.COMMIT, CheckStatus.ROLLBACK):
            decision = Decision.COMMIT if res.status is CheckStatus.COMMIT else Decision.ROLLBACK
            try:
                await self._coord.end(tx.tx_id, decision, Resolver.CHECK, res.reason)
            except TransactionConflict as e:
                log.warning("check of %s answered %s, but: %s", tx.tx_id, res.status.value, e)
            except TxbError:
                log.exception("could not apply the check of %s", tx.tx_id)
                self._reschedule(tx, "could not apply the answer")
            return
        tx.attempts += 1
        if res.sent:
            tx.checks += 1
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

    def _record(self, res: CheckResult) -> None:
        key = res.status.value if res.outcome is CheckOutcome.ANSWERED else res.outcome.value
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
