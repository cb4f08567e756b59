"""The supervisor and the loops' health, on loops that fail on cue: each cause logged once
(with what to do) however often it comes, every failure counted in the
``txbroker.service.loop.failures`` metric, transient causes retried soon with a capped backoff
and blocked ones slowly, readiness false exactly while a loop is blocked or not started, and a
blocked loop handed to ``exit_when_blocked``. tests/sdk/test_supervised_service.py does the
same with real processes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from sqlalchemy.exc import OperationalError, ProgrammingError

from txbroker.errors import (
    BadRequest,
    Forbidden,
    InvalidOffset,
    NotFound,
    StoreError,
    Unauthenticated,
)
from txbroker_sdk.errors import ConnectionClosed, RequestTimeout, TablesMissing, TlsFailed
from txbroker_sdk.supervision import (
    TRANSIENT_MAX_S,
    LoopHealth,
    LoopState,
    Supervisor,
    diagnose,
    unless_stopped,
)

WITHIN_S = 10.0


@pytest.fixture
def metrics() -> Iterator[tuple[MeterProvider, InMemoryMetricReader]]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, reader
    provider.shutdown()


def _failures(reader: InMemoryMetricReader) -> dict[tuple[str, str], int]:
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[tuple[str, str], int] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                assert metric.name == "txbroker.service.loop.failures"
                for p in metric.data.data_points:
                    attrs = p.attributes or {}
                    out[(str(attrs["txbroker.loop"]), str(attrs["error.type"]))] = int(p.value)  # type: ignore[attr-defined]
    return out


class Scripted:
    """A loop that raises the errors it is given, one per run, then works (and says so)
    until the stop."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.health = LoopHealth("scripted")
        self.working = asyncio.Event()
        self.runs = 0

    async def run(self, stop: asyncio.Event) -> None:
        self.runs += 1
        if self.errors:
            raise self.errors.pop(0)
        self.health.ok()
        self.working.set()
        await stop.wait()


async def test_each_cause_is_logged_once_counted_every_time_and_recovery_is_said(
    metrics: tuple[MeterProvider, InMemoryMetricReader], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "txbroker_sdk.supervision")
    provider, reader = metrics
    loop = Scripted(
        Unauthenticated("wrong or missing auth token"),
        Unauthenticated("wrong or missing auth token"),
        Unauthenticated("wrong or missing auth token"),
        ConnectionClosed("the broker closed the connection"),
        ConnectionClosed("the broker closed the connection"),
    )
    supervisor = Supervisor(blocked_retry_s=0.01, meter_provider=provider)
    supervisor.start(loop.run, loop.health)
    await asyncio.wait_for(loop.working.wait(), WITHIN_S)
    assert loop.runs == 6 and loop.health.state is LoopState.RUNNING and supervisor.ready
    await supervisor.stop(WITHIN_S)
    assert loop.health.state is LoopState.STOPPED and not supervisor.ready

    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage().split(":")[1].strip() for r in errors] == [
        "Unauthenticated",
        "ConnectionClosed",
    ]
    assert "What to do: the broker refused this service's auth token" in errors[0].getMessage()
    assert "retried every 0.01 s; the service is not ready" in errors[0].getMessage()
    assert errors[0].exc_info is None  # a known cause: no traceback
    assert "scripted: working again (after 5 failures)" in caplog.text
    assert _failures(reader) == {
        ("scripted", "UNAUTHENTICATED"): 3,
        ("scripted", "CONNECTION_CLOSED"): 2,
    }


async def test_a_cause_that_comes_back_after_a_recovery_is_logged_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = LoopHealth("x")
    h.failed(RequestTimeout("no answer"))
    h.failed(RequestTimeout("no answer"))
    h.ok()
    h.failed(RequestTimeout("no answer"))
    assert sum("x failed: RequestTimeout" in r.getMessage() for r in caplog.records) == 2


def test_transient_failures_back_off_to_a_cap_and_blocked_ones_wait_the_slow_retry() -> None:
    h = LoopHealth("x")
    delays = [h.failed(ConnectionClosed("gone")) for _ in range(8)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, TRANSIENT_MAX_S, TRANSIENT_MAX_S]
    assert h.state is LoopState.RETRYING and h.ready  # an outage: restarting would not help
    assert h.failed(Unauthenticated("no")) == 30.0  # the default slow retry
    assert h.state is LoopState.BLOCKED and not h.ready
    h.ok()
    assert h.failed(ConnectionClosed("gone")) == 0.1  # a success resets the backoff


def test_the_readiness_report_says_which_loop_why_and_what_to_do() -> None:
    h = LoopHealth("subscriber orders (group billing)")
    assert h.report()["state"] == "starting" and not h.ready  # not working yet
    h.failed(TablesMissing("sqlite:///x.db", ["txb_inbox"]))
    r = h.report()
    assert r["name"] == "subscriber orders (group billing)"
    assert (r["state"], r["ready"], r["failures"]) == ("blocked", False, 1)
    assert r["last_error"].startswith("TablesMissing: the txbroker tables are missing")
    assert (
        r["action"] == "run `txbroker db upgrade --url sqlite:///x.db` (or start with migrate=True)"
    )
    assert 29.0 < r["retry_in_s"] <= 30.0
    h.ok()
    r = h.report()
    assert (r["state"], r["ready"], r["action"], r["retry_in_s"]) == ("running", True, None, None)
    assert r["last_error"].startswith("TablesMissing")  # kept for whoever looks later


@pytest.mark.parametrize(
    ("error", "blocked", "says"),
    [
        (Unauthenticated("wrong token"), True, "TXB_AUTH_TOKEN"),
        (Forbidden("no consume on orders"), True, "role"),
        (TablesMissing("sqlite:///x.db", ["txb_inbox"]), True, "txbroker db upgrade"),
        (NotFound("topic 'orders' does not exist"), True, "txbroker topic create"),
        (TlsFailed("handshake"), True, "TXB_TLS_CA"),
        (BadRequest("bad body"), True, "version"),
        (ProgrammingError("SELECT", {}, Exception("permission denied")), True, "database user"),
        (ValueError("a bug"), True, "unexpected"),
        (ConnectionClosed("gone"), False, "TXB_SERVER"),
        (RequestTimeout("late"), False, "TXB_SERVER"),
        (StoreError("disk"), False, "broker"),
        (InvalidOffset("not the start of a record"), False, "broker"),
        (OperationalError("SELECT", {}, Exception("connection refused")), False, "database"),
        (OSError("reset"), False, "database"),
    ],
)
def test_what_each_error_means(error: BaseException, blocked: bool, says: str) -> None:
    d = diagnose(error)
    assert d.blocked is blocked
    assert says in d.action
    assert d.traceback is isinstance(error, ValueError)  # only the unexpected: a traceback


async def test_a_loop_without_health_is_running_while_it_runs_and_one_that_returns_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    returned = asyncio.Event()

    async def quits(stop: asyncio.Event) -> None:
        returned.set()  # returns before the stop: a bug in the loop

    async def serves(stop: asyncio.Event) -> None:
        await stop.wait()

    supervisor = Supervisor(blocked_retry_s=60)
    good = supervisor.start(serves, "serves")
    bad = supervisor.start(quits, "quits")
    await asyncio.wait_for(returned.wait(), WITHIN_S)  # its supervisor has seen it return
    assert good.state is LoopState.RUNNING
    assert bad.state is LoopState.BLOCKED and bad.last_error is not None
    assert "returned before the service stopped" in bad.last_error
    report = supervisor.report()
    assert (report["ready"], report["live"]) == (False, True)
    assert [loop["name"] for loop in report["loops"]] == ["serves", "quits"]
    await asyncio.wait_for(supervisor.stop(WITHIN_S), WITHIN_S)  # the slow retry cut short


async def test_a_blocked_loop_is_handed_to_exit_when_blocked_once() -> None:
    handed: list[str] = []
    loop = Scripted(Forbidden("no"), Forbidden("no"), Forbidden("no"))
    supervisor = Supervisor(blocked_retry_s=0.01, exit_when_blocked=lambda h: handed.append(h.name))
    supervisor.start(loop.run, loop.health)
    await asyncio.wait_for(loop.working.wait(), WITHIN_S)
    await supervisor.stop(WITHIN_S)
    assert handed == ["scripted"]  # blocked once (three failures of one spell)


async def test_unless_stopped_gives_up_a_step_when_the_stop_comes_first() -> None:
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def forever() -> int:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return 1

    async def quick() -> int:
        return 7

    assert await unless_stopped(quick(), stop) == 7
    asyncio.get_running_loop().call_soon(stop.set)
    assert await asyncio.wait_for(unless_stopped(forever(), stop), WITHIN_S) is None
    assert cancelled.is_set()
