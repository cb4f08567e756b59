"""@transactional's PRODUCER span and a subscriber's CONSUMER span: a real broker and database.
The producer span's traceparent travels with the PREPARE, the broker hands it to consumers as
the message's ``traceparent`` header, and the ``process`` span is its child. With tracing off no
traceparent is sent and no span recorded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tests.tx.conftest import GROUP, tx_broker
from txbroker.protocol.frames import Opcode
from txbroker.runtime import tracing
from txbroker_sdk import Client, Consumer
from txbroker_sdk.consumer import ConsumedMessage
from txbroker_sdk.subscriber import apply_once
from txbroker_sdk.transactional import TxPublisher

ORDERS = sa.Table("orders", sa.MetaData(), sa.Column("id", sa.String(32), primary_key=True))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)


async def _noop(session: AsyncSession, msg: ConsumedMessage) -> None:
    pass


async def _boom(session: AsyncSession, msg: ConsumedMessage) -> None:
    raise ValueError("a handler that fails")


async def _place(engine: AsyncEngine, tmp_path: Path, sent: list[Any], handled: list[Any]) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(ORDERS.metadata.create_all)
    broker = tx_broker(tmp_path / "broker").start()
    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=1)
            submit = c.submit

            def spy(opcode: Opcode, body: Any, **kw: Any) -> Any:
                if opcode == Opcode.TX_PREPARE:
                    sent.append(body)
                return submit(opcode, body, **kw)

            c.submit = spy  # type: ignore[method-assign]
            pub = TxPublisher(
                c, async_sessionmaker(engine), producer_group=GROUP, check_url="http://x/txb"
            )

            @pub.transactional("orders")
            async def place(session: AsyncSession, oid: str) -> dict[str, str]:
                await session.execute(ORDERS.insert().values(id=oid))
                return {"id": oid}

            await place("o1")
            await pub.flush(10)
            async with Consumer(c, "billing", "orders") as consumer:
                (msg,) = await consumer.fetch(timeout_ms=5000)
                handled.append(msg.msg)
                assert await apply_once(async_sessionmaker(engine), "billing", msg, _noop)
                with pytest.raises(ValueError):
                    await apply_once(async_sessionmaker(engine), "broken", msg, _boom)
                msg.ack()
    finally:
        broker.stop()


async def test_send_span_is_a_producer_span_with_semconv_attributes(
    engine: AsyncEngine, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    sent: list[Any] = []
    handled: list[Any] = []
    await _place(engine, tmp_path, sent, handled)
    span, process, failed = sorted(
        spans.get_finished_spans(), key=lambda s: (s.kind != SpanKind.PRODUCER, s.start_time)
    )
    assert span.name == "send orders" and span.kind == SpanKind.PRODUCER
    attrs = dict(span.attributes or {})
    assert attrs["messaging.system"] == "txbroker"
    assert attrs["messaging.destination.name"] == "orders"
    assert attrs["messaging.operation.type"] == "send"
    assert attrs["txbroker.producer.group"] == GROUP
    assert attrs["txbroker.tx.phase"] == "commit"
    (prepare,) = sent
    assert attrs["txbroker.tx.id"] == prepare.tx_id
    ctx = span.get_span_context()
    assert prepare.traceparent.startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
    (pulled,) = handled
    assert pulled.headers["traceparent"] == prepare.traceparent
    assert process.name == "process orders" and process.kind == SpanKind.CONSUMER
    assert process.parent is not None and process.parent.span_id == ctx.span_id
    assert process.get_span_context().trace_id == ctx.trace_id
    pattrs = dict(process.attributes or {})
    assert pattrs["messaging.operation.type"] == "process"
    assert pattrs["messaging.consumer.group.name"] == "billing"
    assert pattrs["messaging.message.id"] == pulled.message_id
    assert pattrs["messaging.destination.name"] == "orders"
    assert pattrs["messaging.destination.partition.id"] == "0"
    assert "error.type" not in pattrs
    # A handler that raises: its span says what failed.
    fattrs = dict(failed.attributes or {})
    assert fattrs["messaging.consumer.group.name"] == "broken"
    assert fattrs["error.type"] == "ValueError"
    assert failed.status.status_code == StatusCode.ERROR


async def test_tracing_off_sends_no_traceparent(engine: AsyncEngine, tmp_path: Path) -> None:
    assert not tracing.tracing_on()
    sent: list[Any] = []
    handled: list[Any] = []
    await _place(engine, tmp_path, sent, handled)
    assert [p.traceparent for p in sent] == [None]
    assert "traceparent" not in handled[0].headers
