"""Failover with real brokers, a real etcd and a NameServer: a killed
master's group elects the slave holding the most, which takes over every acknowledged write
and every open transaction; the old master rejoins as a slave, cutting the tail it alone held.
The campaign under the services' load is tests/reconcile/test_standalone_cluster.py's (with
Spark on the logs afterwards); these pin each step."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from tests.cluster.conftest import _require_etcd
from tests.cluster.logs import wait_keys
from tests.tx.conftest import FAST, GROUP, SECRET, CheckServer, check_server
from txbroker.chaos.cluster import Cluster, Member
from txbroker.cluster.routes import Role
from txbroker.errors import NotFound
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import GroupsRequest
from txbroker.server.failover import DIVERGENT_DIR
from txbroker.server.replication.epochs import EpochHistory
from txbroker.store import PROP_KEYS
from txbroker.store.record import decode_properties
from txbroker.store.replication import parse_records
from txbroker_checkback import CheckStatus
from txbroker_sdk import Client
from txbroker_sdk.consumer import Consumer

TOPIC = "orders"
CHECK_URL = "http://127.0.0.1:9/never-called"  # the transactions' timeout outlasts the test
ENV = {"TXB_INDEX_CAPACITY": "65536"}
READ_TIMEOUT_S = 30.0


@contextlib.asynccontextmanager
async def _group(root: Path, per_group: int, *extra: str) -> AsyncIterator[Cluster]:
    """Group g1 of ``per_group`` brokers (``extra`` given to each) with TOPIC created."""
    _require_etcd()
    flags = ("--segment-mib", "8", "--tx-secret", f"{GROUP}={SECRET}", *extra)
    async with Cluster(root, groups=("g1",), per_group=per_group, extra=flags, env=ENV) as c:
        await c.create_topic(TOPIC, queues=2)
        yield c


@pytest.fixture
async def sync3(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with _group(tmp_path / "c", 3, "--replication", "sync") as cluster:
        yield cluster


@pytest.fixture
async def async2(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with _group(tmp_path / "c", 2, "--replication", "async") as cluster:
        yield cluster


async def _keys(url: str, at_least: int) -> list[str]:
    """The keys of every message of TOPIC at the master ``url``: read
    until ``at_least`` came and a fetch finds no more (bounded), by a group of its own."""
    group = uuid.uuid4().hex
    async with Client(url, timeout_s=5) as c, Consumer(c, group, TOPIC, hold_ms=200) as cons:
        return await _drain(cons, at_least)


async def _drain(cons: Consumer, at_least: int) -> list[str]:
    got: list[str] = []
    async with asyncio.timeout(READ_TIMEOUT_S):
        while True:
            batch = await cons.fetch(300)
            for m in batch:
                got.append(m.msg.key or "")
                m.ack()
            if not batch and len(got) >= at_least:
                return got


async def _caught_up(url: str, group: str) -> None:
    """Until the broker at ``url`` holds ``group``'s offsets with nothing left to read
    (copied from its master every 2 s), bounded."""
    async with Client(url, timeout_s=5) as c, asyncio.timeout(READ_TIMEOUT_S):
        while True:
            res = await c.request(Opcode.OFFSETS, GroupsRequest(group, TOPIC))
            if res.groups and all(q.lag == 0 for g in res.groups for q in g.queues):
                return
            await asyncio.sleep(0.1)  # the next look: copies arrive on their own schedule


async def _master(cluster: Cluster) -> Member:
    return cluster.member((await cluster.masters())["g1"].broker_id)


async def test_a_slave_takes_over_every_acknowledged_write_and_open_transaction(
    sync3: Cluster,
) -> None:
    cluster = sync3
    async with await Client.connect(cluster.url, timeout_s=10) as c:
        for i in range(30):
            await c.send(TOPIC, b"m", key=f"m{i}", idempotency_key=f"m{i}")
        txs = [
            await c.prepare(
                TOPIC,
                b"t",
                producer_group=GROUP,
                check_url=CHECK_URL,
                key=f"t{i}",
                timeout_ms=60_000,
            )
            for i in range(3)
        ]
        # A consumer group reads them all at the master; its offsets reach the slaves.
        async with Consumer(c, "billing", TOPIC, hold_ms=200) as cons:
            read = 0
            async with asyncio.timeout(READ_TIMEOUT_S):
                while read < 30:
                    for m in await cons.fetch(200):
                        m.ack()
                        read += 1
            await cons.commit()
        old = await _master(cluster)
        for slave in (m for m in cluster.members if m is not old):
            await _caught_up(slave.proc.url, "billing")
        await cluster.kill_master("g1")
        new = await cluster.wait_master("g1", other_than=old.broker_id)
        assert new.epoch > 0 and new.log_epoch == new.epoch
        # Ended through the NameServer as before the failover: at the new master, which rebuilt
        # them from the replicated log.
        assert (await c.end_transaction(txs[0].tx_id, "commit")).state == "committed"
        assert (await c.end_transaction(txs[1].tx_id, "rollback")).state == "rolled_back"
        async with Client(new.address, timeout_s=5) as direct:
            assert (await direct.list_transactions(limit=10)).total == 1  # the third, open
        # Resent after the failover (the answer may have been lost): deduplicated.
        await c.send(TOPIC, b"m", key="m29", idempotency_key="m29")
        # The group resumes at the new master where it was: the committed transaction only.
        async with Consumer(c, "billing", TOPIC, hold_ms=200) as cons:
            again = await _drain(cons, 1)
        assert again == ["t0"]
    got = await _keys(new.address, 31)
    assert sorted(got) == sorted([f"m{i}" for i in range(30)] + ["t0"])
    # The old master rejoins as a slave of the new one.
    await cluster.restart(old)
    infos = await cluster.wait_brokers(
        lambda bs: any(b.broker_id == old.broker_id and b.role is Role.SLAVE for b in bs.values())
    )
    assert [b.broker_id for b in infos.values() if b.role is Role.MASTER] == [new.broker_id]


async def test_the_old_master_cuts_the_tail_only_it_held_and_follows_the_new_one(
    async2: Cluster,
) -> None:
    cluster = async2
    a = await _master(cluster)
    [b] = [m for m in cluster.members if m is not a]
    async with Client(a.proc.url, timeout_s=5) as c:
        for i in range(10):
            await c.send(TOPIC, b"x", key=f"both{i}")
    assert len(await wait_keys(b.proc.data_dir, TOPIC, 10)) == 10  # the slave holds them
    assert b.proc.proc is not None
    os.kill(b.proc.proc.pid, signal.SIGSTOP)  # the slave falls behind...
    try:
        async with Client(a.proc.url, timeout_s=5) as c:
            for i in range(5):  # ...of writes async replication acknowledged on the master
                await c.send(TOPIC, b"x", key=f"only-a{i}")
        await cluster.kill_master("g1")
    finally:
        os.kill(b.proc.proc.pid, signal.SIGCONT)
    elected = await cluster.wait_master("g1", other_than=a.broker_id)
    assert elected.broker_id == b.broker_id
    async with Client(b.proc.url, timeout_s=5) as c:
        for i in range(5):
            await c.send(TOPIC, b"x", key=f"after{i}")
    await cluster.restart(a)  # restarts itself once more to cut its tail, then follows b
    await cluster.wait_brokers(
        lambda bs: (
            (s := bs.get(f"/txb/brokers/g1/{a.broker_id}")) is not None
            and s.role is Role.SLAVE
            and s.log_epoch == elected.epoch
        )
    )
    [tail] = (a.proc.data_dir / DIVERGENT_DIR).iterdir()
    cut: list[str] = []
    for part in sorted(tail.glob("*.log")):
        for rec in parse_records(part.read_bytes(), int(part.stem)):
            if rec.topic == TOPIC:
                cut.append(decode_properties(rec.props)[PROP_KEYS])
    # b may have fetched the first of them before it stopped (the answer to a held fetch was
    # in its socket); the others were on a alone: cut from a's log, kept aside.
    on_b = sorted(await _keys(b.proc.url, 15))
    only_a = {f"only-a{i}" for i in range(5)}
    assert cut and set(cut) == only_a - set(on_b), (cut, on_b)
    assert set(on_b) - only_a == {f"both{i}" for i in range(10)} | {f"after{i}" for i in range(5)}
    assert sorted(await wait_keys(a.proc.data_dir, TOPIC, len(on_b))) == on_b  # b's log now
    history = EpochHistory(a.proc.data_dir / "meta").load().entries
    assert history == EpochHistory(b.proc.data_dir / "meta").load().entries
    assert [e for e, _ in history][-1] == elected.epoch


@pytest.fixture
async def with_checks(tmp_path: Path) -> AsyncIterator[Cluster]:
    cfg = tmp_path / "tx.toml"
    cfg.write_text(FAST)  # back-checks soon after a transaction's 2 s timeout
    async with _group(tmp_path / "c", 3, "--replication", "sync", "--config", str(cfg)) as c:
        yield c


@pytest.fixture
async def checks() -> AsyncIterator[CheckServer]:
    async with check_server() as server:
        yield server


async def test_the_back_checks_resume_on_the_new_master(
    with_checks: Cluster, checks: CheckServer
) -> None:
    """A transaction whose END_TX never comes (its producer died with the master): the new
    master rebuilt it from the log and back-checks it, as the old one would have."""
    cluster = with_checks
    async with await Client.connect(cluster.url, timeout_s=10) as c:
        tx = await c.prepare(
            TOPIC, b"t", producer_group=GROUP, check_url=checks.url, key="checked",
            timeout_ms=2_000,
        )  # fmt: skip
        checks.answers[tx.tx_id] = CheckStatus.COMMIT
        old = await _master(cluster)
        await cluster.kill_master("g1")  # before its first check was due
    assert checks.checks_for(tx.tx_id) == 0
    new = await cluster.wait_master("g1", other_than=old.broker_id)
    async with Client(new.address, timeout_s=5) as direct:
        got = await _keys(new.address, 1)
        assert got == ["checked"]  # committed by the new master's back-check
        assert (await direct.list_transactions(limit=10)).total == 0
    assert checks.checks_for(tx.tx_id) >= 1


@pytest.fixture
async def sync3_all(tmp_path: Path) -> AsyncIterator[Cluster]:
    """Both slaves acknowledge every write: any of them may be elected with all of it."""
    async with _group(tmp_path / "c", 3, "--replication", "sync", "--min-insync", "2") as c:
        yield c


async def test_an_acknowledged_topic_creation_survives_the_failover(sync3_all: Cluster) -> None:
    """A topic with no record yet (only half messages of transactions on it, say) is on the
    slaves once its creation is acknowledged, as a write is: the master is killed the moment
    the answer came, long before a slave's periodic look at its topics."""
    cluster = sync3_all
    old = await _master(cluster)
    assert old.proc.proc is not None
    async with Client(old.proc.url, timeout_s=10) as c:
        await c.create_topic("payments", queues=2)
        os.kill(old.proc.proc.pid, signal.SIGKILL)
    await asyncio.to_thread(old.proc.kill)  # reaped
    new = await cluster.wait_master("g1", other_than=old.broker_id)
    async with Client(new.address, timeout_s=5) as direct:
        # (A send would wait for 2 slaves: one is left.)
        assert (await direct.describe_topic("payments")).queues == 2


async def test_an_acknowledged_topic_deletion_survives_the_failover(sync3_all: Cluster) -> None:
    """A deleted topic is gone from the slaves once its deletion is acknowledged, as a write
    is: the master is killed the moment the answer came; the elected slave serves no such
    topic, dropped its queue files, and holds the master's fence (a topic created again
    numbers its queues on from where the deleted one ended)."""
    cluster = sync3_all
    old = await _master(cluster)
    assert old.proc.proc is not None
    async with Client(old.proc.url, timeout_s=10) as c:
        for i in range(5):
            await c.send(TOPIC, b"m", key=f"m{i}")
        await c.delete_topic(TOPIC)
        os.kill(old.proc.proc.pid, signal.SIGKILL)
    await asyncio.to_thread(old.proc.kill)  # reaped
    new = await cluster.wait_master("g1", other_than=old.broker_id)
    async with Client(new.address, timeout_s=5) as direct:
        with pytest.raises(NotFound):
            await direct.describe_topic(TOPIC)
        assert TOPIC not in {t.topic for t in await direct.list_topics()}
    for m in cluster.members:
        if m.broker_id == old.broker_id:
            continue
        data = m.proc.data_dir
        assert not (data / "consumequeue" / TOPIC).exists(), m.broker_id
        saved = msgspec.json.decode((data / "meta" / "topics.json").read_bytes())
        assert TOPIC not in {t["name"] for t in saved["topics"]}, m.broker_id
        fence = saved["deleted"][TOPIC]
        assert fence["phys"] > 0 and sum(fence["ends"].values()) == 5, m.broker_id
