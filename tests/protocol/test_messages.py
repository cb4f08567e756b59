"""Frame bodies: round trips per opcode, and malformed bodies refused with a clear error."""

from __future__ import annotations

import pytest

from txbroker.errors import BadRequest
from txbroker.protocol import Opcode
from txbroker.protocol.messages import (
    PullRequest,
    SendBatchRequest,
    SendRequest,
    decode_error,
    decode_request,
    encode_body,
)


def test_send_round_trip() -> None:
    req = SendRequest("orders", b"\x00\xff", key="o-1", headers={"a": "b"}, deliver_at_ms=5)
    assert decode_request(Opcode.SEND, encode_body(req)) == req


def test_batch_round_trip() -> None:
    req = SendBatchRequest([SendRequest("t", bytes([i])) for i in range(3)])
    assert decode_request(Opcode.SEND_BATCH, encode_body(req)) == req


def test_defaults_fill_in() -> None:
    pr = decode_request(Opcode.PULL, encode_body({"group": "g", "topic": "t"}))
    assert pr == PullRequest("g", "t") and pr.hold_ms == 30_000


@pytest.mark.parametrize(
    ("opcode", "body", "fragment"),
    [
        (Opcode.SEND, b"\xc1", "malformed SEND"),  # not msgpack
        (Opcode.SEND, encode_body({"topic": "t"}), "body"),  # required field missing
        (Opcode.SEND, encode_body({"topic": 5, "body": b""}), "topic"),  # wrong type
        (Opcode.PULL, encode_body([1, 2]), "malformed PULL"),
        (Opcode.LOOKUP, b"", "not served"),  # defined, not served
    ],
)
def test_malformed_bodies_are_bad_requests(opcode: int, body: bytes, fragment: str) -> None:
    with pytest.raises(BadRequest, match=fragment):
        decode_request(opcode, body)


def test_unreadable_error_frame_still_yields_an_error() -> None:
    err = decode_error(b"garbage")
    assert err.code == "PROTOCOL_ERROR"
