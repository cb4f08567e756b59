"""An asyncio client for the broker: the broker's requests by name (topics, sends, transactions)
over one :class:`~txbroker_sdk.connection.Connection`.

    async with await Client.connect("txb://127.0.0.1:9876") as client:
        await client.create_topic("orders", queues=4)
        receipt = await client.send("orders", b"...", key="order-42")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Self, cast

from txbroker.errors import TopicExists
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import (
    Empty,
    SendBatchRequest,
    SendBatchResponse,
    SendReceipt,
    SendRequest,
    TopicCreate,
    TopicInfo,
    TopicName,
    TxEndRequest,
    TxEndResponse,
    TxId,
    TxInfo,
    TxListRequest,
    TxListResponse,
    TxPrepareResponse,
    TxResolveRequest,
)
from txbroker_sdk.connection import DEFAULT_CONNECT_DEADLINE_S, DEFAULT_KEEPALIVE_S, Connection
from txbroker_sdk.requests import Transaction, is_nameserver_url, prepare_request

__all__ = ["Client", "Transaction"]

# Read on every send: a module name, not the enum class's attribute (see connection.py).
_SEND: Final = Opcode.SEND
_SEND_BATCH: Final = Opcode.SEND_BATCH


class Client(Connection):
    """A connection to the broker (see :class:`Connection` for connecting, deadlines and
    reconnects) with the broker's requests by name.

    For broker groups behind NameServers, ``await Client.connect("txbns://host:port,...")``
    returns a :class:`~txbroker_sdk.cluster.ClusterClient`, which routes each request to the
    group that holds its queue (docs/cluster.md); ``Client("txbns://...")`` is refused."""

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        auth_token: str | None = None,
        timeout_s: float = 10.0,
        reconnect_s: float = 30.0,
        connect_deadline_s: float = DEFAULT_CONNECT_DEADLINE_S,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
    ) -> Self:
        """Connect now (see :meth:`Connection.connect`): a ``Client`` for ``txb://`` and
        ``txbs://``, a ``ClusterClient`` for ``txbns://``, so whatever takes a broker's address
        (the CLI's ``--server``, the outbox relay, ``TxbService``) takes NameServers as well."""
        options: dict[str, Any] = {
            "auth_token": auth_token,
            "timeout_s": timeout_s,
            "reconnect_s": reconnect_s,
            "connect_deadline_s": connect_deadline_s,
            "keepalive_s": keepalive_s,
            "tls_ca": tls_ca,
            "tls_cert": tls_cert,
            "tls_key": tls_key,
        }
        if cls is Client and is_nameserver_url(url):
            # Imported here: ClusterClient is built on Client (cluster.py imports this module),
            # and this is the one entry point that picks either by the URL.
            from txbroker_sdk.cluster import ClusterClient

            return cast("Self", await ClusterClient.connect(url, **options))
        return await super().connect(url, **options)

    async def ping(self) -> None:
        await self.request(Opcode.PING, Empty())

    async def create_topic(
        self, topic: str, queues: int = 4, *, exist_ok: bool = False
    ) -> TopicInfo:
        """Create ``topic``; with ``exist_ok`` an existing topic is fine (and described)."""
        try:
            info: TopicInfo = await self.request(Opcode.TOPIC_CREATE, TopicCreate(topic, queues))
        except TopicExists:
            if not exist_ok:
                raise
            return await self.describe_topic(topic)
        return info

    async def delete_topic(self, topic: str) -> None:
        await self.request(Opcode.TOPIC_DELETE, TopicName(topic))

    async def list_topics(self) -> list[TopicInfo]:
        topics: list[TopicInfo] = await self.request(Opcode.TOPIC_LIST, Empty())
        return topics

    async def describe_topic(self, topic: str) -> TopicInfo:
        info: TopicInfo = await self.request(Opcode.TOPIC_DESCRIBE, TopicName(topic))
        return info

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        key: str | None = None,
        tags: str | None = None,
        headers: dict[str, str] | None = None,
        idempotency_key: str | None = None,
        deliver_at_ms: int | None = None,
    ) -> SendReceipt:
        req = SendRequest(
            topic, body, key, tags, headers or {}, idempotency_key, deliver_at_ms=deliver_at_ms
        )
        if self._closed is not None:
            receipt: SendReceipt = await self.request(_SEND, req)
            return receipt
        # Connected: request()'s own steps, without its coroutine between this one and the
        # answer (a frame more on every send and on every resumption of the sending task).
        corr, fut = self._submit(_SEND, req, None)
        try:
            receipt = await fut
        except BaseException:
            self._forget(corr)  # cancelled (see request())
            raise
        return receipt

    async def prepare(
        self,
        topic: str,
        body: bytes,
        *,
        producer_group: str,
        check_url: str,
        tx_id: str | None = None,
        key: str | None = None,
        tags: str | None = None,
        headers: dict[str, str] | None = None,
        traceparent: str | None = None,
        timeout_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> Transaction:
        """PREPARE a half message. ``tx_id`` defaults to a new time-ordered id (UUIDv7 hex);
        pass your own to record it (e.g. in the barrier table) before preparing."""
        req = prepare_request(
            topic,
            body,
            producer_group=producer_group,
            check_url=check_url,
            tx_id=tx_id,
            key=key,
            tags=tags,
            headers=headers,
            traceparent=traceparent,
            timeout_ms=timeout_ms,
            deliver_at_ms=deliver_at_ms,
        )
        res: TxPrepareResponse = await self.request(Opcode.TX_PREPARE, req)
        return Transaction(self, res.tx_id, res.message_id)

    async def end_transaction(self, tx_id: str, decision: str) -> TxEndResponse:
        res: TxEndResponse = await self.request(Opcode.TX_END, TxEndRequest(tx_id, decision))
        return res

    async def list_transactions(
        self, state: str | None = None, topic: str | None = None, limit: int = 100
    ) -> TxListResponse:
        res: TxListResponse = await self.request(Opcode.TX_LIST, TxListRequest(state, topic, limit))
        return res

    async def show_transaction(self, tx_id: str) -> TxInfo:
        res: TxInfo = await self.request(Opcode.TX_SHOW, TxId(tx_id))
        return res

    async def resolve_transaction(self, tx_id: str, action: str) -> TxEndResponse:
        """An operator's commit, rollback or resume (fenced like END_TX)."""
        res: TxEndResponse = await self.request(Opcode.TX_RESOLVE, TxResolveRequest(tx_id, action))
        return res

    async def send_batch(self, messages: list[SendRequest]) -> list[SendReceipt]:
        # Through request(): its coroutine is one frame per batch, not per message.
        res: SendBatchResponse = await self.request(_SEND_BATCH, SendBatchRequest(messages))
        return res.receipts
