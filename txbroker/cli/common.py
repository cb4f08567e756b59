"""What the command modules share: running a coroutine, argument types, the broker and database
options every command of a kind takes."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any, Final, Protocol, TypeVar

from txbroker.errors import InvalidArgument

__all__ = [
    "CONNECT_TIMEOUT_S",
    "Subparsers",
    "add_broker_options",
    "add_coordinator_option",
    "add_database_option",
    "add_tls_listener_options",
    "auth_token",
    "client_logging",
    "client_options",
    "coordinator_url",
    "database_url",
    "non_negative",
    "positive",
    "run",
    "seconds",
    "server_url",
    "with_client",
]

T = TypeVar("T")
# How long a command tries to reach the broker: one that is up answers in milliseconds, and a
# person at a terminal wants a wrong address named in seconds, not after a service's 10 s wait.
CONNECT_TIMEOUT_S: Final = 3.0


class Subparsers(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns, as far as the command modules use it."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine on uvloop (the broker's loop too) where it is installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        import asyncio

        return asyncio.run(coro)
    result: T = uvloop.run(coro)
    return result


def positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    return value


# --- commands that talk to a broker ---


def add_broker_options(p: argparse.ArgumentParser, *, json_help: str) -> None:
    p.add_argument(
        "--server",
        help="txb://host:port, txbs:// for TLS; NameServers: txbns://host:port,..., txbnss:// "
        "for TLS (TXB_SERVER; default txb://127.0.0.1:9876)",
    )
    p.add_argument("--auth-token", help="token for a broker started with one (TXB_AUTH_TOKEN)")
    p.add_argument(
        "--tls-ca", metavar="PEM", help="txbs://: the CA that signed the broker's certificate "
        "(TXB_TLS_CA; default: the system's)",
    )  # fmt: skip
    p.add_argument(
        "--tls-client-cert", metavar="PEM", help="txbs:// with mutual TLS: this client's "
        "certificate (TXB_TLS_CLIENT_CERT); its key is --tls-client-key (TXB_TLS_CLIENT_KEY)",
    )  # fmt: skip
    p.add_argument(
        "--tls-client-key",
        metavar="PEM",
        help="the private key of --tls-client-cert (TXB_TLS_CLIENT_KEY)",
    )
    p.add_argument(
        "--connect-timeout",
        type=seconds,
        default=CONNECT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up on a broker not reached within this long (default {CONNECT_TIMEOUT_S:g}; "
        "0: one attempt)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show each failed attempt to connect, and the client's informational log",
    )
    p.add_argument("--json", action="store_true", help=json_help)


# The TXB_* names below are the SDK's (txbroker_sdk.settings), so a shell set up for the CLI
# works for a service too; imported when a command connects, which loads the SDK anyway, so
# that --help and the broker's own commands start without it.


def server_url(args: argparse.Namespace) -> str:
    from txbroker_sdk.settings import DEFAULT_SERVER, SERVER

    return str(args.server or os.environ.get(SERVER) or DEFAULT_SERVER)


def auth_token(args: argparse.Namespace) -> str | None:
    from txbroker_sdk.settings import AUTH_TOKEN

    token: str | None = args.auth_token or os.environ.get(AUTH_TOKEN)
    return token


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``Client`` the broker options give: the token, the TLS files
    and (for a command with ``--connect-timeout``) the connect deadline."""
    from txbroker_sdk.requests import is_nameserver_url, uses_tls
    from txbroker_sdk.settings import TLS_CA, TLS_CLIENT_CERT, TLS_CLIENT_KEY

    env = os.environ
    options: dict[str, Any] = {"auth_token": auth_token(args)}
    if (timeout := getattr(args, "connect_timeout", None)) is not None:
        options["connect_deadline_s"] = timeout
    url = server_url(args)
    # The TLS files mean nothing to a plain broker's URL; NameServers may route to TLS brokers.
    if uses_tls(url) or is_nameserver_url(url):
        options["tls_ca"] = getattr(args, "tls_ca", None) or env.get(TLS_CA)
        options["tls_cert"] = getattr(args, "tls_client_cert", None) or env.get(TLS_CLIENT_CERT)
        options["tls_key"] = getattr(args, "tls_client_key", None) or env.get(TLS_CLIENT_KEY)
    return options


def with_client(
    fn: Callable[[Any, argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    """A command handler that connects a client, runs ``fn(client, args)`` and closes it."""

    def handler(args: argparse.Namespace) -> int:
        async def main() -> int:
            from txbroker_sdk import Client

            async with await Client.connect(server_url(args), **client_options(args)) as c:
                return await fn(c, args)

        client_logging(args)
        return run(main())

    return handler


class _Lines(logging.Formatter):
    """``txbroker: warning: ...``: a log record reads as the command's errors do."""

    def format(self, record: logging.LogRecord) -> str:
        return f"txbroker: {record.levelname.lower()}: {super().format(record)}"


def client_logging(args: argparse.Namespace) -> None:
    """The client's log on stderr: its warnings (a token the broker does not check, say), and
    with ``-v`` its informational lines and each failed connection attempt, which are left out
    otherwise: the final error says how many attempts failed and why."""
    from txbroker_sdk.connection import attempts_log

    handler = logging.StreamHandler()
    handler.setFormatter(_Lines("%(message)s"))
    verbose = getattr(args, "verbose", False)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    if not verbose:
        attempts_log.setLevel(logging.ERROR)


# --- commands that serve, and commands that work on a cluster's etcd ---


def add_tls_listener_options(p: argparse._ActionsContainer) -> None:
    """A listener's TLS files: the broker's (``serve``) and the NameServer's mean the same."""
    p.add_argument(
        "--tls-cert", metavar="PEM", help="serve TLS with this certificate chain (TXB_TLS_CERT)"
    )
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's key (TXB_TLS_KEY)")
    p.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="mutual TLS: clients must present a certificate this CA signed (TXB_TLS_CLIENT_CA)",
    )


def add_coordinator_option(p: argparse.ArgumentParser) -> None:
    """``--coordinator``, required (:func:`coordinator_url`)."""
    p.add_argument(
        "--coordinator",
        metavar="URL",
        help="etcd://host:port[,host:port...] (TXB_COORDINATOR; required)",
    )


def coordinator_url(args: argparse.Namespace) -> str:
    url: str | None = args.coordinator or os.environ.get("TXB_COORDINATOR")
    if not url:
        raise InvalidArgument("give --coordinator etcd://host:port (or TXB_COORDINATOR)")
    return url


# --- commands that work on a service's database ---


def add_database_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="database URL (TXB_DATABASE_URL); postgresql:// or sqlite://")


def database_url(args: argparse.Namespace) -> str:
    from txbroker_sdk.settings import DATABASE_URL

    url: str | None = args.url or os.environ.get(DATABASE_URL)
    if not url:
        raise InvalidArgument("give --url (or TXB_DATABASE_URL), e.g. postgresql://user@host/db")
    return url
