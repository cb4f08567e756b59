"""`txbroker topic|send|consume|dlq`: the broker from a shell, through the Python client.

Every command takes ``--server txb://host:port`` (or ``TXB_SERVER``) and ``--auth-token`` (or
``TXB_AUTH_TOKEN``). Output is human-readable, or one JSON object per line with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from txbroker.errors import InvalidArgument

__all__ = ["register"]

BINARY_MARKER = "base64"  # the "encoding" field of a body that is not UTF-8 text


def _server(args: argparse.Namespace) -> str:
    return str(args.server or os.environ.get("TXB_SERVER") or "txb://127.0.0.1:9876")


def _token(args: argparse.Namespace) -> str | None:
    return args.auth_token or os.environ.get("TXB_AUTH_TOKEN")


def _print(obj: dict[str, Any], as_json: bool, text: str) -> None:
    print(json.dumps(obj) if as_json else text, flush=True)


def _body_fields(body: bytes) -> dict[str, Any]:
    try:
        return {"body": body.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"body": base64.b64encode(body).decode(), "encoding": BINARY_MARKER}


async def _with_client(
    args: argparse.Namespace, fn: Callable[[Any], Coroutine[Any, Any, int]]
) -> int:
    from txbroker_sdk import Client

    async with await Client.connect(_server(args), auth_token=_token(args)) as client:
        return await fn(client)


# --- topic ---


async def _topic(args: argparse.Namespace) -> int:
    async def run(c: Any) -> int:
        if args.action == "create":
            infos = [await c.create_topic(args.name, queues=args.queues)]
        elif args.action == "delete":
            await c.delete_topic(args.name)
            _print({"deleted": args.name}, args.json, f"deleted {args.name}")
            return 0
        elif args.action == "describe":
            infos = [await c.describe_topic(args.name)]
        else:
            infos = await c.list_topics()
        for t in infos:
            _print(
                {"topic": t.topic, "queues": t.queues, "messages": t.messages},
                args.json,
                f"{t.topic:<40} queues={t.queues:<4} messages={t.messages}",
            )
        return 0

    return await _with_client(args, run)


# --- send ---


async def _send(args: argparse.Namespace) -> int:
    if args.body is not None:
        bodies = [args.body.encode()]
    else:
        bodies = [line.rstrip("\n").encode() for line in sys.stdin]
    deliver_at = None
    if args.delay is not None:
        if args.delay < 0:
            raise InvalidArgument("--delay must be >= 0 seconds")
        deliver_at = time.time_ns() // 1_000_000 + int(args.delay * 1000)

    async def run(c: Any) -> int:
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
            _print(
                {
                    "message_id": r.message_id,
                    "topic": r.topic,
                    "queue": r.queue_id,
                    "offset": r.queue_offset,
                    "duplicate": r.duplicate,
                },
                args.json,
                f"sent {r.message_id} to {r.topic}/{r.queue_id} offset {r.queue_offset}"
                + (" (duplicate: original receipt)" if r.duplicate else ""),
            )
        return 0

    return await _with_client(args, run)


# --- consume ---


async def _consume(args: argparse.Namespace) -> int:
    from txbroker_sdk import Consumer

    async def run(c: Any) -> int:
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
                        **_body_fields(msg.body),
                    }
                    _print(
                        record,
                        args.json,
                        f"{msg.topic}/{msg.queue_id}@{msg.queue_offset} {record['body']}",
                    )
                    m.ack()  # after printing: a crash before this redelivers it
                    n += 1
            await consumer.commit()
        return 0

    return await _with_client(args, run)


# --- dlq ---


async def _dlq(args: argparse.Namespace) -> int:
    from txbroker.protocol.frames import Opcode
    from txbroker.protocol.messages import DlqRequest

    async def run(c: Any) -> int:
        if args.action == "list":
            res = await c.request(Opcode.DLQ_LIST, DlqRequest(args.group, args.max))
            for m in res.messages:
                record = {
                    "message_id": m.message_id,
                    "original_topic": m.original_topic,
                    "dlq_offset": m.dlq_offset,
                    "reconsume_count": m.reconsume_count,
                    "redriven": m.dlq_offset < res.redrive_offset,
                    **_body_fields(m.body),
                }
                _print(
                    record,
                    args.json,
                    f"#{m.dlq_offset} {m.original_topic} rc={m.reconsume_count} {record['body']}",
                )
        else:
            res = await c.request(Opcode.DLQ_REDRIVE, DlqRequest(args.group, args.max))
            _print({"redriven": res.redriven}, args.json, f"re-drove {res.redriven} message(s)")
        return 0

    return await _with_client(args, run)


# --- tx ---


def _tx_record(t: Any) -> dict[str, Any]:
    return {
        "tx_id": t.tx_id,
        "state": t.state,
        "topic": t.topic,
        "queue": t.queue_id,
        "producer_group": t.producer_group,
        "check_url": t.check_url,
        "message_id": t.message_id,
        "key": t.key,
        "created_ms": t.created_ms,
        "checks": t.checks,
        "next_check_ms": t.next_check_ms,
        "reason": t.last_reason,
        "resolved_by": t.resolved_by,
    }


async def _tx(args: argparse.Namespace) -> int:
    async def run(c: Any) -> int:
        if args.action == "prepare":
            tx = await c.prepare(
                args.topic,
                (args.body or "").encode(),
                producer_group=args.group,
                check_url=args.check_url,
                key=args.key,
                timeout_ms=args.timeout_ms,
            )
            _print({"tx_id": tx.tx_id, "message_id": tx.message_id}, args.json, tx.tx_id)
        elif args.action == "list":
            state = {"pending": "prepared"}.get(args.state, args.state)
            res = await c.list_transactions(state, args.topic, args.limit)
            for t in res.transactions:
                _print(
                    _tx_record(t),
                    args.json,
                    f"{t.tx_id} {t.state:<9} {t.topic:<24} checks={t.checks} {t.last_reason}",
                )
            if not args.json:
                print(f"{len(res.transactions)} of {res.total} shown", file=sys.stderr)
        elif args.action == "show":
            t = await c.show_transaction(args.tx_id)
            record = _tx_record(t)
            _print(record, args.json, "\n".join(f"{k:>15}: {v}" for k, v in record.items()))
        else:
            r = await c.resolve_transaction(args.tx_id, args.action)
            _print(
                {"tx_id": r.tx_id, "state": r.state, "duplicate": r.duplicate},
                args.json,
                f"{r.tx_id} is {r.state}" + (" (already)" if r.duplicate else ""),
            )
        return 0

    return await _with_client(args, run)


def _runner(
    coro_fn: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        return asyncio.run(coro_fn(args))

    return run


def register(sub: Any) -> None:
    """Add the client commands to the top-level subparsers."""

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--server", help="txb://host:port (TXB_SERVER; default txb://127.0.0.1:9876)"
        )
        p.add_argument("--auth-token", help="token for a broker started with one (TXB_AUTH_TOKEN)")
        p.add_argument("--json", action="store_true", help="one JSON object per line")

    t = sub.add_parser("topic", help="create, list, describe or delete topics")
    tsub = t.add_subparsers(dest="action", required=True)
    for action in ("create", "describe", "delete"):
        p = tsub.add_parser(action)
        p.add_argument("name")
        if action == "create":
            p.add_argument("--queues", type=int, default=4)
        common(p)
    common(tsub.add_parser("list"))
    t.set_defaults(func=_runner(_topic))

    s = sub.add_parser("send", help="send messages (--body, or one per stdin line)")
    s.add_argument("topic")
    s.add_argument("--key")
    s.add_argument("--tag")
    s.add_argument("--idempotency-key")
    s.add_argument("--delay", type=float, help="deliver after this many seconds")
    s.add_argument("--body", help="message text (default: read lines from stdin)")
    common(s)
    s.set_defaults(func=_runner(_send))

    c = sub.add_parser("consume", help="consume as a member of a group, printing each message")
    c.add_argument("topic")
    c.add_argument("--group", required=True)
    c.add_argument("--max", type=int, help="stop after this many messages")
    c.add_argument("--timeout", type=float, default=5.0, help="stop after this long with none")
    c.add_argument("--start", choices=["earliest", "latest"], default="earliest")
    common(c)
    c.set_defaults(func=_runner(_consume))

    x = sub.add_parser("tx", help="transactions: list, show, resolve by hand, prepare")
    xsub = x.add_subparsers(dest="action", required=True)
    p = xsub.add_parser("list", help="open transactions (pending and parked)")
    p.add_argument("--state", choices=["pending", "parked"])
    p.add_argument("--topic")
    p.add_argument("--limit", type=int, default=100)
    common(p)
    for action in ("show", "commit", "rollback", "resume"):
        p = xsub.add_parser(action)
        p.add_argument("tx_id")
        common(p)
    p = xsub.add_parser("prepare", help="prepare a half message (for operators and tests)")
    p.add_argument("topic")
    p.add_argument("--check-url", required=True)
    p.add_argument("--group", default="cli", help="producer group (its secret signs checks)")
    p.add_argument("--key")
    p.add_argument("--body")
    p.add_argument("--timeout-ms", type=int, help="first back-check after this long")
    common(p)
    x.set_defaults(func=_runner(_tx))

    d = sub.add_parser("dlq", help="inspect and re-drive a group's dead letters")
    dsub = d.add_subparsers(dest="action", required=True)
    for action in ("list", "redrive"):
        p = dsub.add_parser(action)
        p.add_argument("--group", required=True)
        p.add_argument("--max", type=int, default=100)
        common(p)
    d.set_defaults(func=_runner(_dlq))
