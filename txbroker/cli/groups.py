"""`txbroker group list|describe`: consumer groups, their members and their lag per queue.

The broker computes the lag (the OFFSETS request; the same figures as ``GET /v1/groups`` and
``txbroker_consumer_lag`` in /metrics): messages past the group's committed offset in each queue.
"""

from __future__ import annotations

import argparse
from typing import Any

from txbroker.cli.common import Subparsers, add_broker_options, with_client
from txbroker.cli.output import Column, print_fields, print_json, print_table, rate_text
from txbroker.errors import NotFound

__all__ = ["fetch_groups", "group_record", "print_groups", "register"]


def register(sub: Subparsers) -> None:
    g = sub.add_parser("group", help="consumer groups and their lag per queue")
    gsub = g.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = gsub.add_parser("list", help="every consumer group, per topic, with its total lag")
    p.add_argument("--topic", help="only the groups reading this topic")
    add_broker_options(p, json_help="one JSON object per group and topic, one per line")
    p.set_defaults(func=with_client(_list))

    p = gsub.add_parser(
        "describe", help="a group's members and, per topic and queue, its offset and lag"
    )
    p.add_argument("group", help="consumer group name")
    add_broker_options(p, json_help="print the group as one JSON object")
    p.set_defaults(func=with_client(_describe))


async def fetch_groups(c: Any, *, group: str | None = None, topic: str | None = None) -> list[Any]:
    from txbroker.protocol.frames import Opcode
    from txbroker.protocol.messages import GroupsRequest

    res = await c.request(Opcode.OFFSETS, GroupsRequest(group, topic))
    return list(res.groups)


def group_record(g: Any) -> dict[str, Any]:
    return {
        "group": g.group,
        "topic": g.topic,
        "members": list(g.members),
        "lag": g.lag,
        "rate_per_s": g.rate_per_s,
        "queues": [
            {"queue": q.queue, "max_offset": q.max_offset, "committed": q.committed, "lag": q.lag}
            for q in g.queues
        ],
    }


def print_groups(groups: list[Any], *, title: str | None = None, with_topic: bool = True) -> None:
    cols: list[Column | str] = ["GROUP"]
    if with_topic:
        cols.append("TOPIC")
    cols += [
        Column("MEMBERS", numeric=True),
        Column("LAG", numeric=True),
        Column("MSGS/S", numeric=True),
        "LAG PER QUEUE",
    ]
    rows = []
    for g in groups:
        per_queue = " ".join(f"{q.queue}:{q.lag}" for q in g.queues)
        rate = "-" if g.rate_per_s is None else f"{g.rate_per_s:,.1f}"
        row: list[object] = [g.group, *([g.topic] if with_topic else [])]
        rows.append([*row, len(g.members), g.lag, rate, per_queue])
    print_table(cols, rows, title=title, empty="no consumer groups")


async def _list(c: Any, args: argparse.Namespace) -> int:
    groups = await fetch_groups(c, topic=args.topic)
    if args.json:
        for g in groups:
            print_json(group_record(g))
    else:
        print_groups(groups)
    return 0


async def _describe(c: Any, args: argparse.Namespace) -> int:
    groups = await fetch_groups(c, group=args.group)
    if not groups:
        raise NotFound(
            f"no consumer group {args.group!r}: a group shows once a member has joined or it "
            "has committed an offset"
        )
    if args.json:
        print_json(
            {
                "group": args.group,
                "lag": sum(g.lag for g in groups),
                "topics": [group_record(g) for g in groups],
            }
        )
        return 0
    print_fields(
        {
            "group": args.group,
            "topics": ", ".join(sorted({g.topic for g in groups})),
            "lag": sum(g.lag for g in groups),
            "consumed": ", ".join(f"{g.topic}: {rate_text(g.rate_per_s)}" for g in groups),
        }
    )
    for g in groups:
        print()
        members = ", ".join(g.members) if g.members else "none live"
        print_table(
            [
                Column("QUEUE", numeric=True),
                Column("MAX OFFSET", numeric=True),
                Column("COMMITTED", numeric=True),
                Column("LAG", numeric=True),
            ],
            ([q.queue, q.max_offset, q.committed, q.lag] for q in g.queues),
            title=f"{g.group} on {g.topic} (lag {g.lag:,}; members: {members})",
        )
    return 0
