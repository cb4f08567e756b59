"""The HTTP API in a broker group with a real etcd (``--role auto``): a write reaching the slave
is answered 307 to the master's HTTP address, before and after a failover, and a transaction
prepared over HTTP at one master (acknowledged once the slave holds it: sync replication) is
committed over HTTP at the next."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.cluster.conftest import _require_etcd
from tests.http.conftest import GROUP, SECRET
from txbroker.chaos.cluster import Cluster, Member

TOPIC = "orders"
PUBLISH = f"/v1/topics/{TOPIC}/messages"
ENV = {"TXB_INDEX_CAPACITY": "65536"}


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Cluster]:
    _require_etcd()
    flags = ("--segment-mib", "8", "--tx-secret", f"{GROUP}={SECRET}", "--replication", "sync")
    async with Cluster(tmp_path / "c", groups=("g1",), per_group=2, extra=flags, env=ENV) as c:
        await c.create_topic(TOPIC, queues=2)
        yield c


async def _roles(cluster: Cluster) -> tuple[Member, Member]:
    master = cluster.member((await cluster.masters())["g1"].broker_id)
    [slave] = [m for m in cluster.members if m is not master]
    return master, slave


async def _redirected(h: httpx.AsyncClient, slave: Member, master: Member) -> httpx.Response:
    """The slave's answer to a publish once it has heard who the master is (until then it
    answers 503 NOT_MASTER, Retry-After: a client retries)."""
    deadline = time.monotonic() + 30
    while True:
        r = await h.post(slave.proc.http + PUBLISH, json={"body": "to the slave"})
        if r.status_code != 503 or time.monotonic() > deadline:
            break
        assert r.json()["code"] == "NOT_MASTER" and r.headers["retry-after"]
        await asyncio.sleep(0.2)
    assert r.status_code == 307, r.text
    assert r.headers["location"] == master.proc.http + PUBLISH
    return r


async def test_a_write_at_the_slave_is_redirected_to_the_master_through_a_failover(
    pair: Cluster,
) -> None:
    a, b = await _roles(pair)
    async with httpx.AsyncClient(timeout=30) as h:
        await _redirected(h, b, a)
        async with httpx.AsyncClient(timeout=30, follow_redirects=True) as follow:
            r = await follow.post(b.proc.http + PUBLISH, json={"body": "followed", "key": "k1"})
            assert r.status_code == 201, r.text
            assert str(r.url).startswith(a.proc.http)
        prepare = {
            "topic": TOPIC,
            "body": "paid",
            "producer_group": GROUP,
            "check_url": "http://127.0.0.1:9/never-called",
            "timeout_ms": 600_000,
        }
        r = await h.post(a.proc.http + "/v1/transactions", json=prepare)
        assert r.status_code == 201, r.text
        tx_id = r.json()["tx_id"]

        await pair.kill_master("g1")
        elected = await pair.wait_master("g1", other_than=a.broker_id)
        assert elected.broker_id == b.broker_id
        # With sync replication b's writes wait for a slave: a rejoins, as the slave of b.
        await pair.restart(a)
        await pair.wait_members("g1")
        await _redirected(h, a, b)
        r = await h.post(b.proc.http + PUBLISH, json={"body": "after", "key": "k2"})
        assert r.status_code == 201, r.text
        # The transaction lives in the log, not in a broker's memory: the new master has it.
        r = await h.post(b.proc.http + f"/v1/transactions/{tx_id}/commit")
        assert r.status_code == 200 and r.json()["state"] == "committed", r.text
        r = await h.post(a.proc.http + f"/v1/transactions/{tx_id}/commit")
        assert r.status_code == 307 and r.headers["location"].startswith(b.proc.http)
