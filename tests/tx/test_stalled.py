"""Check-back endpoints that are really unreachable, then reachable, against real broker
processes: the log a person reads, the stalled flag (listings, CLI, metric), its survival of a
restart, back-checks by pull with no poller, and the backoff schedule the docs state."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
from starlette.applications import Starlette
from starlette.routing import Route

from tests.conftest import BrokerProcess, free_port, run_cli
from tests.server.test_metrics import scrape, value
from tests.tx.conftest import GROUP, SECRET, tx_broker
from txbroker.protocol.messages import TxInfo
from txbroker.runtime.httpserve import HttpServer
from txbroker_checkback import CheckbackEndpoint, CheckRequest, CheckStatus
from txbroker_sdk import Client

# Checks soon and often, the breaker's cool-down short, stalled after 1.5 s of checks that
# reach no one; parking (3 counted checks) never comes while nothing is reached.
QUICK = """
tx_timeout_ms = 200
check_backoff_base_ms = 100
check_backoff_cap_ms = 400
max_checks = 3
check_timeout_ms = 1000
check_breaker_base_ms = 200
check_breaker_cap_ms = 400
stall_after_ms = 1500
"""
STALL_MS = 1500
WAIT_S = 20.0  # bound on every wait for the broker to reach a state
T = TypeVar("T")


async def _until(what: str, probe: Callable[[], Awaitable[T | None]]) -> T:
    """Poll the broker (the state under test) until ``probe`` gives a value; bounded."""
    deadline = time.monotonic() + WAIT_S
    while (got := await probe()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return got


async def _stalled(c: Client, tx_id: str) -> TxInfo:
    async def probe() -> TxInfo | None:
        info = await c.show_transaction(tx_id)
        return info if info.stalled else None

    return await _until(f"{tx_id} to be stalled", probe)


def _log_line(b: BrokerProcess, pattern: str) -> Callable[[], Awaitable[str | None]]:
    async def probe() -> str | None:
        found = re.findall(pattern, b.log_path.read_text())
        return found[0] if found else None

    return probe


@contextlib.asynccontextmanager
async def _endpoint(port: int, answer: CheckStatus) -> AsyncIterator[list[CheckRequest]]:
    """The service's check-back endpoint, up on ``port`` (where nothing listened before)."""
    seen: list[CheckRequest] = []

    def resolve(check: CheckRequest) -> CheckStatus:
        seen.append(check)
        return answer

    endpoint = CheckbackEndpoint(resolve, {GROUP: SECRET})
    server = HttpServer(
        Starlette(routes=[Route("/txb/check", endpoint, methods=["POST"])]), port=port
    )
    await server.start()
    try:
        yield seen
    finally:
        await server.stop()


async def test_an_unreachable_endpoint_is_logged_stalls_and_recovers(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there yet: every check is refused
    url = f"http://127.0.0.1:{port}/txb/check"
    endpoint = f"http://127.0.0.1:{port}"
    b = tx_broker(tmp_path / "b", settings=QUICK).start()
    try:
        async with await Client.connect(b.url) as c, httpx.AsyncClient(base_url=b.http) as h:
            await c.create_topic("orders", queues=1)
            waits = await c.prepare("orders", b"a", producer_group=GROUP, check_url=url)
            decided = await c.prepare("orders", b"b", producer_group=GROUP, check_url=url)
            started = await _until(
                "the failure in the log",
                _log_line(b, rf"WARNING .*back-checks to {endpoint} started failing: .*"),
            )
            assert "started failing: unreachable: connection refused: [Errno 111]" in started
            info = await _stalled(c, waits.tx_id)
            now_ms = time.time_ns() // 1_000_000
            assert info.unreachable_since_ms is not None
            assert info.unreachable_since_ms <= now_ms - STALL_MS
            # Stalled is a flag on a pending transaction: never decided, never parked.
            assert (info.state, info.checks) == ("prepared", 0)
            assert "connection refused" in info.last_reason
            await _stalled(c, decided.tx_id)
            listed = await c.list_transactions(state="stalled")
            assert {t.tx_id for t in listed.transactions} == {waits.tx_id, decided.tx_id}
            assert all(t.stalled for t in listed.transactions)
            assert (await c.list_transactions(state="prepared")).total == 2
            shown = (await h.get("/v1/transactions", params={"state": "stalled"})).json()
            assert shown["total"] == 2 and all(t["stalled"] for t in shown["transactions"])
            assert value(await scrape(h), "txbroker_tx_stalled") == 2
            cli = run_cli("tx", "list", "--state", "stalled", "--server", b.url)
            assert cli.returncode == 0, cli.stderr
            assert cli.stdout.count("stalled") >= 2 and waits.tx_id in cli.stdout

            # An operator may still decide a stalled transaction.
            assert (await c.resolve_transaction(decided.tx_id, "rollback")).state == "rolled_back"
            assert value(await scrape(h), "txbroker_tx_stalled") == 1

            # The service comes up and answers UNKNOWN: the check reaches it, the flag clears,
            # and the log says how long it was down and how many checks failed.
            async with _endpoint(port, CheckStatus.UNKNOWN) as seen:

                async def reached() -> TxInfo | None:
                    info = await c.show_transaction(waits.tx_id)
                    return info if info.checks >= 1 else None

                info = await _until("a check to reach the service", reached)
                assert not info.stalled and info.unreachable_since_ms is None
                assert info.state == "prepared" and seen[0].tx_id == waits.tx_id
                recovered = await _until(
                    "the recovery in the log",
                    _log_line(b, rf"INFO .*back-checks to {endpoint} recovered after .*"),
                )
                n = int(
                    re.search(r": (\d+) checks? failed \(connection refused: \1\)", recovered)[1]
                )  # type: ignore[index]
                failed = value(
                    await scrape(h),
                    "txbroker_tx_checks_total",
                    txbroker_check_outcome="unreachable",
                )
                assert 2 <= n == failed  # every unreachable check of the run, in one line
                assert value(await scrape(h), "txbroker_tx_stalled") == 0
            # Rate-limited: one line when the run started and one when it ended, however many
            # checks failed in between (the next line would come after 5 minutes).
            log = b.log_path.read_text()
            assert log.count(f"back-checks to {endpoint} started failing") == 1
            assert log.count(f"back-checks to {endpoint} still failing") == 0
            assert log.count(f"back-checks to {endpoint} recovered") == 1
    finally:
        b.stop()


async def test_a_stalled_transaction_is_stalled_again_after_a_restart(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/txb/check"
    b = tx_broker(tmp_path / "b", settings=QUICK).start()
    try:
        async with await Client.connect(b.url) as c:
            await c.create_topic("orders", queues=1)
            tx = await c.prepare("orders", b"a", producer_group=GROUP, check_url=url)
            before = await _stalled(c, tx.tx_id)
    finally:
        assert b.stop() == 0
    b = tx_broker(tmp_path / "b", settings=QUICK).start()
    try:
        async with await Client.connect(b.url) as c:
            # At once, before any check of the new process: when the run began was saved.
            after = await c.show_transaction(tx.tx_id)
            assert after.stalled and after.unreachable_since_ms == before.unreachable_since_ms
            assert after.state == "prepared"
    finally:
        b.stop()


async def test_pulled_checks_nobody_polls_stall_until_a_poller_takes_one(tmp_path: Path) -> None:
    b = tx_broker(tmp_path / "b", settings=QUICK).start()
    try:
        async with await Client.connect(b.url) as c, httpx.AsyncClient(base_url=b.http) as h:
            await c.create_topic("orders", queues=1)
            tx = await c.prepare("orders", b"a", producer_group=GROUP, check_url="pull")
            info = await _stalled(c, tx.tx_id)
            assert (info.state, info.checks) == ("prepared", 0)
            r = await h.post(
                f"/v1/producer-groups/{GROUP}/checks", json={"max": 10, "wait_ms": 5000}
            )
            assert [check["tx_id"] for check in r.json()["checks"]] == [tx.tx_id]
            after = await c.show_transaction(tx.tx_id)  # polled: it reached the service
            assert not after.stalled and after.unreachable_since_ms is None
    finally:
        b.stop()


# No breaker in the way (it would hold checks back, not change their due times), and no stall.
BACKOFF = """
tx_timeout_ms = 200
check_backoff_base_ms = 200
check_backoff_cap_ms = 1600
check_breaker_failures = 1000
"""


async def _due_times(c: Client, tx_id: str, n: int, after: int = 0) -> list[int]:
    """The first ``n`` due times of ``tx_id``'s next check past ``after``, as they change."""
    seen: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while len(seen) < n:
        due = (await c.show_transaction(tx_id)).next_check_ms
        if due > max([after, *seen]):
            seen.append(due)
        assert time.monotonic() < deadline, f"due times seen: {seen}"
        await asyncio.sleep(0.01)
    return seen


async def test_the_backoff_of_unreachable_checks_doubles_to_the_cap_across_a_restart(
    tmp_path: Path,
) -> None:
    """docs/transactions.md, "Backoff": after the n-th check that did not decide, reached or
    not, the next waits base * 2^(n-1), capped; the count survives a restart."""
    url = f"http://127.0.0.1:{free_port()}/txb/check"
    b = tx_broker(tmp_path / "b", settings=BACKOFF).start()
    try:
        async with await Client.connect(b.url) as c:
            await c.create_topic("orders", queues=1)
            tx = await c.prepare("orders", b"a", producer_group=GROUP, check_url=url)
            due = await _due_times(c, tx.tx_id, 6)
    finally:
        assert b.stop() == 0
    # Each check goes when due (a refused connection takes a millisecond), so the gaps between
    # due times are the waits: 200, 400, 800, 1600 ms, then the cap again.
    gaps = [later - earlier for earlier, later in itertools.pairwise(due)]
    for gap, wait in zip(gaps, [200, 400, 800, 1600, 1600], strict=True):
        assert wait <= gap < wait + 500, gaps
    b = tx_broker(tmp_path / "b", settings=BACKOFF).start()
    try:
        async with await Client.connect(b.url) as c:
            restored = (await c.show_transaction(tx.tx_id)).next_check_ms
            (next_due,) = await _due_times(c, tx.tx_id, 1, after=restored)
            changed_ms = time.time_ns() // 1_000_000  # the check came before this
            # Not back to the 200 ms base: the 6th attempt's wait is the cap.
            assert next_due - changed_ms > 1000, (restored, next_due, changed_ms)
    finally:
        b.stop()


async def test_a_stalled_transaction_is_stalled_again_on_the_new_master(tmp_path: Path) -> None:
    """The new master has the log, not the old one's tx.json: at its first check that cannot
    reach the service it dates the run from the transaction's first due check, so a stalled
    transaction is stalled again at once, not a stall time after the failover."""
    from tests.cluster.conftest import _require_etcd
    from txbroker.chaos.cluster import Cluster

    _require_etcd()
    cfg = tmp_path / "tx.toml"
    cfg.write_text(QUICK)
    flags = ("--segment-mib", "8", "--tx-secret", f"{GROUP}={SECRET}", "--config", str(cfg),
             "--replication", "sync")  # fmt: skip
    env = {"TXB_INDEX_CAPACITY": "65536"}
    url = f"http://127.0.0.1:{free_port()}/txb/check"
    async with Cluster(tmp_path / "c", groups=("g1",), per_group=3, extra=flags, env=env) as cl:
        await cl.create_topic("orders", queues=1)
        async with await Client.connect(cl.url, timeout_s=10) as c:
            tx = await c.prepare("orders", b"a", producer_group=GROUP, check_url=url)
            before = await _stalled(c, tx.tx_id)
            old = (await cl.masters())["g1"].broker_id
        await cl.kill_master("g1")
        new = await cl.wait_master("g1", other_than=old)
        async with Client(new.address, timeout_s=5) as direct:
            after = await _stalled(direct, tx.tx_id)
    assert before.unreachable_since_ms is not None and after.unreachable_since_ms is not None
    assert after.unreachable_since_ms <= before.unreachable_since_ms
    assert (after.state, after.checks) == ("prepared", 0)
