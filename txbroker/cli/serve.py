"""`txbroker serve`: run the broker.

Every setting of :class:`~txbroker.server.config.ServerConfig` can come from a TOML file
(``--config``), a ``TXB_<SETTING>`` environment variable or, for the ones listed here, a flag;
flags win over the environment, which wins over the file.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from txbroker.cli.common import Subparsers, positive, run
from txbroker.runtime.tracing import setup_tracing

if TYPE_CHECKING:
    from txbroker.server.config import ServerConfig

__all__ = ["config_from_args", "register"]

log = logging.getLogger("txbroker.serve")


def register(sub: Subparsers) -> None:
    sv = sub.add_parser(
        "serve",
        help="run the broker",
        description="Run the broker until SIGINT/SIGTERM. Settings come from flags, TXB_* "
        "environment variables and a TOML file (--config), in that order of precedence.",
    )
    sv.add_argument("--data-dir", help="where the broker keeps its data (TXB_DATA_DIR)")
    sv.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=int, help="TCP port (default 9876; 0 picks a free one)")
    sv.add_argument("--http-port", type=int, help="HTTP admin port (default 9877)")
    sv.add_argument("--flush", choices=["sync", "async"], help="durability mode (default sync)")
    sv.add_argument("--auth-token", help="clients must present this token (TXB_AUTH_TOKEN)")
    sv.add_argument("--config", help="TOML file with any of the settings (names as in the docs)")
    sv.add_argument(
        "--tx-secret",
        action="append",
        metavar="GROUP=SECRET",
        help="check-back signing secret of a producer group (repeat; TXB_TX_SECRETS)",
    )
    sv.add_argument(
        "--segment-mib",
        type=positive,
        help="commit-log segment size in MiB (default 256; at least 5: one 4 MiB message)",
    )
    sv.add_argument(
        "--repair-truncate",
        action="store_true",
        help="if recovery finds a damaged record followed by valid ones, drop everything from "
        "the damage on instead of refusing to start (data loss: for operators, after a backup)",
    )
    checks = sv.add_argument_group(
        "back-checks and parking",
        "A transaction nobody ended is checked after --tx-timeout-ms, then with a backoff "
        "doubling from --check-backoff-base-ms to --check-backoff-cap-ms; after --max-checks "
        "checks that reached the service it is parked for an operator (about 45 minutes with "
        "the defaults; e.g. --tx-timeout-ms 1000 --check-backoff-base-ms 1000 --max-checks 3 "
        "parks in seconds, for testing).",
    )
    checks.add_argument(
        "--tx-timeout-ms",
        type=positive,
        metavar="MS",
        help="first back-check this long after PREPARE, unless the producer asks otherwise "
        "(TXB_TX_TIMEOUT_MS; default 6000)",
    )
    checks.add_argument(
        "--check-backoff-base-ms",
        type=positive,
        metavar="MS",
        help="wait after the first unanswered check, doubling each time "
        "(TXB_CHECK_BACKOFF_BASE_MS; default 5000)",
    )
    checks.add_argument(
        "--check-backoff-cap-ms",
        type=positive,
        metavar="MS",
        help="longest wait between checks (TXB_CHECK_BACKOFF_CAP_MS; default 300000)",
    )
    checks.add_argument(
        "--max-checks",
        type=positive,
        metavar="N",
        help="checks that reached the service before the transaction is parked "
        "(TXB_MAX_CHECKS; default 15)",
    )
    checks.add_argument(
        "--check-timeout-ms",
        type=positive,
        metavar="MS",
        help="how long one check may take (TXB_CHECK_TIMEOUT_MS; default 3000)",
    )
    sv.set_defaults(func=_serve)


def config_from_args(
    args: argparse.Namespace, env: Mapping[str, str], config_file: Path | None = None
) -> ServerConfig:
    """The broker's settings from ``serve``'s flags over ``env`` over the TOML file."""
    from txbroker.server.config import ServerConfig

    flags = {
        "data_dir": args.data_dir,
        "host": args.host,
        "port": args.port,
        "http_port": args.http_port,
        "flush": args.flush,
        "auth_token": args.auth_token,
        "repair_truncate": True if args.repair_truncate else None,
        "segment_bytes": args.segment_mib * 1024 * 1024 if args.segment_mib else None,
        "tx_secrets": args.tx_secret or None,
        "tx_timeout_ms": args.tx_timeout_ms,
        "check_backoff_base_ms": args.check_backoff_base_ms,
        "check_backoff_cap_ms": args.check_backoff_cap_ms,
        "max_checks": args.max_checks,
        "check_timeout_ms": args.check_timeout_ms,
    }
    if config_file is None and args.config:
        config_file = Path(args.config)
    return ServerConfig.build(flags, env, config_file)


def _serve(args: argparse.Namespace) -> int:
    from txbroker.server.app import serve

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = config_from_args(args, os.environ)
    setup_tracing("txbroker")  # only when OTEL_* asks for traces
    log.info(
        "back-checks: first after %d ms, then every %d..%d ms; parked after %d checks",
        config.tx_timeout_ms,
        config.check_backoff_base_ms,
        config.check_backoff_cap_ms,
        config.max_checks,
    )
    run(serve(config))
    return 0
