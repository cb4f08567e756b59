"""The socket-level fuzz, CI-sized: a few hundred hostile connections beside a healthy client.
A longer run by hand: ``txbroker bench fuzz --target wire --cases N --seconds S``."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import BrokerProcess
from tests.fuzz.conftest import TOKEN
from txbroker.bench.fuzz_report import alive, format_reports
from txbroker.bench.fuzz_wire import fuzz_wire
from txbroker.protocol.codec import FrameDecoder, encode_frame
from txbroker.protocol.frames import FrameKind, Opcode
from txbroker.protocol.messages import Hello, decode_error, encode_body
from txbroker_sdk.requests import parse_server_url

# A broker that starts at about 75 MiB must not grow by more than this over a fuzz run: its
# buffers are bounded per connection (one frame) and connections end with their case.
RSS_GROWTH_MAX_KIB = 64 * 1024


async def test_hostile_connections_leave_the_broker_and_a_healthy_client_alone(
    token_broker: BrokerProcess,
) -> None:
    assert token_broker.proc is not None
    pid = token_broker.proc.pid
    report = await fuzz_wire(
        token_broker.url,
        pid,
        TOKEN,
        cases=600,
        seconds=5,
        seed=20,
        log_path=token_broker.log_path,
    )
    print(format_reports([report]))  # the figures, with pytest -s
    assert report.crashes == 0, report.examples
    assert report.tracebacks == 0, token_broker.log_path.read_text()[-4000:]
    assert report.cases >= 100
    assert alive(pid)
    assert report.healthy["acked"] > 0 and report.healthy["missing"] == 0
    assert report.rss_after_kib - report.rss_before_kib < RSS_GROWTH_MAX_KIB
    kinds = {k.split(":")[0] for k in report.outcomes}
    assert {"random bytes", "oversized length", "mutated body", "odd values"} <= kinds


async def test_a_send_still_in_flight_when_the_run_ends_is_waited_for(
    token_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The healthy producer may be inside a send when the run ends; its consumer must wait for
    that send's answer before counting what is missing, or the message acknowledged last is
    reported lost though the broker delivers it."""
    from txbroker.bench import fuzz_wire as wire
    from txbroker_sdk import Client

    class AcknowledgedLate(wire._Healthy):
        async def produce(self) -> None:
            async with await Client.connect(self.url, auth_token=self.token) as client:
                await self.stop.wait()
                # The answer comes after the run's end, later than the consumer's hold (500 ms).
                await asyncio.sleep(1.5)
                self.sent += 1
                await client.send(wire.HEALTHY_TOPIC, str(self.sent).encode())
                self.acked.add(self.sent)

    monkeypatch.setattr(wire, "_Healthy", AcknowledgedLate)
    assert token_broker.proc is not None
    report = await fuzz_wire(
        token_broker.url, token_broker.proc.pid, TOKEN, cases=0, seconds=1, seed=1
    )
    assert report.healthy == {"sent": 1, "acked": 1, "consumed": 1, "missing": 0}
    assert report.crashes == 0, report.examples


async def _exchange(url: str, frames: bytes, answers: int) -> list[tuple[int, int, str | None]]:
    """Send ``frames`` and read ``answers`` answers (or until the broker closes): (opcode,
    kind, error code) of each."""
    host, port = parse_server_url(url)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(frames)
    decoder, out = FrameDecoder(), []
    async with asyncio.timeout(10):
        while len(out) < answers and (data := await reader.read(65536)):
            for f in decoder.feed(data):
                code = decode_error(f.body).code if f.kind == FrameKind.ERROR else None
                out.append((f.opcode, f.kind, code))
    writer.close()
    return out


def _frame(opcode: int, corr: int, body: bytes) -> bytes:
    return encode_frame(FrameKind.REQUEST, opcode, corr, body)


async def test_a_string_that_is_not_utf8_is_a_bad_request_not_an_internal_error(
    token_broker: BrokerProcess,
) -> None:
    """Regression (the wire fuzz found it): a SEND whose topic is not UTF-8 was answered
    INTERNAL with a traceback in the log, and such a HELLO ended the connection without an
    error frame (the exception left ``data_received``)."""
    hello = _frame(Opcode.HELLO, 1, encode_body(Hello("t", TOKEN)))
    send = _frame(Opcode.SEND, 2, b"\x82\xa5topic\xa2\xc3\x28\xa4body\xc4\x00")
    answers = await _exchange(token_broker.url, hello + send, 2)
    assert answers == [
        (Opcode.HELLO, FrameKind.RESPONSE, None),
        (Opcode.SEND, FrameKind.ERROR, "BAD_REQUEST"),
    ]
    bad_hello = _frame(Opcode.HELLO, 1, b"\x81\xa9client_id\xa2\xc3\x28")
    answers = await _exchange(token_broker.url, bad_hello, 2)  # 1, then the close
    assert answers == [(Opcode.STREAM, FrameKind.ERROR, "BAD_REQUEST")]
    assert "Traceback" not in token_broker.log_path.read_text()
