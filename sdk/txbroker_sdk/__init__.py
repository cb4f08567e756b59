"""txbroker's service SDK: publish a message if and only if your transaction commits, and apply
each message exactly once in your own database.

    from txbroker_sdk import TxbService                  # a FastAPI / Starlette service
    from txbroker_sdk import Client, Consumer            # the plain client
    from txbroker_sdk.errors import BrokerUnreachable    # every error, under TxbError

The database side needs the ``sdk`` extra (SQLAlchemy and a driver) and is imported on first
use, so a process that only sends messages does not load SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from txbroker_sdk.client import Client
from txbroker_sdk.consumer import ConsumedMessage, Consumer
from txbroker_sdk.errors import TxbError

if TYPE_CHECKING:
    from txbroker_sdk.barrier import mount
    from txbroker_sdk.database import create_engine
    from txbroker_sdk.retention import Retention
    from txbroker_sdk.schema import upgrade
    from txbroker_sdk.subscriber import Subscribers
    from txbroker_sdk.transactional import TxPublisher
    from txbroker_sdk.web import TxbService

# The names that need SQLAlchemy (or Starlette), by their module: imported when first asked for.
_LAZY: dict[str, str] = {
    "TxbService": "txbroker_sdk.web",
    "TxPublisher": "txbroker_sdk.transactional",
    "mount": "txbroker_sdk.barrier",
    "Subscribers": "txbroker_sdk.subscriber",
    "create_engine": "txbroker_sdk.database",
    "upgrade": "txbroker_sdk.schema",
    "Retention": "txbroker_sdk.retention",
}


if not TYPE_CHECKING:  # hidden from type checkers, so they flag a name that is not here

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            from txbroker_sdk import errors

            where = " (errors are in txbroker_sdk.errors)" if name in errors.__all__ else ""
            raise AttributeError(f"module 'txbroker_sdk' has no attribute {name!r}{where}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # once: later lookups are plain attribute reads
        return value


__all__ = [
    # a service wired in one object: FastAPI or Starlette, its database, the broker
    "TxbService",
    # publishing with a local transaction (@transactional), and the check-back endpoint it needs
    "TxPublisher",
    "mount",
    # applying each message once (@subscriber)
    "Subscribers",
    # the plain client: sends, transactions by hand, a consumer group's messages
    "Client",
    "Consumer",
    "ConsumedMessage",
    # the service's database: an engine tuned for it, txbroker's tables, their retention
    "create_engine",
    "upgrade",
    "Retention",
    # the root of every error (the others: txbroker_sdk.errors)
    "TxbError",
]
