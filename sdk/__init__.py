"""The txbroker Python client: an asyncio connection with pipelined requests and typed errors."""

from sdk.client import Client, parse_server_url

__all__ = ["Client", "parse_server_url"]
