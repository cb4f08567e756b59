"""`txbroker bench peers`: its options, and its tables (one per workload, each system's
durability beside its figures, the ratios of txbroker's medians to each system's)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from txbroker.bench.peers import FLUSH_MODES, PEERS, WORKLOADS
from txbroker.cli.common import non_negative, positive
from txbroker.cli.output import Column, note, print_table
from txbroker.errors import InvalidArgument

__all__ = ["format_ratio", "register_peers"]

# Consumed below this share of the e2e rate: the consumer fell behind (its latency is a queue's).
LAGGING_FRACTION = 0.95


def _choices(allowed: tuple[str, ...]) -> Any:
    def parse(text: str) -> tuple[str, ...]:
        picked = tuple(p.strip() for p in text.split(",") if p.strip())
        bad = [p for p in picked if p not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(bad)}; choose from {','.join(allowed)}"
            )
        return picked

    return parse


def register_peers(bsub: Any) -> None:
    p = bsub.add_parser(
        "peers",
        help="the same workloads against txbroker, RabbitMQ and NATS JetStream, with ratios",
    )
    p.add_argument("--messages", type=positive, default=20_000, help="per system and round")
    p.add_argument("--window", type=positive, default=128, help="messages in flight")
    p.add_argument("--size", type=non_negative, default=1024, help="body bytes per message")
    p.add_argument("--batch", type=positive, default=32, help="messages per batch")
    p.add_argument("--rounds", type=positive, default=3, help="interleaved rounds (medians)")
    p.add_argument("--rate", type=positive, default=5000, help="e2e messages per second")
    p.add_argument("--e2e-seconds", type=float, default=5.0, help="how long e2e publishes")
    p.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="cap in seconds per system, workload and round (figures then cover what was "
        "acknowledged in time, marked capped)",
    )
    p.add_argument(
        "--peers",
        type=_choices(PEERS),
        default=PEERS,
        help=f"comma-separated, from {','.join(PEERS)} (default all)",
    )
    p.add_argument(
        "--flush",
        type=_choices(FLUSH_MODES),
        default=FLUSH_MODES,
        help="txbroker's flush modes to run (default sync,async)",
    )
    p.add_argument(
        "--workloads",
        type=_choices(WORKLOADS),
        default=WORKLOADS,
        help="comma-separated, from single,batch,e2e (default all)",
    )
    p.add_argument(
        "--rabbitmq-url",
        default="amqp://guest:guest@127.0.0.1:5672/",
        help="the RabbitMQ to compare with (default: the local one, guest/guest)",
    )
    p.add_argument(
        "--nats-url",
        default="nats://127.0.0.1:4222",
        help="the NATS server, with JetStream enabled, to compare with (default: the local one)",
    )
    p.add_argument("--data-dir", help="where txbroker's data goes (default: $TMPDIR)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_peers)


def _peers(args: argparse.Namespace) -> int:
    import asyncio

    from txbroker.bench.peers import PeersOptions, bench_peers

    if args.e2e_seconds <= 0 or args.duration <= 0:
        raise InvalidArgument("--e2e-seconds and --duration must be positive")
    if not args.flush:
        raise InvalidArgument("--flush needs at least one of sync,async")
    opts = PeersOptions(
        messages=args.messages,
        window=args.window,
        size=args.size,
        batch=args.batch,
        rounds=args.rounds,
        rate=args.rate,
        e2e_seconds=args.e2e_seconds,
        duration_s=args.duration,
        peers=args.peers,
        flush=args.flush,
        workloads=args.workloads,
        rabbitmq_url=args.rabbitmq_url,
        nats_url=args.nats_url,
        data_root=Path(args.data_dir) if args.data_dir else None,
    )

    def say(line: str) -> None:
        # A skipped or failed peer is always said; progress only without --json.
        if not args.json or not line.startswith("["):
            print(line, file=sys.stderr, flush=True)

    try:
        res = bench_peers(opts, say)
    except asyncio.CancelledError:  # SIGTERM: the run stopped its brokers and deleted its queues
        print(
            "bench peers: stopped by SIGTERM; its brokers, queues and streams are gone",
            file=sys.stderr,
        )
        return 143
    if args.json:
        print(json.dumps(res))
    else:
        print_summary(res)
    return 0


def format_ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if value >= 0.01 else f"{value:.1g}x"


def print_summary(res: dict[str, Any]) -> None:
    o = res["options"]
    systems = [s for s in res["systems"] if s["status"] == "measured"]
    txb = [s["key"] for s in systems if s["key"].startswith("txbroker-")]
    heads = {
        "single": f"single sends: {o['messages']:,} x {o['size']} B, {o['window']} in flight, "
        "one producer",
        "batch": f"batches of {o['batch']}: {o['messages']:,} x {o['size']} B, "
        f"{max(1, o['window'] // o['batch'])} batches in flight, one producer",
        "e2e": f"publish -> consume at {o['rate']:,} msgs/s for {o['e2e_seconds']:g} s, "
        f"{o['size']} B",
    }
    rounds = f"medians of {o['rounds']} round(s)"
    for workload, by_key in res["results"].items():
        rows = []
        for s in systems:
            cell = by_key.get(s["key"])
            if cell is None:
                continue
            m = cell["median"]
            figures = _figures(workload, m, o["rate"])
            ratio_name = "e2e_p99" if workload == "e2e" else workload
            ratios = [
                format_ratio(res["ratios"].get(ratio_name, {}).get(t, {}).get(s["key"]))
                for t in txb
            ]
            rows.append([s["label"], *figures, *ratios, s["durability"]])
        what = "p99" if workload == "e2e" else "msgs/s"
        cols: list[Column | str] = [Column("system")]
        if workload == "e2e":
            cols += [
                Column(h, numeric=True)
                for h in ("sent/s", "consumed/s", "p50 ms", "p99 ms", "max ms")
            ]
        else:
            unit = "batch" if workload == "batch" else "ack"
            cols += [
                Column(h, numeric=True) for h in ("msgs/s", f"{unit} p50 ms", f"{unit} p99 ms")
            ]
        cols += [Column(f"{t.removeprefix('txbroker-')}/this ({what})", numeric=True) for t in txb]
        cols.append(Column("durability at the ack"))
        print_table(cols, rows, title=f"{heads[workload]} ({rounds})")
        print()
    versions = {s["label"].split(" ")[0]: s["version"] for s in systems if s["version"]}
    print(
        "Ratios are txbroker's median over the system's: above 1, txbroker moves more msgs/s; "
        "for p99 latency, below 1, txbroker's is lower."
    )
    if versions:
        print("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".")
    for s in res["systems"]:
        if s["status"] != "measured":
            note(f"{s['label']}: {s['status']} ({s['reason']})")


def _figures(workload: str, m: dict[str, Any], rate: int) -> list[str]:
    capped = " (capped)" if m.get("capped_rounds") else ""
    if workload == "e2e":
        # A consumer that cannot keep up measures its backlog, not the broker's latency.
        lag = " (lagging)" if m["consumed_rate"] < LAGGING_FRACTION * rate else ""
        return [
            f"{m['achieved_rate']:,.0f}{capped}",
            f"{m['consumed_rate']:,.0f}{lag}",
            f"{m['p50_ms']:.2f}",
            f"{m['p99_ms']:.2f}",
            f"{m['max_ms']:.2f}",
        ]
    return [f"{m['msgs_per_s']:,.0f}{capped}", f"{m['ack_p50_ms']:.2f}", f"{m['ack_p99_ms']:.2f}"]
