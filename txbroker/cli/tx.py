"""`txbroker tx list|show|commit|rollback|resume|prepare`: open transactions, for operators.

A transaction is *pending* (prepared, waiting for its END_TX or a back-check's answer) or
*parked* (the back-checks gave up: an operator commits, rolls back or resumes checking). A
pending one whose checks have reached no one for the broker's stall time is *stalled*: still
checked, never decided by the broker. The broker's wire and HTTP name the pending state
``prepared``; JSON output keeps that name (with ``stalled`` beside it), tables say pending or
stalled.
"""

from __future__ import annotations

import argparse
from typing import Any

from txbroker.cli.common import Subparsers, add_broker_options, positive, with_client
from txbroker.cli.output import (
    Column,
    human_time,
    note,
    print_fields,
    print_json,
    print_table,
)
from txbroker.runtime.timetext import ago

__all__ = ["register", "state_label", "tx_record"]

# The CLI's names for the broker's states; --state takes either.
_LABELS = {"prepared": "pending"}
# What `unconfirmed` means to an operator (docs/transactions.md, "A write the slaves did not
# confirm").
UNCONFIRMED = (
    "its last write stands in this master's log, but the slaves did not confirm it in time; "
    "a repeated request is answered once they hold it"
)
_STATES = {"pending": "prepared", "prepared": "prepared", "parked": "parked", "stalled": "stalled"}


def register(sub: Subparsers) -> None:
    x = sub.add_parser("tx", help="transactions: list, show, resolve by hand, prepare")
    xsub = x.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = xsub.add_parser("list", help="open transactions (pending and parked)")
    p.add_argument(
        "--state",
        choices=sorted(_STATES),
        help="only pending (prepared: the same), only parked, or only stalled (pending ones "
        "whose checks reach no one) transactions",
    )
    p.add_argument("--topic", help="only transactions of this topic")
    p.add_argument("--limit", type=positive, default=100, help="show at most this many")
    add_broker_options(p, json_help="one JSON object per transaction, one per line")
    p.set_defaults(func=with_client(_list))

    p = xsub.add_parser("show", help="one transaction in full")
    p.add_argument("tx_id", help="transaction id")
    add_broker_options(p, json_help="print the transaction as one JSON object")
    p.set_defaults(func=with_client(_show))

    for action, text in (
        ("commit", "commit a pending or parked transaction (its message is delivered)"),
        ("rollback", "roll back a pending or parked transaction (its message is dropped)"),
        ("resume", "resume back-checks of a parked transaction"),
    ):
        p = xsub.add_parser(action, help=text)
        p.add_argument("tx_id", help="transaction id")
        add_broker_options(p, json_help="print the outcome as one JSON object")
        p.set_defaults(func=with_client(_resolve))

    p = xsub.add_parser("prepare", help="prepare a half message (for operators and tests)")
    p.add_argument("topic", help="topic the message goes to once committed")
    p.add_argument("--check-url", required=True, help="the service's check-back endpoint")
    p.add_argument(
        "--group",
        default="cli",
        help="producer group: the broker signs its back-checks with this group's --tx-secret "
        "(default: cli)",
    )
    p.add_argument("--key", help="business key of the message")
    p.add_argument("--body", help="message text (default: empty)")
    p.add_argument("--timeout-ms", type=positive, help="first back-check after this long")
    add_broker_options(p, json_help="print the transaction id and message id as JSON")
    p.set_defaults(func=with_client(_prepare))


def state_label(state: str, stalled: bool = False, unconfirmed: bool = False) -> str:
    label = "stalled" if stalled else _LABELS.get(state, state)
    return f"{label}, unconfirmed" if unconfirmed else label


def tx_record(t: Any) -> dict[str, Any]:
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
        "stalled": t.stalled,
        "unreachable_since_ms": t.unreachable_since_ms,
        "unconfirmed": t.unconfirmed,
    }


def _next_check(t: Any) -> str:
    if t.state != "prepared" or t.next_check_ms <= 0:
        return "-"  # parked or ended: no check is due
    return ago(t.next_check_ms)


async def _list(c: Any, args: argparse.Namespace) -> int:
    state = _STATES[args.state] if args.state else None
    res = await c.list_transactions(state, args.topic, args.limit)
    if args.json:
        for t in res.transactions:
            print_json(tx_record(t))
        return 0
    what = f"{state_label(state)} transactions" if state else "open transactions"
    print_table(
        [
            "TX ID",
            "STATE",
            "TOPIC",
            "PRODUCER GROUP",
            "CREATED",
            Column("CHECKS", numeric=True),
            "NEXT CHECK",
            Column("LAST REASON", max_width=48),
        ],
        (
            [
                t.tx_id,
                state_label(t.state, t.stalled, t.unconfirmed),
                t.topic,
                t.producer_group,
                human_time(t.created_ms),
                t.checks,
                _next_check(t),
                t.last_reason or "-",
            ]
            for t in res.transactions
        ),
        empty=f"no {what}",
    )
    if res.transactions:
        note(f"{len(res.transactions)} of {res.total} {what} shown")
    return 0


async def _show(c: Any, args: argparse.Namespace) -> int:
    t = await c.show_transaction(args.tx_id)
    if args.json:
        print_json(tx_record(t))
        return 0
    fields = {
        "tx id": t.tx_id,
        "state": state_label(t.state, t.stalled, t.unconfirmed),
        "topic": f"{t.topic} (queue {t.queue_id})",
        "producer group": t.producer_group,
        "check url": t.check_url,
        "message id": t.message_id,
        "key": t.key,
        "created": human_time(t.created_ms),
        "checks": t.checks,
        "next check": human_time(t.next_check_ms) if _next_check(t) != "-" else "-",
        "last reason": t.last_reason or "-",
        "checks unreachable since": (
            human_time(t.unreachable_since_ms) if t.unreachable_since_ms else "-"
        ),
        "resolved by": t.resolved_by or "-",
    }
    if t.unconfirmed:
        fields["unconfirmed"] = UNCONFIRMED
    print_fields(fields)
    return 0


async def _resolve(c: Any, args: argparse.Namespace) -> int:
    r = await c.resolve_transaction(args.tx_id, args.action)
    if args.json:
        print_json({"tx_id": r.tx_id, "state": r.state, "duplicate": r.duplicate})
    else:
        print(f"{r.tx_id} is {state_label(r.state)}" + (" (already)" if r.duplicate else ""))
    return 0


async def _prepare(c: Any, args: argparse.Namespace) -> int:
    tx = await c.prepare(
        args.topic,
        (args.body or "").encode(),
        producer_group=args.group,
        check_url=args.check_url,
        key=args.key,
        timeout_ms=args.timeout_ms,
    )
    if args.json:
        print_json({"tx_id": tx.tx_id, "message_id": tx.message_id})
    else:
        print(tx.tx_id)
    return 0
