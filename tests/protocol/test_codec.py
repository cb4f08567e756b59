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
    assert out == [Frame(int(k), int(o), c, b) for k, o, c, b in frames]
    assert dec.buffered == 0


def test_byte_by_byte() -> None:
    frame = encode_frame(FrameKind.REQUEST, Opcode.SEND, 7, b"hello")
    dec = FrameDecoder()
    got = [f for i in range(len(frame)) for f in dec.feed(frame[i : i + 1])]
    assert got == [Frame(FrameKind.REQUEST, Opcode.SEND, 7, b"hello")]


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
