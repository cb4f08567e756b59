"""Every frame body, fuzzed: valid values round-trip, and any other bytes are refused with
``BadRequest`` (a ``TxbError``), never another exception, a hang or a large allocation.

The strategies come from the Structs (``bodies.py``), so a new body or field is covered as soon
as ``REQUEST_TYPES`` / ``RESPONSE_TYPES`` name it. Hypothesis's deadline (200 ms per example)
is the hang check; tracemalloc the allocation check.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.protocol.bodies import encode_any, field_names, msgpack_values, values_of
from txbroker.errors import BadRequest, TxbError
from txbroker.protocol import Opcode
from txbroker.protocol.messages import (
    REQUEST_TYPES,
    RESPONSE_TYPES,
    ErrorBody,
    decode_error,
    decode_request,
    decode_response,
    encode_body,
)

REQUESTS = sorted(REQUEST_TYPES)
RESPONSES = sorted(RESPONSE_TYPES)
# Per opcode (21 requests, 21 responses): 50 examples each is still thousands per property,
# and keeps the module within seconds on a 2-core machine.
PER_OPCODE = settings(max_examples=50)
# Decoding a body of a few hundred bytes must not allocate more than this, whatever its length
# prefixes claim (msgpack's str/bin/array/map lengths go up to 2^32 - 1).
ALLOC_MAX_BYTES = 1024 * 1024


def _name(op: int) -> str:
    return Opcode(op).name


def _decodes_or_refuses(op: int, body: bytes, *, response: bool = False) -> None:
    decode = decode_response if response else decode_request
    types = RESPONSE_TYPES if response else REQUEST_TYPES
    try:
        got = decode(op, body)
    except BadRequest:
        return
    expected = types[op]
    assert isinstance(got, getattr(expected, "__origin__", expected))


@pytest.mark.parametrize("op", REQUESTS, ids=_name)
@PER_OPCODE
@given(data=st.data())
def test_requests_round_trip(op: int, data: st.DataObject) -> None:
    value = data.draw(values_of(REQUEST_TYPES[op]))
    assert decode_request(op, encode_body(value)) == value


@pytest.mark.parametrize("op", RESPONSES, ids=_name)
@PER_OPCODE
@given(data=st.data())
def test_responses_round_trip(op: int, data: st.DataObject) -> None:
    value = data.draw(values_of(RESPONSE_TYPES[op]))
    assert decode_response(op, encode_body(value)) == value


@given(value=values_of(ErrorBody))
def test_error_bodies_round_trip(value: ErrorBody) -> None:
    assert decode_error(encode_body(value)) == value


MUTATION = st.tuples(
    st.sampled_from(["flip", "insert", "delete", "truncate"]),
    st.integers(0, 10_000),
    st.binary(min_size=1, max_size=8),
)


def _mutate(raw: bytes, mutations: list[tuple[str, int, bytes]]) -> bytes:
    out = bytearray(raw)
    for how, where, what in mutations:
        i = where % (len(out) + 1)
        if how == "flip" and i < len(out):
            out[i] ^= what[0] or 0xFF
        elif how == "insert":
            out[i:i] = what
        elif how == "delete":
            del out[i : i + len(what)]
        elif how == "truncate":
            del out[i:]
    return bytes(out)


@pytest.mark.parametrize("op", REQUESTS, ids=_name)
@PER_OPCODE
@given(data=st.data(), mutations=st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_requests_decode_or_are_bad_requests(
    op: int, data: st.DataObject, mutations: list[tuple[str, int, bytes]]
) -> None:
    raw = encode_body(data.draw(values_of(REQUEST_TYPES[op])))
    _decodes_or_refuses(op, _mutate(raw, mutations))


@pytest.mark.parametrize("op", RESPONSES, ids=_name)
@PER_OPCODE
@given(data=st.data(), mutations=st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_responses_decode_or_are_bad_requests(
    op: int, data: st.DataObject, mutations: list[tuple[str, int, bytes]]
) -> None:
    raw = encode_body(data.draw(values_of(RESPONSE_TYPES[op])))
    _decodes_or_refuses(op, _mutate(raw, mutations), response=True)


@pytest.mark.parametrize("op", REQUESTS, ids=_name)
@PER_OPCODE
@given(data=st.data())
def test_msgpack_of_any_shape_decodes_or_is_a_bad_request(op: int, data: st.DataObject) -> None:
    value: Any = data.draw(msgpack_values(field_names(REQUEST_TYPES[op])))
    _decodes_or_refuses(op, encode_any(value))


@given(op=st.sampled_from(REQUESTS), raw=st.binary(max_size=300))
def test_arbitrary_bytes_are_bad_requests(op: int, raw: bytes) -> None:
    _decodes_or_refuses(op, raw)
    _decodes_or_refuses(op, raw, response=True)
    assert isinstance(decode_error(raw), ErrorBody)  # an unreadable error is still an error


# msgpack headers whose length field is read as a count or a byte size (big-endian u16/u32).
_LENGTH_HEADERS = {
    "str32": b"\xdb",
    "bin32": b"\xc6",
    "array32": b"\xdd",
    "map32": b"\xdf",
    "ext32": b"\xc9",
    "array16": b"\xdc",
    "map16": b"\xde",
}


@pytest.mark.parametrize("op", REQUESTS, ids=_name)
@PER_OPCODE
@given(
    header=st.sampled_from(sorted(_LENGTH_HEADERS)),
    claimed=st.integers(2**15, 2**32 - 1) | st.just(2**32 - 1),
    tail=st.binary(max_size=64),
    nested=st.booleans(),
)
def test_huge_length_prefixes_are_refused_without_allocating(
    op: int, header: str, claimed: int, tail: bytes, nested: bool
) -> None:
    code = _LENGTH_HEADERS[header]
    width = 2 if header.endswith("16") else 4
    prefix = code + (claimed % 2 ** (8 * width)).to_bytes(width, "big")
    names = field_names(REQUEST_TYPES[op]) or ("x",)
    # Either the whole body, or the value of the body's first field.
    raw = (b"\x81" + encode_any(names[0]) if nested else b"") + prefix + tail
    tracemalloc.start()
    try:
        _decodes_or_refuses(op, raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOC_MAX_BYTES


def test_a_response_for_an_opcode_without_one_is_a_bad_request() -> None:
    """Regression (the fuzz tests found it): ``decode_response`` raised KeyError for an opcode
    with no response body (STREAM, LOOKUP); every decoder failure is a ``TxbError``."""
    for op in (Opcode.STREAM, Opcode.LOOKUP, 999):
        with pytest.raises(BadRequest, match="no response"):
            decode_response(op, b"\x80")
        assert issubclass(BadRequest, TxbError)


@pytest.mark.parametrize("op", [Opcode.HELLO, Opcode.SEND, Opcode.TX_PREPARE], ids=_name)
def test_a_string_that_is_not_utf8_is_a_bad_request(op: int) -> None:
    """Regression (the fuzz tests found it): msgspec raises UnicodeDecodeError, not a
    DecodeError, for a str field that is not UTF-8; it escaped ``decode_request``, so the broker
    answered INTERNAL (and logged a traceback), or, for HELLO, left the connection's
    ``data_received`` with an exception."""
    names = field_names(REQUEST_TYPES[op])
    raw = b"\x81" + encode_any(names[0]) + b"\xa2\xcf\xff"  # fixstr of 2 bytes, not UTF-8
    with pytest.raises(BadRequest, match="malformed"):
        decode_request(op, raw)
    assert decode_error(b"\x82\xa4code\xa1\xff\xa7message\xa0").code == "PROTOCOL_ERROR"
