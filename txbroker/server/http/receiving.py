"""Consuming over HTTP: receive, then acknowledge by receipt.

    POST /v1/groups/{group}/topics/{topic}/receive   {"max", "wait_ms", "invisible_ms"}: 200
    POST /v1/groups/{group}/topics/{topic}/ack       {"receipts"}: 200
    POST /v1/groups/{group}/topics/{topic}/nack      {"receipts", "delay_ms"?}: 200
    POST /v1/groups/{group}/topics/{topic}/extend    {"receipts", "invisible_ms"}: 200

Each request is decoded, checked against the token's roles as a TCP PULL of the topic is
(``access.py``: consume on the topic), and answered by the broker's :class:`Receiver`
(``txbroker/server/receipts.py``), which joins the group and reads, commits and hands back
through the TCP handlers. A broker that is not its group's master answers ``307`` to the
master, as the publishing endpoints do.
"""

from __future__ import annotations

import base64
from collections.abc import Callable

from starlette.responses import Response
from starlette.routing import BaseRoute

from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import PullRequest
from txbroker.runtime.httpdirect import DirectEndpoint, DirectRequest
from txbroker.server.access import Access
from txbroker.server.http.bodies import decode, json_response, read_json_direct
from txbroker.server.http.guard import direct_route, principal
from txbroker.server.http.types import (
    ExtendRequest,
    NackReceipts,
    ReceiptList,
    ReceivedMessage,
    ReceivedMessages,
    ReceiveRequest,
)
from txbroker.server.receipts import Received, Receiver
from txbroker.server.tokens import TokenTable

__all__ = ["PREFIX", "Receiving"]

PREFIX = "/v1/groups/{group}/topics/{topic}"


class Receiving:
    """The endpoints above; ``master_http`` as for :class:`~.messaging.Messaging`."""

    def __init__(
        self,
        receiver: Receiver,
        access: Access,
        *,
        master_http: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._receiver = receiver
        self._access = access
        self._master_http = master_http

    def routes(self, tokens: TokenTable) -> list[BaseRoute]:
        """Direct routes, answered by the HTTP server itself (``runtime/httpdirect.py``):
        receive and ack are the API's hot path, and nack and extend go the way they do."""

        def route(action: str, fn: DirectEndpoint) -> BaseRoute:
            return direct_route(f"{PREFIX}/{action}", fn, tokens, self._master_http)

        return [
            route("receive", self.receive),
            route("ack", self.ack),
            route("nack", self.nack),
            route("extend", self.extend),
        ]

    async def receive(self, request: DirectRequest) -> Response:
        group, topic = self._names(request)
        r = decode(await read_json_direct(request), ReceiveRequest)
        got = await self._receiver.receive(
            group, topic, max_messages=r.max, wait_ms=r.wait_ms, invisible_ms=r.invisible_ms
        )
        return json_response(ReceivedMessages([_received(m) for m in got]), 200)

    async def ack(self, request: DirectRequest) -> Response:
        group, topic = self._names(request)
        r = decode(await read_json_direct(request), ReceiptList)
        return json_response(await self._receiver.ack(group, topic, r.receipts), 200)

    async def nack(self, request: DirectRequest) -> Response:
        group, topic = self._names(request)
        r = decode(await read_json_direct(request), NackReceipts)
        return json_response(await self._receiver.nack(group, topic, r.receipts, r.delay_ms), 200)

    async def extend(self, request: DirectRequest) -> Response:
        group, topic = self._names(request)
        r = decode(await read_json_direct(request), ExtendRequest)
        return json_response(self._receiver.extend(group, topic, r.receipts, r.invisible_ms), 200)

    def _names(self, request: DirectRequest) -> tuple[str, str]:
        """The path's group and topic, once the token may consume the topic (before the body
        is read)."""
        group, topic = request.params["group"], request.params["topic"]
        self._access.check(principal(request), Opcode.PULL, PullRequest(group, topic))
        return group, topic


def _received(r: Received) -> ReceivedMessage:
    m = r.message
    try:
        body, encoding = m.body.decode(), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(m.body).decode(), "base64"
    return ReceivedMessage(
        m.message_id,
        m.topic,
        m.queue_id,
        m.queue_offset,
        m.key,
        m.tags,
        m.headers,
        body,
        encoding,  # type: ignore[arg-type]  # one of the two literals
        r.receipt,
        r.delivery_attempt,
    )
