"""The sans-IO codec on scripted byte chunks: any split, pipelining, and every kind of bad input."""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txbroker.errors import FrameTooLarge, ProtocolError
from txbroker.protocol import Frame, FrameDecoder, FrameKind, Opcode, encode_frame
from txbroker.protocol.frames import HEADER, MAX_FRAME_BYTES

FRAMES = st.lists(
    st.tuples(
        st.sampled_from(list(FrameKind)),
        st.sampled_from(list(Opcode)),
        st.integers(0, 2**32 - 1),
        st.binary(max_size=2000),
    ),
    min_size=1,
    max_size=20,
)


def _fields(f: Frame) -> tuple[int, int, int, bytes]:
    return (f.kind, f.opcode, f.corr_id, f.body)


@given(frames=FRAMES, cuts=st.lists(st.integers(0, 50_000), max_size=30))
def test_any_chunking_yields_the_same_frames(
    frames: list[tuple[int, int, int, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(encode_frame(k, o, c, b) for k, o, c, b in frames)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    dec = FrameDecoder()
    out: list[Frame] = []
    for a, b in itertools.pairwise(points):
        out.extend(dec.feed(stream[a:b]))
    assert [_fields(f) for f in out] == [(int(k), int(o), c, b) for k, o, c, b in frames]
    assert dec.buffered == 0


def test_byte_by_byte() -> None:
    frame = encode_frame(FrameKind.REQUEST, Opcode.SEND, 7, b"hello")
    dec = FrameDecoder()
    got = [f for i in range(len(frame)) for f in dec.feed(frame[i : i + 1])]
    assert [_fields(f) for f in got] == [(FrameKind.REQUEST, Opcode.SEND, 7, b"hello")]


def test_huge_length_prefix_is_refused_before_buffering() -> None:
    dec = FrameDecoder()
    with pytest.raises(FrameTooLarge):
        dec.feed((1 << 30).to_bytes(4, "big"))  # a 1 GiB length, nothing else yet
    assert dec.broken and dec.buffered == 0
    with pytest.raises(ProtocolError):
        dec.feed(encode_frame(FrameKind.REQUEST, Opcode.PING, 1, b""))


@pytest.mark.parametrize(
    "raw",
    [
        HEADER.pack(8, 9, 0, Opcode.PING, 1),  # unknown version
        HEADER.pack(8, 1, 7, Opcode.PING, 1),  # unknown kind
        HEADER.pack(8, 1, 0, 999, 1),  # unknown opcode
        HEADER.pack(3, 1, 0, Opcode.PING, 1),  # length shorter than the header
    ],
)
def test_malformed_headers_are_refused(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(raw)


@given(garbage=st.binary(min_size=12, max_size=200))
def test_garbage_never_crashes_only_refuses_or_waits(garbage: bytes) -> None:
    dec = FrameDecoder()
    try:
        frames = dec.feed(garbage)
    except ProtocolError:
        assert dec.broken
    else:
        # Whatever parsed must be structurally valid; the rest is waiting for more bytes.
        assert all(f.kind in tuple(FrameKind) and f.opcode in tuple(Opcode) for f in frames)


def test_encoding_refuses_oversized_bodies() -> None:
    with pytest.raises(FrameTooLarge):
        encode_frame(FrameKind.REQUEST, Opcode.SEND_BATCH, 1, bytes(MAX_FRAME_BYTES))


def test_random_bytes_are_refused_quickly() -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError):
        for _ in range(100):
            dec.feed(os.urandom(4096))


@given(
    length=st.integers(MAX_FRAME_BYTES + 1, 2**32 - 1),
    before=FRAMES,
    split=st.integers(0, 3),
)
def test_every_oversized_length_is_refused_as_soon_as_it_is_visible(
    length: int, before: list[tuple[int, int, int, bytes]], split: int
) -> None:
    """Any u32 length over the limit, after valid frames, whether its 4 bytes come in one
    chunk or split: refused without waiting for (or buffering) the body it claims."""
    stream = b"".join(encode_frame(k, o, c, b) for k, o, c, b in before)
    prefix = length.to_bytes(4, "big")
    dec = FrameDecoder()
    assert len(dec.feed(stream + prefix[:split])) == len(before)
    with pytest.raises(FrameTooLarge):
        dec.feed(prefix[split:])
    assert dec.broken and dec.buffered == 0


@given(prefix=st.integers(2**31, 2**63), tail=st.binary(max_size=64))
def test_eight_byte_length_prefixes_up_to_2_63_are_refused(prefix: int, tail: bytes) -> None:
    """A peer that writes a 64-bit length (another protocol, or a probe) is read as a 32-bit
    length and a header: refused (too large once the high word is over the limit) or, when the
    bytes happen to make a header, waiting for a body that is at most the limit."""
    dec = FrameDecoder()
    raw = prefix.to_bytes(8, "big") + tail
    try:
        frames = dec.feed(raw)
    except FrameTooLarge:
        assert dec.buffered == 0
    except ProtocolError:
        assert prefix >> 32 <= MAX_FRAME_BYTES and dec.buffered == 0
    else:
        assert prefix >> 32 <= MAX_FRAME_BYTES and dec.buffered <= len(raw)
        assert all(f.opcode in tuple(Opcode) for f in frames)


@given(
    frames=FRAMES,
    flips=st.lists(st.tuples(st.integers(0, 50_000), st.integers(1, 255)), min_size=1, max_size=4),
    chunk=st.integers(1, 4096),
)
def test_mutated_streams_yield_frames_refuse_or_wait(
    frames: list[tuple[int, int, int, bytes]], flips: list[tuple[int, int]], chunk: int
) -> None:
    """Valid frames with bytes flipped anywhere: the decoder yields well-formed frames, raises
    ProtocolError, or waits for more, and never holds more than one frame's worth of bytes."""
    stream = bytearray(b"".join(encode_frame(k, o, c, b) for k, o, c, b in frames))
    for where, mask in flips:
        stream[where % len(stream)] ^= mask
    dec = FrameDecoder()
    try:
        for i in range(0, len(stream), chunk):
            for f in dec.feed(stream[i : i + chunk]):
                assert f.kind in tuple(FrameKind) and f.opcode in tuple(Opcode)
                assert len(f.body) <= MAX_FRAME_BYTES - 8
            assert dec.buffered <= MAX_FRAME_BYTES + 4
    except ProtocolError:
        assert dec.broken and dec.buffered == 0
