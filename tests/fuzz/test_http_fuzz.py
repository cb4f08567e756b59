"""The HTTP admin fuzz, CI-sized: odd paths, methods, bodies, tokens and forms at /v1/*,
/metrics and /console. A longer run by hand: ``txbroker bench fuzz --target http``."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import httpx

from tests.conftest import BrokerProcess
from tests.fuzz.conftest import TOKEN
from txbroker.bench.fuzz_http import fuzz_http
from txbroker.bench.fuzz_report import alive, format_reports


async def test_odd_requests_get_clear_4xx_answers_and_the_broker_stays_up(
    token_broker: BrokerProcess,
) -> None:
    assert token_broker.proc is not None
    pid = token_broker.proc.pid
    report = await fuzz_http(
        token_broker.http,
        pid,
        TOKEN,
        cases=400,
        seconds=6,
        seed=20,
        log_path=token_broker.log_path,
    )
    print(format_reports([report]))  # the figures, with pytest -s
    assert report.crashes == 0, report.examples
    assert report.tracebacks == 0, token_broker.log_path.read_text()[-4000:]
    assert report.cases >= 100
    assert alive(pid)
    kinds = {k.split(":")[0] for k in report.outcomes}
    assert {"odd path", "bad method", "bad body", "console form"} <= kinds


def test_a_method_an_endpoint_does_not_take_is_a_problem_405(token_broker: BrokerProcess) -> None:
    """Regression (the HTTP fuzz found it): Starlette's own 405 was plain text, unlike every
    other error of the admin API."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for method, path in [
        ("POST", "/v1/topics"),
        ("DELETE", "/healthz"),
        ("GET", "/v1/transactions/x/commit"),
    ]:
        r = httpx.request(method, token_broker.http + path, headers=headers, timeout=10)
        assert r.status_code == 405, (method, path, r.text)
        assert r.json()["code"] == "METHOD_NOT_ALLOWED"
        assert r.headers["allow"]


async def test_a_malformed_chunk_is_answered_400_without_a_traceback(
    token_broker: BrokerProcess,
) -> None:
    """Regression (the HTTP fuzz found it): headers that parse start the app; a malformed chunk
    after them made uvicorn answer 400 itself, and the app's own answer then raised on the
    finished connection ("Exception in ASGI application" and a traceback in the log)."""
    where = urlsplit(token_broker.http)
    chunked = b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    raws = [
        b"POST /console/login" + chunked + b"Content-Length: 3\r\n\r\nzz\r\n",
        b"POST /console/login" + chunked + b"\r\nzz\r\n",  # headers fine, the chunk not
        b"POST /v1/topics/t/messages" + chunked + b"\r\n2\r\n{}\r\nzz\r\n",  # one good first
    ]
    for raw in raws * 10:  # the race was lost every time on an idle broker; 10 to be sure
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        writer.write(raw)
        async with asyncio.timeout(10):
            answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert "Traceback" not in token_broker.log_path.read_text()
