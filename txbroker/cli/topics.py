"""`txbroker topic create|list|describe|delete`."""

from __future__ import annotations

import argparse
from typing import Any

from txbroker.cli.common import Subparsers, add_broker_options, positive, with_client
from txbroker.cli.output import (
    Column,
    human_time,
    print_fields,
    print_json,
    print_table,
    rate_text,
)

__all__ = ["register", "topic_record"]

DELETE_DESCRIPTION = (
    "Delete a topic, for every reader at once and durably (a crash right after the answer does "
    "not bring it back): its messages, consumer groups' offsets, retries, dead letters and "
    "delayed messages are gone, and its open transactions are rolled back (a later commit is "
    "refused). A topic created again under the name starts empty; its queue offsets go on "
    "from where the deleted ones ended. The disk space of its queue files is freed at once, "
    "that of its messages when retention deletes the commit-log segments holding them "
    "(see docs/operations.md, Deleting a topic)."
)


def register(sub: Subparsers) -> None:
    t = sub.add_parser("topic", help="create, list, describe or delete topics")
    tsub = t.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = tsub.add_parser("create", help="create a topic (creating an identical one is a no-op)")
    p.add_argument("name", help="topic name")
    p.add_argument("--queues", type=positive, default=4, help="queues (ordering, parallelism)")
    add_broker_options(p, json_help="print the topic as one JSON object")
    p.set_defaults(func=with_client(_create))

    p = tsub.add_parser("list", help="topics with their queues and message counts")
    add_broker_options(p, json_help="one JSON object per topic, one per line")
    p.set_defaults(func=with_client(_list))

    p = tsub.add_parser(
        "describe", help="a topic's queues with their offsets, and the groups reading it"
    )
    p.add_argument("name", help="topic name")
    add_broker_options(p, json_help="print the description as one JSON object")
    p.set_defaults(func=with_client(_describe))

    p = tsub.add_parser(
        "delete",
        help="delete a topic and everything it holds, for good",
        description=DELETE_DESCRIPTION,
    )
    p.add_argument("name", help="topic name")
    add_broker_options(p, json_help='print {"deleted": NAME}')
    p.set_defaults(func=with_client(_delete))


def topic_record(t: Any) -> dict[str, Any]:
    return {
        "topic": t.topic,
        "queues": t.queues,
        "messages": t.messages,
        "created_ms": t.created_ms,
        "rate_per_s": t.rate_per_s,
    }


async def _create(c: Any, args: argparse.Namespace) -> int:
    t = await c.create_topic(args.name, queues=args.queues)
    if args.json:
        print_json(topic_record(t))
    else:
        print(f"topic {t.topic}: {t.queues} queues, {t.messages} messages")
    return 0


async def _list(c: Any, args: argparse.Namespace) -> int:
    topics = await c.list_topics()
    if args.json:
        for t in topics:
            print_json(topic_record(t))
        return 0
    print_table(
        ["TOPIC", Column("QUEUES", numeric=True), Column("MESSAGES", numeric=True), "CREATED"],
        ([t.topic, t.queues, t.messages, human_time(t.created_ms)] for t in topics),
        empty="no topics",
    )
    return 0


async def _describe(c: Any, args: argparse.Namespace) -> int:
    from txbroker.cli.groups import fetch_groups, group_record, print_groups

    t = await c.describe_topic(args.name)
    groups = await fetch_groups(c, topic=args.name)
    if args.json:
        print_json(
            {
                **topic_record(t),
                "offsets": [
                    {"queue": o.queue, "min_offset": o.min_offset, "max_offset": o.max_offset}
                    for o in t.offsets
                ],
                "groups": [group_record(g) for g in groups],
            }
        )
        return 0
    print_fields(
        {
            "topic": t.topic,
            "queues": t.queues,
            "messages": t.messages,
            "created": human_time(t.created_ms),
            "rate in": rate_text(t.rate_per_s),
            "groups": len(groups),
        }
    )
    print()
    print_table(
        [
            Column("QUEUE", numeric=True),
            Column("MIN OFFSET", numeric=True),
            Column("MAX OFFSET", numeric=True),
            Column("MESSAGES", numeric=True),
        ],
        ([o.queue, o.min_offset, o.max_offset, o.max_offset - o.min_offset] for o in t.offsets),
        title="queues",
    )
    if groups:
        print()
        print_groups(groups, title="consumer groups", with_topic=False)
    return 0


async def _delete(c: Any, args: argparse.Namespace) -> int:
    await c.delete_topic(args.name)
    if args.json:
        print_json({"deleted": args.name})
    else:
        print(f"deleted {args.name}")
    return 0
