"""The `txbroker` command line: the broker, its topics, messages, transactions, consumer groups
and dead letters, a service's database tables and outbox, and the benchmarks.

Each command group is a module here with a ``register(subparsers)`` function; ``--help`` on any
command says what it does and what every option means.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from txbroker.errors import TxbError

__all__ = ["build_parser", "main"]


class _Version(argparse.Action):
    """``--version``: read only when asked (the build is found by looking for files)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from txbroker import __version__
        from txbroker.runtime.build import BUILD

        print(f"txbroker {__version__}, build: {BUILD.describe()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    from txbroker.cli import (
        bench,
        chaos,
        cluster,
        db,
        dlq,
        groups,
        messages,
        nameserver,
        outbox,
        reconcile,
        serve,
        topics,
        tx,
    )

    p = argparse.ArgumentParser(
        prog="txbroker",
        description="Transactional messaging for Python services: the broker and its tools.",
        epilog="Run `txbroker COMMAND --help` for a command's options.",
    )
    p.add_argument(
        "--version", action=_Version, nargs=0, help="print the version and which build runs"
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The order of `txbroker --help`: running the broker, using it, a service's side, figures.
    for group in (
        serve,
        nameserver,
        cluster,
        topics,
        messages,
        tx,
        groups,
        dlq,
        db,
        outbox,
        reconcile,
        bench,
        chaos,
    ):
        group.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rc: int = args.func(args)
    except TxbError as e:
        print(f"txbroker: error [{e.code}]: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (head, less) went away. Point stdout at /dev/null so the interpreter's
        # final flush does not fail again (as the Python docs on SIGPIPE advise).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return rc
