"""`txbroker send` and `txbroker consume`: messages from a shell.

Both stream: a line per message as it is sent or received (one JSON object per line with
``--json``). A body that is not UTF-8 text is printed base64-encoded, marked by its
``"encoding"`` field.
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from typing import Any

from txbroker.cli.common import Subparsers, add_broker_options, positive, with_client
from txbroker.cli.output import print_json
from txbroker.errors import InvalidArgument

__all__ = ["BINARY_MARKER", "body_fields", "register"]

BINARY_MARKER = "base64"  # the "encoding" field of a body that is not UTF-8 text


def register(sub: Subparsers) -> None:
    s = sub.add_parser("send", help="send messages (--body, or one per stdin line)")
    s.add_argument("topic", help="topic to send to")
    s.add_argument("--key", help="business key: picks the queue (same key, same queue), indexed")
    s.add_argument("--tag", help="a tag consumers may filter on")
    s.add_argument(
        "--idempotency-key",
        help="the broker keeps one message per key (in its dedup window); with several stdin "
        "lines each gets KEY-<line number>",
    )
    s.add_argument("--delay", type=float, help="deliver after this many seconds")
    s.add_argument("--body", help="message text (default: read lines from stdin)")
    add_broker_options(s, json_help="one JSON receipt per message, one per line")
    s.set_defaults(func=_send)

    c = sub.add_parser("consume", help="consume as a member of a group, printing each message")
    c.add_argument("topic", help="topic to consume")
    c.add_argument("--group", required=True, help="consumer group (offsets are kept per group)")
    c.add_argument("--max", type=positive, help="stop after this many messages")
    c.add_argument(
        "--timeout", type=float, default=5.0, help="stop after this many seconds with none"
    )
    c.add_argument(
        "--start",
        choices=["earliest", "latest"],
        default="earliest",
        help="where a new group starts (default earliest)",
    )
    add_broker_options(c, json_help="one JSON object per message, one per line")
    c.set_defaults(func=with_client(_consume))


def body_fields(body: bytes) -> dict[str, Any]:
    try:
        return {"body": body.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode(), "encoding": BINARY_MARKER}


def _send(args: argparse.Namespace) -> int:
    # Arguments are checked and stdin read before connecting.
    if args.delay is not None and args.delay < 0:
        raise InvalidArgument("--delay must be >= 0 seconds")
    if args.body is not None:
        bodies = [args.body.encode()]
    else:
        bodies = [line.rstrip("\n").encode() for line in sys.stdin]
    return with_client(lambda c, a: _send_all(c, a, bodies))(args)


async def _send_all(c: Any, args: argparse.Namespace, bodies: list[bytes]) -> int:
    deliver_at = None
    if args.delay is not None:
        deliver_at = time.time_ns() // 1_000_000 + int(args.delay * 1000)
    for i, body in enumerate(bodies):
        ik = args.idempotency_key
        if ik is not None and len(bodies) > 1:
            ik = f"{ik}-{i}"  # one key per line, derived, so lines do not dedup each other
        r = await c.send(
            args.topic,
            body,
            key=args.key,
            tags=args.tag,
            idempotency_key=ik,
            deliver_at_ms=deliver_at,
        )
        if args.json:
            print_json(
                {
                    "message_id": r.message_id,
                    "topic": r.topic,
                    "queue": r.queue_id,
                    "offset": r.queue_offset,
                    "duplicate": r.duplicate,
                }
            )
        else:
            dup = " (duplicate: original receipt)" if r.duplicate else ""
            print(
                f"sent {r.message_id} to {r.topic}/{r.queue_id} offset {r.queue_offset}{dup}",
                flush=True,
            )
    return 0


async def _consume(c: Any, args: argparse.Namespace) -> int:
    from txbroker_sdk import Consumer

    n = 0
    async with Consumer(c, args.group, args.topic, start=args.start) as consumer:
        while args.max is None or n < args.max:
            batch = await consumer.fetch(timeout_ms=int(args.timeout * 1000))
            if not batch:
                break  # nothing arrived for --timeout seconds
            for m in batch:
                if args.max is not None and n >= args.max:
                    break
                msg = m.msg
                record = {
                    "message_id": msg.message_id,
                    "topic": msg.topic,
                    "queue": msg.queue_id,
                    "offset": msg.queue_offset,
                    "key": msg.key,
                    "tags": msg.tags,
                    "headers": msg.headers,
                    "reconsume_count": msg.reconsume_count,
                    **body_fields(msg.body),
                }
                if args.json:
                    print_json(record)
                else:
                    print(
                        f"{msg.topic}/{msg.queue_id}@{msg.queue_offset} {record['body']}",
                        flush=True,
                    )
                m.ack()  # after printing: a crash before this redelivers it
                n += 1
        await consumer.commit()
    return 0
