"""`txbroker serve`'s replication flags (docs/cluster.md, "Replication"), in one place."""

from __future__ import annotations

import argparse
from typing import Any

from txbroker.cli.common import positive

__all__ = ["add_replication_flags", "replication_flags"]


def add_replication_flags(sv: argparse.ArgumentParser) -> None:
    rp = sv.add_argument_group(
        "replication",
        "A slave (--replica-of, or --role auto in a group) follows its master's commit log "
        "and serves consumers, read-only; a master answers writes after its own flush "
        "(--replication async) or once --min-insync slaves flushed them too (sync). See "
        "docs/cluster.md.",
    )
    rp.add_argument(
        "--replica-of",
        metavar="URL",
        help="run as a slave of the master at txb://host:port (TXB_REPLICA_OF), with --role "
        "slave in a group; give it the master's --segment-mib",
    )
    rp.add_argument(
        "--replication",
        choices=["sync", "async"],
        help="master: what a write waits for (TXB_REPLICATION; default async)",
    )
    rp.add_argument(
        "--min-insync",
        type=positive,
        metavar="N",
        help="sync replication: slaves that must have flushed a write (TXB_MIN_INSYNC; default 1)",
    )
    rp.add_argument(
        "--replication-timeout-ms",
        type=positive,
        metavar="MS",
        help="sync replication: a write not on enough slaves by then fails with "
        "REPLICATION_TIMEOUT (TXB_REPLICATION_TIMEOUT_MS; default 5000)",
    )


def replication_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "replica_of": args.replica_of,
        "replication": args.replication,
        "min_insync": args.min_insync,
        "replication_timeout_ms": args.replication_timeout_ms,
    }
