"""Publishing and two-phase messages over HTTP: JSON in, the TCP request path behind.

    POST /v1/topics/{topic}/messages            one message, or {"messages": [...]}: 201
    POST /v1/transactions                       prepare a half message: 201
    POST /v1/transactions/{tx_id}/commit        the producer's decision: 200
    POST /v1/transactions/{tx_id}/rollback

Each request is decoded into the TCP protocol's request (``SendRequest``, ``TxPrepareRequest``,
``TxEndRequest``), checked against the token's roles as a TCP request with that opcode is
(``access.py``), and handed to the broker through :func:`tcp_requests`: the same handler a TCP
connection calls for that opcode, so the same producer, transaction coordinator and
durability wait answer it, and a slave refuses it the same way. A write reaching a broker that
is not its group's master is answered ``307`` to the master's HTTP address when the broker
knows it (an elected group), otherwise ``503``.

``Idempotency-Key`` follows the IETF draft (draft-ietf-httpapi-idempotency-key-header): the
producer's deduplication by key answers a repeat with the original receipt; before that, a key
held by a request still in flight on this broker is ``409``, and a key stored with another
message (topic, body, key, tags or headers) is ``422``.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from txbroker.errors import TransactionConflict
from txbroker.protocol.frames import MAX_BATCH_MESSAGES, Opcode
from txbroker.protocol.messages import (
    SendBatchRequest,
    SendBatchResponse,
    SendReceipt,
    SendRequest,
    TxEndRequest,
    TxEndResponse,
    TxPrepareRequest,
    TxPrepareResponse,
)
from txbroker.runtime.httpdirect import DirectRequest
from txbroker.server.access import Access
from txbroker.server.connection import settle
from txbroker.server.delay import SCHEDULE_TOPIC
from txbroker.server.http.bodies import (
    decode,
    json_response,
    read_json,
    read_json_direct,
    undecodable,
)
from txbroker.server.http.guard import direct_route, guarded, principal, redirecting
from txbroker.server.http.problems import (
    BadRequest,
    Conflict,
    InvalidArgument,
)
from txbroker.server.http.types import (
    Encoding,
    PrepareTransaction,
    PublishBatch,
    PublishMessage,
    Receipt,
    Receipts,
)
from txbroker.server.producer import HEADER_PREFIX
from txbroker.server.role import Role
from txbroker.server.tokens import TokenTable
from txbroker.store import (
    PROP_KEYS,
    PROP_TAGS,
    PROP_TARGET_TOPIC,
    KeyKind,
    MessageStore,
    StoredMessage,
)
from txbroker.tx.state import Decision

__all__ = ["Messaging", "TcpRequest", "tcp_requests"]

# W3C Trace Context, version 00: kept with a half message only when it is well-formed (the
# spec says to ignore a malformed one rather than refuse the request).
TRACEPARENT: Final = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")

# An opcode and its request in, the TCP handler's answer out.
TcpRequest = Callable[[int, Any], Awaitable[Any]]
T = TypeVar("T")


def tcp_requests(handlers: Mapping[int, Callable[[Any], Any]], role: Role) -> TcpRequest:
    """The HTTP API's one way into the broker, as a TCP connection goes: the role's check (a
    slave refuses writes), then the handler for the opcode, then the answer settled to its body
    (docs/server.md, "Where a new front end plugs in")."""

    def call(opcode: int, req: Any) -> Awaitable[Any]:
        # Not a coroutine itself: the caller awaits settle's, one frame fewer on every request.
        role.check(opcode)
        return settle(handlers[opcode](req))

    return call


class Messaging:
    """The endpoints above; ``master_http``: the group master's HTTP base URL when this broker
    knows another broker is master (None otherwise)."""

    def __init__(
        self,
        broker: TcpRequest,
        access: Access,
        store: MessageStore,
        *,
        dedup_window_ms: int,
        master_http: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._broker = broker
        self._access = access
        self._store = store
        self._window_ms = dedup_window_ms
        self._master_http = master_http
        self._inflight: set[str] = set()  # idempotency keys of requests being answered

    def routes(self, tokens: TokenTable) -> list[BaseRoute]:
        def route(path: str, fn: Callable[[Request], Awaitable[Response]]) -> Route:
            return Route(path, guarded(self._redirecting(fn), tokens, role=None), methods=["POST"])

        return [
            # The API's hot path: the HTTP server answers it itself (runtime/httpdirect.py).
            direct_route("/v1/topics/{topic}/messages", self.publish, tokens, self._master_http),
            route("/v1/transactions", self.prepare),
            route("/v1/transactions/{tx_id}/commit", self.commit),
            route("/v1/transactions/{tx_id}/rollback", self.rollback),
        ]

    # --- endpoints ---

    async def publish(self, request: DirectRequest) -> Response:
        topic = request.params["topic"]
        # Every message goes to the path's topic: the role is checked before the body is read
        # (a batch needs what a single send does, on the same topic).
        self._access.check(principal(request), Opcode.SEND, SendRequest(topic, b""))
        raw = await read_json_direct(request)
        header_key = _idempotency_key(request.header(b"idempotency-key"))
        body = _decode_publish(raw)
        if isinstance(body, PublishBatch):
            messages = body.messages
            if header_key is not None:
                raise BadRequest(
                    "Idempotency-Key names a single message: give each message of a batch "
                    "its own idempotency_key"
                )
            if not 1 <= len(messages) <= MAX_BATCH_MESSAGES:
                raise InvalidArgument(f"a batch holds 1..{MAX_BATCH_MESSAGES} messages")
            reqs = [_send_request(topic, m, f"messages[{i}]") for i, m in enumerate(messages)]
        else:
            if header_key is not None and body.idempotency_key not in (None, header_key):
                raise BadRequest("the Idempotency-Key header and idempotency_key differ")
            reqs = [_send_request(topic, body, "body", header_key)]
        batch = isinstance(body, PublishBatch)
        held = self._claim(reqs)
        try:
            if held:
                await self._refuse_reused_keys(reqs)
            receipts = await self._publish(reqs, batch=batch)
        finally:
            self._inflight -= held
        if batch:
            return json_response(Receipts([_receipt(r) for r in receipts]), 201)
        return json_response(_receipt(receipts[0]), 201)

    async def prepare(self, request: Request) -> Response:
        p = decode(await read_json(request), PrepareTransaction)
        tp = request.headers.get("traceparent")
        req = TxPrepareRequest(
            p.topic,
            _body(p.body, p.encoding, "body"),
            p.producer_group,
            p.check_url,
            tx_id=p.tx_id,
            key=p.key,
            tags=p.tags,
            headers=p.headers,
            traceparent=tp if tp is not None and TRACEPARENT.fullmatch(tp) else None,
            timeout_ms=p.timeout_ms,
        )
        self._access.check(principal(request), Opcode.TX_PREPARE, req)
        answer = await self._ask(Opcode.TX_PREPARE, req, TxPrepareResponse)
        return json_response(answer, 201)

    async def commit(self, request: Request) -> Response:
        return await self._end(request, Decision.COMMIT)

    async def rollback(self, request: Request) -> Response:
        return await self._end(request, Decision.ROLLBACK)

    # --- the calls into the broker ---

    async def _publish(self, reqs: list[SendRequest], *, batch: bool) -> list[SendReceipt]:
        """A single message as a TCP SEND, a batch as a SEND_BATCH (all or nothing)."""
        if batch:
            answer = await self._broker(Opcode.SEND_BATCH, SendBatchRequest(reqs))
            assert isinstance(answer, SendBatchResponse), f"SEND_BATCH answered {answer!r}"
            return answer.receipts
        receipt = await self._broker(Opcode.SEND, reqs[0])
        assert isinstance(receipt, SendReceipt), f"SEND answered {receipt!r}"
        return [receipt]

    async def _end(self, request: Request, decision: Decision) -> Response:
        req = TxEndRequest(request.path_params["tx_id"], decision.value)
        self._access.check(principal(request), Opcode.TX_END, req)
        try:
            answer = await self._ask(Opcode.TX_END, req, TxEndResponse)
        except TransactionConflict as e:
            # Refused only because it ended the other way: that is the state it is in.
            other = Decision.ROLLBACK if decision is Decision.COMMIT else Decision.COMMIT
            raise Conflict(str(e), code=e.code, state=other.state.value) from e
        return json_response(answer, 200)

    async def _ask(self, opcode: int, req: Any, answer: type[T]) -> T:
        out = await self._broker(opcode, req)
        assert isinstance(out, answer), f"{Opcode(opcode).name} answered {type(out).__name__}"
        return out

    # --- idempotency keys ---

    def _claim(self, reqs: Sequence[SendRequest]) -> set[str]:
        """Hold the requests' idempotency keys while this request is answered (the caller lets
        go of what this returns); 409 if another request on this broker holds one."""
        mine: set[str] = set()
        for r in reqs:
            if r.idempotency_key is not None:
                mine.add(r.idempotency_key)
        if not mine:
            return mine
        busy = sorted(mine & self._inflight)
        if busy:
            raise Conflict(
                f"a request with Idempotency-Key {busy[0]!r} is still in flight: retry once it "
                "is answered",
                code="IDEMPOTENCY_KEY_IN_FLIGHT",
            )
        self._inflight |= mine
        return mine

    async def _refuse_reused_keys(self, reqs: Sequence[SendRequest]) -> None:
        """422 when a key is stored (within the deduplication window) with another message,
        or given twice in the request for two different ones. Checked before anything is
        written, so a batch with one such key stores nothing."""
        since = time.time_ns() // 1_000_000 - self._window_ms
        seen: dict[str, SendRequest] = {}
        for r in reqs:
            ik = r.idempotency_key
            if ik is None:
                continue
            first = seen.setdefault(ik, r)
            if first is not r and _fingerprint(first) != _fingerprint(r):
                raise _reused(ik, "in this batch")
            if first is r:
                found = await self._store.lookup(
                    KeyKind.IDEMPOTENCY_KEY, ik, limit=1, since_ms=since
                )
                if found and _stored_fingerprint(found[0]) != _fingerprint(r):
                    raise _reused(ik, "before")

    # --- clusters ---

    def _redirecting(
        self, fn: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """``fn``, answered 307 to the master when this broker turns out not to be it."""
        return redirecting(fn, self._master_http)


# --- decoding ---


_decode_message: Final = msgspec.json.Decoder(PublishMessage).decode
_decode_batch: Final = msgspec.json.Decoder(PublishBatch).decode


def _decode_publish(raw: bytes) -> PublishMessage | PublishBatch:
    """The body as one message or as a batch (``{"messages": [...]}``). Decoded as a message
    first, the common case: a batch fails that at its ``messages`` key (no message has that
    field), so each body is decoded in full once. Only a body that is neither is looked at
    again, to say which of the two it does not match."""
    try:
        return _decode_message(raw)
    except msgspec.ValidationError as e:
        not_single = e
    except msgspec.DecodeError as e:
        raise undecodable(e, PublishMessage) from e
    try:
        return _decode_batch(raw)
    except msgspec.ValidationError as e:
        if _is_batch(raw):
            raise undecodable(e, PublishBatch) from e
        raise undecodable(not_single, PublishMessage) from not_single


def _is_batch(raw: bytes) -> bool:
    """Whether the body (valid JSON) is an object with a ``messages`` field."""
    try:
        shape = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
    except msgspec.ValidationError as e:
        raise BadRequest(f"the body must be a JSON object: {e}") from e
    return "messages" in shape


def _idempotency_key(value: str | None) -> str | None:
    """The Idempotency-Key header's key: an RFC 8941 string (quoted), or the bare value."""
    if value is None:
        return None
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if not value:
        raise BadRequest("Idempotency-Key is empty")
    return value


def _body(text: str, encoding: Encoding, where: str) -> bytes:
    if encoding == "utf-8":
        return text.encode()
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadRequest(f"{where}: the body is not valid base64 ({e})") from e


def _send_request(
    topic: str, m: PublishMessage, where: str, idempotency_key: str | None = None
) -> SendRequest:
    return SendRequest(
        topic,
        _body(m.body, m.encoding, where),
        key=m.key,
        tags=m.tags,
        headers=m.headers,
        idempotency_key=idempotency_key or m.idempotency_key,
        deliver_at_ms=m.deliver_at_ms,
    )


def _receipt(r: SendReceipt) -> Receipt:
    return Receipt(r.message_id, r.topic, r.queue_id, r.queue_offset, r.duplicate)


# --- what an idempotency key stands for ---

Fingerprint = tuple[str, bytes, str | None, str | None, dict[str, str]]


def _fingerprint(r: SendRequest) -> Fingerprint:
    return (r.topic, r.body, r.key, r.tags, r.headers)


def _stored_fingerprint(m: StoredMessage) -> Fingerprint:
    props = m.properties
    topic = props.get(PROP_TARGET_TOPIC, m.topic) if m.topic == SCHEDULE_TOPIC else m.topic
    headers = {k[len(HEADER_PREFIX) :]: v for k, v in props.items() if k.startswith(HEADER_PREFIX)}
    return (topic, m.body, props.get(PROP_KEYS), props.get(PROP_TAGS), headers)


def _reused(key: str, when: str) -> InvalidArgument:
    return InvalidArgument(
        f"Idempotency-Key {key!r} was used {when} for another message (topic, body, key, tags "
        "or headers differ): use a new key for a new message",
        code="IDEMPOTENCY_KEY_REUSED",
    )
