"""`txbroker bench BENCH`: figures.

store, produce, e2e, http, tx, service, disk, recovery, tx-recovery, growth, reconcile, cli and
instructions are registered here; fuzz, peers, failover and partition have their options and
tables in bench_fuzz.py, bench_peers.py, bench_failover.py and bench_partition.py. Each prints a
summary (medians over ``--runs``), or one JSON object with ``--json``. Progress goes to stderr:
a bar on a terminal, a line per finished run in a log, nothing with --json.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from txbroker.cli.bench_failover import register_failover
from txbroker.cli.bench_fuzz import register_fuzz
from txbroker.cli.bench_partition import register_partition
from txbroker.cli.bench_peers import register_peers
from txbroker.cli.common import Subparsers, non_negative, positive, run
from txbroker.cli.output import RunProgress, note, status
from txbroker.errors import InvalidArgument

__all__ = ["register"]

_FLUSH_HELP = "the broker's durability mode (default sync)"
_RUNS_HELP = "report the median of this many runs"
_JSON_HELP = "print one JSON object (every run and the medians)"


def _root(args: argparse.Namespace) -> Path | None:
    return Path(args.data_dir) if args.data_dir else None


def register(sub: Subparsers) -> None:
    bench = sub.add_parser("bench", help="benchmarks that print figures")
    bsub = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")

    def common(p: argparse.ArgumentParser, *, runs: int = 3, flush: str = "--flush") -> None:
        p.add_argument(flush, choices=["sync", "async"], default="sync", help=_FLUSH_HELP)
        p.add_argument("--runs", type=positive, default=runs, help=_RUNS_HELP)
        p.add_argument("--data-dir", help="where to put temporary data (default: $TMPDIR)")
        p.add_argument("--json", action="store_true", help=_JSON_HELP)

    bs = bsub.add_parser("store", help="message store append throughput and latency")
    bs.add_argument("--messages", type=positive, default=200_000, help="messages per run")
    bs.add_argument("--size", type=non_negative, default=1024, help="body bytes per message")
    bs.add_argument("--appenders", type=positive, default=64, help="concurrent appenders")
    common(bs)
    bs.set_defaults(func=_store)

    bp = bsub.add_parser("produce", help="producer throughput against a real broker")
    bp.add_argument("--messages", type=positive, default=200_000, help="messages per run")
    bp.add_argument("--size", type=non_negative, default=1024, help="body bytes per message")
    bp.add_argument("--producers", type=positive, default=4, help="client connections")
    bp.add_argument("--batch", type=positive, default=1, help="messages per request (1: single)")
    bp.add_argument("--inflight", type=positive, default=64, help="single sends in flight each")
    bp.add_argument(
        "--replicas",
        type=non_negative,
        default=0,
        help="slaves following the broker (0: none); with slaves each run is also made "
        "without them first, as the baseline",
    )
    bp.add_argument(
        "--replication",
        choices=["sync", "async"],
        default="async",
        help="with --replicas: what a send waits for (sync: the slaves' flush too)",
    )
    common(bp)
    bp.set_defaults(func=_produce)

    be = bsub.add_parser("e2e", help="publish-to-consume latency at a fixed rate")
    be.add_argument("--rate", type=positive, default=5000, help="messages per second")
    be.add_argument("--seconds", type=float, default=10.0, help="how long to send")
    be.add_argument("--size", type=non_negative, default=1024, help="body bytes per message")
    common(be)
    be.set_defaults(func=_e2e)

    bh = bsub.add_parser(
        "http", help="the HTTP API beside the TCP protocol: publish, batches, receive+ack"
    )
    bh.add_argument(
        "--messages", type=positive, default=20_000, help="per workload and transport, per run"
    )
    bh.add_argument("--size", type=non_negative, default=1024, help="body bytes per message")
    bh.add_argument(
        "--concurrency",
        type=positive,
        default=64,
        help="single publishes in flight (HTTP: keep-alive connections; TCP: sends on one)",
    )
    bh.add_argument("--batch", type=positive, default=32, help="messages per batch and per receive")
    bh.add_argument(
        "--batch-concurrency",
        type=positive,
        default=4,
        help="batches in flight, and HTTP receivers (as `bench produce`'s 4 producers)",
    )
    bh.add_argument(
        "--no-ceiling",
        action="store_true",
        help="skip measuring the HTTP client against a trivial server",
    )
    common(bh)
    bh.set_defaults(func=_http)

    bt = bsub.add_parser("tx", help="transactions: prepare + commit/rollback, with back-checks")
    bt.add_argument("--transactions", type=positive, default=50_000, help="per run")
    bt.add_argument("--producers", type=positive, default=64, help="concurrent producers")
    bt.add_argument("--size", type=non_negative, default=1024, help="body bytes per message")
    bt.add_argument("--connections", type=positive, default=8, help="shared by the producers")
    bt.add_argument("--rollback-rate", type=float, default=0.0, help="fraction (0..1) rolled back")
    bt.add_argument(
        "--unknown-rate",
        type=float,
        default=0.0,
        help="fraction (0..1) never ended by the producer: left to back-checks",
    )
    common(bt)
    bt.set_defaults(func=_tx)

    bsv = bsub.add_parser(
        "service", help="orders/s with @transactional and outbox vs no messaging; latency"
    )
    bsv.add_argument(
        "--database-url",
        help="a PostgreSQL server (postgresql://...): a throwaway database is created on it per "
        "run and dropped after; default: a SQLite file in a temporary directory",
    )
    bsv.add_argument("--orders", type=positive, default=5000, help="per mode per run")
    bsv.add_argument(
        "--concurrency",
        type=positive,
        help="callers placing orders (default: 64 on PostgreSQL, enough for every mode to reach "
        "its peak; 16 on SQLite, which writes one transaction at a time)",
    )
    bsv.add_argument(
        "--latency-orders", type=positive, default=1000, help="per mode, latency phase"
    )
    bsv.add_argument(
        "--latency-rate",
        type=positive,
        default=200,
        help="orders/s in the latency phase (at most half the mode's measured throughput)",
    )
    bsv.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the barrier row alone and the PREPARE/END_TX messages alone (diagnostic)",
    )
    bsv.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() the service's heap after the warm-up, as a tuned long-running service "
        "may (default: not frozen)",
    )
    common(bsv, flush="--broker-flush")
    bsv.set_defaults(func=_service)

    bd = bsub.add_parser("disk", help="the disk's write+fdatasync ceiling per batch size")
    bd.add_argument(
        "--batch",
        type=positive,
        nargs="+",
        default=[32, 64, 128],
        help="records per fdatasync (several: one measurement each)",
    )
    bd.add_argument("--record-bytes", type=positive, default=1104, help="1 KiB body + header")
    bd.add_argument("--records", type=positive, default=100_000, help="records per measurement")
    bd.add_argument("--runs", type=positive, default=3, help=_RUNS_HELP)
    bd.add_argument("--data-dir", help="directory on the disk to measure (default: $TMPDIR)")
    bd.add_argument("--json", action="store_true", help="print {batch: records/s}")
    bd.set_defaults(func=_disk)

    br = bsub.add_parser("recovery", help="reopen time after kill -9 with a large log")
    br.add_argument("--log-mib", type=positive, default=1024, help="log size to fill (MiB)")
    br.add_argument("--data-dir", help="where to put the temporary store (default: $TMPDIR)")
    br.add_argument("--json", action="store_true", help="print one JSON object")
    br.set_defaults(func=_recovery)

    btr = bsub.add_parser(
        "tx-recovery", help="restart time with one old open transaction and many later ones"
    )
    btr.add_argument(
        "--transactions", type=positive, default=100_000, help="resolved after the old one"
    )
    btr.add_argument("--producers", type=positive, default=64, help="concurrent producers")
    btr.add_argument(
        "--flush", choices=["sync", "async"], default="async", help="durability (default async)"
    )
    btr.add_argument("--data-dir", help="where to put the broker's data (default: $TMPDIR)")
    btr.add_argument("--json", action="store_true", help="print one JSON object")
    btr.set_defaults(func=_tx_recovery)

    bg = bsub.add_parser(
        "growth", help="broker memory and start-up time with 1M, 10M stored messages and groups"
    )
    bg.add_argument(
        "--messages",
        type=positive,
        nargs="+",
        default=[1_000_000, 10_000_000],
        help="stored 1 KiB messages to start on (several: the store grows from one to the next)",
    )
    bg.add_argument(
        "--groups", type=int, default=100_000, help="consumer groups' offsets added at the end"
    )
    bg.add_argument("--data-dir", help="where to put the temporary store (default: $TMPDIR)")
    bg.add_argument("--json", action="store_true", help="print one JSON object per point")
    bg.set_defaults(func=_growth)

    brc = bsub.add_parser(
        "reconcile",
        help="the Spark reconciliation's time on N transactions with injected anomalies",
    )
    brc.add_argument(
        "--rows",
        default="1000000",
        help="local transactions (and messages, and inbox rows) per run; a comma-separated "
        "list runs each size once, e.g. 1000000,3000000,10000000",
    )
    brc.add_argument(
        "--anomalies", type=positive, default=25, help="injected cases of each kind (default 25)"
    )
    brc.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    brc.add_argument(
        "--database-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a PostgreSQL server; a throwaway database is created on it and dropped",
    )
    brc.add_argument("--data-dir", help="where the commit log is written (default: $TMPDIR)")
    brc.add_argument("--json", action="store_true", help="print one JSON object per size")
    brc.set_defaults(func=_reconcile)

    bc = bsub.add_parser(
        "cli", help="start-up time of `txbroker --help` and `txbroker send`, beside python -c pass"
    )
    bc.add_argument("--runs", type=positive, default=10, help=_RUNS_HELP)
    bc.add_argument("--data-dir", help="where to put the broker's data (default: $TMPDIR)")
    bc.add_argument("--json", action="store_true", help=_JSON_HELP)
    bc.set_defaults(func=_cli)

    bi = bsub.add_parser(
        "instructions",
        help="instructions per message of the broker's hot path, under callgrind (in-process)",
    )
    bi.add_argument("--rounds", type=positive, default=20, help="rounds of 64 sends (8 batches)")
    bi.add_argument("--data-dir", help="where to put the broker's data (default: $TMPDIR)")
    bi.add_argument("--json", action="store_true", help="print one JSON object")
    bi.set_defaults(func=_instructions)

    register_fuzz(bsub)

    register_peers(bsub)

    register_failover(bsub)

    register_partition(bsub)


def _store(args: argparse.Namespace) -> int:
    from txbroker.bench.store_bench import bench_store, format_result, summarize
    from txbroker.store import FlushMode

    results = []
    with RunProgress("store bench", enabled=not args.json) as progress:
        for i in range(args.runs):
            progress(i, args.runs)
            results.append(
                run(
                    bench_store(
                        args.messages, args.size, FlushMode(args.flush), args.appenders, _root(args)
                    )
                )
            )
        progress(args.runs, args.runs)
    summary = summarize(results)
    print(json.dumps(summary) if args.json else format_result(summary))
    return 0


def _produce(args: argparse.Namespace) -> int:
    from txbroker.bench.broker_bench import bench_produce, format_produce

    with RunProgress("produce bench", enabled=not args.json) as progress:
        res = bench_produce(
            args.messages,
            args.size,
            args.producers,
            args.batch,
            args.inflight,
            args.flush,
            args.runs,
            _root(args),
            progress=progress,
            replicas=args.replicas,
            replication=args.replication,
        )
    print(json.dumps(res) if args.json else format_produce(res))
    return 0


def _e2e(args: argparse.Namespace) -> int:
    from txbroker.bench.broker_bench import bench_e2e, format_e2e

    with RunProgress("e2e bench", enabled=not args.json) as progress:
        res = bench_e2e(
            args.rate,
            args.seconds,
            args.size,
            args.flush,
            args.runs,
            _root(args),
            progress=progress,
        )
    print(json.dumps(res) if args.json else format_e2e(res))
    return 0


def _http(args: argparse.Namespace) -> int:
    from txbroker.bench.http_bench import Settings, bench_http, format_http

    settings = Settings(
        args.messages,
        args.size,
        args.concurrency,
        args.batch,
        args.batch_concurrency,
        args.flush,
    )
    with RunProgress("http bench", enabled=not args.json) as progress:
        res = bench_http(
            settings, args.runs, _root(args), progress=progress, ceiling=not args.no_ceiling
        )
    print(json.dumps(res) if args.json else format_http(res))
    return 0


def _tx(args: argparse.Namespace) -> int:
    from txbroker.bench.tx_bench import bench_tx, format_tx

    if not (0 <= args.rollback_rate <= 1 and 0 <= args.unknown_rate <= 1):
        raise InvalidArgument("--rollback-rate and --unknown-rate are fractions in 0..1")
    with RunProgress("tx bench", enabled=not args.json) as progress:
        res = bench_tx(
            args.transactions,
            args.producers,
            args.size,
            args.rollback_rate,
            args.unknown_rate,
            args.flush,
            args.runs,
            _root(args),
            progress=progress,
            connections=args.connections,
        )
    print(json.dumps(res) if args.json else format_tx(res))
    return 0


def _service(args: argparse.Namespace) -> int:
    from txbroker.bench.service_bench import bench_service, format_summary
    from txbroker.bench.service_options import ServiceBenchOptions

    opts = ServiceBenchOptions(
        database_url=args.database_url,
        orders=args.orders,
        concurrency=args.concurrency,
        latency_orders=args.latency_orders,
        latency_rate=args.latency_rate,
        runs=args.runs,
        broker_flush=args.broker_flush,
        data_root=_root(args),
        breakdown=args.breakdown,
        gc_freeze=args.gc_freeze,
    )
    with RunProgress("service bench", enabled=not args.json) as progress:
        res = bench_service(opts, progress)
    print(json.dumps(res) if args.json else format_summary(res, opts))
    return 0


def _disk(args: argparse.Namespace) -> int:
    from txbroker.bench.store_bench import bench_disk, format_disk

    with RunProgress("disk bench", enabled=not args.json) as progress:
        res = bench_disk(
            args.batch, args.record_bytes, args.records, args.runs, _root(args), progress
        )
    print(json.dumps({str(k): v for k, v in res.items()}) if args.json else format_disk(res))
    return 0


def _reconcile(args: argparse.Namespace) -> int:
    from txbroker.bench.reconcile_bench import bench_reconcile, format_reconcile

    try:
        sizes = [int(s.replace("_", "")) for s in args.rows.split(",")]
    except ValueError:
        raise InvalidArgument(f"--rows takes numbers, e.g. 1000000,3000000: {args.rows!r}") from (
            None
        )
    if any(n <= args.anomalies * 4 for n in sizes):
        raise InvalidArgument("--rows must be well above 4 x --anomalies")
    results = []
    for n in sizes:
        with status(f"bench reconcile: {n:,} rows", enabled=not args.json):
            res = bench_reconcile(
                args.database_url,
                n,
                anomalies=args.anomalies,
                master=args.master,
                data_root=_root(args),
                say=(lambda _s: None) if args.json else note,
            )
        results.append(res)
        if args.json:
            print(json.dumps(asdict(res)), flush=True)
    if not args.json:
        print(format_reconcile(results))
    return 0 if all(r.exact for r in results) else 1


def _growth(args: argparse.Namespace) -> int:
    from txbroker.bench.growth_bench import bench_growth, format_growth

    points = run(
        bench_growth(
            args.messages, args.groups, _root(args), say=(lambda _s: None) if args.json else note
        )
    )
    if args.json:
        for p in points:
            print(json.dumps(asdict(p)), flush=True)
    else:
        print(format_growth(points))
    return 0


def _tx_recovery(args: argparse.Namespace) -> int:
    from txbroker.bench.tx_recovery_bench import bench_tx_recovery, format_tx_recovery

    what = f"1 old open transaction and {args.transactions:,} resolved, then restarts ..."
    with status(what, enabled=not args.json):
        res = bench_tx_recovery(args.transactions, args.producers, args.flush, _root(args))
    print(json.dumps(asdict(res)) if args.json else format_tx_recovery(res))
    return 0


def _recovery(args: argparse.Namespace) -> int:
    from txbroker.bench.recovery_bench import bench_recovery, format_recovery

    with status(f"filling a store to {args.log_mib} MiB, then kill -9 ...", enabled=not args.json):
        res = run(bench_recovery(args.log_mib * 1024 * 1024, _root(args)))
    print(json.dumps(asdict(res)) if args.json else format_recovery(res))
    return 0


def _cli(args: argparse.Namespace) -> int:
    from txbroker.bench.cli_bench import bench_cli, format_cli

    with RunProgress("cli bench", enabled=not args.json) as progress:
        res = bench_cli(args.runs, _root(args), progress)
    print(json.dumps(res.as_dict()) if args.json else format_cli(res))
    return 0


def _instructions(args: argparse.Namespace) -> int:
    from txbroker.bench.instructions import bench_instructions, format_instructions

    with status("four callgrind runs of the in-process loop ...", enabled=not args.json):
        res = bench_instructions(args.rounds, _root(args))
    print(json.dumps(asdict(res)) if args.json else format_instructions(res))
    return 0
