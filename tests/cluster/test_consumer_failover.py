"""A consumer group across a master's failover, at chosen moments (docs/cluster.md, "Consumers
across a failover"): the group is served by its broker group's master only; it never commits,
nor fetches from, an offset beyond a record it has not processed there; after a failover it
resumes at or before the first record it has not processed. Real brokers (``--role auto``),
a real etcd and a NameServer; each moment scripted: a pull held at the master as it dies,
messages fetched and not yet committed, a transaction's commit written on a master that dies
before a slave has it, and a pull that finishes beside one that fails."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import google_crc32c
import pytest

from tests.cluster.conftest import _require_etcd
from tests.cluster.logs import wait_keys
from tests.tx.conftest import GROUP, SECRET, CheckServer, check_server
from txbroker.chaos.cluster import Cluster, Member
from txbroker.errors import NotMaster, TxbError
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import GroupsRequest, HeartbeatRequest
from txbroker_checkback import CheckStatus
from txbroker_sdk import Client
from txbroker_sdk.cluster import ClusterClient
from txbroker_sdk.consumer import ConsumedMessage, Consumer

TOPIC: Final = "orders"
ENV: Final = {"TXB_INDEX_CAPACITY": "65536"}
READ_TIMEOUT_S: Final = 60.0  # an election (3 s lease) and a back-check, on a loaded runner
# Back-checks 2 s after a transaction was left open, then often: the new master decides it
# soon after it took over.
SETTINGS: Final = """
tx_timeout_ms = 2000
check_backoff_base_ms = 100
check_backoff_cap_ms = 300
max_checks = 100
check_timeout_ms = 1000
"""


@contextlib.asynccontextmanager
async def _cluster(
    root: Path, groups: tuple[str, ...], per_group: int, replication: str
) -> AsyncIterator[Cluster]:
    _require_etcd()
    cfg = root / "tx.toml"  # root: the test's own folder
    await asyncio.to_thread(cfg.write_text, SETTINGS)
    flags = ("--segment-mib", "8", "--tx-secret", f"{GROUP}={SECRET}", "--config", str(cfg))
    flags += ("--replication", replication)
    async with Cluster(
        root / "c", groups=groups, per_group=per_group, extra=flags, env=ENV
    ) as cluster:
        await cluster.create_topic(TOPIC, queues=2 * len(groups))
        yield cluster


@pytest.fixture
async def sync3(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with _cluster(tmp_path, ("g1",), 3, "sync") as cluster:
        yield cluster


@pytest.fixture
async def two_groups(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with _cluster(tmp_path, ("g1", "g2"), 2, "async") as cluster:
        yield cluster


@pytest.fixture
async def checks() -> AsyncIterator[CheckServer]:
    async with check_server() as server:
        yield server


async def _master(cluster: Cluster, group: str = "g1") -> Member:
    return cluster.member((await cluster.masters())[group].broker_id)


async def _send(c: Client, keys: list[str]) -> None:
    """Send one message per key, each resent (same idempotency key) while its group elects."""
    for k in keys:
        async with asyncio.timeout(READ_TIMEOUT_S):
            while True:
                try:
                    await c.send(TOPIC, k.encode(), key=k, idempotency_key=k)
                    break
                except TxbError:
                    await asyncio.sleep(0.2)  # the next try, while the group has no master


async def _read(cons: Consumer, want: set[str], seen: Counter[str]) -> None:
    """Fetch and acknowledge until every key of ``want`` was seen (bounded); fetches that fail
    while a master is away are tried again, as a subscriber does."""
    async with asyncio.timeout(READ_TIMEOUT_S):
        while not want <= set(seen):
            try:
                batch = await cons.fetch(500)
            except TxbError:
                await asyncio.sleep(0.1)  # the next fetch, not a synchronisation
                continue
            for m in batch:
                seen[m.body.decode()] += 1
                m.ack()


async def _lag(member: Member, group: str) -> int:
    """What ``group`` has not committed at ``member``, once it committed at all (bounded)."""
    async with Client(member.proc.url, timeout_s=5) as c, asyncio.timeout(READ_TIMEOUT_S):
        while True:
            res = await c.request(Opcode.OFFSETS, GroupsRequest(group, TOPIC))
            if res.groups and all(q.committed is not None for q in res.groups[0].queues):
                return int(res.groups[0].lag)
            await asyncio.sleep(0.1)  # the consumer commits every second


async def test_a_slave_of_an_elected_group_serves_no_consumer(sync3: Cluster) -> None:
    """Joining, pulling and committing are the master's: a slave answers NOT_MASTER naming it
    (a slave may hold a tail the next master does not have, learnt only at its next fetch)."""
    master = await _master(sync3)
    slave = next(m for m in sync3.members if m is not master)
    async with Client(slave.proc.url, timeout_s=5) as c:
        with pytest.raises(NotMaster, match="its master is txb://"):
            await c.request(Opcode.HEARTBEAT, HeartbeatRequest("billing", TOPIC, "m1"))


async def test_a_pull_held_at_the_master_as_it_dies_resumes_at_the_new_one(
    sync3: Cluster,
) -> None:
    async with (
        await Client.connect(sync3.url, timeout_s=5) as c,
        Consumer(c, "billing", TOPIC, hold_ms=1000) as cons,
    ):
        seen: Counter[str] = Counter()
        await _send(c, [f"a{i}" for i in range(10)])
        await _read(cons, {f"a{i}" for i in range(10)}, seen)
        await cons.commit()
        held = asyncio.create_task(cons.fetch(30_000))  # nothing to read: held at the master
        old = await _master(sync3)
        await sync3.kill_master("g1")
        with contextlib.suppress(TxbError):
            for m in await held:
                seen[m.body.decode()] += 1
                m.ack()
        new = await sync3.wait_master("g1", other_than=old.broker_id)
        after = [f"b{i}" for i in range(10)]
        await _send(c, after)
        await _read(cons, set(after), seen)
        await cons.commit()
    assert all(seen[k] == 1 for k in after), seen  # each once: nothing skipped, nothing twice
    # The group's offsets at the new master: everything processed, nothing past the end.
    assert await _lag(sync3.member(new.broker_id), "billing") == 0


async def test_messages_fetched_and_not_committed_when_the_master_dies_come_again(
    sync3: Cluster,
) -> None:
    async with (
        await Client.connect(sync3.url, timeout_s=5) as c,
        Consumer(c, "billing", TOPIC, hold_ms=1000) as cons,
    ):
        first = [f"a{i}" for i in range(10)]
        await _send(c, first)
        fetched: list[ConsumedMessage] = []
        async with asyncio.timeout(READ_TIMEOUT_S):
            while len(fetched) < len(first):
                fetched += await cons.fetch(500)  # not acknowledged: nothing committed
        old = await _master(sync3)
        await sync3.kill_master("g1")
        for m in fetched:  # processed now, while the master is gone: the commit cannot reach it
            m.ack()
        new = await sync3.wait_master("g1", other_than=old.broker_id)
        seen: Counter[str] = Counter()
        later = [f"b{i}" for i in range(5)]
        await _send(c, later)
        await _read(cons, set(first) | set(later), seen)
        await cons.commit()
    # The new master had the group where it was (nothing of `first` committed): all of it
    # comes again (at least once; an inbox drops the repeat), then what was sent after.
    assert set(first) <= set(seen) and all(seen[k] == 1 for k in later), seen
    assert await _lag(sync3.member(new.broker_id), "billing") == 0


async def test_a_commit_written_on_a_master_that_dies_before_a_slave_has_it(
    sync3: Cluster, checks: CheckServer
) -> None:
    """END_TX(commit) reaches the master, which writes the commit while its slaves are frozen,
    and dies. No consumer saw that record while no slave had reported it (a master's consumers
    read only what its slaves hold). The new master either has it (the answer to a frozen
    slave's held fetch may wait in its socket) or rebuilt the open transaction from the log and
    commits it on a back-check: either way its message is delivered once."""
    async with (
        await Client.connect(sync3.url, timeout_s=5) as c,
        Consumer(c, "billing", TOPIC, hold_ms=1000) as cons,
    ):
        seen: Counter[str] = Counter()
        tx = await c.prepare(
            TOPIC, b"t1", producer_group=GROUP, check_url=checks.url, key="t1",
            timeout_ms=2_000,
        )  # fmt: skip
        checks.answers[tx.tx_id] = CheckStatus.COMMIT
        master = await _master(sync3)
        slaves = [m for m in sync3.members if m is not master]
        for s in slaves:
            assert s.proc.proc is not None
            os.kill(s.proc.proc.pid, signal.SIGSTOP)
        try:
            ending = asyncio.create_task(c.end_transaction(tx.tx_id, "commit"))
            # The commit is in the master's log, waiting for a slave to have it.
            await wait_keys(master.proc.data_dir, TOPIC, 1)
            fetched = await cons.fetch(300)
            assert fetched == [], [m.body for m in fetched]  # not readable: no slave has it
            await sync3.kill_master("g1")
        finally:
            for s in slaves:
                assert s.proc.proc is not None
                os.kill(s.proc.proc.pid, signal.SIGCONT)
        with contextlib.suppress(TxbError):
            await ending  # its outcome is unknown to the producer: the back-check decides
        await sync3.wait_master("g1", other_than=master.broker_id)
        await _read(cons, {"t1"}, seen)
        after = ["a1", "a2"]
        await _send(c, after)
        await _read(cons, set(after), seen)
    assert seen == Counter({"t1": 1, "a1": 1, "a2": 1}), seen


async def test_a_pull_that_finished_beside_a_failed_one_is_handed_out(
    two_groups: Cluster,
) -> None:
    """Over two broker groups: one group's pull brings messages while the other's fails (its
    master died). The messages are handed out (they are outstanding: a message left behind
    would hold its queue's commit back and never be processed) and the failure is raised by
    the next fetch, never lost."""
    cluster = two_groups
    async with await Client.connect(cluster.url, timeout_s=5) as c:
        assert isinstance(c, ClusterClient)
        route = await c.route(TOPIC)
        g2_queues = next(g.queues for g in route.groups if g.group == "g2")
        to_g2 = [k for k in (f"k{i}" for i in range(100)) if _queue(k, route.queues) in g2_queues]
        async with Consumer(c, "billing", TOPIC, hold_ms=30_000) as cons:
            fetching = asyncio.create_task(cons.fetch())
            await asyncio.sleep(0)  # both groups' pulls are out, held (nothing to read)
            fetching.cancel()  # the pulls go on: their answers wait for the next fetch
            with contextlib.suppress(asyncio.CancelledError):
                await fetching
            await _send(c, to_g2[:1])  # g2's pull answers with it
            await cluster.kill_master("g1")  # g1's pull fails
            pulls = list(cons._pulls.values())
            await asyncio.wait(pulls, timeout=READ_TIMEOUT_S)
            assert all(p.done() for p in pulls) and any(p.exception() for p in pulls)
            got = await cons.fetch(0)
            assert [m.body.decode() for m in got] == to_g2[:1]
            got[0].ack()
            with pytest.raises(TxbError):
                await cons.fetch(0)  # g1's failure, not lost
            seen: Counter[str] = Counter()
            await _send(c, to_g2[1:3])
            await _read(cons, set(to_g2[1:3]), seen)
    assert seen == Counter(to_g2[1:3]), seen


def _queue(key: str, queues: int) -> int:
    """The topic's queue a key goes to, as the SDK and the broker choose it."""
    return google_crc32c.value(key.encode()) % queues
