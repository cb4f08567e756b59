"""`txbroker db upgrade|clean`: the SDK's tables in a service's database."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta

from txbroker.cli.common import (
    Subparsers,
    add_database_option,
    database_url,
    positive,
    run,
)
from txbroker.cli.output import print_json, status

__all__ = ["register"]


def register(sub: Subparsers) -> None:
    db = sub.add_parser("db", help="the SDK's tables in a service's database")
    dsub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")

    up = dsub.add_parser(
        "upgrade",
        help="create or upgrade the txbroker tables (txb_*), and say which it did",
    )
    add_database_option(up)
    up.add_argument(
        "--json", action="store_true", help='print {"before", "after", "created", "changed"}'
    )
    up.set_defaults(func=_upgrade)

    cl = dsub.add_parser("clean", help="delete old barrier, inbox and published outbox rows")
    add_database_option(cl)
    cl.add_argument(
        "--keep-days",
        type=positive,
        default=7,
        help="keep rows younger than this; must exceed the back-check and redelivery horizons "
        "(see txbroker_sdk/retention.py; default 7)",
    )
    cl.add_argument("--batch", type=positive, default=1000, help="rows per transaction")
    cl.set_defaults(func=_clean)


def _upgrade(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from txbroker_sdk.schema import upgrade

    url = database_url(args)
    try:
        with status("migrating the txbroker tables ...", enabled=not args.json):
            result = upgrade(url)
    except (SQLAlchemyError, OSError) as e:
        print(f"txbroker: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print_json(
            {
                "before": result.before,
                "after": result.after,
                "created": result.created,
                "changed": result.changed,
            }
        )
    else:
        print(result)
    return 0


def _clean(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from txbroker_sdk.retention import clean_up_url

    url = database_url(args)
    keep = timedelta(days=args.keep_days)
    try:
        report = run(clean_up_url(url, keep=keep, batch_size=args.batch))
    except (SQLAlchemyError, OSError) as e:
        print(f"txbroker: error: {e}", file=sys.stderr)
        return 2
    print(
        f"deleted txb_local_tx={report.local_tx} txb_inbox={report.inbox} "
        f"txb_outbox={report.outbox} (older than {args.keep_days} days)"
    )
    return 0
