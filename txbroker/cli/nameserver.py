"""`txbroker nameserver`: serve topic routes and group masters from etcd (docs/cluster.md)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from txbroker.cli.common import (
    Subparsers,
    add_coordinator_option,
    add_tls_listener_options,
    coordinator_url,
    run,
)
from txbroker.errors import InvalidArgument

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
    )
    run(serve_nameserver(config))
    return 0
