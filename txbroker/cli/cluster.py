"""`txbroker cluster status`: broker groups, roles, offsets, replication lag and lease holders,
as etcd has them; `txbroker cluster forget`: drop a decommissioned broker from its group's
members (docs/cluster.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from txbroker.cli.common import Subparsers, add_coordinator_option, coordinator_url, run
from txbroker.cli.output import Column, print_json, print_table

if TYPE_CHECKING:
    from txbroker.cluster.status import ClusterStatus

__all__ = ["register"]


def register(sub: Subparsers) -> None:
    c = sub.add_parser("cluster", help="broker groups as etcd has them")
    csub = c.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = csub.add_parser(
        "status",
        help="groups, masters, each broker's role, flushed offset, lag and lease; topic routes",
        description="Read the cluster's state from etcd: each group's master (and, where its "
        "brokers elect one, the election key's holder and lease), every registered broker with "
        "its role, flushed offset, bytes behind its master and registration lease, and every "
        "topic's route. Offsets are the brokers' last registrations (about every second).",
    )
    add_coordinator_option(p)
    p.add_argument("--json", action="store_true", help="print the status as one JSON object")
    p.set_defaults(func=_status)
    f = csub.add_parser(
        "forget",
        help="remove a decommissioned broker from its group's members",
        description="A group's members are kept in etcd with no lease: an election with sync "
        "replication waits for fresh reports from all but min-insync of them. Remove a broker "
        "that will not come back, so its group can elect without it (refused while it runs).",
    )
    f.add_argument("group", help="the broker group it was a member of")
    f.add_argument("broker_id", metavar="BROKER_ID", help="its --broker-id")
    add_coordinator_option(f)
    f.set_defaults(func=_forget)


def _forget(args: argparse.Namespace) -> int:
    run(_forget_member(coordinator_url(args), args.group, args.broker_id))
    print(f"broker {args.broker_id} is no longer a member of group {args.group}")
    return 0


async def _forget_member(url: str, group: str, broker_id: str) -> None:
    from txbroker.cluster import connect_coordinator
    from txbroker.cluster.routes import forget_member

    async with await connect_coordinator(url) as coordinator:
        await forget_member(coordinator, group, broker_id)


def _status(args: argparse.Namespace) -> int:
    coordinator = coordinator_url(args)
    from txbroker.cluster.status import queue_span

    status = run(_read(coordinator))
    if args.json:
        print_json(status.to_json())
        return 0
    print_table(
        ["GROUP", "MASTER", "ELECTED", "ELECTION LEASE", Column("BROKERS", numeric=True),
         Column("MAX LAG (B)", numeric=True)],
        [(g.group, g.master or "-", g.elected or "-", g.election_lease or "-", g.brokers,
          "-" if g.max_lag_bytes is None else g.max_lag_bytes) for g in status.groups],
        title=f"groups (etcd revision {status.revision})",
        empty="no broker groups registered",
    )  # fmt: skip
    print_table(
        ["GROUP", "BROKER", "ROLE", "ADDRESS", Column("FLUSHED", numeric=True),
         Column("LAG (B)", numeric=True), Column("EPOCH", numeric=True), "LEASE"],
        [(b.group, b.broker, b.role, b.address, b.flushed_offset,
          "-" if b.lag_bytes is None else b.lag_bytes, b.epoch, b.lease) for b in status.brokers],
        title="brokers",
        empty="no brokers registered",
    )  # fmt: skip
    print_table(
        ["TOPIC", Column("QUEUES", numeric=True), "GROUPS"],
        [(t.topic, t.queues, ", ".join(f"{s.group}: {queue_span(s.queues)}" for s in t.shares))
         for t in status.topics],
        title="topic routes",
        empty="no topics routed over groups",
    )  # fmt: skip
    return 0


async def _read(url: str) -> ClusterStatus:
    from txbroker.cluster import connect_coordinator
    from txbroker.cluster.status import read_status

    async with await connect_coordinator(url) as coordinator:
        return await read_status(coordinator)
