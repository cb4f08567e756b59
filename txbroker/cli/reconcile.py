"""`txbroker reconcile` and `txbroker log export`: the Spark reconciliation of services'
tables against the commit log, and the log as Parquet for a job that cannot see the broker's
disk. Both live in ``txbroker_reconcile`` (the `reconcile` extra); this module only wires them
into the command line, importing them when the command runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from txbroker.cli.common import Subparsers
from txbroker.cli.output import RunProgress, print_fields, print_json
from txbroker.errors import InvalidArgument

__all__ = ["register"]

_EXTRA = "the reconciliation needs the reconcile extra: pip install 'txbroker[reconcile]'"


def register(sub: Subparsers) -> None:
    from txbroker_reconcile.options import DESCRIPTION, add_arguments

    rc = sub.add_parser(
        "reconcile",
        help="prove the guarantee with Spark: lost, phantom, duplicate, stuck; latency",
        description=DESCRIPTION,
    )
    add_arguments(rc)
    rc.set_defaults(func=_reconcile)

    lg = sub.add_parser("log", help="the broker's commit log, read offline")
    lsub = lg.add_subparsers(dest="log_command", required=True, metavar="ACTION")
    ex = lsub.add_parser(
        "export",
        help="write the log as Parquet (one file per segment) for `txbroker reconcile --log`",
    )
    ex.add_argument(
        "--log", required=True, metavar="DIR", help="the broker's data directory (--data-dir)"
    )
    ex.add_argument("--out", required=True, metavar="DIR", help="where the Parquet files go")
    ex.add_argument("--json", action="store_true", help="print what was written as JSON")
    ex.set_defaults(func=_export)


def _reconcile(args: argparse.Namespace) -> int:
    try:
        from txbroker_reconcile.options import options_from
        from txbroker_reconcile.run import run_job
    except ImportError as e:  # pyspark or pyarrow missing
        raise InvalidArgument(f"{_EXTRA} ({e})") from None
    return run_job(options_from(args))


def _export(args: argparse.Namespace) -> int:
    try:
        from txbroker_reconcile.export import export_log
    except ImportError as e:
        raise InvalidArgument(f"{_EXTRA} ({e})") from None
    with RunProgress("exporting segments", enabled=not args.json) as progress:
        result = export_log(
            args.log, Path(args.out), on_segment=lambda _name, n, total: progress(n, total)
        )
    fields = {
        "written": result.files,
        "unchanged": result.skipped,
        "records": result.records,
        "corrupt": result.corrupt,
        "out": args.out,
    }
    if args.json:
        print_json(fields)
    else:
        print_fields(fields, title="log export")
    return 0
