"""Broker groups and the NameServer with real processes: a real etcd,
two groups of two brokers each, a master and a slave (g1's named by --role master and --role
slave --replica-of, g2's elected by --role auto), and NameServers; clients through
``txbns://``."""

from __future__ import annotations

import asyncio
import collections
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import google_crc32c
import pytest

from tests.cluster.conftest import EtcdServer
from tests.cluster.groups import NameServerProcess, masters_of, wait_for_brokers
from tests.conftest import IN_CI
from txbroker.cluster.routes import Role, choose_masters, spread_queues
from txbroker.errors import InvalidArgument, NoRoute, NotFound
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import RouteRequest, SendRequest
from txbroker.runtime.brokerproc import BrokerProcess
from txbroker_sdk import Client, Consumer
from txbroker_sdk.cluster import ClusterClient

if not IN_CI:
    pytest.importorskip("aetcd")

from txbroker.cluster import connect_coordinator
from txbroker.cluster.routes import replace_route

# Long enough for a loaded runner's first fetch; the consumer's loop ends on the count, not it.
FETCH_MS = 2_000
DEADLINE_S = 30.0
LOOK_S = 0.05  # between looks at what a slave holds
TX_SECRET = "ops-svc=s3cret"  # the producer group of the transactions prepared here


@dataclass
class Cluster:
    etcd: EtcdServer
    brokers: dict[str, BrokerProcess]  # each group's master, by group
    slaves: dict[str, BrokerProcess]  # each group's slave, by group
    nameservers: list[NameServerProcess]

    @property
    def url(self) -> str:
        return "txbns://" + ",".join(ns.address for ns in self.nameservers)

    def cli(self, *args: str) -> str:
        """`txbroker ARGS` (bounded); its stdout, once it exited 0."""
        done = subprocess.run(
            [sys.executable, "-m", "txbroker.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def topic_create(self, topic: str, queues: int, groups: str) -> dict[str, object]:
        answer: dict[str, object] = json.loads(
            self.cli("topic", "create", topic, "--queues", str(queues), "--groups", groups,
                     "--coordinator", self.etcd.url, "--json")
        )  # fmt: skip
        return answer


@pytest.fixture
def cluster(etcd: EtcdServer, tmp_path: Path) -> Iterator[Cluster]:
    started: list[BrokerProcess | NameServerProcess] = []
    try:
        brokers, slaves = {}, {}
        for group, role in (("g1", "master"), ("g2", "auto")):
            b = BrokerProcess(
                tmp_path / group,
                *("--group", group, "--coordinator", etcd.url, "--role", role),
                *("--broker-id", f"{group}-a", "--tx-secret", TX_SECRET),
            )
            started.append(b)
            brokers[group] = b.start()
        asyncio.run(wait_for_brokers(etcd.url, masters_of("g1", "g2")))
        # Each master's slave, started once the masters are: g2-a won g2's election alone.
        for group, role in (("g1", ("--role", "slave", "--replica-of", brokers["g1"].url)),
                            ("g2", ("--role", "auto"))):  # fmt: skip
            s = BrokerProcess(
                tmp_path / f"{group}-b",
                *("--group", group, "--coordinator", etcd.url, *role),
                *("--broker-id", f"{group}-b", "--tx-secret", TX_SECRET),
            )
            started.append(s)
            slaves[group] = s.start()
        asyncio.run(wait_for_brokers(etcd.url, lambda bs: len(bs) == 4))
        nameservers = []
        for i in range(2):
            ns = NameServerProcess(etcd.url, tmp_path / f"ns{i}.log")
            started.append(ns)
            nameservers.append(ns.start())
        yield Cluster(etcd, brokers, slaves, nameservers)
    finally:
        for p in reversed(started):
            p.stop()


async def test_brokers_register_with_their_roles_and_go_when_stopped(cluster: Cluster) -> None:
    brokers = await wait_for_brokers(cluster.etcd.url, masters_of("g1", "g2"))
    by_group = {b.group: b for b in brokers.values() if b.role is Role.MASTER}
    assert by_group["g1"].role is Role.MASTER and by_group["g1"].epoch == 0  # --role master
    assert by_group["g2"].role is Role.MASTER and by_group["g2"].epoch > 0  # elected
    assert by_group["g1"].address == cluster.brokers["g1"].url
    assert by_group["g2"].http == cluster.brokers["g2"].http

    slaves = {b.broker_id: b for b in brokers.values() if b.role is Role.SLAVE}
    assert set(slaves) == {"g1-b", "g2-b"}  # g2-b campaigns, and follows g2-a meanwhile
    assert slaves["g1-b"].address == cluster.slaves["g1"].url

    cluster.brokers["g1"].stop()  # SIGTERM: the registration is revoked, not left to expire
    left = await wait_for_brokers(cluster.etcd.url, lambda b: len(b) == 3, timeout_s=5)
    assert set(choose_masters(left.values())) == {"g2"}  # g1-b is named a slave: no failover


async def test_producers_spread_over_both_groups_and_a_consumer_gets_each_once(
    cluster: Cluster,
) -> None:
    created = cluster.topic_create("orders", 8, "g1,g2")
    assert created["groups"] == [
        {"group": "g1", "queues": [0, 1, 2, 3], "master": cluster.brokers["g1"].url},
        {"group": "g2", "queues": [4, 5, 6, 7], "master": cluster.brokers["g2"].url},
    ]
    assert cluster.topic_create("orders", 8, "g1,g2") == created  # again: a no-op

    sent = 0
    queues: collections.Counter[int] = collections.Counter()
    async with await Client.connect(cluster.url) as client:
        assert isinstance(client, ClusterClient)

        async def produce(n: int, keyed: bool) -> None:
            nonlocal sent
            for i in range(n):
                key = f"order-{n}-{i}" if keyed else None
                r = await client.send("orders", f"{n}-{keyed}-{i}".encode(), key=key)
                queues[r.queue_id] += 1
                sent += 1

        await asyncio.gather(produce(100, True), produce(60, False), produce(40, True))
        batch = [SendRequest("orders", f"batch-{i}".encode(), key=f"b{i}") for i in range(24)]
        receipts = await client.send_batch(batch)
        assert len(receipts) == 24
        sent += 24
        for r in receipts:
            queues[r.queue_id] += 1
        # A key keeps its queue, over groups as on one broker.
        again = await client.send("orders", b"again-1", key="order-100-7")
        first = await client.send("orders", b"again-2", key="order-100-7")
        assert again.queue_id == first.queue_id
        sent += 2

    assert set(queues) == set(range(8)), queues
    stored = {}
    for group, broker in cluster.brokers.items():
        async with await Client.connect(broker.url) as direct:
            info = await direct.describe_topic("orders")
            assert info.queues == 4
            stored[group] = info.messages
    assert stored["g1"] > 0 and stored["g2"] > 0
    assert sum(stored.values()) == sent
    # Each group's slave holds its group's share (replicated: waited for, bounded).
    for group, slave in cluster.slaves.items():
        async with await Client.connect(slave.url) as direct:
            for _ in range(int(DEADLINE_S / LOOK_S)):  # bounded: DEADLINE_S
                if await _messages(direct, "orders") >= stored[group]:
                    break
                await asyncio.sleep(LOOK_S)  # the next look: replication runs on its own
            assert await _messages(direct, "orders") == stored[group]

    async with await Client.connect(cluster.url) as client:
        seen: collections.Counter[bytes] = collections.Counter()
        async with Consumer(client, "billing", "orders") as consumer:
            deadline = time.monotonic() + DEADLINE_S
            while sum(seen.values()) < sent and time.monotonic() < deadline:
                for m in await consumer.fetch(FETCH_MS):
                    seen[m.body] += 1
                    m.ack()
            extra = await consumer.fetch(500)  # nothing more comes
    assert sum(seen.values()) == sent and set(seen.values()) == {1}
    assert extra == []


async def _messages(client: Client, topic: str) -> int:
    try:
        return (await client.describe_topic(topic)).messages
    except NotFound:  # not copied from the master yet
        return 0


async def test_a_route_change_is_picked_up(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("txbroker_sdk.consumer.ROUTE_CHECK_S", 0.2)  # the consumer's look
    cluster.topic_create("moves", 4, "g1")
    client = await ClusterClient.connect(cluster.url)
    client.refresh_s = 0.2  # the periodic refresh, made short
    consumer = Consumer(client, "billing", "moves")
    await consumer.start()  # on g1 alone
    sent = 0
    try:
        assert {(await client.send("moves", b"x")).queue_id for _ in range(8)} == {0, 1, 2, 3}
        sent += 8
        # The topic grows onto g2: its share first, then the route (as topic create does).
        async with await Client.connect(cluster.brokers["g2"].url) as g2:
            await g2.create_topic("moves", 4)
        async with await connect_coordinator(cluster.etcd.url) as coordinator:
            await replace_route(coordinator, spread_queues("moves", 8, ["g1", "g2"]))
        # Picked up by the timer: within a bounded number of sends (each a round trip).
        deadline = time.monotonic() + DEADLINE_S
        seen: set[int] = set()
        while not seen >= {4, 5, 6, 7} and time.monotonic() < deadline:
            seen.add((await client.send("moves", f"y{sent}".encode())).queue_id)
            sent += 1
        assert seen >= {4, 5, 6, 7}
        # The consumer joined g2 too: it gets every message, g2's included.
        got: collections.Counter[bytes] = collections.Counter()
        while sum(got.values()) < sent and time.monotonic() < deadline:
            for m in await consumer.fetch(FETCH_MS):
                got[m.body] += 1
                m.ack()
        assert sum(got.values()) == sent
        assert consumer._parts is not None and set(consumer._parts) == {"g1", "g2"}
    finally:
        await consumer.close()
        await client.close()

    # A routing error: the topic leaves g1 for g2 alone, and a client whose route is fresh
    # (no timer would refresh it for an hour) learns it from g1's answer.
    cluster.topic_create("leaves", 4, "g1")
    client = await ClusterClient.connect(cluster.url)
    client.refresh_s = 3600
    try:
        assert (await client.send("leaves", b"x", key="k")).queue_id in range(4)
        fetches = client.route_fetches
        async with await Client.connect(cluster.brokers["g2"].url) as g2:
            await g2.create_topic("leaves", 4)
        async with await connect_coordinator(cluster.etcd.url) as coordinator:
            await replace_route(coordinator, spread_queues("leaves", 4, ["g2"]))
        async with await Client.connect(cluster.brokers["g1"].url) as g1:
            await g1.delete_topic("leaves")
        receipt = await _send_until_moved(client, "leaves")
        assert client.route_fetches > fetches
        async with await Client.connect(cluster.brokers["g2"].url) as g2:
            info = await g2.describe_topic("leaves")
        assert info.messages >= 1 and receipt.topic == "leaves"
    finally:
        await client.close()


async def _send_until_moved(client: ClusterClient, topic: str) -> object:
    """One send; the NameServer may not have seen the new route yet when g1 refuses, so the
    refused send may be refused again: retried until the route arrives (bounded)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            return await client.send(topic, b"moved", key="k")
        except NoRoute:
            raise
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)  # the NameServer's watch is a round trip behind


async def test_the_nameserver_answers_clearly_for_an_unknown_topic(cluster: Cluster) -> None:
    broker = cluster.brokers["g1"].url.removeprefix("txb://")
    with pytest.raises(InvalidArgument, match=r"is not a NameServer.*opcode 70 is not served"):
        await Client.connect(f"txbns://{broker}")  # a broker's address by mistake
    async with await Client.connect(cluster.url) as client:
        with pytest.raises(NoRoute, match=r"no route for topic 'nowhere'.*topic create nowhere"):
            await client.send("nowhere", b"x")
        with pytest.raises(NoRoute) as raised:
            await client.request(Opcode.ROUTE, RouteRequest("nowhere"))
        assert raised.value.code == "NO_ROUTE"
        groups = await client.request(Opcode.ROUTE, RouteRequest(""))
        assert {g.group: g.master for g in groups.groups} == {
            "g1": cluster.brokers["g1"].url,
            "g2": cluster.brokers["g2"].url,
        }


async def test_any_nameserver_answers(cluster: Cluster) -> None:
    cluster.topic_create("either", 2, "g1,g2")
    async with await Client.connect(cluster.url) as client:
        assert isinstance(client, ClusterClient)
        await client.send("either", b"1")
        cluster.nameservers[0].stop()
        route = await client.route("either", refresh=True)  # the second one answers
        assert [g.group for g in route.groups] == ["g1", "g2"]
        await client.send("either", b"2")
    # Connected on first use, with submit/post as TxPublisher pipelines: routed as well.
    client = ClusterClient(cluster.url)
    try:
        receipt = await client.submit(Opcode.SEND, SendRequest("either", b"3", key="k1"))
        assert receipt.topic == "either"
        client.post(Opcode.SEND, SendRequest("either", b"4"), note="test")
    finally:
        await client.close()  # waits for the post's answer first
    assert client.unanswered == 0
    # The CLI takes NameServers where it takes a broker (docs/cluster.md's commands).
    server = ["--server", cluster.url]
    cluster.cli("send", "either", "--body", "5", "--key", "k1", *server)
    got = cluster.cli("consume", "either", "--group", "cli", "--max", "5", *server, "--json")
    bodies = sorted(json.loads(line)["body"] for line in got.splitlines())
    assert bodies == ["1", "2", "3", "4", "5"]


async def test_cluster_status_shows_groups_roles_offsets_and_routes(cluster: Cluster) -> None:
    await wait_for_brokers(cluster.etcd.url, masters_of("g1", "g2"))
    cluster.topic_create("status-orders", 6, "g1,g2")
    status = json.loads(
        cluster.cli("cluster", "status", "--coordinator", cluster.etcd.url, "--json")
    )
    groups = {g["group"]: g for g in status["groups"]}
    assert set(groups) == {"g1", "g2"} and status["revision"] > 0
    assert groups["g1"]["master"] == "g1-a" and groups["g1"]["elected"] is None  # --role master
    assert groups["g2"]["master"] == "g2-a" and groups["g2"]["elected"] == "g2-a"  # --role auto
    assert int(groups["g2"]["election_lease"], 16) > 0
    brokers = {b["broker"]: b for b in status["brokers"]}
    assert brokers["g1-a"]["role"] == "master" and brokers["g1-a"]["lag_bytes"] == 0
    assert brokers["g1-a"]["address"] == cluster.brokers["g1"].url
    assert brokers["g2-a"]["epoch"] > 0 and int(brokers["g2-a"]["lease"], 16) > 0
    assert brokers["g1-b"]["role"] == "slave" and brokers["g2-b"]["role"] == "slave"
    assert brokers["g1-b"]["lag_bytes"] is not None and brokers["g1-b"]["lag_bytes"] >= 0
    assert groups["g1"]["brokers"] == 2 and groups["g2"]["brokers"] == 2
    assert all(b["flushed_offset"] >= 0 for b in brokers.values())
    (route,) = [t for t in status["topics"] if t["topic"] == "status-orders"]
    assert route["groups"] == [
        {"group": "g1", "queues": [0, 1, 2]},
        {"group": "g2", "queues": [3, 4, 5]},
    ]

    text = cluster.cli("cluster", "status", "--coordinator", cluster.etcd.url)
    assert "g1-a" in text and "g2-a" in text and "status-orders" in text and "g1: 0-2" in text


async def test_operator_commands_through_the_nameservers_reach_every_group(
    cluster: Cluster,
) -> None:
    """tx list/resolve, group describe and topic delete given only the NameServers."""
    cluster.topic_create("ops", 4, "g1,g2")  # g1: queues 0-1, g2: 2-3
    async with await Client.connect(cluster.url) as client:
        for i in range(40):
            await client.send("ops", b"m", key=f"k{i}")
        # An open transaction on each group, ended by hand below.
        txs = {}
        for group, held in (("g1", range(0, 2)), ("g2", range(2, 4))):
            key = next(f"tx-{i}" for i in range(1000) if _queue_of(f"tx-{i}", 4) in held)
            tx = await client.prepare(
                "ops", b"t", producer_group="ops-svc", check_url="http://127.0.0.1:9/check",
                key=key, timeout_ms=600_000,
            )  # fmt: skip
            txs[group] = tx.tx_id
        async with Consumer(client, "billing", "ops") as consumer:
            got = 0
            deadline = time.monotonic() + DEADLINE_S
            while got < 40 and time.monotonic() < deadline:
                for m in await consumer.fetch(FETCH_MS):
                    got += 1
                    m.ack()
        assert got == 40

    listed = cluster.cli("tx", "list", "--server", cluster.url, "--json").splitlines()
    assert {json.loads(t)["tx_id"] for t in listed} == set(txs.values())  # from both masters
    for tx_id in txs.values():
        out = json.loads(cluster.cli("tx", "commit", tx_id, "--server", cluster.url, "--json"))
        assert out["state"] == "committed", out
    assert cluster.cli("tx", "list", "--server", cluster.url, "--json") == ""

    described = json.loads(cluster.cli("group", "describe", "billing", "--server", cluster.url,
                                       "--json"))  # fmt: skip
    [ops] = described["topics"]
    assert ops["topic"] == "ops"
    assert [q["queue"] for q in ops["queues"]] == [0, 1, 2, 3]  # the topic's, over both groups
    assert sum(q["max_offset"] for q in ops["queues"]) == 42  # 40 sends, 2 commits
    assert ops["lag"] == sum(q["lag"] for q in ops["queues"]) == described["lag"]

    out = json.loads(cluster.cli("topic", "delete", "ops", "--server", cluster.url,
                                 "--coordinator", cluster.etcd.url, "--json"))  # fmt: skip
    assert out == {"deleted": "ops", "route_removed": True}
    for broker in cluster.brokers.values():
        async with await Client.connect(broker.url) as direct:
            with pytest.raises(NotFound):
                await direct.describe_topic("ops")
    async with await Client.connect(cluster.url) as client:
        with pytest.raises(NoRoute):
            await client.send("ops", b"gone")


def _queue_of(key: str, queues: int) -> int:
    """The topic's queue a key goes to (as the SDK picks it)."""
    return google_crc32c.value(key.encode()) % queues
