"""What each request does: the opcode → handler table, one per broker.

A handler takes the decoded request and returns the response body, or a ``Deferred`` that
settles later (``connection.py``): SEND answers with its receipt held until the group commit is
durable, a transaction with the coordinator's future, anything that must wait or read with
``later(coroutine)``. Whether a request is served now is the broker's ``Role``, not this table's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from txbroker.errors import InvalidArgument
from txbroker.protocol.frames import MAX_BATCH_MESSAGES, Opcode
from txbroker.protocol.messages import (
    AckRequest,
    DlqRequest,
    Empty,
    GroupsRequest,
    GroupsResponse,
    HeartbeatRequest,
    LeaveRequest,
    NackRequest,
    PullRequest,
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
    TxResolveRequest,
)
from txbroker.runtime.tracing import tracing_on
from txbroker.server.admin import Admin
from txbroker.server.connection import Deferred, Handler, later
from txbroker.server.consumer import ConsumerService
from txbroker.server.deletion import TopicDeletion
from txbroker.server.producer import Producer
from txbroker.server.replication.master import ReplicationMaster
from txbroker.server.retry import RetryService
from txbroker.server.topics import TopicRegistry
from txbroker.tx import spans
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.state import Decision, Resolver

__all__ = ["build_handlers"]


def build_handlers(
    admin: Admin,
    topics: TopicRegistry,
    producer: Producer,
    consumer: ConsumerService,
    retry: RetryService,
    tx: TxCoordinator,
    deletion: TopicDeletion,
    slaves: ReplicationMaster | None = None,
) -> dict[int, Handler]:
    """The broker's handlers; ``slaves`` (a broker that may be a master) serves its slaves'
    REPL_FETCH and holds a topic creation's answer until they have the topic (sync)."""

    def ping(_: Any) -> Empty:
        return Empty()

    def topic_create(req: TopicCreate) -> TopicInfo | Deferred:
        info = admin.topic_info(topics.create(req.topic, req.queues))
        # Acknowledged as a write is: with sync replication, once the slaves hold it (also
        # when it existed: an earlier creation's answer may have timed out).
        replicated = slaves.topics_replicated() if slaves is not None else None
        return info if replicated is None else Deferred(replicated, info)

    async def delete_replicated(name: str) -> Empty:
        await deletion.delete(name)
        # Acknowledged as a creation is: with sync replication, once the slaves deleted it.
        replicated = slaves.topics_replicated() if slaves is not None else None
        if replicated is not None:
            await replicated
        return Empty()

    def topic_delete(req: TopicName) -> Deferred:
        return later(delete_replicated(req.topic))

    def topic_list(_: Any) -> list[TopicInfo]:
        return [admin.topic_info(t) for t in topics.list()]

    def topic_describe(req: TopicName) -> TopicInfo:
        return admin.topic_info(topics.get(req.topic))

    def send(req: SendRequest) -> SendReceipt | Deferred:
        if req.idempotency_key is not None:
            return later(_first(producer.publish_deduplicated((req,))))
        receipts, durable = producer.publish((req,))
        return receipts[0] if durable is None else Deferred(durable, receipts[0], shared=True)

    def send_batch(req: SendBatchRequest) -> SendBatchResponse | Deferred:
        if not 1 <= len(req.messages) <= MAX_BATCH_MESSAGES:
            raise InvalidArgument(f"a batch holds 1..{MAX_BATCH_MESSAGES} messages")
        if any(r.idempotency_key is not None for r in req.messages):
            return later(_batch(producer.publish_deduplicated(req.messages)))
        receipts, durable = producer.publish(req.messages)
        answer = SendBatchResponse(receipts)
        return answer if durable is None else Deferred(durable, answer, shared=True)

    def heartbeat(req: HeartbeatRequest) -> Deferred:
        return later(consumer.heartbeat(req))

    def pull(req: PullRequest) -> Deferred:
        return later(consumer.pull(req))

    def ack(req: AckRequest) -> Deferred:
        return later(_empty(consumer.ack(req)))

    def nack(req: NackRequest) -> Deferred:
        return later(retry.nack(req))

    def dlq_list(req: DlqRequest) -> Deferred:
        return later(retry.list_dlq(req.group, req.max_messages))

    def dlq_redrive(req: DlqRequest) -> Deferred:
        return later(retry.redrive(req.group, req.max_messages))

    def offsets(req: GroupsRequest) -> GroupsResponse:
        return GroupsResponse(admin.groups(req.group or None, req.topic or None))

    def leave(req: LeaveRequest) -> Deferred:
        return later(_empty(consumer.leave(req)))

    # PREPARE and END_TX answer at once when they can (``*_nowait``: the answer, and the group
    # commit it waits for) and only as a task when they must wait or read first.
    def end_nowait(req: TxEndRequest) -> Any:
        return tx.end_nowait(req.tx_id, _decision(req), Resolver.PRODUCER)

    async def end(req: TxEndRequest) -> TxEndResponse:
        return await tx.end(req.tx_id, _decision(req), Resolver.PRODUCER)

    async def resolve(req: TxResolveRequest) -> TxEndResponse:
        if req.action == "resume":
            return await tx.resume(req.tx_id)
        try:
            decision = Decision(req.action)
        except ValueError as e:
            raise InvalidArgument("action must be commit, rollback or resume") from e
        return await tx.end(req.tx_id, decision, Resolver.OPERATOR, "resolved by an operator")

    now: dict[int, Any] = {Opcode.TX_PREPARE: tx.prepare_nowait, Opcode.TX_END: end_nowait}
    slow: dict[int, Any] = {
        Opcode.TX_PREPARE: tx.prepare,
        Opcode.TX_END: end,
        Opcode.TX_RESOLVE: resolve,
    }
    if tracing_on():  # asked once, at start: with tracing off the handlers are untouched
        spans.trace_handlers(now, tx, direct=True)
        spans.trace_handlers(slow, tx)
    prepare_now, prepare_slow = now[Opcode.TX_PREPARE], slow[Opcode.TX_PREPARE]
    end_now, end_slow = now[Opcode.TX_END], slow[Opcode.TX_END]
    resolve_slow = slow[Opcode.TX_RESOLVE]

    def tx_prepare(req: TxPrepareRequest) -> Any:
        got = prepare_now(req)
        return later(prepare_slow(req)) if got is None else _held(got)

    def tx_end(req: TxEndRequest) -> Any:
        got = end_now(req)
        return later(end_slow(req)) if got is None else _held(got)

    def tx_resolve(req: TxResolveRequest) -> Deferred:
        return later(resolve_slow(req))

    def tx_list(req: TxListRequest) -> TxListResponse:
        found = tx.listing(req.state, req.topic)
        limit = max(1, min(req.limit, 10_000))
        return TxListResponse([tx.info(t) for t in found[:limit]], len(found))

    def tx_show(req: TxId) -> TxInfo:
        return tx.info(tx.get(req.tx_id))

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
    if slaves is not None:
        handlers[Opcode.REPL_FETCH] = slaves.handle
    return handlers


def _held(got: tuple[Any, asyncio.Future[None] | None]) -> Any:
    """The coordinator's answer as a handler's: held until its group commit is durable, as a
    send's receipt is (one callback per group commit and connection, not a future each)."""
    answer, durable = got
    return answer if durable is None else Deferred(durable, answer, shared=True)


async def _empty(done: Awaitable[object]) -> Empty:
    await done
    return Empty()


async def _first(receipts: Awaitable[list[SendReceipt]]) -> SendReceipt:
    return (await receipts)[0]


async def _batch(receipts: Awaitable[list[SendReceipt]]) -> SendBatchResponse:
    return SendBatchResponse(await receipts)


def _decision(req: TxEndRequest) -> Decision:
    try:
        return Decision(req.decision)
    except ValueError as e:
        raise InvalidArgument("decision must be commit or rollback") from e
