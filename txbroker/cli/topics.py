"""`txbroker topic create|list|describe|delete`."""

from __future__ import annotations

import argparse
import os
from typing import Any

from txbroker.cli.common import (
    Subparsers,
    add_broker_options,
    client_logging,
    client_options,
    positive,
    run,
    with_client,
)
from txbroker.cli.output import (
    Column,
    human_time,
    print_fields,
    print_json,
    print_table,
    rate_text,
)
from txbroker.errors import InvalidArgument, NotFound

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
    p.add_argument(
        "--groups",
        metavar="G1,G2",
        help="spread the queues over these broker groups (with --coordinator): the route goes "
        "to etcd and the topic is created on each group's master with its share of queues",
    )
    p.add_argument(
        "--coordinator",
        metavar="URL",
        help="with --groups: etcd://host:port[,...] (TXB_COORDINATOR)",
    )
    add_broker_options(p, json_help="print the topic as one JSON object")
    p.set_defaults(func=_create_command)

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
    p.add_argument(
        "--coordinator",
        metavar="URL",
        help="with NameServers (--server txbns://...): once the topic is deleted on each group "
        "holding it, remove its route from etcd://host:port[,...] too (TXB_COORDINATOR)",
    )
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


def _create_command(args: argparse.Namespace) -> int:
    if args.groups is None:
        return with_client(_create)(args)
    client_logging(args)
    coordinator = args.coordinator or os.environ.get("TXB_COORDINATOR")
    if not coordinator:
        raise InvalidArgument("--groups needs --coordinator etcd://host:port (or TXB_COORDINATOR)")
    groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    return run(_create_routed(coordinator, groups, args))


async def _create_routed(coordinator_url: str, groups: list[str], args: argparse.Namespace) -> int:
    """The route first checked against etcd, the topic created on each group's master (all
    must be registered), then the route written: a client never gets a route to a group that
    does not hold the topic."""
    from txbroker.cluster import connect_coordinator
    from txbroker.cluster.routes import (
        BROKERS_PREFIX,
        BrokerInfo,
        choose_masters,
        read_route,
        spread_queues,
        write_route,
    )
    from txbroker_sdk import Client

    route = spread_queues(args.name, args.queues, groups)
    async with await connect_coordinator(coordinator_url) as coordinator:
        existing = await read_route(coordinator, route.topic)
        if existing is not None and existing != route:
            await write_route(coordinator, route)  # raises TopicExists, naming the route there
        listing = await coordinator.list_prefix(BROKERS_PREFIX)
        masters = choose_masters(BrokerInfo.from_json(kv.value) for kv in listing.items)
        missing = [s.group for s in route.shares if s.group not in masters]
        if missing:
            raise NotFound(
                f"no master registered for group(s) {', '.join(missing)} at {coordinator_url}: "
                "start their brokers with --group and --coordinator first"
            )
        created = []
        for share in route.shares:
            address = masters[share.group].address
            async with await Client.connect(address, **_options_for(address, args)) as client:
                await client.create_topic(route.topic, len(share.queues), exist_ok=True)
            created.append({"group": share.group, "queues": list(share.queues), "master": address})
        await write_route(coordinator, route)
    if args.json:
        print_json({"topic": route.topic, "queues": route.queues, "groups": created})
    else:
        print(f"topic {route.topic}: {route.queues} queues over {len(created)} groups")
        for c in created:
            q = c["queues"]
            print(f"  {c['group']}: queues {q[0]}-{q[-1]} on {c['master']}")
    return 0


def _options_for(address: str, args: argparse.Namespace) -> dict[str, Any]:
    """The client options for a master's address (its TLS files for txbs://)."""
    return client_options(argparse.Namespace(**{**vars(args), "server": address}))


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
    """On one broker; through NameServers, on the master of each group the route names, and
    then (with a coordinator) the route itself: removed last, so a deletion that failed on a
    group can be run again through the NameServers."""
    from txbroker_sdk.cluster import ClusterClient

    routed = isinstance(c, ClusterClient)
    if args.coordinator and not routed:
        raise InvalidArgument("--coordinator goes with NameServers' --server txbns://...")
    coordinator = (args.coordinator or os.environ.get("TXB_COORDINATOR")) if routed else None
    await c.delete_topic(args.name)
    if coordinator:
        from txbroker.cluster import connect_coordinator
        from txbroker.cluster.routes import delete_route

        async with await connect_coordinator(coordinator) as etcd:
            await delete_route(etcd, args.name)
    if args.json:
        print_json(
            {"deleted": args.name, **({"route_removed": bool(coordinator)} if routed else {})}
        )
    elif routed and not coordinator:
        print(
            f"deleted {args.name} on its groups; its route stays in etcd (sends get NOT_FOUND): "
            "give --coordinator to remove it"
        )
    else:
        print(f"deleted {args.name}")
    return 0
