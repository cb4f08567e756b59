"""What each request does: thin functions from a decoded request to a response body."""

from __future__ import annotations

from typing import Any

from txbroker.errors import InvalidArgument
from txbroker.protocol.frames import MAX_BATCH_MESSAGES, Opcode
from txbroker.protocol.messages import (
    AckRequest,
    DlqListResponse,
    DlqRedriveResponse,
    DlqRequest,
    Empty,
    GroupsRequest,
    GroupsResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaveRequest,
    NackRequest,
    NackResponse,
    PullRequest,
    PullResponse,
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
    TxPrepareRequest,
    TxPrepareResponse,
    TxResolveRequest,
)
from txbroker.runtime.tracing import tracing_on
from txbroker.server.admin import Admin
from txbroker.server.connection import Deferred, DirectHandler, Handler
from txbroker.server.consumer import ConsumerService
from txbroker.server.deletion import TopicDeletion
from txbroker.server.producer import Producer
from txbroker.server.retry import RetryService
from txbroker.server.topics import TopicRegistry
from txbroker.tx import spans
from txbroker.tx.coordinator import TxCoordinator, tx_info
from txbroker.tx.state import Decision, Resolver, TxState

__all__ = ["build_direct_handlers", "build_handlers"]


def build_handlers(
    admin: Admin,
    topics: TopicRegistry,
    producer: Producer,
    consumer: ConsumerService,
    retry: RetryService,
    tx: TxCoordinator,
    deletion: TopicDeletion,
) -> dict[int, Handler]:
    async def ping(_: Any) -> Empty:
        return Empty()

    async def topic_create(req: TopicCreate) -> TopicInfo:
        return admin.topic_info(topics.create(req.topic, req.queues))

    async def topic_delete(req: TopicName) -> Empty:
        await deletion.delete(req.topic)
        return Empty()

    async def topic_list(_: Any) -> list[TopicInfo]:
        return [admin.topic_info(t) for t in topics.list()]

    async def topic_describe(req: TopicName) -> TopicInfo:
        return admin.topic_info(topics.get(req.topic))

    async def send(req: SendRequest) -> SendReceipt:
        return await producer.send(req)

    async def send_batch(req: SendBatchRequest) -> SendBatchResponse:
        if not 1 <= len(req.messages) <= MAX_BATCH_MESSAGES:
            raise InvalidArgument(f"a batch holds 1..{MAX_BATCH_MESSAGES} messages")
        return SendBatchResponse(await producer.send_batch(req.messages))

    async def heartbeat(req: HeartbeatRequest) -> HeartbeatResponse:
        return await consumer.heartbeat(req)

    async def pull(req: PullRequest) -> PullResponse:
        return await consumer.pull(req)

    async def ack(req: AckRequest) -> Empty:
        await consumer.ack(req)
        return Empty()

    async def nack(req: NackRequest) -> NackResponse:
        return await retry.nack(req)

    async def dlq_list(req: DlqRequest) -> DlqListResponse:
        return await retry.list_dlq(req.group, req.max_messages)

    async def dlq_redrive(req: DlqRequest) -> DlqRedriveResponse:
        return await retry.redrive(req.group, req.max_messages)

    async def offsets(req: GroupsRequest) -> GroupsResponse:
        return GroupsResponse(admin.groups(req.group or None, req.topic or None))

    async def leave(req: LeaveRequest) -> Empty:
        await consumer.leave(req)
        return Empty()

    async def tx_prepare(req: TxPrepareRequest) -> TxPrepareResponse:
        return await tx.prepare(req)

    async def tx_end(req: TxEndRequest) -> TxEndResponse:
        return await tx.end(req.tx_id, _decision(req), Resolver.PRODUCER)

    async def tx_list(req: TxListRequest) -> TxListResponse:
        if req.state not in (None, "", "prepared", "parked"):
            raise InvalidArgument("state must be prepared or parked")
        state = TxState(req.state) if req.state else None
        found = tx.list(state, req.topic)
        limit = max(1, min(req.limit, 10_000))
        return TxListResponse([tx_info(t) for t in found[:limit]], len(found))

    async def tx_show(req: TxId) -> TxInfo:
        return tx_info(tx.get(req.tx_id))

    async def tx_resolve(req: TxResolveRequest) -> TxEndResponse:
        if req.action == "resume":
            return await tx.resume(req.tx_id)
        try:
            decision = Decision(req.action)
        except ValueError as e:
            raise InvalidArgument("action must be commit, rollback or resume") from e
        return await tx.end(req.tx_id, decision, Resolver.OPERATOR, "resolved by an operator")

    handlers: dict[int, Handler] = {
        Opcode.TX_PREPARE: tx_prepare,
        Opcode.TX_END: tx_end,
        Opcode.TX_LIST: tx_list,
        Opcode.TX_SHOW: tx_show,
        Opcode.TX_RESOLVE: tx_resolve,
        Opcode.NACK: nack,
        Opcode.DLQ_LIST: dlq_list,
        Opcode.DLQ_REDRIVE: dlq_redrive,
        Opcode.HEARTBEAT: heartbeat,
        Opcode.PULL: pull,
        Opcode.ACK: ack,
        Opcode.LEAVE: leave,
        Opcode.OFFSETS: offsets,
        Opcode.PING: ping,
        Opcode.TOPIC_CREATE: topic_create,
        Opcode.TOPIC_DELETE: topic_delete,
        Opcode.TOPIC_LIST: topic_list,
        Opcode.TOPIC_DESCRIBE: topic_describe,
        Opcode.SEND: send,
        Opcode.SEND_BATCH: send_batch,
    }
    if tracing_on():  # asked once, at start: with tracing off the handlers are untouched
        spans.trace_handlers(handlers, tx)
    return handlers


def build_direct_handlers(tx: TxCoordinator, producer: Producer) -> dict[int, DirectHandler]:
    """The task-free fronts of the hot requests (see ``connection.py``): single sends and the
    transactional ones; each returns None where the handler above must answer."""

    def send(req: SendRequest) -> object:
        if req.idempotency_key is not None:
            return None  # deduplication reads the key index: the task handler's
        receipt, durable = producer.send_nowait(req)
        return receipt if durable is None else Deferred(durable, receipt)

    def tx_end(req: TxEndRequest) -> object:
        return tx.end_nowait(req.tx_id, _decision(req), Resolver.PRODUCER)

    def send_batch(req: SendBatchRequest) -> object:
        if not 1 <= len(req.messages) <= MAX_BATCH_MESSAGES:
            raise InvalidArgument(f"a batch holds 1..{MAX_BATCH_MESSAGES} messages")
        if any(r.idempotency_key is not None for r in req.messages):
            return None
        receipts, durable = producer.send_batch_nowait(req.messages)
        answer = SendBatchResponse(receipts)
        return answer if durable is None else Deferred(durable, answer)

    direct: dict[int, DirectHandler] = {
        Opcode.SEND: send,
        Opcode.SEND_BATCH: send_batch,
        Opcode.TX_PREPARE: tx.prepare_nowait,
        Opcode.TX_END: tx_end,
    }
    if tracing_on():
        spans.trace_handlers(direct, tx, direct=True)
    return direct


def _decision(req: TxEndRequest) -> Decision:
    try:
        return Decision(req.decision)
    except ValueError as e:
        raise InvalidArgument("decision must be commit or rollback") from e
