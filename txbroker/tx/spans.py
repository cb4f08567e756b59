"""The broker's spans of a transaction (docs/tracing.md draws the whole trace).

``prepare {topic}`` and ``commit|rollback {topic}`` (SERVER) for PREPARE and END_TX or an
operator's decision, ``check {producer group}`` (CLIENT) for a back-check's HTTP call, and
``commit|rollback {topic}`` (INTERNAL) for a check's answer applied (:func:`trace_handlers`
gives the parents). Only when tracing is on: ``handlers.py`` asks once, at start, and wraps the
transactional handlers only then, so with no SDK configured a PREPARE or an END_TX runs no
tracing code at all. The back-checker asks per check (a check is an HTTP call: a boolean is
noise).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final
from urllib.parse import urlsplit

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from txbroker.errors import StoreFailed, TxbError
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import (
    TxEndRequest,
    TxEndResponse,
    TxPrepareRequest,
    TxPrepareResponse,
    TxResolveRequest,
)
from txbroker.runtime import tracing as tr
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.state import Tx
from txbroker_checkback import CheckOutcome, CheckResult

__all__ = ["checked", "resolving", "start_check", "trace_handlers"]

# Span names carry a bounded word, never what a client typed: anything else is "end".
_DECISIONS: Final = frozenset({"commit", "rollback"})
_ACTIONS: Final = frozenset({"commit", "rollback", "resume"})

Start = Callable[[Any, int], Span]  # (request, start time in ns) -> the started span
Done = Callable[[Span, Any], None]  # (span, answer): the answer's attributes


def _tracer() -> Tracer:
    return tr.tracer(__name__)


def _fail(span: Span, e: BaseException) -> None:
    span.set_attribute(tr.ERROR_TYPE, e.code if isinstance(e, TxbError) else type(e).__name__)
    span.set_status(Status(StatusCode.ERROR, str(e)[:200]))


def _tx_attributes(tx: Tx, operation: str) -> dict[str, AttributeValue]:
    return {
        tr.SYSTEM: tr.MESSAGING_SYSTEM,
        tr.DESTINATION: tx.topic,
        tr.OPERATION_NAME: operation,
        tr.MESSAGE_ID: tx.message_id,
        tr.PARTITION: str(tx.queue_id),
        tr.TX_ID: tx.tx_id,
        tr.PRODUCER_GROUP: tx.producer_group,
    }


# --- PREPARE, END_TX and an operator's resolution (the broker's request handlers) ---


def _start_prepare(req: TxPrepareRequest, start_ns: int) -> Span:
    attrs: dict[str, AttributeValue] = {
        tr.SYSTEM: tr.MESSAGING_SYSTEM,
        tr.DESTINATION: req.topic,
        tr.OPERATION_TYPE: "send",  # the half message is stored: the broker's side of a send
        tr.OPERATION_NAME: "prepare",
        tr.TX_PHASE: "prepare",
        tr.PRODUCER_GROUP: req.producer_group,
    }
    if req.tx_id:
        attrs[tr.TX_ID] = req.tx_id
    return _tracer().start_span(
        f"prepare {req.topic}",
        context=tr.context_from(req.traceparent),
        kind=SpanKind.SERVER,
        attributes=attrs,
        start_time=start_ns,
    )


def _prepared(span: Span, answer: TxPrepareResponse) -> None:
    span.set_attribute(tr.TX_ID, answer.tx_id)
    span.set_attribute(tr.MESSAGE_ID, answer.message_id)


def _start_end(
    coord: TxCoordinator,
    tx_id: str,
    action: str,
    by: str,
    start_ns: int,
    kind: SpanKind = SpanKind.SERVER,
    parent: Span | None = None,
) -> Span:
    """The span of a decision on ``tx_id``, in the trace its half message kept."""
    tx = coord.find(tx_id)
    if tx is None:  # never prepared, or ended long ago: no kept traceparent, no topic
        attrs: dict[str, AttributeValue] = {tr.SYSTEM: tr.MESSAGING_SYSTEM, tr.TX_ID: tx_id}
        name, traceparent = action, None
    else:
        attrs = _tx_attributes(tx, action)
        name, traceparent = f"{action} {tx.topic}", tx.traceparent
    attrs[tr.OPERATION_NAME] = action
    attrs[tr.TX_PHASE] = action
    attrs[tr.TX_RESOLVED_BY] = by
    if action in _DECISIONS:
        attrs[tr.OPERATION_TYPE] = "settle"  # the message is made visible, or discarded
    context = tr.context_in(parent) if parent is not None else tr.context_from(traceparent)
    return _tracer().start_span(
        name, context=context, kind=kind, attributes=attrs, start_time=start_ns
    )


def _ended(span: Span, answer: TxEndResponse) -> None:
    if answer.duplicate:
        span.set_attribute(tr.TX_DUPLICATE, True)


def trace_handlers(handlers: dict[int, Any], coord: TxCoordinator, *, direct: bool = False) -> None:
    """Wrap the transactional handlers in ``handlers`` (the task handlers, or with ``direct``
    the task-free ones) so each request is a span. Called at start, when tracing is on.

    ::

        prepare {topic}            SERVER    a PREPARE; child of the producer's span
        commit|rollback {topic}    SERVER    an END_TX, or an operator's decision; child of the
                                             span whose traceparent the half message kept
        check {producer group}     CLIENT    a back-check's HTTP call; child of that same span,
                                             and the parent the service's endpoint span names
                                             (its traceparent goes in the request's header)
        commit|rollback {topic}    INTERNAL  a check's answer applied; child of the check
    """

    def end(req: TxEndRequest, start_ns: int) -> Span:
        action = req.decision if req.decision in _DECISIONS else "end"
        return _start_end(coord, req.tx_id, action, "producer", start_ns)

    def resolve(req: TxResolveRequest, start_ns: int) -> Span:
        action = req.action if req.action in _ACTIONS else "end"
        return _start_end(coord, req.tx_id, action, "operator", start_ns)

    wrap = _direct if direct else _async
    for opcode, start, done in (
        (Opcode.TX_PREPARE, _start_prepare, _prepared),
        (Opcode.TX_END, end, _ended),
        (Opcode.TX_RESOLVE, resolve, _ended),
    ):
        if opcode in handlers:
            handlers[opcode] = wrap(handlers[opcode], start, done)


def _async(
    fn: Callable[[Any], Awaitable[Any]], start: Start, done: Done
) -> Callable[[Any], Awaitable[Any]]:
    @functools.wraps(fn)
    async def run(req: Any) -> Any:
        span = start(req, time.time_ns())
        try:
            answer = await fn(req)
        except asyncio.CancelledError:
            span.end()  # the client went away; what it asked is settled without it
            raise
        except Exception as e:
            _fail(span, e)
            span.end()
            raise
        done(span, answer)
        span.end()
        return answer

    return run


def _direct(fn: Callable[[Any], Any], start: Start, done: Done) -> Callable[[Any], Any]:
    """A direct handler answers with the answer and the group commit it waits for (None: at
    once), or with None ("the task handler answers"): the span starts when the request came
    and ends with its answer, and a None makes no span (the task handler makes it)."""

    @functools.wraps(fn)
    def run(req: Any) -> Any:
        start_ns = time.time_ns()
        try:
            answer = fn(req)
        except Exception as e:
            span = start(req, start_ns)
            _fail(span, e)
            span.end()
            raise
        if answer is None:
            return None
        span = start(req, start_ns)
        body, durable = answer
        if durable is not None:
            durable.add_done_callback(functools.partial(_settled, span, done, body))
        else:
            done(span, body)
            span.end()
        return answer

    return run


def _settled(span: Span, done: Done, body: Any, durable: asyncio.Future[None]) -> None:
    if durable.cancelled():
        _fail(span, StoreFailed("the group commit was cancelled"))
    elif (e := durable.exception()) is not None:
        _fail(span, e)
    else:
        done(span, body)
    span.end()


# --- back-checks (txbroker.tx.checker) ---


def start_check(tx: Tx) -> Span:
    """The CLIENT span of one back-check; its traceparent goes in the request's header."""
    url = urlsplit(tx.check_url)
    attrs = _tx_attributes(tx, "check")
    attrs[tr.TX_PHASE] = "check"
    attrs[tr.CHECK_COUNT] = tx.checks
    attrs[tr.HTTP_METHOD] = "POST"
    attrs[tr.URL_FULL] = tx.check_url
    attrs[tr.SERVER_ADDRESS] = url.hostname or ""
    attrs[tr.SERVER_PORT] = url.port or (443 if url.scheme == "https" else 80)
    return _tracer().start_span(
        f"check {tx.producer_group}",
        context=tr.context_from(tx.traceparent),
        kind=SpanKind.CLIENT,
        attributes=attrs,
    )


def checked(span: Span, res: CheckResult) -> None:
    """End the check's span with what the service answered (or why it did not)."""
    span.set_attribute(tr.CHECK_STATUS, res.status.value)
    span.set_attribute(tr.CHECK_OUTCOME, res.outcome.value)
    if res.http_status is not None:
        span.set_attribute(tr.HTTP_STATUS, res.http_status)
    if res.outcome is not CheckOutcome.ANSWERED:
        # HTTP semconv: the status code when there was one, else what went wrong.
        code = res.http_status
        error = str(code) if code is not None and code >= 400 else res.outcome.value
        span.set_attribute(tr.ERROR_TYPE, error)
        span.set_status(Status(StatusCode.ERROR, res.reason[:200]))
    span.end()


@contextlib.contextmanager
def resolving(coord: TxCoordinator, tx: Tx, decision: str, check: Span | None) -> Iterator[None]:
    """An INTERNAL span, the check's child, around applying its answer (none without one)."""
    if check is None:
        yield
        return
    span = _start_end(
        coord, tx.tx_id, decision, "check", time.time_ns(), SpanKind.INTERNAL, parent=check
    )
    try:
        yield
    except Exception as e:
        _fail(span, e)
        raise
    finally:
        span.end()
