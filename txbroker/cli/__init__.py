"""The `txbroker` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from txbroker.errors import InvalidArgument, TxbError

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro)
    result: T = uvloop.run(coro)
    return result


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _bench_store(args: argparse.Namespace) -> int:
    from txbroker.bench.store_bench import bench_store, format_result, summarize
    from txbroker.store import FlushMode

    results = []
    for i in range(args.runs):
        if not args.json:
            print(f"  run {i + 1}/{args.runs} ...", file=sys.stderr, flush=True)
        results.append(
            _run(
                bench_store(
                    args.messages,
                    args.size,
                    FlushMode(args.flush),
                    args.appenders,
                    Path(args.data_dir) if args.data_dir else None,
                )
            )
        )
    summary = summarize(results)
    print(json.dumps(summary) if args.json else format_result(summary))
    return 0


def _bench_recovery(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from txbroker.bench.recovery_bench import bench_recovery

    if not args.json:
        print(f"filling a store to {args.log_mib} MiB, then kill -9 ...", file=sys.stderr)
    res = _run(
        bench_recovery(args.log_mib * 1024 * 1024, Path(args.data_dir) if args.data_dir else None)
    )
    if args.json:
        print(json.dumps(asdict(res)))
    else:
        print(
            f"recovery bench: log {res.log_bytes / 2**20:,.0f} MiB, {res.records:,} records\n"
            f"  reopen after kill -9       {res.reopen_after_kill_s:6.2f} s"
            f"  ({res.replayed_after_kill:,} records replayed from the checkpoint)\n"
            f"  reopen with no checkpoint  {res.full_replay_s:6.2f} s"
            f"  ({res.replayed_full:,} records verified and replayed)"
        )
    return 0


def _bench_disk(args: argparse.Namespace) -> int:
    from txbroker.bench.store_bench import bench_disk

    root = Path(args.data_dir) if args.data_dir else None
    res = bench_disk(args.batch, args.record_bytes, args.records, args.runs, root)
    if args.json:
        print(json.dumps({str(k): v for k, v in res.items()}))
    else:
        for batch, rate in res.items():
            print(f"write+fdatasync every {batch:>4} records: {rate:>12,.0f} records/s")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import logging
    import os

    from txbroker.server.app import serve
    from txbroker.server.config import ServerConfig

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    flags = {
        "data_dir": args.data_dir,
        "host": args.host,
        "port": args.port,
        "http_port": args.http_port,
        "flush": args.flush,
        "auth_token": args.auth_token,
        "repair_truncate": True if args.repair_truncate else None,
        "segment_bytes": args.segment_mib * 1024 * 1024 if args.segment_mib else None,
        "tx_secrets": args.tx_secret or None,
    }
    config = ServerConfig.build(flags, os.environ, Path(args.config) if args.config else None)
    _run(serve(config))
    return 0


def _bench_produce(args: argparse.Namespace) -> int:
    from txbroker.bench.broker_bench import bench_produce

    root = Path(args.data_dir) if args.data_dir else None
    res = bench_produce(
        args.messages,
        args.size,
        args.producers,
        args.batch,
        args.inflight,
        args.flush,
        args.runs,
        root,
        progress=not args.json,
    )
    if args.json:
        print(json.dumps(res))
    else:
        m = res["median"]
        assert isinstance(m, dict)
        lat = m["ack_latency"]
        mode = f"batches of {m['batch']}" if m["batch"] > 1 else f"{m['inflight']} in flight"
        print(
            f"produce bench: {int(m['messages']):,} x {int(m['size'])} B, {int(m['producers'])} "
            f"producer(s), {mode}, flush={m['flush']} (median of {res['runs']})\n"
            f"  throughput    {m['msgs_per_s']:>10,.0f} msgs/s  {m['mb_per_s']:,.1f} MB/s\n"
            f"  ack latency   p50 {lat['p50_ms']} ms  p99 {lat['p99_ms']} ms  "
            f"p999 {lat['p999_ms']} ms  max {lat['max_ms']} ms"
        )
    return 0


def _bench_e2e(args: argparse.Namespace) -> int:
    from txbroker.bench.broker_bench import bench_e2e

    root = Path(args.data_dir) if args.data_dir else None
    res = bench_e2e(
        args.rate, args.seconds, args.size, args.flush, args.runs, root, progress=not args.json
    )
    if args.json:
        print(json.dumps(res))
    else:
        m = res["median"]
        assert isinstance(m, dict)
        lat = m["latency"]
        print(
            f"e2e bench: {m['rate']:,} msgs/s for {int(m['messages']):,} messages of "
            f"{int(m['size'])} B, flush={m['flush']} (median of {res['runs']}), achieved "
            f"{m['achieved_rate']:,.0f} msgs/s\n"
            f"  publish-to-consume  p50 {lat['p50_ms']} ms  p99 {lat['p99_ms']} ms  "
            f"p999 {lat['p999_ms']} ms  max {lat['max_ms']} ms"
        )
    return 0


def _bench_tx(args: argparse.Namespace) -> int:
    from txbroker.bench.tx_bench import bench_tx

    if not (0 <= args.rollback_rate <= 1 and 0 <= args.unknown_rate <= 1):
        raise InvalidArgument("--rollback-rate and --unknown-rate are fractions in 0..1")
    root = Path(args.data_dir) if args.data_dir else None
    res = bench_tx(
        args.transactions,
        args.producers,
        args.size,
        args.rollback_rate,
        args.unknown_rate,
        args.flush,
        args.runs,
        root,
        progress=not args.json,
        connections=args.connections,
    )
    if args.json:
        print(json.dumps(res))
        return 0
    m = res["median"]
    assert isinstance(m, dict)
    p, e = m["prepare_latency"], m["end_latency"]
    print(
        f"tx bench: {int(m['transactions']):,} transactions x {int(m['size'])} B, "
        f"{int(m['producers'])} producers, flush={m['flush']} (median of {res['runs']})\n"
        f"  throughput      {m['tx_per_s']:>10,.0f} transactions/s (prepare + end)\n"
        f"  prepare         p50 {p['p50_ms']} ms  p99 {p['p99_ms']} ms  p999 {p['p999_ms']} ms\n"
        f"  end             p50 {e['p50_ms']} ms  p99 {e['p99_ms']} ms  p999 {e['p999_ms']} ms\n"
        f"  back-checks     {int(m['checks'])} made, {int(m['resolved_by_check'])} transactions "
        f"left to them; unexpected {int(m['unexpected_checks'])}, "
        f"duplicate {int(m['duplicate_checks'])}"
    )
    return 0


def _bench_service(args: argparse.Namespace) -> int:
    from txbroker.bench.service_bench import ServiceBenchOptions, bench_service, format_summary

    opts = ServiceBenchOptions(
        database_url=args.database_url,
        orders=args.orders,
        concurrency=args.concurrency,
        latency_orders=args.latency_orders,
        latency_rate=args.latency_rate,
        runs=args.runs,
        broker_flush=args.broker_flush,
        data_root=Path(args.data_dir) if args.data_dir else None,
        breakdown=args.breakdown,
        gc_freeze=args.gc_freeze,
    )
    res = bench_service(opts, progress=not args.json)
    print(json.dumps(res) if args.json else format_summary(res, opts))
    return 0


def _db_upgrade(args: argparse.Namespace) -> int:
    import os

    from txbroker_sdk.schema import upgrade

    url = args.url or os.environ.get("TXB_DATABASE_URL")
    if not url:
        raise InvalidArgument("give --url (or TXB_DATABASE_URL), e.g. postgresql://user@host/db")
    upgrade(url)
    print("txbroker tables are up to date", file=sys.stderr)
    return 0


def _db_clean(args: argparse.Namespace) -> int:
    import os
    from datetime import timedelta

    from sqlalchemy.exc import SQLAlchemyError

    from txbroker_sdk.retention import clean_up_url

    url = args.url or os.environ.get("TXB_DATABASE_URL")
    if not url:
        raise InvalidArgument("give --url (or TXB_DATABASE_URL), e.g. postgresql://user@host/db")
    keep = timedelta(days=args.keep_days)
    try:
        report = _run(clean_up_url(url, keep=keep, batch_size=args.batch))
    except (SQLAlchemyError, OSError) as e:
        print(f"txbroker: error: {e}", file=sys.stderr)
        return 2
    print(
        f"deleted txb_local_tx={report.local_tx} txb_inbox={report.inbox} "
        f"txb_outbox={report.outbox} (older than {args.keep_days} days)"
    )
    return 0


def _outbox_relay(args: argparse.Namespace) -> int:
    import logging
    import os

    from txbroker_outbox.runner import relay_main

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    url = args.url or os.environ.get("TXB_DATABASE_URL")
    if not url:
        raise InvalidArgument("give --url (or TXB_DATABASE_URL), e.g. postgresql://user@host/db")
    if not args.poll_interval > 0:
        raise InvalidArgument(f"--poll-interval must be positive, got {args.poll_interval}")
    _run(
        relay_main(
            url,
            args.server or os.environ.get("TXB_SERVER") or "txb://127.0.0.1:9876",
            namespace=args.namespace,
            batch_size=args.batch,
            ordered=not args.unordered,
            poll_interval_s=args.poll_interval,
            auth_token=args.auth_token or os.environ.get("TXB_AUTH_TOKEN"),
        )
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="txbroker", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    sv = sub.add_parser("serve", help="run the broker")
    sv.add_argument("--data-dir", help="where the broker keeps its data (TXB_DATA_DIR)")
    sv.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=int, help="TCP port (default 9876; 0 picks a free one)")
    sv.add_argument("--http-port", type=int, help="HTTP admin port (default 9877)")
    sv.add_argument("--flush", choices=["sync", "async"], help="durability mode (default sync)")
    sv.add_argument("--auth-token", help="clients must present this token (TXB_AUTH_TOKEN)")
    sv.add_argument("--config", help="TOML file with any of the settings above")
    sv.add_argument(
        "--tx-secret",
        action="append",
        metavar="GROUP=SECRET",
        help="check-back signing secret of a producer group (repeat; TXB_TX_SECRETS)",
    )
    sv.add_argument(
        "--segment-mib",
        type=_positive,
        help="commit-log segment size in MiB (default 256; at least 5: one 4 MiB message)",
    )
    sv.add_argument(
        "--repair-truncate",
        action="store_true",
        help="if recovery finds a damaged record followed by valid ones, drop everything from "
        "the damage on instead of refusing to start (data loss: for operators, after a backup)",
    )
    sv.set_defaults(func=_serve)

    db = sub.add_parser("db", help="the SDK's tables in a service's database")
    dsub = db.add_subparsers(dest="db_command", required=True)
    up = dsub.add_parser("upgrade", help="create or upgrade the txbroker tables")
    up.add_argument("--url", help="database URL (TXB_DATABASE_URL); postgresql:// or sqlite://")
    up.set_defaults(func=_db_upgrade)
    cl = dsub.add_parser("clean", help="delete old barrier, inbox and published outbox rows")
    cl.add_argument("--url", help="database URL (TXB_DATABASE_URL); postgresql:// or sqlite://")
    cl.add_argument(
        "--keep-days",
        type=_positive,
        default=7,
        help="keep rows younger than this; must exceed the back-check and redelivery horizons "
        "(see sdk/retention.py; default 7)",
    )
    cl.add_argument("--batch", type=_positive, default=1000, help="rows per transaction")
    cl.set_defaults(func=_db_clean)

    ob = sub.add_parser("outbox", help="the transactional outbox of a service's database")
    osub = ob.add_subparsers(dest="outbox_command", required=True)
    rl = osub.add_parser("relay", help="publish the outbox's rows until SIGINT/SIGTERM")
    rl.add_argument("--url", help="database URL (TXB_DATABASE_URL); postgresql:// or sqlite://")
    rl.add_argument("--server", help="broker address txb://host:port (TXB_SERVER)")
    rl.add_argument(
        "--namespace",
        required=True,
        help="names this database in idempotency keys (one per service database)",
    )
    rl.add_argument("--batch", type=_positive, default=100, help="rows per round (max 1000)")
    rl.add_argument("--unordered", action="store_true", help="do not keep per-key order")
    rl.add_argument(
        "--poll-interval", type=float, default=1.0, help="seconds between polls (default 1)"
    )
    rl.add_argument("--auth-token", help="the broker's auth token (TXB_AUTH_TOKEN)")
    rl.set_defaults(func=_outbox_relay)

    from txbroker.cli.client import register

    register(sub)

    bench = sub.add_parser("bench", help="benchmarks that print figures")
    bsub = bench.add_subparsers(dest="bench", required=True)
    bs = bsub.add_parser("store", help="message store append throughput and latency")
    bs.add_argument("--messages", type=_positive, default=200_000)
    bs.add_argument("--size", type=_non_negative, default=1024, help="body bytes per message")
    bs.add_argument("--flush", choices=["sync", "async"], default="sync")
    bs.add_argument("--appenders", type=_positive, default=64)
    bs.add_argument("--runs", type=_positive, default=3, help="report the median of this many")
    bs.add_argument("--data-dir", help="where to put the temporary store (default: $TMPDIR)")
    bs.add_argument("--json", action="store_true", help="print one JSON object")
    bs.set_defaults(func=_bench_store)
    bp = bsub.add_parser("produce", help="producer throughput against a real broker")
    bp.add_argument("--messages", type=_positive, default=200_000)
    bp.add_argument("--size", type=_non_negative, default=1024)
    bp.add_argument("--producers", type=_positive, default=4, help="client connections")
    bp.add_argument("--batch", type=_positive, default=1, help="messages per request (1: single)")
    bp.add_argument("--inflight", type=_positive, default=64, help="single sends in flight each")
    bp.add_argument("--flush", choices=["sync", "async"], default="sync")
    bp.add_argument("--runs", type=_positive, default=3)
    bp.add_argument("--data-dir")
    bp.add_argument("--json", action="store_true")
    bp.set_defaults(func=_bench_produce)

    be = bsub.add_parser("e2e", help="publish-to-consume latency at a fixed rate")
    be.add_argument("--rate", type=_positive, default=5000, help="messages per second")
    be.add_argument("--seconds", type=float, default=10.0)
    be.add_argument("--size", type=_non_negative, default=1024)
    be.add_argument("--flush", choices=["sync", "async"], default="sync")
    be.add_argument("--runs", type=_positive, default=3)
    be.add_argument("--data-dir")
    be.add_argument("--json", action="store_true")
    be.set_defaults(func=_bench_e2e)

    bt = bsub.add_parser("tx", help="transactions: prepare + commit/rollback, with back-checks")
    bt.add_argument("--transactions", type=_positive, default=50_000)
    bt.add_argument("--producers", type=_positive, default=64)
    bt.add_argument("--size", type=_non_negative, default=1024)
    bt.add_argument("--connections", type=_positive, default=8, help="shared by the producers")
    bt.add_argument("--rollback-rate", type=float, default=0.0)
    bt.add_argument("--unknown-rate", type=float, default=0.0, help="left to back-checks")
    bt.add_argument("--flush", choices=["sync", "async"], default="sync")
    bt.add_argument("--runs", type=_positive, default=3)
    bt.add_argument("--data-dir")
    bt.add_argument("--json", action="store_true")
    bt.set_defaults(func=_bench_tx)

    bsv = bsub.add_parser(
        "service", help="orders/s with @transactional and outbox vs no messaging; latency"
    )
    bsv.add_argument(
        "--database-url",
        help="a PostgreSQL server (postgresql://...): a throwaway database is created on it per "
        "run and dropped after; default: a SQLite file in a temporary directory",
    )
    bsv.add_argument("--orders", type=_positive, default=5000, help="per mode per run")
    bsv.add_argument(
        "--concurrency",
        type=_positive,
        help="callers placing orders (default: 64 on PostgreSQL, enough for every mode to reach "
        "its peak; 16 on SQLite, which writes one transaction at a time)",
    )
    bsv.add_argument(
        "--latency-orders", type=_positive, default=1000, help="per mode, latency phase"
    )
    bsv.add_argument(
        "--latency-rate",
        type=_positive,
        default=200,
        help="orders/s in the latency phase (at most half the mode's measured throughput)",
    )
    bsv.add_argument("--broker-flush", choices=["sync", "async"], default="sync")
    bsv.add_argument("--runs", type=_positive, default=3)
    bsv.add_argument("--data-dir", help="broker data and SQLite files (default: $TMPDIR)")
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
    bsv.add_argument("--json", action="store_true")
    bsv.set_defaults(func=_bench_service)

    bd = bsub.add_parser("disk", help="the disk's write+fdatasync ceiling per batch size")
    bd.add_argument("--batch", type=_positive, nargs="+", default=[32, 64, 128])
    bd.add_argument("--record-bytes", type=_positive, default=1104, help="1 KiB body + header")
    bd.add_argument("--records", type=_positive, default=100_000)
    bd.add_argument("--runs", type=_positive, default=3)
    bd.add_argument("--data-dir", help="directory on the disk to measure (default: $TMPDIR)")
    bd.add_argument("--json", action="store_true")
    bd.set_defaults(func=_bench_disk)

    br = bsub.add_parser("recovery", help="reopen time after kill -9 with a large log")
    br.add_argument("--log-mib", type=_positive, default=1024, help="log size to fill (MiB)")
    br.add_argument("--data-dir", help="where to put the temporary store (default: $TMPDIR)")
    br.add_argument("--json", action="store_true")
    br.set_defaults(func=_bench_recovery)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except TxbError as e:
        print(f"txbroker: error [{e.code}]: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return rc
