"""`txbroker bench partition`: the partition scenarios at length, sync and async replication,
a table of what the history checker found per scenario (txbroker/chaos/partition_bench.py).

Exit code: 0 when every scenario ran and found no anomaly (async replication's losses are
reported, not counted), 1 otherwise, 2 when it cannot run here (not root, no ``ip``, no etcd).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from txbroker.cli.common import positive, run
from txbroker.errors import InvalidArgument

__all__ = ["register_partition"]


def register_partition(bsub: Any) -> None:
    p = bsub.add_parser(
        "partition",
        help="network partitions of a broker group: lost, duplicated, out of order, unavailable",
        description=(
            "Each partition scenario on a fresh cluster (a group of three --role auto brokers, "
            "etcd and a NameServer, each in a network namespace of its own): writers and a "
            "consumer group load it through the NameServer, links are cut by rule (or, "
            "replication-latency-loss, the replication link slowed and made lossy through a "
            "proxy) for --during-s, healed, and the history of every operation is checked "
            "against what the group holds; acknowledgement latency is measured before and "
            "during the fault. With async replication acknowledged writes may be lost: their "
            "number and when they were acknowledged are reported. Needs root, iproute2, "
            "iptables and Debian's etcd-server."
        ),
    )
    p.add_argument(
        "--kinds",
        type=_names,
        help="comma-separated partitions, e.g. isolate-master,halves (default all; an unknown "
        "name lists them)",
    )
    p.add_argument(
        "--replication",
        choices=["sync", "async", "both"],
        default="both",
        help="sync: nothing acknowledged may be lost; async: the loss window measured; both "
        "(default)",
    )
    p.add_argument(
        "--during-s", type=float, default=20.0, help="seconds the partition lasts (default 20)"
    )
    p.add_argument(
        "--before-s", type=float, default=2.0, help="seconds of load before the cut (default 2)"
    )
    p.add_argument(
        "--after-s",
        type=float,
        default=5.0,
        help="seconds of load after the heal, once writes are acknowledged again (default 5)",
    )
    p.add_argument("--writers", type=positive, default=4, help="concurrent writers (default 4)")
    p.add_argument("--runs", type=positive, default=1, help="runs of each scenario (default 1)")
    p.add_argument("--data-dir", help="where the clusters' data goes (default: $TMPDIR)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_partition)


def _names(text: str) -> tuple[str, ...]:
    # Checked against the partitions once the command runs: the parser does not import them.
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _partition(args: argparse.Namespace) -> int:
    import asyncio
    import shutil
    import signal
    import tempfile
    import time

    from txbroker.chaos.partition_bench import (
        KINDS,
        MODES,
        PartitionBench,
        bench_partitions,
        format_partitions,
        unavailable,
    )

    kinds = KINDS if args.kinds is None else args.kinds
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise InvalidArgument(f"unknown --kinds {','.join(unknown)}; choose from {','.join(KINDS)}")
    if not (args.during_s > 0 and args.before_s > 0 and args.after_s >= 0):
        raise InvalidArgument("--during-s and --before-s must be positive, --after-s >= 0")
    why = unavailable()
    if why is not None:
        print(f"txbroker: cannot run the partition bench: {why}", file=sys.stderr)
        return 2
    bench = PartitionBench(
        kinds=kinds,
        modes=MODES if args.replication == "both" else (args.replication,),
        writers=args.writers,
        before_s=args.before_s,
        during_s=args.during_s,
        after_s=args.after_s,
        runs=args.runs,
    )
    # The clients' reconnect warnings are what the partitions are for: only errors are news.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    t0 = time.monotonic()

    def say(line: str) -> None:
        if not args.json:
            print(f"partition bench: {line}", file=sys.stderr, flush=True)

    root = Path(tempfile.mkdtemp(prefix="txb-partition-", dir=args.data_dir))
    try:
        results = run(bench_partitions(bench, root, say))
    except asyncio.CancelledError:  # SIGTERM: the nets and their processes are gone already
        print("txbroker: partition bench stopped (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        settings = {k: getattr(bench, k) for k in ("kinds", "modes", "writers", "runs")}
        settings |= {k: getattr(bench, k) for k in ("before_s", "during_s", "after_s")}
        settings["seconds"] = round(time.monotonic() - t0, 1)
        print(json.dumps({"settings": settings, "scenarios": [s.as_dict() for s in results]}))
    else:
        print(format_partitions(results))
    return 0 if all(s.clean for s in results) else 1
