"""The record codec on its own: round trips, limits, and that every kind of damage is caught."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txbroker.errors import CorruptLog, InvalidArgument, MessageTooLarge
from txbroker.store.record import (
    HEADER,
    MAX_BODY_BYTES,
    MAX_PROPERTIES_BYTES,
    check_record,
    decode_record,
    encode_properties,
    encode_record_parts,
)


def _encode(topic: str, props: dict[str, str], body: bytes, **kw: int) -> bytes:
    args = {"flags": 0, "queue_id": 0, "queue_offset": 0, "physical_offset": 0, "born_ms": 1}
    args.update(kw)
    return b"".join(
        encode_record_parts(
            topic.encode(),
            encode_properties(props),
            body,
            args["flags"],
            args["queue_id"],
            args["queue_offset"],
            args["physical_offset"],
            args["born_ms"],
            args.get("store_ms", 2),
        )
    )


@pytest.mark.parametrize("size", [0, 1, 55, 56, 1024, 65_536, MAX_BODY_BYTES])
def test_round_trip_every_size_class(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    raw = _encode("orders", {"keys": "a b", "id": "x"}, body, queue_id=7, queue_offset=9)
    assert (
        len(raw)
        == HEADER.size + len("orders") + len(encode_properties({"keys": "a b", "id": "x"})) + size
    )
    msg = decode_record(raw)
    assert msg.body == body and msg.topic == "orders"
    assert (msg.queue_id, msg.queue_offset, msg.size) == (7, 9, len(raw))
    assert msg.keys == ["a", "b"] and msg.message_id == "x"


@given(
    topic=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,40}", fullmatch=True),
    props=st.dictionaries(st.text(max_size=20), st.text(max_size=50), max_size=6),
    body=st.binary(max_size=3000),
    flags=st.integers(0, 0xFFFF),
    qid=st.integers(0, 0xFFFF),
    qoff=st.integers(0, 2**63),
    phys=st.integers(0, 2**63),
)
def test_codec_round_trip_property(
    topic: str, props: dict[str, str], body: bytes, flags: int, qid: int, qoff: int, phys: int
) -> None:
    raw = _encode(
        topic, props, body, flags=flags, queue_id=qid, queue_offset=qoff, physical_offset=phys
    )
    msg = decode_record(raw)
    assert (msg.topic, msg.properties, msg.body) == (topic, props, body)
    assert (msg.flags, msg.queue_id, msg.queue_offset, msg.physical_offset) == (
        flags,
        qid,
        qoff,
        phys,
    )


@given(body=st.binary(min_size=1, max_size=500), data=st.data())
def test_any_single_byte_flip_is_detected(body: bytes, data: st.DataObject) -> None:
    raw = bytearray(_encode("t", {"k": "v"}, body))
    pos = data.draw(st.integers(0, len(raw) - 1))
    bit = data.draw(st.integers(0, 7))
    raw[pos] ^= 1 << bit
    assert check_record(bytes(raw)) is not None
    with pytest.raises(CorruptLog):
        decode_record(bytes(raw))


@given(body=st.binary(max_size=300), data=st.data())
def test_every_truncation_is_detected(body: bytes, data: st.DataObject) -> None:
    raw = _encode("t", {}, body)
    cut = data.draw(st.integers(0, len(raw) - 1))
    assert check_record(raw[:cut]) is not None


def test_property_limits_and_types() -> None:
    with pytest.raises(MessageTooLarge):
        encode_properties({"k": "x" * (MAX_PROPERTIES_BYTES + 1)})
    with pytest.raises(InvalidArgument):
        encode_properties({"k": 1})  # type: ignore[dict-item]
    assert encode_properties({}) == b""
