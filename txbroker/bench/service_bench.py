"""`txbroker bench service`: what the service SDK costs a business transaction.

One order insert, in three modes measured in the same run against a fresh database and a fresh
broker child process: the baseline (no messaging), ``TxPublisher.transactional``, and the outbox
with its relay running. Each mode's throughput is timed in slices run in rotating order, so
every mode meets the same noisy machine; commit-to-applied latency is timed in a separate, paced
phase with the subscriber running. Every committed order must be applied exactly once, or the
run fails with BenchFailed. What each figure means: docs/benchmarks.md, "The service SDK".
"""

from __future__ import annotations

from sqlalchemy.engine import make_url

from txbroker.bench.broker_bench import OnRun, repeat_against_broker, run_client
from txbroker.bench.service_db import check_connections, postgresql_server
from txbroker.bench.service_options import (
    BREAKDOWN_MODES,
    GROUP,
    SECRET,
    ServiceBenchOptions,
    ServiceBenchResult,
)
from txbroker.bench.service_phases import one_run, pools

__all__ = ["bench_service", "command_line", "format_summary"]


def _connections(opts: ServiceBenchOptions) -> int:
    """The most database connections one run opens: both pools full, plus the connection that
    creates and drops its throwaway database."""
    return sum(size + overflow for size, overflow in pools(opts)) + 1


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
        return run_client(one_run(broker_url, opts, next(runs)))

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
