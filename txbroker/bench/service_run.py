"""One run of the service bench in this process: the service (its ways to place an order), its
outbox relay and check-back resolver, the subscriber that applies what it publishes, and the
clocks: commit and applied stamps per order, CPU and garbage-collector time per mode."""

from __future__ import annotations

import asyncio
import functools
import gc
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session

import txbroker_outbox as outbox
from txbroker.bench.service_db import APPLIED, ORDERS, BenchFailed, verify
from txbroker.bench.service_options import (
    GROUP,
    OUTBOX_TOPIC,
    SUBSCRIBER_CONCURRENCY,
    TX_TOPIC,
    ServiceBenchOptions,
    messaging,
)
from txbroker.protocol.frames import Opcode
from txbroker.protocol.ids import new_id
from txbroker.protocol.messages import TxEndRequest
from txbroker_checkback import CheckRequest, CheckStatus
from txbroker_sdk import Client, ConsumedMessage
from txbroker_sdk.barrier import BarrierResolver, record_commit
from txbroker_sdk.subscriber import Subscribers
from txbroker_sdk.transactional import TxPublisher, encode_body

__all__ = ["CountingResolver", "GcClock", "ServiceRun"]

_decode = msgspec.json.Decoder()


class StampedSession(Session):
    """Calls ``info["on_commit"]`` as its COMMIT starts and ``info["on_committed"]`` once it is
    done, with ``time.perf_counter()``: the two ends of commit-to-applied latency."""


@event.listens_for(StampedSession, "before_commit")
def _before_commit(session: Session) -> None:
    callback = session.info.pop("on_commit", None)
    if callback is not None:
        callback(time.perf_counter())


@event.listens_for(StampedSession, "after_commit")
def _after_commit(session: Session) -> None:
    callback = session.info.pop("on_committed", None)
    if callback is not None:
        callback(time.perf_counter())


class GcClock:
    """Seconds of CPU this process has spent in the cyclic garbage collector while installed:
    process time, as the CPU per order it is a part of (wall time would count a collection's
    time off the CPU, which a loaded machine makes longer than the process's CPU)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        else:
            self.seconds += time.process_time() - self._t0

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


class CountingResolver:
    """The barrier resolver, counting the back-checks it answers."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._inner = BarrierResolver(engine)
        self.checks = 0

    async def __call__(self, check: CheckRequest) -> CheckStatus:
        self.checks += 1
        return await self._inner(check)


@dataclass
class Stamps:
    committed: dict[str, float] = field(default_factory=dict)
    applied: dict[str, float] = field(default_factory=dict)
    waiting: set[str] = field(default_factory=set)
    all_applied: asyncio.Event = field(default_factory=asyncio.Event)

    def expect(self, ids: Iterable[str]) -> None:
        self.waiting = {i for i in ids if i not in self.applied}
        if self.waiting:
            self.all_applied.clear()
        else:
            self.all_applied.set()

    def on_applied(self, order_id: str, at: float) -> None:
        self.applied[order_id] = at
        self.waiting.discard(order_id)
        if not self.waiting:
            self.all_applied.set()

    def latencies(self, ids: list[str]) -> list[float]:
        return [self.applied[i] - self.committed[i] for i in ids]


def _order(order_id: str, mode: str) -> dict[str, Any]:
    return {"id": order_id, "mode": mode, "item": "lamp", "qty": 1, "amount_cents": 1999}


class ServiceRun:
    """One run: the service (three ways to place an order), its relay and check endpoint, and
    the subscriber that applies what it publishes."""

    def __init__(
        self,
        opts: ServiceBenchOptions,
        engine: AsyncEngine,
        subscriber_engine: AsyncEngine,
        clients: tuple[Client, Client, Client],
        check_url: str,
    ) -> None:
        self.opts = opts
        self.engine = engine
        self.sessions = async_sessionmaker(
            engine, expire_on_commit=False, sync_session_class=StampedSession
        )
        self.sub_sessions = async_sessionmaker(
            subscriber_engine, expire_on_commit=False, sync_session_class=StampedSession
        )
        publisher_client, relay_client, self.sub_client = clients
        self._publisher_client = publisher_client
        self._check_url = check_url
        self.relay = outbox.Relay(relay_client, engine, namespace="bench")
        self.stamps = Stamps()
        self.modes = opts.modes
        self.placed = dict.fromkeys(self.modes, 0)
        self.outbox_added = 0
        self.backlog = 0
        self.cpu_s = dict.fromkeys(self.modes, 0.0)  # this process's CPU in timed slices
        self.gc_s = dict.fromkeys(self.modes, 0.0)  # the part of it in the garbage collector
        self.gc_clock = GcClock()
        publisher = TxPublisher(
            publisher_client, self.sessions, producer_group=GROUP, check_url=check_url
        )
        self._transactional = publisher.transactional(TX_TOPIC, key=lambda o: o["id"])(self._insert)
        self.place: dict[str, Callable[[str], Awaitable[None]]] = {
            "baseline": self._place_baseline,
            "transactional": self._place_transactional,
            "outbox": self._place_outbox,
            "barrier-only": self._place_barrier_only,
            "messages-only": self._place_messages_only,
        }

    async def _insert(self, session: AsyncSession, order: dict[str, Any]) -> dict[str, Any]:
        session.info["on_commit"] = functools.partial(
            self.stamps.committed.__setitem__, order["id"]
        )
        await session.execute(ORDERS.insert().values(order))
        return order

    async def _place_baseline(self, order_id: str) -> None:
        async with self.sessions() as session, session.begin():
            await self._insert(session, _order(order_id, "baseline"))
        self.placed["baseline"] += 1

    async def _place_transactional(self, order_id: str) -> None:
        await self._transactional(_order(order_id, "transactional"))
        self.placed["transactional"] += 1

    async def _place_outbox(self, order_id: str) -> None:
        async with self.sessions() as session, session.begin():
            order = await self._insert(session, _order(order_id, "outbox"))
            await outbox.add(session, OUTBOX_TOPIC, order, key=order_id)
        self.placed["outbox"] += 1
        self.outbox_added += 1

    async def _place_barrier_only(self, order_id: str) -> None:
        async with self.sessions() as session, session.begin():
            await self._insert(session, _order(order_id, "barrier-only"))
            await record_commit(session, new_id(), TX_TOPIC, order_id)
        self.placed["barrier-only"] += 1

    async def _place_messages_only(self, order_id: str) -> None:
        client = self._publisher_client
        async with self.sessions() as session, session.begin():
            order = await self._insert(session, _order(order_id, "messages-only"))
            tx = await client.prepare(
                TX_TOPIC,
                encode_body(order),
                producer_group=GROUP,
                check_url=self._check_url,
                key=order_id,
            )
        client.post(Opcode.TX_END, TxEndRequest(tx.tx_id, "commit"))  # unawaited, as there
        self.placed["messages-only"] += 1

    async def _apply(self, session: AsyncSession, msg: ConsumedMessage) -> None:
        order = _decode.decode(msg.body)
        session.info["on_committed"] = functools.partial(self.stamps.on_applied, order["id"])
        await session.execute(APPLIED.insert().values(order_id=order["id"], mode=order["mode"]))

    async def timed_slice(self, mode: str, ids: list[str]) -> float:
        """Place ``ids`` with ``concurrency`` callers; the seconds it took."""
        todo = iter(ids)

        async def caller() -> None:
            for order_id in todo:
                await self.place[mode](order_id)

        t0, cpu0, gc0 = time.perf_counter(), time.process_time(), self.gc_clock.seconds
        async with asyncio.TaskGroup() as tg:
            for _ in range(self.opts.callers):
                tg.create_task(caller())
        elapsed = time.perf_counter() - t0
        self.cpu_s[mode] += time.process_time() - cpu0
        self.gc_s[mode] += self.gc_clock.seconds - gc0
        if mode == "outbox":
            self.backlog = max(self.backlog, self.outbox_added - self.relay.published)
        return elapsed

    async def relay_caught_up(self, timeout_s: float = 60.0) -> None:
        """Wait (bounded) until the relay has published every outbox row added so far."""
        deadline = time.monotonic() + timeout_s
        while self.relay.published < self.outbox_added:
            if time.monotonic() > deadline:
                raise BenchFailed(
                    f"the relay published {self.relay.published} of {self.outbox_added} rows "
                    f"in {timeout_s:.0f} s"
                )
            await asyncio.sleep(0.005)  # watching its counter: the relay has no event for it

    async def paced(self, mode: str, ids: list[str], rate: float) -> float:
        """Place ``ids`` at ``rate`` per second (at most ``concurrency`` in flight); the rate
        achieved."""
        slots = asyncio.Semaphore(self.opts.callers)

        async def one(order_id: str) -> None:
            try:
                await self.place[mode](order_id)
            finally:
                slots.release()

        start = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for i, order_id in enumerate(ids):
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing the arrivals, not synchronisation
                await slots.acquire()
                tg.create_task(one(order_id))
        return len(ids) / (time.perf_counter() - start)

    async def applied(self, ids: list[str], work: Awaitable[Any] | None = None) -> Any:
        """Run the subscriber (and ``work`` beside it) until every order in ``ids`` is
        applied; return ``work``'s result."""
        self.stamps.expect(ids)
        subs = Subscribers(self.sub_client, self.sub_sessions)
        for topic in (TX_TOPIC, OUTBOX_TOPIC):
            subs.subscriber(
                topic, group=f"{topic}-applier", concurrency=SUBSCRIBER_CONCURRENCY, order="key"
            )(self._apply)
        stop = asyncio.Event()
        runner = asyncio.create_task(subs.run(stop))
        timeout_s = 60 + len(ids) / 50
        try:
            result = await work if work is not None else None
            waiter = asyncio.create_task(self.stamps.all_applied.wait())
            done, _ = await asyncio.wait(
                {waiter, runner}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            if runner in done:
                runner.result()  # the subscriber's failure
                raise BenchFailed("the subscriber stopped")
            if waiter not in done:
                raise BenchFailed(
                    f"{len(self.stamps.waiting)} of {len(ids)} orders not applied after "
                    f"{timeout_s:.0f} s"
                )
            return result
        finally:
            stop.set()
            async with asyncio.timeout(60):
                await runner

    async def verify(self, modes: Iterable[str]) -> None:
        for mode in modes:
            await verify(self.engine, mode, self.placed[mode], messaging=messaging(mode))
