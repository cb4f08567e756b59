"""What each request needs: the role, and the topic it needs it on, per opcode.

:meth:`Access.check` runs on every request of a connection whose token is not admin on every
topic (an admin token skips it: nothing is added to the hot path of a broker without tokens or
used with the admin token). A request refused gets ``FORBIDDEN`` naming the role and the topic
it needs; the connection stays open. Listings are filtered to the topics the token may see.
:class:`Access` holds the table of what each opcode needs.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Final

from txbroker.errors import Forbidden
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import (
    DlqListResponse,
    GroupsResponse,
    TxListResponse,
)
from txbroker.server.tokens import Principal, Role, TokenTable

__all__ = ["Access"]

P, C, R, A = Role.PRODUCE, Role.CONSUME, Role.READ, Role.ADMIN
ANY_ROLE: Final = (P, C, R)
# Opcode -> (roles, any of which will do; the request's topic). Opcodes whose topic comes from
# a transaction, a batch or nowhere are handled in Access.check.
_TOPIC_RULES: Final[dict[int, tuple[tuple[Role, ...], Callable[[Any], str | None]]]] = {
    Opcode.SEND: ((P,), lambda r: r.topic),
    Opcode.TX_PREPARE: ((P,), lambda r: r.topic),
    Opcode.HEARTBEAT: ((C,), lambda r: r.topic),
    Opcode.PULL: ((C,), lambda r: r.topic),
    Opcode.ACK: ((C,), lambda r: r.topic),
    Opcode.NACK: ((C,), lambda r: r.topic),
    Opcode.LEAVE: ((C,), lambda r: r.topic),
    Opcode.TOPIC_DESCRIBE: (ANY_ROLE, lambda r: r.topic),
    Opcode.TOPIC_CREATE: ((A,), lambda r: r.topic),
    Opcode.TOPIC_DELETE: ((A,), lambda r: r.topic),
    Opcode.OFFSETS: ((R, C), lambda r: r.topic or None),
    Opcode.TX_LIST: ((R,), lambda r: r.topic or None),
    Opcode.DLQ_LIST: ((R,), lambda r: None),
}
# Requests about a transaction: the role, needed on the transaction's topic.
_TX_RULES: Final[dict[int, Role]] = {Opcode.TX_END: P, Opcode.TX_SHOW: R, Opcode.TX_RESOLVE: A}
# Listings answered for any of these roles, filtered to what the token may see.
_LISTINGS: Final = frozenset({Opcode.TOPIC_LIST, Opcode.OFFSETS, Opcode.TX_LIST, Opcode.DLQ_LIST})


class Access:
    """The tokens and the rules below. ``tx_topic`` names a transaction's topic (None when the
    broker does not hold it: then the role is needed on some topic, and the request goes on to
    be answered as for an unknown transaction, which changes nothing).

    ::

        opcode                                 needs
        PING                                   any valid token
        SEND, SEND_BATCH, TX_PREPARE           produce on the topic (every message's, in a batch)
        TX_END                                 produce on the transaction's topic
        HEARTBEAT, PULL, ACK, NACK, LEAVE      consume on the topic
        TOPIC_DESCRIBE                         any role on the topic
        TOPIC_LIST                             any role; lists the topics it has a role on
        OFFSETS                                read or consume (on the topic, if one is asked);
                                               lists the groups of topics it may read or consume
        TX_LIST, TX_SHOW                       read (on the transaction's topic); lists those
        DLQ_LIST                               read; lists dead letters of topics it may read
        TOPIC_CREATE, TOPIC_DELETE             admin on the topic
        TX_RESOLVE                             admin on the transaction's topic
        DLQ_REDRIVE                            admin on every topic (``*``): a group's dead
                                               letters go back to whatever topics they came from
        REPL_FETCH                             admin on every topic (``*``): a slave reads the
                                               whole log
        ROUTE (a NameServer's)                 any role on the topic; any role for the groups alone
    """

    def __init__(self, tokens: TokenTable, tx_topic: Callable[[str], str | None]) -> None:
        self.tokens = tokens
        self._tx_topic = tx_topic
        # Requests refused, by opcode name (txbroker.requests.forbidden on /metrics).
        self.forbidden: collections.Counter[str] = collections.Counter()

    def check(self, who: Principal, opcode: int, req: Any) -> None:
        """Raise :class:`Forbidden` unless ``who`` may make this request. A superuser (admin
        on every topic: everyone on a broker without tokens) may make any, as a TCP connection
        of one is never checked."""
        if who.superuser:
            return
        try:
            self._check(who, opcode, req)
        except Forbidden:
            self.forbidden[_op(opcode)] += 1
            raise

    def _check(self, who: Principal, opcode: int, req: Any) -> None:
        rule = _TOPIC_RULES.get(opcode)
        if rule is not None:
            roles, topic_of = rule
            topic = topic_of(req)
            if opcode in _LISTINGS and topic is None:
                _need_role(who, opcode, roles)  # filtered afterwards
            else:
                _need(who, opcode, roles, topic)
        elif opcode == Opcode.SEND_BATCH:
            for topic in dict.fromkeys(m.topic for m in req.messages):
                _need(who, opcode, (P,), topic)
        elif opcode in _TX_RULES:
            role = _TX_RULES[opcode]
            topic = self._tx_topic(req.tx_id)
            if topic is None:
                _need_role(who, opcode, (role,))
            else:
                _need(who, opcode, (role,), topic)
        elif opcode == Opcode.TOPIC_LIST:
            _need_role(who, opcode, ANY_ROLE)
        elif opcode in (Opcode.DLQ_REDRIVE, Opcode.REPL_FETCH):
            _need(who, opcode, (A,), None)
        elif opcode == Opcode.ROUTE:
            if req.topic:
                _need(who, opcode, ANY_ROLE, req.topic)
            else:
                _need_role(who, opcode, ANY_ROLE)
        elif opcode != Opcode.PING:
            raise Forbidden(f"{_op(opcode)} is not allowed for token {who.name!r}")

    @staticmethod
    def filters(opcode: int) -> bool:
        return opcode in _LISTINGS

    @staticmethod
    def filter(who: Principal, opcode: int, result: Any) -> Any:
        """A listing's answer cut to what ``who`` may see."""
        if opcode == Opcode.TOPIC_LIST:
            return [t for t in result if who.sees(t.topic, ANY_ROLE)]
        if opcode == Opcode.OFFSETS and isinstance(result, GroupsResponse):
            return GroupsResponse([g for g in result.groups if who.sees(g.topic, (R, C))])
        if opcode == Opcode.TX_LIST and isinstance(result, TxListResponse):
            shown = [t for t in result.transactions if who.may(R, t.topic)]
            hidden = len(result.transactions) - len(shown)
            return TxListResponse(shown, result.total - hidden)
        if opcode == Opcode.DLQ_LIST and isinstance(result, DlqListResponse):
            shown_dlq = [m for m in result.messages if who.may(R, m.original_topic)]
            return DlqListResponse(shown_dlq, result.redrive_offset)
        return result


def _op(opcode: int) -> str:
    return Opcode(opcode).name


def _roles(roles: tuple[Role, ...]) -> str:
    return " or ".join(r.value for r in roles)


def _need(who: Principal, opcode: int, roles: tuple[Role, ...], topic: str | None) -> None:
    if not any(who.may(r, topic) for r in roles):
        where = f"topic {topic!r}" if topic is not None else "every topic (*)"
        raise Forbidden(
            f"{_op(opcode)} needs the {_roles(roles)} role on {where}; token {who.name!r} "
            f"has {_held(who)}"
        )


def _need_role(who: Principal, opcode: int, roles: tuple[Role, ...]) -> None:
    if not any(who.has(r) for r in roles):
        raise Forbidden(
            f"{_op(opcode)} needs the {_roles(roles)} role; token {who.name!r} has {_held(who)}"
        )


def _held(who: Principal) -> str:
    roles = ", ".join(sorted(r.value for r in who.roles))
    return f"{roles} on {', '.join(who.topics)}"
