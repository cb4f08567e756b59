"""The txbroker Python client: an asyncio connection with pipelined requests and typed errors."""

from sdk.client import Client, ConnectionClosed, RequestTimeout, Transaction, parse_server_url
from sdk.consumer import ConsumedMessage, Consumer

__all__ = [
    # connection
    "Client",
    "ConnectionClosed",
    "RequestTimeout",
    "Transaction",
    "parse_server_url",
    # consuming
    "ConsumedMessage",
    "Consumer",
]
