"""The opcode -> role table of ``access.py``, every served opcode against every role, and the
token table's pure parts (no broker: the wire tests are test_access.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from txbroker.errors import Forbidden
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import (
    REQUEST_TYPES,
    AckRequest,
    DlqRequest,
    Empty,
    GroupsRequest,
    HeartbeatRequest,
    Hello,
    LeaveRequest,
    NackRequest,
    PullRequest,
    ReplFetchRequest,
    RouteRequest,
    SendBatchRequest,
    SendRequest,
    TopicCreate,
    TopicName,
    TxEndRequest,
    TxId,
    TxListRequest,
    TxPrepareRequest,
    TxResolveRequest,
)
from txbroker.server.access import Access
from txbroker.server.tokens import ANYONE, Principal, Role, TokenEntry, TokenTable

T = "orders.eu"
REQUESTS: dict[int, Any] = {
    Opcode.PING: Empty(),
    Opcode.TOPIC_CREATE: TopicCreate(T),
    Opcode.TOPIC_DELETE: TopicName(T),
    Opcode.TOPIC_LIST: Empty(),
    Opcode.TOPIC_DESCRIBE: TopicName(T),
    Opcode.SEND: SendRequest(T, b""),
    Opcode.SEND_BATCH: SendBatchRequest([SendRequest(T, b"")]),
    Opcode.PULL: PullRequest("g", T),
    Opcode.ACK: AckRequest("g", T, "m", 1, []),
    Opcode.NACK: NackRequest("g", T, "m", 1, 0, 0),
    Opcode.HEARTBEAT: HeartbeatRequest("g", T, "m"),
    Opcode.LEAVE: LeaveRequest("g", T, "m"),
    Opcode.OFFSETS: GroupsRequest(topic=T),
    Opcode.TX_PREPARE: TxPrepareRequest(T, b"", "pg", "http://x"),
    Opcode.TX_END: TxEndRequest("tx1", "commit"),
    Opcode.TX_LIST: TxListRequest(topic=T),
    Opcode.TX_SHOW: TxId("tx1"),
    Opcode.TX_RESOLVE: TxResolveRequest("tx1", "commit"),
    Opcode.DLQ_LIST: DlqRequest("g"),
    Opcode.DLQ_REDRIVE: DlqRequest("g"),
    Opcode.ROUTE: RouteRequest(T),
    Opcode.REPL_FETCH: ReplFetchRequest("slave", 0, 0),
}
P, C, R, A = Role.PRODUCE, Role.CONSUME, Role.READ, Role.ADMIN
# Which single role (on orders.*) lets each request through.
ALLOWED: dict[int, set[Role]] = {
    Opcode.PING: {P, C, R},
    Opcode.TOPIC_CREATE: set(),
    Opcode.TOPIC_DELETE: set(),
    Opcode.TOPIC_LIST: {P, C, R},
    Opcode.TOPIC_DESCRIBE: {P, C, R},
    Opcode.SEND: {P},
    Opcode.SEND_BATCH: {P},
    Opcode.PULL: {C},
    Opcode.ACK: {C},
    Opcode.NACK: {C},
    Opcode.HEARTBEAT: {C},
    Opcode.LEAVE: {C},
    Opcode.OFFSETS: {C, R},
    Opcode.TX_PREPARE: {P},
    Opcode.TX_END: {P},
    Opcode.TX_LIST: {R},
    Opcode.TX_SHOW: {R},
    Opcode.TX_RESOLVE: set(),
    Opcode.DLQ_LIST: {R},
    Opcode.DLQ_REDRIVE: set(),  # admin on * only
    Opcode.ROUTE: {P, C, R},
    Opcode.REPL_FETCH: set(),  # admin on * only: a slave reads the whole log
}


def test_every_request_opcode_has_a_rule() -> None:
    assert set(REQUESTS) == set(REQUEST_TYPES) - {Opcode.HELLO} == set(ALLOWED)


@pytest.mark.parametrize("opcode", sorted(REQUESTS), ids=lambda o: Opcode(o).name)
def test_each_role_on_a_pattern_is_allowed_exactly_what_the_table_says(opcode: int) -> None:
    access = Access(TokenTable(), lambda tx_id: T)
    req = REQUESTS[opcode]
    for role in (P, C, R):
        who = Principal("t", frozenset({role}), ("orders.*",))
        if role in ALLOWED[opcode]:
            access.check(who, opcode, req)
        else:
            with pytest.raises(Forbidden, match=f"{Opcode(opcode).name} needs the"):
                access.check(who, opcode, req)
        elsewhere = Principal("t", frozenset({role}), ("billing",))
        if opcode not in (Opcode.PING, Opcode.TOPIC_LIST, Opcode.DLQ_LIST):
            with pytest.raises(Forbidden):  # the right role on another topic is no role
                access.check(elsewhere, opcode, req)
    admin_here = Principal("ops", frozenset({A}), ("orders.*",))
    if opcode in (Opcode.DLQ_REDRIVE, Opcode.REPL_FETCH):
        with pytest.raises(Forbidden, match=r"every topic \(\*\)"):
            access.check(admin_here, opcode, req)
    else:
        access.check(admin_here, opcode, req)  # admin implies the other roles
    access.check(ANYONE, opcode, req)
    assert ANYONE.superuser and not admin_here.superuser


def test_a_transaction_the_broker_does_not_hold_needs_the_role_only() -> None:
    access = Access(TokenTable(), lambda tx_id: None)
    producer = Principal("p", frozenset({P}), ("orders.*",))
    access.check(producer, Opcode.TX_END, TxEndRequest("gone", "commit"))  # answered NOT_FOUND
    with pytest.raises(Forbidden):
        access.check(producer, Opcode.TX_RESOLVE, TxResolveRequest("gone", "commit"))


def test_patterns_are_case_sensitive_globs() -> None:
    who = Principal("t", frozenset({P}), ("orders.*", "audit-?"))
    assert who.may(P, "orders.eu") and who.may(P, "audit-1")
    assert not who.may(P, "Orders.eu") and not who.may(P, "orders") and not who.may(P, "audit-10")
    assert not who.may(P, None) and Principal("t", frozenset({P})).may(P, None)


def test_tokens_are_kept_as_digests_and_never_shown() -> None:
    secret = "s3cret-token-value"
    entry = TokenEntry(Principal("svc", frozenset({P})), hashlib.sha256(secret.encode()).digest())
    table = TokenTable.build("admin-secret", [entry])
    assert table.required and len(table) == 2
    assert table.authenticate(secret) == entry.principal
    admin = table.authenticate("admin-secret")
    assert admin is not None and admin.name == "admin" and admin.superuser
    assert table.authenticate(None) is None and table.authenticate("") is None
    assert table.authenticate(hashlib.sha256(secret.encode()).hexdigest()) is None
    for shown in (repr(table), repr(entry), repr(Hello("c", secret))):
        assert secret not in shown and "admin-secret" not in shown
    assert TokenTable().authenticate(None) is ANYONE  # no tokens: everyone
