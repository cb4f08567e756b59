"""`txbroker bench service`, run tiny: the result's shape, and the sanity check that keeps a
broken run from reporting figures."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import pytest
from sqlalchemy import Table, column, func, select, table
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import IN_CI, run_cli
from tests.databases import PG_URL
from txbroker.bench.service_bench import bench_service, command_line, format_summary
from txbroker.bench.service_db import (
    APPLIED,
    ORDERS,
    BenchFailed,
    check_connections,
    create_tables,
    throwaway_database,
    verify,
)
from txbroker.bench.service_options import (
    BREAKDOWN_MODES,
    MODES,
    PG_CALLERS,
    SQLITE_CALLERS,
    ServiceBenchOptions,
    ServiceBenchResult,
)
from txbroker.bench.service_run import GcClock
from txbroker.errors import InvalidArgument
from txbroker_sdk.database import async_url
from txbroker_sdk.tables import LOCAL_TX


def _tiny(
    tmp_path: Path, orders: int, *, breakdown: bool = False, gc_freeze: bool = False
) -> ServiceBenchOptions:
    """One run on SQLite, 4 callers, 2 slices: seconds, not minutes."""
    return ServiceBenchOptions(
        orders=orders,
        concurrency=4,
        latency_orders=20,
        latency_rate=100,
        runs=1,
        slices=2,
        data_root=tmp_path,
        breakdown=breakdown,
        gc_freeze=gc_freeze,
    )


def test_a_tiny_run_on_sqlite_reports_every_figure(tmp_path: Path) -> None:
    opts = _tiny(tmp_path, 40)
    res = bench_service(opts)
    assert res["runs"] == 1
    m = res["median"]
    assert isinstance(m, dict)
    # Every field of the result, and the broker's CPU over the run (the bench harness adds it).
    assert set(m) == {f.name for f in dataclasses.fields(ServiceBenchResult)} | {"broker_cpu_s"}
    assert m["database"] == "sqlite" and m["broker_flush"] == "sync"
    for mode in ("baseline", "transactional", "outbox"):
        assert m[f"{mode}_per_s"] > 0 and m["cpu_us_per_order"][mode] > 0
    # The ratio is of the rates before they are rounded to whole orders a second (a slow run's
    # rates are small enough for that rounding to move their ratio by more than a per cent).
    t, b = m["transactional_per_s"], m["baseline_per_s"]
    assert (t - 0.5) / (b + 0.5) - 5e-4 <= m["transactional_ratio"] <= (t + 0.5) / (b - 0.5) + 5e-4
    for lat in (m["transactional_latency"], m["outbox_latency"]):
        assert 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    # Per messaging mode: the warm-up slice (2 x concurrency), the timed orders, the latency
    # phase; each checked against the database to have been applied exactly once.
    assert m["applied_once"] == 2 * (2 * 4 + 40 + 20)
    assert m["back_checks"] == 0 and m["relay_duplicates"] == 0
    assert m["breakdown_ratio"] == m["breakdown_per_s"] == {}  # not asked for
    assert m["gc_frozen_objects"] == 0  # not asked for
    assert set(m["gc_us_per_order"]) == {"baseline", "transactional", "outbox"}
    assert all(0 <= m["gc_us_per_order"][k] <= m["cpu_us_per_order"][k] for k in MODES)
    # busy = CPU seconds over the slices' seconds, i.e. CPU per order times orders/s (both
    # rounded, hence the tolerance).
    for k in MODES:
        per_s = m[f"{k}_per_s"]
        assert m["busy"][k] == pytest.approx(m["cpu_us_per_order"][k] * per_s / 1e6, rel=0.02)
    (only,) = res["all"]
    assert isinstance(only, dict)
    text_out = format_summary(res, opts)
    assert f"run by run: {only['transactional_ratio']:.2f}\n" in text_out
    assert "@transactional" in text_out and "(diagnostic)" not in text_out
    assert "txbroker bench service --orders 40 --concurrency 4" in text_out
    assert not list(tmp_path.iterdir())  # the broker's data and the SQLite file are gone


def test_breakdown_times_the_barrier_and_the_messages_each_alone(tmp_path: Path) -> None:
    opts = _tiny(tmp_path, 24, breakdown=True)
    res = bench_service(opts)
    m = res["median"]
    assert isinstance(m, dict)
    assert set(m["breakdown_ratio"]) == set(m["breakdown_per_s"]) == set(BREAKDOWN_MODES)
    for mode in BREAKDOWN_MODES:
        assert m["breakdown_per_s"][mode] > 0 and m["cpu_us_per_order"][mode] > 0
        # Of the rates before rounding, as the transactional ratio (see the test above).
        r, b = m["breakdown_per_s"][mode], m["baseline_per_s"]
        assert (
            (r - 0.5) / (b + 0.5) - 5e-4
            <= m["breakdown_ratio"][mode]
            <= (r + 0.5) / (b - 0.5) + 5e-4
        )
    # "messages-only" publishes (warm-up and timed orders, each checked applied once) on top
    # of the two messaging modes; "barrier-only" publishes nothing (verified: no applied rows).
    assert m["applied_once"] == 2 * (2 * 4 + 24 + 20) + (2 * 4 + 24)
    assert m["back_checks"] == 0
    text_out = format_summary(res, opts)
    assert "barrier-only" in text_out and "messages-only" in text_out
    assert text_out.count("(diagnostic)") == 2
    assert "--breakdown" in text_out


def test_the_default_callers_follow_the_database() -> None:
    assert ServiceBenchOptions().callers == SQLITE_CALLERS
    assert ServiceBenchOptions(database_url=PG_URL).callers == PG_CALLERS
    assert ServiceBenchOptions(database_url=PG_URL, concurrency=3).callers == 3
    assert "--concurrency 64" in command_line(ServiceBenchOptions(database_url=PG_URL))


def test_the_gc_clock_counts_collections_only_while_installed() -> None:
    with GcClock() as clock:
        gc.collect()
        during = clock.seconds
    assert during > 0
    assert clock._callback not in gc.callbacks
    gc.collect()
    assert clock.seconds == during


def test_gc_freeze_freezes_the_warm_heap_for_the_run_and_thaws_it_after(tmp_path: Path) -> None:
    opts = _tiny(tmp_path, 24, gc_freeze=True)
    res = bench_service(opts)
    m = res["median"]
    assert isinstance(m, dict)
    assert m["gc_frozen_objects"] > 10_000  # the modules, classes and engines, at least
    assert gc.get_freeze_count() == 0  # a later run (or test) starts from a normal heap
    text_out = format_summary(res, opts)
    assert "--gc-freeze" in text_out and "heap frozen after the warm-up" in text_out


async def test_verify_fails_a_run_with_a_lost_duplicate_or_orphan_message(
    engine: AsyncEngine,
) -> None:
    await create_tables(engine)

    async def insert(into: Table, **row: object) -> None:
        async with engine.begin() as conn:
            await conn.execute(into.insert().values(row))

    for oid in ("o1", "o2"):
        await insert(ORDERS, id=oid, mode="outbox", item="lamp", qty=1, amount_cents=5)
    await insert(APPLIED, order_id="o1", mode="outbox")
    with pytest.raises(BenchFailed, match="1 of 2 orders not applied exactly once"):
        await verify(engine, "outbox", 2, messaging=True)  # o2 lost
    await insert(APPLIED, order_id="o2", mode="outbox")
    await verify(engine, "outbox", 2, messaging=True)
    with pytest.raises(BenchFailed, match="3 orders placed but 2 committed"):
        await verify(engine, "outbox", 3, messaging=True)
    await insert(APPLIED, order_id="o1", mode="outbox")
    with pytest.raises(BenchFailed, match="1 of 2 orders not applied exactly once"):
        await verify(engine, "outbox", 2, messaging=True)  # o1 applied twice
    await insert(APPLIED, order_id="o9", mode="transactional")
    with pytest.raises(BenchFailed, match="1 applied rows without their order"):
        await verify(engine, "transactional", 0, messaging=True)
    await verify(engine, "baseline", 0, messaging=False)
    await insert(APPLIED, order_id="o8", mode="baseline")
    with pytest.raises(BenchFailed, match="publishes nothing"):
        await verify(engine, "baseline", 0, messaging=False)


async def test_a_postgresql_url_gets_a_throwaway_database_dropped_afterwards() -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    admin = create_async_engine(async_url(PG_URL))
    try:
        async with admin.connect() as conn:
            await conn.execute(select(1))
    except OSError as e:
        await admin.dispose()
        if IN_CI:
            raise
        pytest.skip(f"PostgreSQL not available at {PG_URL}: {e}")
    databases = table("pg_database", column("datname"))
    try:
        async with throwaway_database(PG_URL, None) as url:
            name = url.rpartition("/")[2]
            assert name.startswith("txb_bench_")
            db = create_async_engine(async_url(url))
            try:
                async with db.connect() as conn:  # migrated: the SDK's tables are there
                    assert await conn.scalar(select(func.count()).select_from(LOCAL_TX)) == 0
            finally:
                await db.dispose()
        async with admin.connect() as conn:
            gone = select(databases.c.datname).where(databases.c.datname == name)
            assert (await conn.execute(gone)).first() is None
    finally:
        await admin.dispose()


async def test_more_callers_than_the_server_has_connections_for_are_refused_up_front() -> None:
    try:
        await check_connections(PG_URL, 2, "--concurrency 1")  # room for two: passes
    except OSError as e:
        if IN_CI:
            raise
        pytest.skip(f"PostgreSQL not available at {PG_URL}: {e}")
    with pytest.raises(InvalidArgument, match=r"--concurrency 9999 needs up to 100000 conn"):
        await check_connections(PG_URL, 100_000, "--concurrency 9999")


def test_the_cli_refuses_more_callers_than_connections_before_starting_anything() -> None:
    out = run_cli("bench", "service", "--database-url", PG_URL, "--concurrency", "100000")
    if not IN_CI and "Connect call failed" in out.stderr:
        pytest.skip(f"PostgreSQL not available at {PG_URL}")
    assert out.returncode == 2, out.stderr
    assert "--concurrency 100000 needs up to" in out.stderr
    assert "max_connections" in out.stderr
    assert "run 1/" not in out.stderr  # no broker was started


async def test_a_url_that_is_not_postgresql_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="postgresql"):
        async with throwaway_database("sqlite:///x.db", None):
            pass


def test_the_cli_refuses_a_database_that_is_not_postgresql_before_starting_anything() -> None:
    out = run_cli("bench", "service", "--database-url", "sqlite:///shop.db")
    assert out.returncode == 2
    assert "must be postgresql://...; leave it out for SQLite" in out.stderr
    assert "run 1/" not in out.stderr  # no broker was started
