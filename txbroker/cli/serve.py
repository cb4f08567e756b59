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

from txbroker.cli.common import Subparsers, add_tls_listener_options, non_negative, positive, run
from txbroker.cli.serve_replication import add_replication_flags, replication_flags

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
    sv.add_argument("--auth-token", help="an admin token clients must present (TXB_AUTH_TOKEN)")
    sv.add_argument("--config", help="TOML file with any of the settings (names as in the docs)")
    sv.add_argument(
        "--trace-url",
        metavar="URL",
        help="the console links each transaction to its trace here: a trace UI's URL with "
        "{trace_id} in it, e.g. 'http://jaeger:16686/trace/{trace_id}' (TXB_TRACE_URL)",
    )
    sv.add_argument(
        "--reconcile-reports",
        metavar="DIR",
        help="where `txbroker reconcile --out` writes: the console shows the newest "
        "summary.json in DIR or its subfolders (TXB_RECONCILE_REPORTS)",
    )
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
        "parks in seconds, for testing). One whose checks reach no one for --stall-after-ms "
        "is stalled: checked on and never decided, but shown and alerted on.",
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
    checks.add_argument(
        "--stall-after-ms",
        type=positive,
        metavar="MS",
        help="a transaction whose checks have reached no one this long (its endpoint is "
        "unreachable, or no poller takes its pulled checks) is stalled "
        "(TXB_STALL_AFTER_MS; default 900000, 15 min)",
    )
    connection_flags(sv)
    _cluster_flags(sv)
    add_replication_flags(sv)
    _security_flags(sv)
    _retention_flags(sv)
    sv.set_defaults(func=_serve)


def _hours(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _retention_flags(sv: argparse.ArgumentParser) -> None:
    ret = sv.add_argument_group(
        "retention",
        "Whole commit-log segments are deleted once their newest record is older than the "
        "age limit, or while the log is larger than the size limit; open and parked "
        "transactions' half messages are copied forward first. See docs/operations.md, "
        "'Retention'.",
    )
    age = ret.add_mutually_exclusive_group()
    age.add_argument(
        "--retention-hours",
        type=_hours,
        metavar="H",
        help="age limit in hours, e.g. 24 or 0.5; 0: none (default 72)",
    )
    age.add_argument(
        "--retention-ms",
        type=non_negative,
        metavar="MS",
        help="age limit in ms; 0: none (TXB_RETENTION_MS; default 259200000, 72 h)",
    )
    ret.add_argument(
        "--retention-bytes",
        type=non_negative,
        metavar="N",
        help="size limit of the log in bytes, at least one segment; 0: none "
        "(TXB_RETENTION_BYTES; default 0)",
    )
    ret.add_argument(
        "--retention-check-interval-ms",
        type=positive,
        metavar="MS",
        help="how often the limits are looked at, at least 1000 "
        "(TXB_RETENTION_CHECK_INTERVAL_MS; default 10000)",
    )


def _cluster_flags(sv: argparse.ArgumentParser) -> None:
    cl = sv.add_argument_group(
        "broker groups",
        "With --coordinator and --group the broker registers in etcd as a member of the group, "
        "master or slave, and NameServers route clients to it. See docs/cluster.md.",
    )
    cl.add_argument(
        "--coordinator",
        metavar="URL",
        help="etcd://host:port[,host:port...] (TXB_COORDINATOR; default: none, a lone broker)",
    )
    cl.add_argument("--group", metavar="NAME", help="the broker group it belongs to (TXB_GROUP)")
    cl.add_argument(
        "--broker-id",
        metavar="ID",
        help="its name in the group, unique there (TXB_BROKER_ID; default HOST-PORT)",
    )
    cl.add_argument(
        "--role",
        choices=["auto", "master", "slave"],
        help="master or slave as given, or auto: a slave following the group's elected master, "
        "and master when it wins the election; takes over when the master dies (failover, "
        "docs/cluster.md) (TXB_ROLE; default auto)",
    )


def _security_flags(sv: argparse.ArgumentParser) -> None:
    sec = sv.add_argument_group(
        "access control and TLS",
        "Tokens with roles (produce, consume, read, admin) and topic patterns, and TLS on the "
        "TCP and HTTP listeners. See docs/operations.md, 'Security'.",
    )
    sec.add_argument(
        "--token-file",
        metavar="FILE",
        help="TOML file of [[tokens]] entries: name, token_sha256 (or token), roles, topics "
        "(TXB_TOKENS_FILE)",
    )
    add_tls_listener_options(sec)
    sec.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="the CA that signed the other brokers' certificates: a slave checks its txbs:// "
        "master's against it (TXB_TLS_CA; default: the system's)",
    )


def connection_flags(sv: argparse.ArgumentParser) -> None:
    conns = sv.add_argument_group(
        "connection limits",
        "At most --max-connections (lowered at start to what the open-file limit allows); those "
        "that have not completed HELLO may hold all but --reserved-connections of them, the "
        "oldest making room for newer ones, so a flood of idle sockets cannot lock out a real "
        "client. See docs/operations.md, 'Connection limits'.",
    )
    conns.add_argument(
        "--max-connections",
        type=positive,
        metavar="N",
        help="client connections open at once (TXB_MAX_CONNECTIONS; default 10000)",
    )
    conns.add_argument(
        "--reserved-connections",
        type=non_negative,
        metavar="N",
        help="slots only authenticated connections may take (TXB_RESERVED_CONNECTIONS; "
        "default a tenth of --max-connections)",
    )
    conns.add_argument(
        "--handshake-timeout-ms",
        type=positive,
        metavar="MS",
        help="a connection must complete HELLO this soon (TXB_HANDSHAKE_TIMEOUT_MS; default 5000)",
    )
    conns.add_argument(
        "--idle-timeout-ms",
        type=non_negative,
        metavar="MS",
        help="close an authenticated connection silent this long with nothing in flight; 0: "
        "never (TXB_IDLE_TIMEOUT_MS; default 300000)",
    )
    conns.add_argument(
        "--max-frames-per-s",
        type=non_negative,
        metavar="N",
        help="frames one connection may send a second (bursts of twice as many); 0: no limit "
        "(TXB_MAX_FRAMES_PER_S; default 200000)",
    )


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
        "tokens_file": args.token_file,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_client_ca": args.tls_client_ca,
        "tls_ca": args.tls_ca,
        "repair_truncate": True if args.repair_truncate else None,
        "segment_bytes": args.segment_mib * 1024 * 1024 if args.segment_mib else None,
        "tx_secrets": args.tx_secret or None,
        "tx_timeout_ms": args.tx_timeout_ms,
        "check_backoff_base_ms": args.check_backoff_base_ms,
        "check_backoff_cap_ms": args.check_backoff_cap_ms,
        "max_checks": args.max_checks,
        "check_timeout_ms": args.check_timeout_ms,
        "stall_after_ms": args.stall_after_ms,
        "max_connections": args.max_connections,
        "reserved_connections": args.reserved_connections,
        "handshake_timeout_ms": args.handshake_timeout_ms,
        "idle_timeout_ms": args.idle_timeout_ms,
        "max_frames_per_s": args.max_frames_per_s,
        "trace_url": args.trace_url,
        "reconcile_reports": args.reconcile_reports,
        "retention_ms": (
            round(args.retention_hours * 3_600_000)
            if args.retention_hours is not None
            else args.retention_ms
        ),
        "retention_bytes": args.retention_bytes,
        "retention_check_interval_ms": args.retention_check_interval_ms,
        "coordinator": args.coordinator,
        "group": args.group,
        "broker_id": args.broker_id,
        "role": args.role,
        **replication_flags(args),
    }
    if config_file is None and args.config:
        config_file = Path(args.config)
    return ServerConfig.build(flags, env, config_file)


def _serve(args: argparse.Namespace) -> int:
    from txbroker import __version__
    from txbroker.console import console_routes
    from txbroker.runtime.build import BUILD
    from txbroker.runtime.tracing import setup_tracing
    from txbroker.server.app import serve

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = config_from_args(args, os.environ)
    setup_tracing("txbroker-broker")  # only when OTEL_* asks for traces (the default name)
    log.info("txbroker %s, build: %s", __version__, BUILD.describe())
    log.info(
        "back-checks: first after %d ms, then every %d..%d ms; parked after %d checks; "
        "stalled after %d ms of checks that reach no one",
        config.tx_timeout_ms,
        config.check_backoff_base_ms,
        config.check_backoff_cap_ms,
        config.max_checks,
        config.stall_after_ms,
    )
    log.info(
        "retention: segments older than %s or beyond %s deleted, looked at every %d ms",
        f"{config.retention_ms / 3_600_000:g} h" if config.retention_ms else "(no age limit)",
        f"{config.retention_bytes} bytes" if config.retention_bytes else "(no size limit)",
        config.retention_check_interval_ms,
    )
    run(serve(config, console_routes))  # logs the console's URL once it listens
    return 0
