"""`txbroker bench service`: what the service SDK costs a business transaction.

The business transaction inserts one order row. Three modes, measured in the same run, against
the same fresh database and a fresh broker (`txbroker serve` child process):

* baseline: the insert and its commit, no messaging;
* transactional: the same insert through ``TxPublisher.transactional`` (PREPARE, barrier row,
  commit, END_TX); the check-back endpoint (barrier resolver, real HTTP) is served in this
  process and counts the back-checks it answers, which should be none;
* outbox: the same insert plus ``outbox.add`` in one transaction, with a ``Relay`` in this
  process publishing meanwhile.

Throughput: ``concurrency`` callers place orders as fast as they can: by default 64 on
PostgreSQL, enough for every mode to reach its peak (the baseline's orders/s is flat from 16
callers up; @transactional's rises to 64, because each order also waits on the broker and the
broker's group commit and the client's frames batch more as more orders are in flight), and 16
on SQLite, which takes one writer at a time. Each mode's orders are
cut into slices, run in rotating mode order, so every mode meets the same (noisy, shared)
machine; after an untimed warm-up slice per mode (pools, prepared statements, topics).
orders/s = orders / time from the first call of a slice to the last caller's return, summed
over slices. The ratios to the baseline are taken per run. The outbox relay runs while its
slices are timed (it is part of the service); ``outbox_backlog`` is the most rows it still had
to publish when a slice's callers finished (what it had not kept up with), and the next slice
starts once it has caught up. The subscriber (another service in production) does not run
during the throughput phase, because in this process it would take the callers' CPU; it
applies the phase's messages afterwards, untimed. ``cpu_us_per_order`` is this process's CPU
time per order in the timed slices (the callers; for the outbox also the relay): when it is
close to 1e6 / orders_per_s, the service's own CPU is what limits its throughput;
``busy`` is that fraction (this process's CPU time over the slices' wall time).
``gc_us_per_order`` is the part of it spent in the cyclic garbage collector (``gc.callbacks``).

``gc_freeze`` freezes the process's heap after the warm-up (``gc.freeze()``: what is alive then,
mostly modules, classes and the engines, is never scanned again), as a long-running service may
do after its start-up. Without it, every full collection rescans that heap (about 90,000 objects
here). The freeze is undone when the run ends.

``breakdown`` adds two diagnostic modes to the throughput phase, each one half of what
@transactional adds to the baseline: ``barrier-only`` (the insert plus the barrier row, no
messaging) and ``messages-only`` (the insert with PREPARE awaited before the commit and END_TX
sent after it, as @transactional does, but no barrier row). Their ratios show where the cost
lies; neither is a safe way to publish (``messages-only`` has nothing for a back-check to find).

Commit-to-applied latency is measured in a separate phase, at a fixed rate (open loop, at most
``concurrency`` in flight), with the subscriber running: the throughput phase builds a backlog
on purpose, and its latency would measure that backlog. The rate is ``latency_rate``, or half
the mode's throughput in this run if that is lower, so that the path is measured, not a queue.
Latency = the subscriber's transaction that wrote the ``bench_applied`` row has committed
(SQLAlchemy ``after_commit``) minus the business session starting its COMMIT (``before_commit``,
after the last statement), both ``time.perf_counter()`` in this process. The stamps stay in the
process, keyed by order id, instead of riding in the body: ``@transactional`` fixes the body at
PREPARE, before the commit it would have to time. The first 10% are warm-up and left out.

Sanity: after each phase, every committed order of a messaging mode must have exactly one
applied row and no applied row may lack its order (baseline: every order committed, nothing
applied); otherwise the run fails with BenchFailed, and no figures are printed.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session
from starlette.applications import Starlette
from starlette.routing import Route

import txbroker_outbox as outbox
from txbroker.bench.broker_bench import (
    WARMUP_FRACTION,
    OnRun,
    _pcts,
    repeat_against_broker,
    run_client,
)
from txbroker.bench.service_db import (
    APPLIED,
    ORDERS,
    BenchFailed,
    check_connections,
    create_tables,
    postgresql_server,
    throwaway_database,
    verify,
)
from txbroker.protocol.frames import Opcode
from txbroker.protocol.ids import new_id
from txbroker.protocol.messages import TxEndRequest
from txbroker.runtime.httpserve import serving
from txbroker_checkback import CheckbackEndpoint, CheckRequest, CheckStatus
from txbroker_sdk import Client, ConsumedMessage
from txbroker_sdk.barrier import BarrierResolver, record_commit
from txbroker_sdk.database import create_engine
from txbroker_sdk.subscriber import Subscribers
from txbroker_sdk.transactional import TxPublisher, encode_body

__all__ = [
    "BREAKDOWN_MODES",
    "MODES",
    "ServiceBenchOptions",
    "ServiceBenchResult",
    "bench_service",
    "command_line",
    "format_summary",
]

MODES: Final = ("baseline", "transactional", "outbox")
BREAKDOWN_MODES: Final = ("barrier-only", "messages-only")
GROUP: Final = "bench-orders"
SECRET: Final = "bench-service-secret"
TX_TOPIC: Final = "bench-tx"
OUTBOX_TOPIC: Final = "bench-outbox"
# Per subscription; the subscriber keeps up with the latency phase's rate with room to spare,
# and its connections (two subscriptions' worth) must fit PostgreSQL's max_connections beside
# the callers' pool.
SUBSCRIBER_CONCURRENCY: Final = 8
# Default callers (see the module docstring).
PG_CALLERS: Final = 64
SQLITE_CALLERS: Final = 16
_decode = msgspec.json.Decoder()


@dataclass(frozen=True)
class ServiceBenchOptions:
    database_url: str | None = None  # None: a SQLite file; else a PostgreSQL server
    orders: int = 5000  # per mode per run
    concurrency: int | None = None  # None: PG_CALLERS on PostgreSQL, SQLITE_CALLERS on SQLite
    latency_orders: int = 1000  # per messaging mode per run
    latency_rate: int = 200  # orders/s in the latency phase
    runs: int = 3
    broker_flush: str = "sync"
    data_root: Path | None = None
    slices: int = 4  # timed slices per mode per run
    breakdown: bool = False  # also time BREAKDOWN_MODES
    gc_freeze: bool = False  # gc.freeze() after the warm-up (see the module docstring)

    @property
    def callers(self) -> int:
        if self.concurrency is not None:
            return self.concurrency
        return SQLITE_CALLERS if self.database_url is None else PG_CALLERS

    @property
    def modes(self) -> tuple[str, ...]:
        return MODES + BREAKDOWN_MODES if self.breakdown else MODES


@dataclass(frozen=True)
class ServiceBenchResult:
    database: str
    broker_flush: str
    orders: int
    concurrency: int
    baseline_per_s: float
    transactional_per_s: float
    outbox_per_s: float
    transactional_ratio: float
    outbox_ratio: float
    latency_rate: int
    latency_orders: int
    transactional_latency: dict[str, float]
    outbox_latency: dict[str, float]
    latency_achieved_per_s: dict[str, float]
    back_checks: int
    outbox_backlog: int
    relay_duplicates: int
    applied_once: int  # orders checked to have exactly one applied row
    # The service process's CPU (callers, relay, check endpoint) per order in timed slices:
    # when it is near 1e6 / orders_per_s, the service's CPU is what limits throughput.
    cpu_us_per_order: dict[str, float]
    # That CPU time over the slices' wall time: near 1.0 on PostgreSQL, the service's one core
    # is the limit (on SQLite the driver's threads can take it past 1.0).
    busy: dict[str, float]
    # The part of it spent in the cyclic garbage collector, and how many objects were frozen.
    gc_us_per_order: dict[str, float]
    gc_frozen_objects: int
    # With ``breakdown``: orders/s of each BREAKDOWN_MODES mode over the baseline's, per run.
    breakdown_ratio: dict[str, float]
    breakdown_per_s: dict[str, float]


class _StampedSession(Session):
    """Calls ``info["on_commit"]`` as its COMMIT starts and ``info["on_committed"]`` once it is
    done, with ``time.perf_counter()``: the two ends of commit-to-applied latency."""


@event.listens_for(_StampedSession, "before_commit")
def _before_commit(session: Session) -> None:
    callback = session.info.pop("on_commit", None)
    if callback is not None:
        callback(time.perf_counter())


@event.listens_for(_StampedSession, "after_commit")
def _after_commit(session: Session) -> None:
    callback = session.info.pop("on_committed", None)
    if callback is not None:
        callback(time.perf_counter())


class _GcClock:
    """Seconds this process has spent in the cyclic garbage collector while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0

    def __enter__(self) -> _GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


class _CountingResolver:
    """The barrier resolver, counting the back-checks it answers."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._inner = BarrierResolver(engine)
        self.checks = 0

    async def __call__(self, check: CheckRequest) -> CheckStatus:
        self.checks += 1
        return await self._inner(check)


@dataclass
class _Stamps:
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


class _ServiceRun:
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
            engine, expire_on_commit=False, sync_session_class=_StampedSession
        )
        self.sub_sessions = async_sessionmaker(
            subscriber_engine, expire_on_commit=False, sync_session_class=_StampedSession
        )
        publisher_client, relay_client, self.sub_client = clients
        self._publisher_client = publisher_client
        self._check_url = check_url
        self.relay = outbox.Relay(relay_client, engine, namespace="bench")
        self.stamps = _Stamps()
        self.modes = opts.modes
        self.placed = dict.fromkeys(self.modes, 0)
        self.outbox_added = 0
        self.backlog = 0
        self.cpu_s = dict.fromkeys(self.modes, 0.0)  # this process's CPU in timed slices
        self.gc_s = dict.fromkeys(self.modes, 0.0)  # the part of it in the garbage collector
        self.gc_clock = _GcClock()
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
            await verify(self.engine, mode, self.placed[mode], messaging=_messaging(mode))


def _rotated(modes: tuple[str, ...], offset: int) -> tuple[str, ...]:
    k = offset % len(modes)
    return modes[k:] + modes[:k]


async def _throughput(run: _ServiceRun, run_index: int) -> dict[str, float]:
    """orders/s per mode: an untimed warm-up slice each, then ``slices`` timed ones, rotating;
    then the subscriber applies everything and the sanity check runs."""
    opts = run.opts
    applied: list[str] = []
    for mode in run.modes:
        ids = [f"{mode}-warm-{i}" for i in range(2 * opts.callers)]
        await run.timed_slice(mode, ids)
        await run.relay_caught_up()
        applied += ids if _messaging(mode) else []
    if opts.gc_freeze:
        gc.collect()  # untimed; what survives it is frozen
        gc.freeze()
    seconds = dict.fromkeys(run.modes, 0.0)
    run.cpu_s = dict.fromkeys(run.modes, 0.0)  # not the warm-up's
    run.gc_s = dict.fromkeys(run.modes, 0.0)
    bounds = [opts.orders * s // opts.slices for s in range(opts.slices + 1)]
    for s in range(opts.slices):
        for mode in _rotated(run.modes, run_index + s):
            ids = [f"{mode}-{i}" for i in range(bounds[s], bounds[s + 1])]
            seconds[mode] += await run.timed_slice(mode, ids)
            # Untimed: its publishing must not spill into the next mode's slice.
            await run.relay_caught_up()
            applied += ids if _messaging(mode) else []
    await run.applied(applied)  # untimed: another service's work
    await run.verify(run.modes)
    return {mode: opts.orders / seconds[mode] for mode in run.modes}


def _messaging(mode: str) -> bool:
    return mode not in ("baseline", "barrier-only")


async def _latency(
    run: _ServiceRun, run_index: int, throughput: dict[str, float]
) -> dict[str, tuple[float, list[float]]]:
    """(achieved rate, commit-to-applied seconds after warm-up) per messaging mode."""
    n = run.opts.latency_orders
    out: dict[str, tuple[float, list[float]]] = {}
    for mode in _rotated(MODES, run_index):
        if mode == "baseline":
            continue
        ids = [f"{mode}-lat-{i}" for i in range(n)]
        target = min(run.opts.latency_rate, throughput[mode] / 2)
        rate = await run.applied(ids, run.paced(mode, ids, target))
        await run.verify([mode])
        out[mode] = (rate, run.stamps.latencies(ids[int(n * WARMUP_FRACTION) :]))
    return out


async def _one_run(
    broker_url: str, opts: ServiceBenchOptions, run_index: int
) -> ServiceBenchResult:
    async with throwaway_database(opts.database_url, opts.data_root) as db_url:
        (size, overflow), (sub_size, sub_overflow) = _pools(opts)
        engine = create_engine(db_url, pool_size=size, max_overflow=overflow)
        sub_engine = create_engine(db_url, pool_size=sub_size, max_overflow=sub_overflow)
        clients: list[Client] = []
        try:
            await create_tables(engine)
            clients = [await Client.connect(broker_url) for _ in range(3)]
            await clients[0].create_topic(TX_TOPIC, queues=8)
            await clients[0].create_topic(OUTBOX_TOPIC, queues=8)
            resolver = _CountingResolver(engine)
            app = Starlette(
                routes=[
                    Route(
                        "/txb/check", CheckbackEndpoint(resolver, {GROUP: SECRET}), methods=["POST"]
                    )
                ]
            )
            async with serving(app) as base:
                run = _ServiceRun(
                    opts,
                    engine,
                    sub_engine,
                    (clients[0], clients[1], clients[2]),
                    base + "/txb/check",
                )
                stop_relay = asyncio.Event()
                relay = asyncio.create_task(run.relay.run(stop_relay))
                try:
                    with run.gc_clock:
                        rates = await _throughput(run, run_index)
                        frozen = gc.get_freeze_count()
                        latency = await _latency(run, run_index, rates)
                finally:
                    if opts.gc_freeze:
                        gc.unfreeze()
                    stop_relay.set()
                    async with asyncio.timeout(60):
                        await relay
            return ServiceBenchResult(
                database=engine.dialect.name,
                broker_flush=opts.broker_flush,
                orders=opts.orders,
                concurrency=opts.callers,
                baseline_per_s=round(rates["baseline"]),
                transactional_per_s=round(rates["transactional"]),
                outbox_per_s=round(rates["outbox"]),
                transactional_ratio=round(rates["transactional"] / rates["baseline"], 3),
                outbox_ratio=round(rates["outbox"] / rates["baseline"], 3),
                latency_rate=opts.latency_rate,
                latency_orders=opts.latency_orders,
                transactional_latency=_pcts(latency["transactional"][1]),
                outbox_latency=_pcts(latency["outbox"][1]),
                latency_achieved_per_s={m: round(latency[m][0], 1) for m in latency},
                back_checks=resolver.checks,
                outbox_backlog=run.backlog,
                relay_duplicates=run.relay.duplicates,
                applied_once=sum(run.placed[m] for m in run.modes if _messaging(m)),
                cpu_us_per_order={
                    mode: round(run.cpu_s[mode] / opts.orders * 1e6) for mode in run.modes
                },
                # CPU seconds over the timed slices' seconds, which are orders / rate.
                busy={
                    mode: round(run.cpu_s[mode] * rates[mode] / opts.orders, 3)
                    for mode in run.modes
                },
                gc_us_per_order={
                    mode: round(run.gc_s[mode] / opts.orders * 1e6, 1) for mode in run.modes
                },
                gc_frozen_objects=frozen,
                breakdown_ratio={
                    mode: round(rates[mode] / rates["baseline"], 3)
                    for mode in BREAKDOWN_MODES
                    if mode in rates
                },
                breakdown_per_s={
                    mode: round(rates[mode]) for mode in BREAKDOWN_MODES if mode in rates
                },
            )
        finally:
            for c in clients:
                await c.close()
            await engine.dispose()
            await sub_engine.dispose()


def _pools(opts: ServiceBenchOptions) -> tuple[tuple[int, int], tuple[int, int]]:
    """(pool size, overflow) of the service's engine and of the subscriber's. Every caller
    holds a connection through its transaction (through PREPARE, too), plus the relay's claim
    and LISTEN connections and the check endpoint's; the subscriber's lanes, two subscriptions'
    worth."""
    return (opts.callers + 4, 4), (2 * SUBSCRIBER_CONCURRENCY, 2)


def _connections(opts: ServiceBenchOptions) -> int:
    """The most database connections one run opens: both pools full, plus the connection that
    creates and drops its throwaway database."""
    return sum(size + overflow for size, overflow in _pools(opts)) + 1


def bench_service(opts: ServiceBenchOptions, progress: OnRun | None = None) -> dict[str, object]:
    """Run the bench ``opts.runs`` times, each against a fresh broker and database."""
    if opts.database_url is not None:
        postgresql_server(opts.database_url)  # refuse a wrong URL before starting anything
        run_client(
            check_connections(
                opts.database_url, _connections(opts), f"--concurrency {opts.callers}"
            )
        )
    runs = iter(range(opts.runs))

    def one(broker_url: str) -> ServiceBenchResult:
        return run_client(_one_run(broker_url, opts, next(runs)))

    extra = ("--tx-secret", f"{GROUP}={SECRET}")
    return repeat_against_broker(one, opts.runs, opts.broker_flush, opts.data_root, progress, extra)


def command_line(opts: ServiceBenchOptions) -> str:
    """The command that repeats this bench (a database password masked)."""
    parts = ["txbroker bench service"]
    if opts.database_url is not None:
        url = make_url(opts.database_url).render_as_string(hide_password=True)
        parts.append(f"--database-url {url}")
    parts += [
        f"--orders {opts.orders}",
        f"--concurrency {opts.callers}",
        f"--latency-orders {opts.latency_orders}",
        f"--latency-rate {opts.latency_rate}",
        f"--broker-flush {opts.broker_flush}",
        f"--runs {opts.runs}",
    ]
    if opts.breakdown:
        parts.append("--breakdown")
    if opts.gc_freeze:
        parts.append("--gc-freeze")
    return " ".join(parts)


def format_summary(res: dict[str, object], opts: ServiceBenchOptions) -> str:
    m = res["median"]
    assert isinstance(m, dict)
    tl, ol = m["transactional_latency"], m["outbox_latency"]
    at, cpu, gcu = m["latency_achieved_per_s"], m["cpu_us_per_order"], m["gc_us_per_order"]
    busy = m["busy"]

    def cost(mode: str) -> str:
        return f"{busy[mode]:>6.0%}{cpu[mode]:>8,.0f} us{gcu[mode]:>6,.0f} us"

    frozen = int(m["gc_frozen_objects"])
    runs = res["all"]
    assert isinstance(runs, list)
    per_run = ", ".join(f"{r['transactional_ratio']:.2f}" for r in runs)
    return (
        f"service bench: {int(m['orders']):,} orders per mode, {int(m['concurrency'])} callers, "
        f"{m['database']}, broker flush={m['broker_flush']} (median of {res['runs']} runs)\n"
        f"  command: {command_line(opts)}\n"
        f"  {'mode':<16}{'orders/s':>10}{'vs baseline':>13}{'busy':>6}{'CPU/order':>11}{'GC':>9}"
        f"   commit-to-applied p50, p99\n"
        f"  {'baseline':<16}{m['baseline_per_s']:>10,.0f}{1:>13.2f}{cost('baseline')}\n"
        f"  {'@transactional':<16}{m['transactional_per_s']:>10,.0f}"
        f"{m['transactional_ratio']:>13.2f}{cost('transactional')}"
        f"   {tl['p50_ms']:.1f} ms, {tl['p99_ms']:.1f} ms at {at['transactional']:,.0f} orders/s\n"
        f"  {'outbox':<16}{m['outbox_per_s']:>10,.0f}{m['outbox_ratio']:>13.2f}{cost('outbox')}"
        f"   {ol['p50_ms']:.1f} ms, {ol['p99_ms']:.1f} ms at {at['outbox']:,.0f} orders/s\n"
        + "".join(
            f"  {mode:<16}{m['breakdown_per_s'][mode]:>10,.0f}"
            f"{m['breakdown_ratio'][mode]:>13.2f}{cost(mode)}   (diagnostic)\n"
            for mode in BREAKDOWN_MODES
            if mode in m["breakdown_ratio"]
        )
        + f"  @transactional vs baseline, run by run: {per_run}\n"
        f"  back-checks {int(m['back_checks'])}; outbox backlog when its callers finished: "
        f"{int(m['outbox_backlog'])} rows; relay duplicates {int(m['relay_duplicates'])}; "
        f"{int(m['applied_once']):,} orders per run applied exactly once (checked)\n"
        f"  Throughput: callers place orders as fast as they can, in slices that rotate the "
        f"modes, while the subscriber is idle;\n"
        f"  the ratios are per run. CPU/order: this (the service's) process, in the timed "
        f"slices; busy: that CPU time over\n"
        f"  the slices' wall time (near 100%, the service's core is the limit); GC: the part "
        f"of the CPU in the garbage collector\n  ("
        + (f"heap frozen after the warm-up: {frozen:,} objects" if frozen else "heap not frozen")
        + ").\n  Latency: a separate phase at a fixed rate (at most half the mode's throughput), "
        "from the business COMMIT starting\n  to the subscriber's commit."
    )
