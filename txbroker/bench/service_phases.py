"""The service bench's phases over one run: throughput (slices of each mode, rotating), then
commit-to-applied latency at a fixed rate; and one whole run against a fresh database."""

from __future__ import annotations

import asyncio
import gc

from starlette.applications import Starlette
from starlette.routing import Route

from txbroker.bench.broker_bench import WARMUP_FRACTION, _pcts
from txbroker.bench.service_db import create_tables, throwaway_database
from txbroker.bench.service_options import (
    BREAKDOWN_MODES,
    GROUP,
    MODES,
    OUTBOX_TOPIC,
    SECRET,
    SUBSCRIBER_CONCURRENCY,
    TX_TOPIC,
    ServiceBenchOptions,
    ServiceBenchResult,
    messaging,
)
from txbroker.bench.service_run import CountingResolver, ServiceRun
from txbroker.runtime.httpserve import serving
from txbroker_checkback import CheckbackEndpoint
from txbroker_sdk import Client
from txbroker_sdk.database import create_engine

__all__ = ["one_run", "pools"]


def _rotated(modes: tuple[str, ...], offset: int) -> tuple[str, ...]:
    k = offset % len(modes)
    return modes[k:] + modes[:k]


async def _throughput(run: ServiceRun, run_index: int) -> dict[str, float]:
    """orders/s per mode: an untimed warm-up slice each, then ``slices`` timed ones, rotating;
    then the subscriber applies everything and the sanity check runs."""
    opts = run.opts
    applied: list[str] = []
    for mode in run.modes:
        ids = [f"{mode}-warm-{i}" for i in range(2 * opts.callers)]
        await run.timed_slice(mode, ids)
        await run.relay_caught_up()
        applied += ids if messaging(mode) else []
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
            applied += ids if messaging(mode) else []
    await run.applied(applied)  # untimed: another service's work
    await run.verify(run.modes)
    return {mode: opts.orders / seconds[mode] for mode in run.modes}


async def _latency(
    run: ServiceRun, run_index: int, throughput: dict[str, float]
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


async def one_run(broker_url: str, opts: ServiceBenchOptions, run_index: int) -> ServiceBenchResult:
    async with throwaway_database(opts.database_url, opts.data_root) as db_url:
        (size, overflow), (sub_size, sub_overflow) = pools(opts)
        engine = create_engine(db_url, pool_size=size, max_overflow=overflow)
        sub_engine = create_engine(db_url, pool_size=sub_size, max_overflow=sub_overflow)
        clients: list[Client] = []
        try:
            await create_tables(engine)
            clients = [await Client.connect(broker_url) for _ in range(3)]
            await clients[0].create_topic(TX_TOPIC, queues=8)
            await clients[0].create_topic(OUTBOX_TOPIC, queues=8)
            resolver = CountingResolver(engine)
            app = Starlette(
                routes=[
                    Route(
                        "/txb/check", CheckbackEndpoint(resolver, {GROUP: SECRET}), methods=["POST"]
                    )
                ]
            )
            async with serving(app) as base:
                run = ServiceRun(
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
                applied_once=sum(run.placed[m] for m in run.modes if messaging(m)),
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


def pools(opts: ServiceBenchOptions) -> tuple[tuple[int, int], tuple[int, int]]:
    """(pool size, overflow) of the service's engine and of the subscriber's. Every caller
    holds a connection through its transaction (through PREPARE, too), plus the relay's claim
    and LISTEN connections and the check endpoint's; the subscriber's lanes, two subscriptions'
    worth."""
    return (opts.callers + 4, 4), (2 * SUBSCRIBER_CONCURRENCY, 2)
