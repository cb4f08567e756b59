"""txbroker's service SDK: publish a message if and only if your transaction commits, and apply
each message exactly once in your own database.

    from txbroker_sdk import Client, Subscribers, TxPublisher, create_engine, mount, upgrade

A service imports from here (and ``txbroker_outbox``, ``txbroker_checkback``), never from the
broker's modules. The connection and consumer need only the base install; the database side
(``TxPublisher``, ``Subscribers``, the barrier, migrations, retention) needs the ``sdk`` extra
(SQLAlchemy and a driver) and is imported on first use, so a process that only sends messages
does not load SQLAlchemy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from txbroker.errors import (
    BadRequest,
    Forbidden,
    InvalidArgument,
    InvalidName,
    MessageTooLarge,
    NotFound,
    StaleGeneration,
    TlsRequired,
    TooManyTransactions,
    TopicExists,
    TransactionConflict,
    TransactionNotFound,
    TxbError,
    Unauthenticated,
)
from txbroker_sdk.client import Client, Transaction, parse_server_url
from txbroker_sdk.consumer import ConsumedMessage, Consumer
from txbroker_sdk.errors import (
    BrokerUnreachable,
    ConnectionClosed,
    RequestTimeout,
    TablesMissing,
    TlsFailed,
)

if TYPE_CHECKING:
    from txbroker.runtime.httpserve import HttpServer, serving
    from txbroker.runtime.signals import stop_on_signals
    from txbroker_sdk.barrier import BarrierResolver, TransactionFenced, mount, record_commit
    from txbroker_sdk.database import create_engine
    from txbroker_sdk.preflight import require_tables
    from txbroker_sdk.retention import Retention, clean_up
    from txbroker_sdk.schema import upgrade
    from txbroker_sdk.subscriber import Handler, Subscribers, apply_once
    from txbroker_sdk.transactional import TxPublisher, encode_body
    from txbroker_sdk.web import NotStarted, TxbService

# The database side and the HTTP server (uvicorn), by the module that defines each name:
# imported when first asked for.
_LAZY: dict[str, str] = {
    "HttpServer": "txbroker.runtime.httpserve",
    "serving": "txbroker.runtime.httpserve",
    "stop_on_signals": "txbroker.runtime.signals",
    "BarrierResolver": "txbroker_sdk.barrier",
    "TransactionFenced": "txbroker_sdk.barrier",
    "mount": "txbroker_sdk.barrier",
    "record_commit": "txbroker_sdk.barrier",
    "create_engine": "txbroker_sdk.database",
    "require_tables": "txbroker_sdk.preflight",
    "Retention": "txbroker_sdk.retention",
    "clean_up": "txbroker_sdk.retention",
    "upgrade": "txbroker_sdk.schema",
    "Handler": "txbroker_sdk.subscriber",
    "Subscribers": "txbroker_sdk.subscriber",
    "apply_once": "txbroker_sdk.subscriber",
    "TxPublisher": "txbroker_sdk.transactional",
    "encode_body": "txbroker_sdk.transactional",
    "NotStarted": "txbroker_sdk.web",
    "TxbService": "txbroker_sdk.web",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'txbroker_sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


__all__ = [
    # connection
    "Client",
    "Transaction",
    "parse_server_url",
    # consuming
    "ConsumedMessage",
    "Consumer",
    # publishing with a local transaction (@transactional) and the barrier behind its checks
    "TxPublisher",
    "encode_body",
    "mount",
    "BarrierResolver",
    "record_commit",
    # applying each message once (@subscriber and the inbox)
    "Subscribers",
    "Handler",
    "apply_once",
    # the service's database
    "create_engine",
    "upgrade",
    "require_tables",
    "Retention",
    "clean_up",
    # running a service (TxbService: the FastAPI / Starlette integration)
    "TxbService",
    "HttpServer",
    "serving",
    "stop_on_signals",
    # errors (one root: TxbError)
    "TxbError",
    "BadRequest",
    "BrokerUnreachable",
    "ConnectionClosed",
    "Forbidden",
    "InvalidArgument",
    "InvalidName",
    "MessageTooLarge",
    "NotFound",
    "NotStarted",
    "RequestTimeout",
    "StaleGeneration",
    "TablesMissing",
    "TlsFailed",
    "TlsRequired",
    "TooManyTransactions",
    "TopicExists",
    "TransactionConflict",
    "TransactionFenced",
    "TransactionNotFound",
    "Unauthenticated",
]
