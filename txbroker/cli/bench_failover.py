"""`txbroker bench failover`: the failover campaign at length and its figures.

It runs the fault campaign's failover scenarios (txbroker/chaos/failover.py) and prints the
campaign's table (acknowledged, lost, duplicated, anomalies, Spark), then how long each new
master took to serve (median, p90, max and every sample) and, with async replication, the loss
window: acknowledged writes that went down with a killed master. Exit code as `txbroker chaos`:
0 clean (async's loss window allowed), 1 not, 2 cannot run.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from txbroker.cli.chaos import add_campaign_flags, run_from_flags
from txbroker.cli.common import positive

__all__ = ["register_failover"]


def register_failover(bsub: Any) -> None:
    p = bsub.add_parser(
        "failover",
        help="kill -9 of broker groups' masters under load: lost, duplicated, time to serve",
        description=(
            "The failover campaign: 2 broker groups of 3 brokers (--role auto) with etcd and a "
            "NameServer on loopback, the orders/billing services and a producer under load, and "
            "each round a kill -9 of a group's master; then every acknowledged write and "
            "committed transaction is checked applied once, and the time each new master took "
            "to serve is reported. Needs Debian's etcd-server."
        ),
    )
    p.add_argument("--rounds", type=positive, default=10, help="kills per scenario (10)")
    p.add_argument("--load", type=positive, default=200, help="plain sends per round (200)")
    p.add_argument(
        "--replication",
        choices=["sync", "async", "both"],
        default="both",
        help="sync: 0 lost expected; async: the loss window measured; both (default)",
    )
    add_campaign_flags(p)
    p.set_defaults(func=_failover)


def _failover(args: argparse.Namespace) -> int:
    from rich.console import Console

    from txbroker.chaos import Sizes, print_table
    from txbroker.chaos.failover import distribution, summary

    scenarios = {
        "sync": ("master-failover",),
        "async": ("master-failover-async",),
        "both": ("master-failover", "master-failover-async"),
    }[args.replication]

    rows = run_from_flags(
        args,
        scenarios,
        Sizes(args.rounds, args.load, round_timeout_s=60, max_s=60.0 * args.rounds + 120),
        lambda f: f"serving after {distribution(f.failover_s)}",
    )
    if rows is None:
        return 2
    if args.json:
        print(json.dumps([{**r.as_dict(), "failover": summary(r.failover_s)} for r in rows]))
    else:
        print_table(rows, Console(width=None if sys.stdout.isatty() else 160))
        for r in rows:  # the time to serve is in the table's notes
            if r.loss_allowed:
                print(
                    f"{r.scenario}: loss window: {r.lost} of {r.acknowledged} acknowledged "
                    f"writes lost over {r.faults} kills ({r.lost / max(r.faults, 1):.1f} a kill)"
                )
    return 0 if all(r.clean for r in rows) else 1
