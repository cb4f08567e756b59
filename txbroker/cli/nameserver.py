"""`txbroker nameserver`: serve topic routes and group masters from etcd (docs/cluster.md)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from txbroker.cli.common import (
    Subparsers,
    add_coordinator_option,
    add_tls_listener_options,
    coordinator_url,
    run,
)
from txbroker.cli.serve import connection_flags
from txbroker.errors import InvalidArgument

if TYPE_CHECKING:
    from txbroker.server.admission import Limits

__all__ = ["DEFAULT_PORT", "register"]

# Beside the broker's 9876 (TCP) and 9877 (HTTP).
DEFAULT_PORT = 9878


def register(sub: Subparsers) -> None:
    ns = sub.add_parser(
        "nameserver",
        help="serve topic routes over broker groups to clients",
        description="Serve topic routes and each broker group's master, from etcd, to clients "
        "(txbns://host:port in the SDK) until SIGINT/SIGTERM. Stateless: run several, any one "
        "answers. See docs/cluster.md.",
    )
    add_coordinator_option(ns)
    ns.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ns.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"TCP port (default {DEFAULT_PORT}; 0 picks a free one)",
    )
    sec = ns.add_argument_group(
        "token and TLS",
        "As `txbroker serve`'s: clients present the token in HELLO, and connect to a TLS "
        "NameServer with txbnss://host:port. See docs/cluster.md, 'Security'.",
    )
    sec.add_argument("--auth-token", help="a token clients must present (TXB_AUTH_TOKEN)")
    add_tls_listener_options(sec)
    connection_flags(ns)
    ns.set_defaults(func=_nameserver)


def _nameserver(args: argparse.Namespace) -> int:
    from txbroker.nameserver import NameServerConfig, serve_nameserver

    coordinator = coordinator_url(args)
    if not 0 <= args.port <= 65535:
        raise InvalidArgument(f"port must be 0..65535, got {args.port}")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    env = os.environ

    def path(flag: str | None, name: str) -> Path | None:
        given = flag or env.get(name)
        return Path(given) if given else None

    config = NameServerConfig(
        coordinator,
        args.host,
        args.port,
        auth_token=args.auth_token or env.get("TXB_AUTH_TOKEN") or None,
        tls_cert=path(args.tls_cert, "TXB_TLS_CERT"),
        tls_key=path(args.tls_key, "TXB_TLS_KEY"),
        tls_client_ca=path(args.tls_client_ca, "TXB_TLS_CLIENT_CA"),
        limits=_limits(args, env),
    )
    run(serve_nameserver(config))
    return 0


# The connection limits' settings, as `txbroker serve` names them (flags, then TXB_* variables).
LIMITS: Final = (
    "max_connections",
    "reserved_connections",
    "handshake_timeout_ms",
    "idle_timeout_ms",
    "max_frames_per_s",
)


def _limits(args: argparse.Namespace, env: Mapping[str, str]) -> Limits:
    from txbroker.server.admission import checked_limits

    given: dict[str, int] = {}
    for name in LIMITS:
        value = getattr(args, name)
        if value is None and env.get("TXB_" + name.upper()):
            raw = env["TXB_" + name.upper()]
            try:
                value = int(raw)
            except ValueError:
                raise InvalidArgument(f"{name} must be an integer, got {raw!r}") from None
        if value is not None:
            given[name] = value
    return checked_limits(**given)
