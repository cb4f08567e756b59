"""Random request bodies for the wire fuzz: every field of the right type, its value odd.

Values are drawn from the Structs' own type information (``msgspec.inspect``), so a new request
or field is fuzzed as soon as ``REQUEST_TYPES`` names it. Names, URLs and ids come from pools
that mix valid and invalid ones (a name made of random characters would never reach the code
past the name check), and never name the healthy client's topic or group.
"""

from __future__ import annotations

import random
from typing import Any, Final

import msgspec.inspect as mi

from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import (
    AckRequest,
    DlqRequest,
    GroupsRequest,
    HeartbeatRequest,
    LeaveRequest,
    NackRequest,
    PullRequest,
    QueuePosition,
    SendRequest,
    TxEndRequest,
    TxId,
    TxPrepareRequest,
    TxResolveRequest,
)

__all__ = ["TOPICS", "member_requests", "random_body", "session_start"]

# Topics the fuzz creates and writes (valid), and names the checks must refuse.
TOPICS: Final = ("fz-a", "fz-b", "fz.c")
_BAD_NAMES: Final = ("", ".", "-x", "a b", "é", "%RETRY%fz", "%DLQ%fz", "x" * 200, "../etc")
_GROUPS: Final = ("fz-g1", "fz-g2", *_BAD_NAMES)
# Back-checks must stay on this host: a closed loopback port, or URLs the broker refuses.
_CHECK_URLS: Final = ("http://127.0.0.1:9/check", "ftp://127.0.0.1/", "http://", "", "x" * 3000)
_TX_IDS: Final = ("fz-tx-1", "fz-tx-2", "", "a" * 65, "bad id", "ü")
_WORDS: Final = ("commit", "rollback", "resume", "prepared", "parked", "clustering", "broadcast")
_WORDS_MORE: Final = ("earliest", "latest", "timestamp")
# Fields whose value is drawn from a pool, by name.
_POOLS: Final[dict[str, tuple[str, ...]]] = {
    "topic": (*TOPICS, *_BAD_NAMES),
    "group": _GROUPS,
    "producer_group": _GROUPS,
    "check_url": _CHECK_URLS,
    "tx_id": _TX_IDS,
    "decision": _WORDS,
    "action": _WORDS,
    "state": _WORDS,
    "mode": _WORDS,
    "start": _WORDS_MORE,
}
# Integers at the edges of every check: signs, small limits, 2^31, 2^63.
_INTS: Final = (0, 1, -1, 2, 7, 255, 256, 1024, 1025, 30_000, 2**31, 2**32, 2**63 - 1, -(2**63))
_ODD_TEXT: Final = ("", " ", "\x00", "é", "日本", "\U0001f600", "\u202e", "a" * 1025, "%")
# Bounds on what one body holds: a fuzz request is small; the limits are fuzzed by the values.
LIST_MAX: Final = 8
TEXT_MAX: Final = 64
BYTES_MAX: Final = 4096


def _char(rng: random.Random) -> str:
    if rng.random() < 0.8:
        return chr(rng.randrange(32, 127))
    c = rng.randrange(0x110000 - 0x800)
    return chr(c if c < 0xD800 else c + 0x800)  # never a surrogate: not encodable as UTF-8


def _text(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(_ODD_TEXT)
    return "".join(_char(rng) for _ in range(rng.randrange(TEXT_MAX)))


def _int(rng: random.Random) -> int:
    if rng.random() < 0.7:
        return rng.choice(_INTS)
    return rng.randrange(-(2**63), 2**63)


def _value(rng: random.Random, t: mi.Type, name: str = "") -> Any:
    if name in _POOLS and isinstance(t, mi.StrType | mi.UnionType) and rng.random() < 0.9:
        return rng.choice(_POOLS[name])
    if isinstance(t, mi.StrType):
        return _text(rng)
    if isinstance(t, mi.IntType):
        return _int(rng)
    if isinstance(t, mi.FloatType):
        return rng.choice((0.0, -1.0, 1e308, float("inf"), rng.random()))
    if isinstance(t, mi.BoolType):
        return rng.random() < 0.5
    if isinstance(t, mi.BytesType):
        return rng.randbytes(rng.choice((0, 1, rng.randrange(BYTES_MAX))))
    if isinstance(t, mi.NoneType):
        return None
    if isinstance(t, mi.UnionType):
        return _value(rng, rng.choice(t.types), name)
    if isinstance(t, mi.ListType):
        return [_value(rng, t.item_type, name) for _ in range(rng.randrange(LIST_MAX))]
    if isinstance(t, mi.DictType):
        n = rng.randrange(LIST_MAX)
        return {_text(rng): _value(rng, t.value_type) for _ in range(n)}
    if isinstance(t, mi.StructType):
        # Optional fields are left out now and then, as a client would.
        fields = {
            f.name: _value(rng, f.type, f.name)
            for f in t.fields
            if f.required or rng.random() < 0.7
        }
        return t.cls(**fields)
    raise AssertionError(f"no random value for {t!r}: add one for the new field type")


def random_body(rng: random.Random, body_type: object) -> Any:
    """A value of ``body_type`` (a request Struct) with odd but well-typed field values."""
    return _value(rng, mi.type_info(body_type))


# A member's requests, valid except for one field or two: they get past the name and schema
# checks into the consumer, retry and transaction code (``member_requests``).
def session_start(rng: random.Random) -> HeartbeatRequest:
    """A HEARTBEAT that joins a fuzz group on a fuzz topic, as a new member."""
    mode = rng.choice(("clustering", "clustering", "broadcast"))
    start = rng.choice(_WORDS_MORE)
    return HeartbeatRequest(
        rng.choice(_GROUPS[:2]), rng.choice(TOPICS), f"fz-m{rng.randrange(10**6)}", mode, start
    )


def _near(rng: random.Random, value: int) -> int:
    return value if rng.random() < 0.5 else rng.choice((value - 1, value + 1, *_INTS))


def member_requests(
    rng: random.Random, hb: HeartbeatRequest, generation: int, queues: list[int], n: int
) -> list[tuple[int, object]]:
    """``n`` requests of the member ``hb`` joined as (generation, queues): reads, commits,
    retries, sends and a transaction, with odd offsets, queue ids, generations and limits."""
    g, t, m = hb.group, hb.topic, hb.member_id
    tx_id = f"fz-{rng.randrange(10**9)}"

    def queue() -> int:
        return rng.choice(queues) if queues and rng.random() < 0.7 else _int(rng)

    def positions() -> list[QueuePosition]:
        return [QueuePosition(queue(), _int(rng)) for _ in range(rng.randrange(4))]

    makers = (
        lambda: (
            Opcode.PULL,
            PullRequest(
                g, t, m, _near(rng, generation), _near(rng, 32), rng.choice((0, 1, 50, -1)),
                rng.choice((None, [], ["a"], [_text(rng)])), positions(),
            ),
        ),
        lambda: (Opcode.ACK, AckRequest(g, t, m, _near(rng, generation), positions())),
        lambda: (Opcode.NACK, NackRequest(g, t, m, _near(rng, generation), queue(), _int(rng))),
        lambda: (Opcode.LEAVE, LeaveRequest(g, t, rng.choice((m, _text(rng))))),
        lambda: (Opcode.HEARTBEAT, hb),
        lambda: (rng.choice((Opcode.DLQ_LIST, Opcode.DLQ_REDRIVE)), DlqRequest(g, _int(rng))),
        lambda: (Opcode.OFFSETS, GroupsRequest(rng.choice((g, None)), rng.choice((t, None)))),
        lambda: (
            Opcode.SEND,
            SendRequest(
                t, rng.randbytes(rng.randrange(64)), queue_id=rng.choice((None, queue())),
                deliver_at_ms=rng.choice((None, _int(rng))),
                idempotency_key=rng.choice((None, "fz-k", _text(rng))),
            ),
        ),
        lambda: (
            Opcode.TX_PREPARE,
            TxPrepareRequest(
                t, b"x", "fz-pg", _CHECK_URLS[0], tx_id, timeout_ms=rng.choice((None, _int(rng))),
                deliver_at_ms=rng.choice((None, _int(rng))),
            ),
        ),
        lambda: (Opcode.TX_END, TxEndRequest(tx_id, rng.choice(_WORDS))),
        lambda: (Opcode.TX_RESOLVE, TxResolveRequest(tx_id, rng.choice(_WORDS))),
        lambda: (Opcode.TX_SHOW, TxId(tx_id)),
    )  # fmt: skip
    return [rng.choice(makers)() for _ in range(n)]
