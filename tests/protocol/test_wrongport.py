"""HTTP where frames belong, told apart by the sans-IO decoder from scripted bytes; the note the
broker's HTTP port adds, read back; the TCP port's HTTP answer."""

from __future__ import annotations

import pytest

from txbroker.errors import FrameTooLarge, ProtocolError, WrongPort
from txbroker.protocol.codec import FrameDecoder, encode_frame
from txbroker.protocol.frames import FrameKind, Opcode
from txbroker.protocol.wrongport import (
    SEEN_BYTES_MAX,
    http_port_note,
    http_refusal,
    tcp_port_named,
)

UVICORN_400 = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 93\r\nconnection: close\r\n\r\nInvalid HTTP request received. "
    + http_port_note(9876).encode()
)


@pytest.mark.parametrize(
    "request_line",
    [
        b"GET / HTTP/1.1",
        b"HEAD /healthz HTTP/1.1",
        b"POST /v1/messages HTTP/1.1",
        b"PUT /x HTTP/1.1",
        b"DELETE /v1/topics/t HTTP/1.1",
        b"PATCH /x HTTP/1.1",
        b"OPTIONS * HTTP/1.1",
        b"CONNECT host:443 HTTP/1.1",
        b"TRACE / HTTP/1.1",
        b"PRI * HTTP/2.0",
    ],
)
def test_an_http_request_is_named_as_one(request_line: bytes) -> None:
    with pytest.raises(WrongPort) as caught:
        FrameDecoder().feed(request_line + b"\r\nHost: x\r\n\r\n")
    assert str(caught.value) == (
        f"an HTTP request ({request_line.decode()}) at a txbroker TCP port, which speaks "
        "txbroker frames, not HTTP"
    )
    assert caught.value.seen.startswith(request_line)


def test_an_http_answer_is_named_in_any_chunking_and_its_head_kept() -> None:
    whole = FrameDecoder()
    with pytest.raises(WrongPort, match=r"^an HTTP answer \(HTTP/1\.1 400 Bad Request\) where"):
        whole.feed(UVICORN_400)
    split = FrameDecoder()
    assert split.feed(UVICORN_400[:3]) == []  # no length visible yet
    with pytest.raises(WrongPort) as caught:
        split.feed(UVICORN_400[3:])
    assert caught.value.seen == UVICORN_400  # what the client reads the TCP port from
    assert tcp_port_named(caught.value.seen) == 9876
    assert whole.broken and split.broken
    with pytest.raises(ProtocolError, match="already failed"):
        whole.feed(b"more")


def test_http_after_frames_and_its_head_is_bounded() -> None:
    frame = encode_frame(FrameKind.RESPONSE, Opcode.PING, 1, b"")
    d = FrameDecoder()
    with pytest.raises(WrongPort) as caught:
        d.feed(frame + b"HTTP/1.1 200 OK\r\n" + b"x" * 5000)
    assert len(caught.value.seen) == SEEN_BYTES_MAX


@pytest.mark.parametrize(
    "text", [b"SSH-2.0-OpenSSH_9.6\r\n", b"GETS", b"HTTx", b"\x16\x03\x01\x02\x00", b"get / "]
)
def test_other_text_is_a_frame_too_large(text: bytes) -> None:
    with pytest.raises(FrameTooLarge) as caught:
        FrameDecoder().feed(text)
    assert type(caught.value) is FrameTooLarge


def test_the_note_is_read_back_and_nothing_else_is() -> None:
    assert (
        tcp_port_named(b"HTTP/1.1 400 Bad Request\r\n\r\n" + http_port_note(40123).encode())
        == 40123
    )
    assert tcp_port_named(http_port_note(1).encode()) == 1
    assert tcp_port_named(b"HTTP/1.1 400 Bad Request\r\n\r\nInvalid HTTP request received.") is None
    assert http_port_note(9876).isascii()  # uvicorn encodes its 400's text as ASCII


def test_the_tcp_ports_http_answer_is_whole_http() -> None:
    for port, names in ((9877, b"HTTP port (API, console) is 9877."), (0, b"--http-port")):
        answer = http_refusal(port)
        head, body = answer.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        assert lines[0] == b"HTTP/1.1 400 Bad Request"
        assert f"Content-Length: {len(body)}".encode() in lines
        assert b"Connection: close" in lines and names in body
