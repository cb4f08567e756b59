"""Transactions under sync replication when the slave does not answer (docs/transactions.md,
"A write the slaves did not confirm"): a PREPARE or a commit whose wait for the slave timed out
is in the master's log and stands there. The client is told REPLICATION_TIMEOUT; a resend is
answered once the slave holds the record; the transaction ends exactly once, never left open.

Real master and slave processes and a real check-back server; the slave frozen (SIGSTOP), which
is what a partition that drops its packets looks like to a master that keeps its lease.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, TypeVar

import httpx
import pytest

from tests.cluster.test_partition import stopped
from tests.conftest import BrokerProcess, run_cli
from tests.replication.conftest import Brokers
from tests.tx.conftest import GROUP, SECRET, check_server
from tests.tx.test_transactions import _consume_all, _wait_state
from txbroker.errors import ReplicationTimeout, TransactionConflict
from txbroker.protocol.ids import new_id
from txbroker_checkback import CheckStatus
from txbroker_sdk import Client

TOPIC: Final = "orders"
# The master's wait for its slave, short so a frozen slave fails a write soon.
REPLICATION_TIMEOUT_MS: Final = 1000
# Back-checks 300 ms after a PREPARE, then every 100-200 ms, answered UNKNOWN until the test
# says what the service decided: never parked while the slave is frozen.
SETTINGS: Final = """
tx_timeout_ms = 300
check_backoff_base_ms = 100
check_backoff_cap_ms = 200
max_checks = 1000
check_timeout_ms = 500
"""
# A resend after the slave is thawed: it answers within one fetch round; each failed attempt
# waits one replication timeout, and a loaded machine may need a few.
HEALED_BOUND_S: Final = 30.0
CHECKED_BOUND_S: Final = 15.0  # the first back-check is due 300 ms after the PREPARE

T = TypeVar("T")


def _sync_pair(brokers: Brokers, root: Path) -> tuple[BrokerProcess, BrokerProcess]:
    cfg = root / "tx.toml"
    cfg.write_text(SETTINGS)
    master = brokers.master(
        "master",
        *("--replication", "sync", "--replication-timeout-ms", str(REPLICATION_TIMEOUT_MS)),
        *("--config", str(cfg), "--tx-secret", f"{GROUP}={SECRET}"),
    )
    return master, brokers.slave(master)


def _pid(b: BrokerProcess) -> int:
    assert b.proc is not None and b.proc.poll() is None, f"{b.data_dir.name} is not running"
    return b.proc.pid


async def _once_replicated(request: Callable[[], Awaitable[T]]) -> T:
    """``request``'s answer once the slave holds what it answers for: while it is catching up
    the request fails with REPLICATION_TIMEOUT, as the first attempt did."""
    deadline = time.monotonic() + HEALED_BOUND_S
    while True:
        try:
            return await request()
        except ReplicationTimeout:
            assert time.monotonic() < deadline, "the slave never confirmed the record"


async def _keyed(http: str, key: str) -> int:
    """How many messages of TOPIC the broker at ``http`` holds under ``key``."""
    async with httpx.AsyncClient(base_url=http) as h:
        r = await h.get("/v1/messages", params={"topic": TOPIC, "key": key})
        r.raise_for_status()
        return len(r.json()["messages"])


async def _open_on(http: str) -> int:
    """The open transactions the broker's HTTP admin API lists."""
    async with httpx.AsyncClient(base_url=http) as h:
        r = await h.get("/v1/transactions")
        r.raise_for_status()
        total: int = r.json()["total"]
        return total


async def _admin_unconfirmed(http: str, tx_id: str) -> object:
    """The ``unconfirmed`` flag the HTTP admin API shows for ``tx_id``."""
    async with httpx.AsyncClient(base_url=http) as h:
        r = await h.get(f"/v1/transactions/{tx_id}")
        r.raise_for_status()
        return r.json()["unconfirmed"]


async def _console_badges(http: str, tx_id: str) -> list[str]:
    """The "unconfirmed" badges in ``tx_id``'s row of the console's Transactions page (a broker
    without a token shows its console to requests from its own host)."""
    async with httpx.AsyncClient(base_url=http) as h:
        r = await h.get("/console/transactions")
        r.raise_for_status()
    row = next(tr for tr in r.text.split("<tr>") if f"/transactions/{tx_id}" in tr)
    return re.findall(r'class="badge (unconfirmed)"', row)


async def _cli(broker: BrokerProcess, *args: str) -> str:
    """What ``txbroker ARGS --server`` the broker prints (a real CLI process)."""
    got = await asyncio.to_thread(run_cli, *args, "--server", broker.url)
    assert got.returncode == 0, got.stderr
    return got.stdout


async def test_a_commit_the_slave_did_not_confirm_stands_and_ends_once(
    brokers: Brokers, tmp_path: Path
) -> None:
    master, slave = _sync_pair(brokers, tmp_path)
    async with check_server() as checks, await Client.connect(master.url) as c:
        checks.default = CheckStatus.COMMIT  # the service committed, should anyone ask
        await c.create_topic(TOPIC, queues=1)
        tx = await c.prepare(
            TOPIC,
            b"order-1",
            producer_group=GROUP,
            check_url=checks.url,
            key="o1",
            timeout_ms=60_000,  # ended by the producer: no check is due during the test
        )
        with stopped(_pid(slave)):
            with pytest.raises(ReplicationTimeout, match="0 of the 1 slaves"):
                await tx.commit()
            # The commit is in the master's log: it stands there, ended, not open again, and
            # says the slaves have not confirmed it.
            info = await c.show_transaction(tx.tx_id)
            assert (info.state, info.unconfirmed) == ("committed", True)
            shown = await _cli(master, "tx", "show", tx.tx_id)
            assert "committed, unconfirmed" in shown and "did not confirm it in time" in shown
            assert (await c.list_transactions()).total == 0
            # A resend is an acknowledgement too: not before the slave holds the commit. It
            # writes nothing (one visible copy, below).
            with pytest.raises(ReplicationTimeout):
                await tx.commit()
            with pytest.raises(TransactionConflict):
                await tx.rollback()
        again = await _once_replicated(tx.commit)
        assert (again.state, again.duplicate, again.resolved_by) == ("committed", True, "producer")
        assert await _consume_all(c, TOPIC, "billing") == [b"order-1"]
        assert await _keyed(master.http, "o1") == 1
        assert await _keyed(slave.http, "o1") == 1  # replicated once the consumer could read it
        assert (await c.list_transactions()).total == 0
        assert await _open_on(master.http) == 0
        info = await c.show_transaction(tx.tx_id)
        assert (info.state, info.resolved_by, info.unconfirmed) == ("committed", "producer", False)
        assert "unconfirmed" not in await _cli(master, "tx", "show", tx.tx_id)
    assert checks.seen == []  # decided by the producer: never asked


@pytest.mark.parametrize(
    ("answer", "state"), [(CheckStatus.COMMIT, "committed"), (CheckStatus.ROLLBACK, "rolled_back")]
)
async def test_a_prepare_the_slave_did_not_confirm_is_back_checked_and_resolved(
    brokers: Brokers, tmp_path: Path, answer: CheckStatus, state: str
) -> None:
    master, slave = _sync_pair(brokers, tmp_path)
    tx_id = new_id()  # recorded before preparing (as the SDK's barrier row does)

    async def prepare() -> str:
        got = await c.prepare(
            TOPIC, b"order-2", producer_group=GROUP, check_url=checks.url, tx_id=tx_id, key="o2"
        )
        return got.message_id

    async with check_server() as checks, await Client.connect(master.url) as c:
        await c.create_topic(TOPIC, queues=1)
        with stopped(_pid(slave)):
            with pytest.raises(ReplicationTimeout, match="0 of the 1 slaves"):
                await prepare()
            # The half record is in the master's log: the transaction is open there and is
            # back-checked when due, as any other (answered UNKNOWN: the service cannot tell yet).
            info = await c.show_transaction(tx_id)
            assert (info.state, info.unconfirmed) == ("prepared", True)
            # An operator sees it: in the HTTP admin API, the CLI's list and the console's
            # Transactions page (a badge beside its state).
            assert await _admin_unconfirmed(master.http, tx_id) is True
            assert "pending, unconfirmed" in await _cli(master, "tx", "list")
            assert await _console_badges(master.http, tx_id) == ["unconfirmed"]
            deadline = time.monotonic() + CHECKED_BOUND_S
            while checks.checks_for(tx_id) == 0:
                assert time.monotonic() < deadline, "the transaction was never back-checked"
                await asyncio.sleep(0.05)  # polling the check server's record: the condition
            with pytest.raises(ReplicationTimeout):
                await prepare()  # a resend is acknowledged only once the slave holds the half
        message_id = await _once_replicated(prepare)
        info = await c.show_transaction(tx_id)
        assert (info.message_id, info.unconfirmed) == (message_id, False)  # the same half
        assert await _admin_unconfirmed(master.http, tx_id) is False
        assert await _console_badges(master.http, tx_id) == []
        checks.answers[tx_id] = answer  # what the service's barrier decided
        await _wait_state(c, tx_id, state)
        info = await c.show_transaction(tx_id)
        assert info.resolved_by == "check"
        delivered = [b"order-2"] if answer is CheckStatus.COMMIT else []
        assert await _consume_all(c, TOPIC, "billing") == delivered
        assert await _keyed(master.http, "o2") == len(delivered)
        assert await _keyed(slave.http, "o2") == len(delivered)
        assert (await c.list_transactions()).total == 0
        assert await _open_on(master.http) == 0
