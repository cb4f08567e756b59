"""The check-back contract end to end over real HTTP: the service endpoint verifies and answers,
the broker-side caller reads answers strictly, and every failure mode is UNKNOWN."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from tests.httpserver import serve_app
from txbroker_checkback import (
    CheckbackEndpoint,
    CheckOutcome,
    CheckRequest,
    CheckStatus,
    call_check,
    sign,
)
from txbroker_checkback.signing import HEADER_SIGNATURE, HEADER_TIMESTAMP

SECRETS = {"orders": "s3cret"}
REQ = CheckRequest(tx_id="t1", topic="orders", producer_group="orders", check_count=0)


def _endpoint_app(answers: dict[str, CheckStatus], seen: list[CheckRequest]) -> Starlette:
    def resolver(check: CheckRequest) -> CheckStatus:
        seen.append(check)
        return answers.get(check.tx_id, CheckStatus.UNKNOWN)

    return Starlette(
        routes=[Route("/check", CheckbackEndpoint(resolver, SECRETS), methods=["POST"])]
    )


@pytest.mark.parametrize("status", list(CheckStatus))
async def test_signed_check_gets_the_resolvers_answer(status: CheckStatus) -> None:
    seen: list[CheckRequest] = []
    async with serve_app(_endpoint_app({"t1": status}, seen)) as base, httpx.AsyncClient() as h:
        res = await call_check(h, base + "/check", REQ, "s3cret", "00-abc-def-01", 5)
    assert (res.status, res.outcome, res.sent) == (status, CheckOutcome.ANSWERED, True)
    assert seen == [REQ]


async def test_endpoint_rejects_bad_signatures_and_bodies() -> None:
    seen: list[CheckRequest] = []
    async with serve_app(_endpoint_app({}, seen)) as base, httpx.AsyncClient() as h:
        body = b'{"tx_id":"t1","topic":"orders","producer_group":"orders","check_count":0}'
        now = time.time_ns() // 1_000_000

        async def post(content: bytes, ts: int, sig: str) -> httpx.Response:
            headers = {HEADER_TIMESTAMP: str(ts), HEADER_SIGNATURE: sig}
            return await h.post(base + "/check", content=content, headers=headers)

        assert (await post(body, now, sign("wrong", now, body))).status_code == 401
        stale = now - 10 * 60 * 1000
        assert (await post(body, stale, sign("s3cret", stale, body))).status_code == 401
        assert (await post(body + b" ", now, sign("s3cret", now, body))).status_code == 401
        assert (await h.post(base + "/check", content=body)).status_code == 401  # unsigned
        junk = b"{not json"
        assert (await post(junk, now, sign("s3cret", now, junk))).status_code == 400
        other = body.replace(b'"orders","check', b'"nobody","check')
        assert (await post(other, now, sign("s3cret", now, other))).status_code == 401
        assert (await post(body, now, sign("s3cret", now, body))).status_code == 200
    assert len(seen) == 1  # only the authentic request reached the resolver


def _misbehaving_app() -> Starlette:
    async def error(_: Request) -> Response:
        return PlainTextResponse("boom", 500)

    async def garbage(_: Request) -> Response:
        return PlainTextResponse("<html>OK</html>", 200)

    async def lowercase(_: Request) -> Response:
        return Response(b'{"status": "commit"}', 200, media_type="application/json")

    async def empty(_: Request) -> Response:
        return Response(b"{}", 200, media_type="application/json")

    async def slow(_: Request) -> Response:
        await asyncio.sleep(1.5)  # past the caller's 0.5 s timeout
        return Response(b'{"status": "COMMIT"}', 200)

    return Starlette(
        routes=[
            Route("/500", error, methods=["POST"]),
            Route("/garbage", garbage, methods=["POST"]),
            Route("/lower", lowercase, methods=["POST"]),
            Route("/empty", empty, methods=["POST"]),
            Route("/slow", slow, methods=["POST"]),
        ]
    )


@pytest.mark.parametrize(
    ("path", "outcome"),
    [
        ("/500", CheckOutcome.BAD_ANSWER),
        ("/garbage", CheckOutcome.BAD_ANSWER),
        ("/lower", CheckOutcome.BAD_ANSWER),
        ("/empty", CheckOutcome.BAD_ANSWER),
        ("/slow", CheckOutcome.TIMEOUT),
        ("/missing", CheckOutcome.BAD_ANSWER),  # 404
    ],
)
async def test_every_misbehaviour_is_unknown_never_commit(path: str, outcome: CheckOutcome) -> None:
    async with serve_app(_misbehaving_app()) as base, httpx.AsyncClient() as h:
        res = await call_check(h, base + path, REQ, "s3cret", None, 0.5)
    assert res.status is CheckStatus.UNKNOWN and res.outcome is outcome and res.sent


async def test_an_endpoint_that_is_down_is_unknown_and_not_counted() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with httpx.AsyncClient() as h:
        res = await call_check(h, f"http://127.0.0.1:{port}/check", REQ, "s3cret", None, 1)
    assert res.status is CheckStatus.UNKNOWN and res.outcome is CheckOutcome.UNREACHABLE
    assert not res.sent


async def test_each_failure_names_its_cause() -> None:
    """What a person reads in the broker's log and in a transaction's last reason: refused,
    TLS, a signature the endpoint refused, an HTTP status, an unreadable answer."""
    with socket.socket() as s:  # bound, never listening: every connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        async with httpx.AsyncClient() as h:
            refused = await call_check(h, f"http://127.0.0.1:{port}/c", REQ, "s3cret", None, 1)
    assert refused.cause == "connection refused" and not refused.sent
    assert refused.reason.startswith("unreachable: connection refused: ")
    seen: list[CheckRequest] = []
    async with serve_app(_endpoint_app({}, seen)) as base, httpx.AsyncClient() as h:
        tls = await call_check(
            h, base.replace("http:", "https:") + "/check", REQ, "s3cret", None, 2
        )
        assert (tls.outcome, tls.cause) == (CheckOutcome.UNREACHABLE, "TLS")
        assert "SSL" in tls.reason  # the TLS library's words: wrong version number
        forged = await call_check(h, base + "/check", REQ, "not-the-secret", None, 2)
        assert (forged.outcome, forged.cause) == (CheckOutcome.BAD_ANSWER, "signature refused")
        assert forged.reason.startswith("HTTP 401: the endpoint refused the signature")
        ok = await call_check(h, base + "/check", REQ, "s3cret", None, 2)
        assert ok.cause == "answered"
    async with serve_app(_misbehaving_app()) as base, httpx.AsyncClient() as h:
        assert (await call_check(h, base + "/500", REQ, "s3cret", None, 2)).cause == "HTTP 500"
        garbage = await call_check(h, base + "/garbage", REQ, "s3cret", None, 2)
        assert garbage.cause == "unreadable answer"
        assert (await call_check(h, base + "/slow", REQ, "s3cret", None, 0.3)).cause == "timeout"


async def test_resolver_failure_is_a_500() -> None:
    def broken(_: CheckRequest) -> CheckStatus:
        raise RuntimeError("db down")

    app = Starlette(routes=[Route("/c", CheckbackEndpoint(broken, SECRETS), methods=["POST"])])
    async with serve_app(app) as base, httpx.AsyncClient() as h:
        res = await call_check(h, base + "/c", REQ, "s3cret", None, 5)
    assert res.status is CheckStatus.UNKNOWN and "500" in res.reason


def test_a_service_mounting_the_endpoint_does_not_import_the_broker_side_http_client() -> None:
    """The service imports the SDK and the barrier's mount; httpx (the broker's caller) stays
    out of its process until something asks for the caller."""
    probe = (
        "import sys, txbroker_sdk; from txbroker_sdk import mount, TxPublisher, Subscribers; "
        "assert 'httpx' not in sys.modules, 'imported with the endpoint'; "
        "from txbroker_checkback import call_check; "
        "assert 'httpx' in sys.modules and call_check.__module__ == 'txbroker_checkback.caller'; "
        "import txbroker_checkback; "
        "assert not hasattr(txbroker_checkback, 'no_such_name')"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
