"""The error mapping and the guard, without a broker: each broker error answers its status, and
an unexpected exception is logged and answered 500 as a problem (never a bare traceback)."""

from __future__ import annotations

import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from txbroker import errors
from txbroker.server.http.guard import guarded
from txbroker.server.http.problems import CONTENT_TYPE, problem_for
from txbroker.server.tokens import TokenTable


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.BadRequest, 400),
        (errors.InvalidArgument, 422),
        (errors.InvalidName, 422),
        (errors.MessageTooLarge, 413),
        (errors.Unauthenticated, 401),
        (errors.Forbidden, 403),
        (errors.NotFound, 404),
        (errors.TransactionNotFound, 404),
        (errors.TransactionConflict, 409),
        (errors.NotMaster, 503),
        (errors.ReplicationTimeout, 503),
        (errors.StoreFailed, 503),
        (errors.TooManyTransactions, 503),  # retriable
        (errors.Internal, 500),
        (errors.TopicExists, 500),  # no publish answers it: a bug if one does
    ],
)
def test_each_broker_error_has_its_status_and_keeps_its_code(
    error: type[errors.TxbError], status: int
) -> None:
    p = problem_for(error("why"))
    body = p.body()
    assert (p.status, body.status, body.code, body.detail) == (status, status, error.code, "why")
    assert body.type == f"urn:txbroker:error:{error.code}"


async def test_an_unexpected_exception_is_logged_and_answered_500(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(_: Request) -> Response:
        raise RuntimeError("a bug")

    app = Starlette(routes=[Route("/x", guarded(broken, TokenTable(), role=None))])
    transport = httpx.ASGITransport(app=app)
    with caplog.at_level(logging.ERROR):
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            r = await client.get("/x")
    assert r.status_code == 500 and r.headers["content-type"] == CONTENT_TYPE
    assert r.json()["code"] == "INTERNAL" and "a bug" not in r.text  # details stay in the log
    assert "a bug" in caplog.text and "GET /x failed" in caplog.text
