"""One trace across processes, as an operator sees it in Jaeger: a real broker, examples/shop's
orders service (``@transactional``, its check-back endpoint, an outbox relay) and billing
service (a subscriber) as separate processes, each exporting OTLP over HTTP to a receiver this
test runs. The first order's END_TX is dropped (``TXB_FAULTS=drop_end_tx=@1``: the service
lives on, so its spans leave), so the broker back-checks it:

    orders   send orders (PRODUCER)
    broker   ├── prepare orders (SERVER)
    broker   ├── check orders-svc (CLIENT)
    orders   │   ├── check orders-svc (SERVER; under FastAPI's POST /txb/check where it traces)
    broker   │   └── commit orders (INTERNAL, resolved by the check)
    orders   ├── send audit (PRODUCER, the outbox relay): its message's consumers continue it
    billing  └── process orders (CONSUMER)

and the second order's END_TX arrives: ``commit orders`` (SERVER, resolved by the producer).
With tracing off in every process (three ways of saying so) the same flow works and the
receiver gets nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tracing.otlp import OtlpReceiver, Received
from tests.tracing.stack import GROUP, Stack
from txbroker_sdk import Client, Consumer

ORDERS = ("checked", "ended")  # the first one's END_TX is dropped: the back-check commits it
WAIT_S = 60.0
# Exported within 0.1 s of ending, so the test waits for spans, not for a batch timer.
OTEL_ON = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_TRACES_SAMPLER": "always_on"}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


@contextlib.contextmanager
def _running(stack: Stack) -> Iterator[Stack]:
    try:
        yield stack.start()
    finally:
        codes = stack.stop()
    # Each process stopped on its SIGTERM (its lifespan flushed its spans): none left running.
    assert all(code in (0, -signal.SIGTERM) for code in codes.values()), (codes, stack.logs())


async def _place(stack: Stack, order_id: str) -> None:
    assert stack.orders is not None
    order = {"id": order_id, "item": "lamp", "amount_cents": 1999}
    async with httpx.AsyncClient(timeout=30) as http:
        res = await http.post(f"{stack.orders.url}/orders", json=order)
    assert res.status_code == 201, (res.text, stack.logs())


async def _consume(url: str, topic: str, n: int) -> list[Any]:
    """The first ``n`` messages of ``topic``, read by a group of the test's own."""
    got: list[Any] = []
    async with Client(url) as client, Consumer(client, f"trace-test-{topic}", topic) as consumer:
        async with asyncio.timeout(WAIT_S):
            while len(got) < n:
                for msg in await consumer.fetch(timeout_ms=1000):
                    got.append(msg.msg)
                    msg.ack()
    return got


async def _billed(stack: Stack, order_id: str) -> None:
    assert stack.billing is not None
    url = f"{stack.billing.url}/invoices/{order_id}"
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(int(WAIT_S * 10)):
            if (await http.get(url)).json():
                return
            await asyncio.sleep(0.1)  # polling another process's database, bounded
    raise AssertionError(f"{order_id} not billed within {WAIT_S} s:\n{stack.logs()}")


def _one(spans: list[Received], **match: Any) -> Received:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, found, spans)
    return found[0]


def _by_tx(spans: list[Received], name: str, kind: str, tx_id: str) -> Received:
    found = [
        s
        for s in spans
        if s.name == name and s.kind == kind and s.attributes.get("txbroker.tx.id") == tx_id
    ]
    assert len(found) == 1, (name, kind, tx_id, spans)
    return found[0]


def _complete(spans: list[Received]) -> bool:
    """Every span the flow makes has arrived (the processes still run)."""
    names = [(s.service, s.name) for s in spans]
    return (
        names.count(("billing", "process orders")) == len(ORDERS)
        and names.count(("orders", "send audit")) == len(ORDERS)
        and ("orders", f"check {GROUP}") in names
        and names.count(("txbroker-broker", "commit orders")) == len(ORDERS)
    )


async def test_one_trace_from_the_producer_through_a_back_check_to_the_consumer(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **OTEL_ON}
    stack = Stack(
        tmp_path,
        broker_env=otlp,  # no OTEL_SERVICE_NAME: the broker names itself txbroker-broker
        orders_env={**otlp, "OTEL_SERVICE_NAME": "orders", "TXB_FAULTS": "drop_end_tx=@1"},
        billing_env={**otlp, "OTEL_SERVICE_NAME": "billing"},
    )
    with _running(stack) as running:
        for order_id in ORDERS:
            await _place(running, order_id)
        audit = await _consume(running.broker.url, "audit", len(ORDERS))
        complete = await asyncio.to_thread(receiver.wait_for, _complete, WAIT_S)
        assert complete, "\n".join([*map(repr, receiver.spans), running.logs()])
    spans = list(receiver.spans)  # all: each process flushed what was left as it stopped

    # The back-checked transaction: its one check names it.
    check = _one(spans, service="txbroker-broker", name=f"check {GROUP}", kind="CLIENT")
    tx_id = check.attributes["txbroker.tx.id"]
    send = _by_tx(spans, "send orders", "PRODUCER", tx_id)
    assert send.service == "orders"
    prepare = _by_tx(spans, "prepare orders", "SERVER", tx_id)
    # The service's SERVER span of the check: the endpoint's own, or, where the framework traces
    # requests (FastAPI does, with a provider set), the framework's, the endpoint's under it.
    http = _one(spans, service="orders", kind="SERVER", parent_id=check.span_id)
    served = _one(spans, service="orders", name=f"check {GROUP}")
    assert served.span_id == http.span_id or (
        served.kind == "INTERNAL" and served.parent_id == http.span_id
    ), (served, http)
    commit = _by_tx(spans, "commit orders", "INTERNAL", tx_id)
    # The consumer's parent: the producer's span, named by the message's traceparent.
    process = _one(spans, name="process orders", parent_id=send.span_id)
    relay = _one(spans, name="send audit", parent_id=send.span_id)
    chain = [send, prepare, check, http, served, commit, process, relay]
    assert {s.trace_id for s in chain} == {send.trace_id}, chain
    assert prepare.service == "txbroker-broker" and prepare.parent_id == send.span_id
    assert check.parent_id == send.span_id
    assert commit.service == "txbroker-broker" and commit.parent_id == check.span_id
    assert process.service == "billing" and process.kind == "CONSUMER"
    assert relay.service == "orders" and relay.kind == "PRODUCER"
    assert not any(s.error for s in chain), chain

    # Semantic conventions, and txbroker's own attributes.
    message_id = prepare.attributes["messaging.message.id"]
    for span in (send, prepare, check, served, commit, process, relay):
        assert span.attributes["messaging.system"] == "txbroker", span
    for span in (send, prepare, check, served, commit, process):
        assert span.attributes["messaging.destination.name"] == "orders", span
    for span in (send, prepare, check, served, commit):
        assert span.attributes["txbroker.producer.group"] == GROUP, span
    assert send.attributes["messaging.operation.type"] == "send"
    assert send.attributes["txbroker.tx.phase"] == "commit"
    assert prepare.attributes["messaging.operation.type"] == "send"
    assert prepare.attributes["messaging.operation.name"] == "prepare"
    assert prepare.attributes["txbroker.tx.phase"] == "prepare"
    assert check.attributes["txbroker.tx.phase"] == "check"
    assert check.attributes["txbroker.check.status"] == "COMMIT"
    assert check.attributes["txbroker.check.outcome"] == "answered"
    assert check.attributes["http.request.method"] == "POST"
    assert check.attributes["http.response.status_code"] == 200
    assert check.attributes["url.full"] == f"{stack.orders and stack.orders.url}/txb/check"
    assert check.attributes["messaging.message.id"] == message_id
    assert http.attributes["http.request.method"] == "POST"
    assert http.attributes["http.response.status_code"] == 200
    assert served.attributes["txbroker.tx.id"] == tx_id
    assert served.attributes["txbroker.check.status"] == "COMMIT"
    assert served.attributes["messaging.message.id"] == message_id
    assert commit.attributes["messaging.operation.type"] == "settle"
    assert commit.attributes["txbroker.tx.phase"] == "commit"
    assert commit.attributes["txbroker.tx.resolved_by"] == "check"
    assert process.attributes["messaging.operation.type"] == "process"
    assert process.attributes["messaging.consumer.group.name"] == "billing"
    assert process.attributes["messaging.message.id"] == message_id
    assert relay.attributes["messaging.operation.type"] == "send"
    assert relay.attributes["messaging.destination.name"] == "audit"

    # The other transaction ended by its END_TX: a SERVER span in the producer's trace.
    (other,) = [
        s for s in spans if s.name == "send orders" and s.attributes["txbroker.tx.id"] != tx_id
    ]
    ended = _by_tx(spans, "commit orders", "SERVER", other.attributes["txbroker.tx.id"])
    assert ended.parent_id == other.span_id and ended.trace_id == other.trace_id
    assert ended.attributes["txbroker.tx.resolved_by"] == "producer"
    assert ended.attributes["messaging.operation.type"] == "settle"

    # The outbox's messages carry the relay's span: their consumers continue from it.
    relays = {s.span_id: s for s in spans if s.name == "send audit"}
    for msg in audit:
        _version, trace_id, span_id, _flags = msg.headers["traceparent"].split("-")
        assert relays[span_id].trace_id == trace_id
        assert relays[span_id].attributes["messaging.message.id"] == msg.message_id
        assert relays[span_id].parent_id in {send.span_id, other.span_id}
    assert {json.loads(m.body)["id"] for m in audit} == set(ORDERS)


async def test_with_tracing_off_nothing_is_exported_and_everything_works(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    # The endpoint is set where it could mislead: would a process export anyway?
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **OTEL_ON}
    stack = Stack(
        tmp_path,
        broker_env={**endpoint, "OTEL_SDK_DISABLED": "true"},
        orders_env={**endpoint, "OTEL_TRACES_EXPORTER": "none", "TXB_FAULTS": "drop_end_tx=@1"},
        billing_env={},  # nothing configured at all
    )
    with _running(stack) as running:
        for order_id in ORDERS:
            await _place(running, order_id)
        orders = await _consume(running.broker.url, "orders", len(ORDERS))
        audit = await _consume(running.broker.url, "audit", len(ORDERS))
        for order_id in ORDERS:  # billed, the back-checked one too
            await _billed(running, order_id)
    assert {json.loads(m.body)["id"] for m in orders} == set(ORDERS)
    assert not any("traceparent" in m.headers for m in [*orders, *audit])
    # Every process has exited, having flushed whatever it had: nothing ever came.
    assert receiver.requests == 0 and receiver.spans == []
