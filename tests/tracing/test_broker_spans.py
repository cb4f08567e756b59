"""The broker's transaction spans (``txbroker.tx.spans``) around the real coordinator's handlers,
in process (a broker server on a temporary directory, sync flush), recorded by an in-memory
provider: the direct handlers' spans end with the group commit's answer and sit under the
producer's span; decisions land in the transaction's trace; failures carry error.type; and
the back-check's CLIENT span says why a check failed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from txbroker.errors import TransactionConflict, TransactionNotFound
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import TxEndRequest, TxPrepareRequest, TxResolveRequest
from txbroker.runtime import tracing
from txbroker.server.app import BrokerServer
from txbroker.server.config import ServerConfig
from txbroker.store.config import FlushMode
from txbroker.tx import spans
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.state import Decision, Resolver
from txbroker_checkback import CheckOutcome, CheckResult, CheckStatus

GROUP = "orders-svc"
URL = "http://127.0.0.1:9/txb/check"  # never called: nothing here waits for a back-check


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[TxCoordinator]:
    config = ServerConfig(
        data_dir=tmp_path / "data",
        port=0,
        http_port=0,
        flush=FlushMode.SYNC,
        tx_secrets={GROUP: "s3cret"},
        tx_timeout_ms=600_000,
    )
    server = BrokerServer(config)
    await server.start()
    assert server.tx is not None
    server.topics.create("orders", 1)
    try:
        yield server.tx
    finally:
        await server.stop()


def _handlers(coord: TxCoordinator) -> tuple[dict[int, Any], dict[int, Any]]:
    """The transactional handlers as handlers.py builds them, traced."""

    async def end(req: TxEndRequest) -> Any:
        return await coord.end(req.tx_id, Decision(req.decision), Resolver.PRODUCER)

    async def resolve(req: TxResolveRequest) -> Any:
        return await coord.end(req.tx_id, Decision(req.action), Resolver.OPERATOR, "by hand")

    def end_nowait(req: TxEndRequest) -> Any:
        return coord.end_nowait(req.tx_id, Decision(req.decision), Resolver.PRODUCER)

    tasks: dict[int, Any] = {
        Opcode.TX_PREPARE: coord.prepare,
        Opcode.TX_END: end,
        Opcode.TX_RESOLVE: resolve,
    }
    direct: dict[int, Any] = {Opcode.TX_PREPARE: coord.prepare_nowait, Opcode.TX_END: end_nowait}
    spans.trace_handlers(tasks, coord)
    spans.trace_handlers(direct, coord, direct=True)
    return tasks, direct


def _producer_span() -> tuple[str, int]:
    """A producer's span as a service would send it: its traceparent, and its span id."""
    with tracing.tracer("test").start_as_current_span("send orders") as span:
        tp = tracing.traceparent()
    assert tp is not None
    return tp, span.get_span_context().span_id


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def _answer(got: Any) -> Any:
    """A direct handler's answer once its group commit is durable (the span's callback on the
    group commit was registered before this waiter's, so it has run)."""
    answer, durable = got
    if durable is not None:
        await asyncio.wait_for(asyncio.shield(durable), 10)
    return answer


async def test_prepare_and_commit_spans_are_children_of_the_producers_span(
    coordinator: TxCoordinator, exporter: InMemorySpanExporter
) -> None:
    _, direct = _handlers(coordinator)
    tp, producer = _producer_span()
    req = TxPrepareRequest("orders", b"o-1", GROUP, URL, tx_id="tx-1", traceparent=tp)
    prepared = direct[Opcode.TX_PREPARE](req)
    assert isinstance(prepared[1], asyncio.Future)  # sync flush: the group commit answers
    assert _named(exporter, "prepare orders") == []  # open until the answer is durable
    answer = await _answer(prepared)
    (prepare,) = _named(exporter, "prepare orders")
    assert prepare.kind == SpanKind.SERVER
    assert prepare.parent is not None and prepare.parent.span_id == producer
    attrs = dict(prepare.attributes or {})
    assert attrs["messaging.system"] == "txbroker"
    assert attrs["messaging.destination.name"] == "orders"
    assert attrs["messaging.operation.type"] == "send"
    assert attrs["messaging.operation.name"] == "prepare"
    assert attrs["messaging.message.id"] == answer.message_id
    assert attrs["txbroker.tx.id"] == "tx-1"
    assert attrs["txbroker.tx.phase"] == "prepare"
    assert attrs["txbroker.producer.group"] == GROUP

    await _answer(direct[Opcode.TX_END](TxEndRequest("tx-1", "commit")))
    (commit,) = _named(exporter, "commit orders")
    assert commit.kind == SpanKind.SERVER
    assert commit.parent is not None and commit.parent.span_id == producer
    assert commit.context.trace_id == prepare.context.trace_id
    attrs = dict(commit.attributes or {})
    assert attrs["messaging.operation.type"] == "settle"
    assert attrs["messaging.message.id"] == answer.message_id
    assert attrs["txbroker.tx.phase"] == "commit"
    assert attrs["txbroker.tx.resolved_by"] == "producer"
    assert "txbroker.tx.duplicate" not in attrs

    # The same decision again: answered at once, marked a duplicate.
    await _answer(direct[Opcode.TX_END](TxEndRequest("tx-1", "commit")))
    assert dict(_named(exporter, "commit orders")[1].attributes or {})["txbroker.tx.duplicate"]
    # The other decision: refused, and the span says so.
    with pytest.raises(TransactionConflict):
        direct[Opcode.TX_END](TxEndRequest("tx-1", "rollback"))
    (refused,) = _named(exporter, "rollback orders")
    assert refused.status.status_code == StatusCode.ERROR
    assert dict(refused.attributes or {})["error.type"] == "TRANSACTION_CONFLICT"
    assert refused.parent is not None and refused.parent.span_id == producer


async def test_the_task_handlers_and_an_operators_resolution(
    coordinator: TxCoordinator, exporter: InMemorySpanExporter
) -> None:
    tasks, _ = _handlers(coordinator)
    tp, producer = _producer_span()
    req = TxPrepareRequest("orders", b"o-2", GROUP, URL, tx_id="tx-2", traceparent=tp)
    await tasks[Opcode.TX_PREPARE](req)
    await tasks[Opcode.TX_RESOLVE](TxResolveRequest("tx-2", "rollback"))
    (prepare,) = _named(exporter, "prepare orders")
    (rollback,) = _named(exporter, "rollback orders")
    assert prepare.parent is not None and prepare.parent.span_id == producer
    assert rollback.parent is not None and rollback.parent.span_id == producer
    assert dict(rollback.attributes or {})["txbroker.tx.resolved_by"] == "operator"
    # A transaction the broker never saw: no kept traceparent, so a root span, failed.
    with pytest.raises(TransactionNotFound):
        await tasks[Opcode.TX_END](TxEndRequest("nope", "commit"))
    (unknown,) = _named(exporter, "commit")
    assert unknown.parent is None
    assert dict(unknown.attributes or {})["error.type"] == "TRANSACTION_NOT_FOUND"


@pytest.mark.parametrize(
    ("result", "error"),
    [
        (CheckResult(CheckStatus.COMMIT, CheckOutcome.ANSWERED, "answered", 0.01, 200), None),
        (CheckResult(CheckStatus.UNKNOWN, CheckOutcome.BAD_ANSWER, "HTTP 503", 0.01, 503), "503"),
        (CheckResult(CheckStatus.UNKNOWN, CheckOutcome.TIMEOUT, "no answer", 3.0), "timeout"),
        (CheckResult(CheckStatus.UNKNOWN, CheckOutcome.UNREACHABLE, "refused", 0.0), "unreachable"),
    ],
)
async def test_a_checks_client_span_says_how_it_went(
    coordinator: TxCoordinator,
    exporter: InMemorySpanExporter,
    result: CheckResult,
    error: str | None,
) -> None:
    tp, producer = _producer_span()
    req = TxPrepareRequest("orders", b"o-3", GROUP, URL, tx_id="tx-3", traceparent=tp)
    await coordinator.prepare(req)
    tx = coordinator.get("tx-3")
    span = spans.start_check(tx)
    spans.checked(span, result)
    (check,) = _named(exporter, f"check {GROUP}")
    assert check.kind == SpanKind.CLIENT
    assert check.parent is not None and check.parent.span_id == producer
    attrs = dict(check.attributes or {})
    assert attrs["url.full"] == URL
    assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", 9)
    assert attrs["txbroker.check.status"] == result.status.value
    assert attrs["txbroker.check.outcome"] == result.outcome.value
    assert attrs.get("http.response.status_code") == result.http_status
    assert attrs.get("error.type") == error
    assert (check.status.status_code == StatusCode.ERROR) == (error is not None)
    # Its answer applied: an INTERNAL span under the check.
    with spans.resolving(coordinator, tx, "commit", span):
        await coordinator.end("tx-3", Decision.COMMIT, Resolver.CHECK, "answered")
    (applied,) = _named(exporter, "commit orders")
    assert applied.kind == SpanKind.INTERNAL
    assert applied.parent is not None and applied.parent.span_id == check.context.span_id
    assert dict(applied.attributes or {})["txbroker.tx.resolved_by"] == "check"
