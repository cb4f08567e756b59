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
