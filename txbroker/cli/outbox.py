"""`txbroker outbox relay`: publish a service database's outbox rows (the relay itself lives in
``txbroker_outbox``)."""

from __future__ import annotations

import argparse
import logging

from txbroker.cli.common import (
    Subparsers,
    add_database_option,
    client_options,
    database_url,
    positive,
    run,
    server_url,
)
from txbroker.errors import InvalidArgument

__all__ = ["register"]


def register(sub: Subparsers) -> None:
    ob = sub.add_parser("outbox", help="the transactional outbox of a service's database")
    osub = ob.add_subparsers(dest="outbox_command", required=True, metavar="ACTION")
    rl = osub.add_parser("relay", help="publish the outbox's rows until SIGINT/SIGTERM")
    add_database_option(rl)
    rl.add_argument("--server", help="broker address txb://host:port (TXB_SERVER)")
    rl.add_argument(
        "--namespace",
        required=True,
        help="names this database in idempotency keys (one per service database)",
    )
    rl.add_argument("--batch", type=positive, default=100, help="rows per round (max 1000)")
    rl.add_argument("--unordered", action="store_true", help="do not keep per-key order")
    rl.add_argument(
        "--poll-interval", type=float, default=1.0, help="seconds between polls (default 1)"
    )
    rl.add_argument("--auth-token", help="the broker's auth token (TXB_AUTH_TOKEN)")
    rl.set_defaults(func=_relay)


def _relay(args: argparse.Namespace) -> int:
    from txbroker_outbox.runner import relay_main

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    url = database_url(args)
    if not args.poll_interval > 0:
        raise InvalidArgument(f"--poll-interval must be positive, got {args.poll_interval}")
    run(
        relay_main(
            url,
            server_url(args),
            namespace=args.namespace,
            batch_size=args.batch,
            ordered=not args.unordered,
            poll_interval_s=args.poll_interval,
            **client_options(args),
        )
    )
    return 0
