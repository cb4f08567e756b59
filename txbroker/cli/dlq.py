"""`txbroker dlq list|redrive`: a consumer group's dead letters (messages that failed every
retry), and sending them back to the group's topics."""

from __future__ import annotations

import argparse
from typing import Any

from txbroker.cli.common import Subparsers, add_broker_options, positive, with_client
from txbroker.cli.messages import body_fields
from txbroker.cli.output import Column, human_time, print_json, print_table

__all__ = ["register"]


def register(sub: Subparsers) -> None:
    d = sub.add_parser("dlq", help="inspect and re-drive a group's dead letters")
    dsub = d.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = dsub.add_parser("list", help="the group's dead letters, oldest first")
    p.add_argument("--group", required=True, help="consumer group")
    p.add_argument("--max", type=positive, default=100, help="show at most this many")
    add_broker_options(p, json_help="one JSON object per dead letter, one per line")
    p.set_defaults(func=with_client(_list))

    p = dsub.add_parser(
        "redrive", help="send dead letters back to their topics, for the group to consume again"
    )
    p.add_argument("--group", required=True, help="consumer group")
    p.add_argument("--max", type=positive, default=100, help="re-drive at most this many")
    add_broker_options(p, json_help='print {"redriven": N}')
    p.set_defaults(func=with_client(_redrive))


async def _list(c: Any, args: argparse.Namespace) -> int:
    from txbroker.protocol.frames import Opcode
    from txbroker.protocol.messages import DlqRequest

    res = await c.request(Opcode.DLQ_LIST, DlqRequest(args.group, args.max))
    records = [
        {
            "message_id": m.message_id,
            "original_topic": m.original_topic,
            "dlq_offset": m.dlq_offset,
            "reconsume_count": m.reconsume_count,
            "store_ms": m.store_ms,
            "redriven": m.dlq_offset < res.redrive_offset,
            **body_fields(m.body),
        }
        for m in res.messages
    ]
    if args.json:
        for r in records:
            print_json(r)
        return 0
    print_table(
        [
            Column("OFFSET", numeric=True),
            "TOPIC",
            "MESSAGE ID",
            Column("RETRIES", numeric=True),
            "DEAD SINCE",
            "REDRIVEN",
            Column("BODY", max_width=60),
        ],
        (
            [
                r["dlq_offset"],
                r["original_topic"],
                r["message_id"],
                r["reconsume_count"],
                human_time(r["store_ms"]),
                r["redriven"],
                r["body"] if r["encoding"] == "utf-8" else f"(base64) {r['body']}",
            ]
            for r in records
        ),
        empty=f"no dead letters for group {args.group}",
    )
    return 0


async def _redrive(c: Any, args: argparse.Namespace) -> int:
    from txbroker.protocol.frames import Opcode
    from txbroker.protocol.messages import DlqRequest

    res = await c.request(Opcode.DLQ_REDRIVE, DlqRequest(args.group, args.max))
    if args.json:
        print_json({"redriven": res.redriven})
    else:
        print(f"re-drove {res.redriven} message(s)")
    return 0
