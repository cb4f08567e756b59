"""Partitions: a master cut off from etcd steps down before its lease can
have ended, and no two masters of one group accept writes, checked by reading the brokers' logs
afterwards.

Real processes (txbroker/chaos/cluster.py): etcd, one group g1 of three ``--role auto``
brokers with sync replication, a NameServer. The lease is election.DEFAULT_TTL_S (3 s).

- etcd stopped (SIGSTOP): the master's keep-alives go unanswered, so it refuses writes before
  the lease's TTL has passed since the pause (its last keep-alive was sent before the pause);
  once etcd resumes a master is elected again and writes through the NameServer succeed.
- the master stopped (SIGSTOP), a silent peer as across a partition that drops packets: a
  request to it through the NameServer fails by the client's timeout, and the next goes to the
  newly elected master.
- the master stopped (SIGSTOP): another broker is elected and takes writes; the old master,
  woken, does not acknowledge a write that reached it while frozen, rejoins as a slave and
  catches up. Offline, each log is read back with the store's own code: every acknowledged
  write is in the new master's log once, the old master's log holds nothing the new master's
  does not, and nothing acknowledged is in a divergent tail it cut.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Final

import pytest

from tests.cluster.conftest import _require_etcd
from txbroker.chaos.cluster import Cluster, Member
from txbroker.cluster.election import DEFAULT_TTL_S
from txbroker.cluster.routes import BrokerInfo, Role
from txbroker.errors import NotMaster, TxbError
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import SendReceipt, SendRequest
from txbroker.server.failover import DIVERGENT_DIR
from txbroker.store import PROP_KEYS, MessageStore, StoreConfig
from txbroker.store.commitlog import ScannedRecord
from txbroker.store.record import decode_properties
from txbroker.store.replication import parse_records
from txbroker_sdk import Client
from txbroker_sdk.cluster import ClusterClient
from txbroker_sdk.errors import RequestTimeout

GROUP: Final = "g1"
TOPIC: Final = "orders"
QUEUES: Final = 4
SEGMENT_MIB: Final = 8
INDEX_CAPACITY: Final = 65536
PROBE_EVERY_S: Final = 0.05  # between write probes (a poll's period, not a synchronisation)
STEP_DOWN_BOUND_S: Final = 10.0  # how long the probes go on before the test gives up
PAUSE_S: Final = DEFAULT_TTL_S + 0.5  # etcd stays stopped past the lease's TTL
ELECTION_BOUND_S: Final = 30.0
SEND_BOUND_S: Final = 20.0  # one acknowledged send, its retries included
# A client's request timeout short next to an election, so a request that ended by its own
# timeout is told from one that waited for the failover.
SILENT_TIMEOUT_S: Final = 1.0
# The election's target (the lease's TTL plus 2 s to take over, txbroker/cluster/election.py),
# one request timeout for the attempt that went to the silent master last, and 1 s for the
# retries, the route fetches and the new master's first sync write.
REROUTED_BOUND_S: Final = DEFAULT_TTL_S + 2.0 + SILENT_TIMEOUT_S + 1.0


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    """g1: three --role auto brokers, sync replication; ``orders`` created on it."""
    _require_etcd()
    async with Cluster(
        tmp_path / "cluster",
        groups=(GROUP,),
        per_group=3,
        extra=("--replication", "sync", "--segment-mib", str(SEGMENT_MIB)),
        env={"TXB_INDEX_CAPACITY": str(INDEX_CAPACITY)},
    ) as c:
        await c.create_topic(TOPIC, QUEUES)
        yield c


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """SIGSTOP ``pid`` for the block; SIGCONT at its end whatever happens (again if already)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _pid(m: Member) -> int:
    assert m.proc.proc is not None and m.proc.proc.poll() is None, f"{m.broker_id} is not running"
    return m.proc.proc.pid


async def _send_acked(c: Client, key: str) -> SendReceipt:
    """One write, acknowledged: retried (same idempotency key) while the broker is still
    taking over (NotMaster) or its slave is not following yet (bounded)."""
    deadline = time.monotonic() + SEND_BOUND_S
    while True:
        try:
            return await c.send(TOPIC, key.encode(), key=key, idempotency_key=key)
        except TxbError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(PROBE_EVERY_S)  # the next attempt, not a synchronisation


async def test_a_master_cut_off_from_etcd_steps_down_before_its_lease_ends(
    cluster: Cluster,
) -> None:
    master = (await cluster.masters())[GROUP]
    # Past the broker's replication timeout (5 s): a probe waiting for its slaves at the
    # step-down ends in its answer (ReplicationTimeout), not in this client's RequestTimeout.
    async with Client(master.address, timeout_s=10) as direct:
        for i in range(20):
            await direct.send(TOPIC, b"before", key=f"before-{i}")

        # Probes every 50 ms, each on its own (one waiting for its slaves must not delay the
        # next), until one was refused as NotMaster and etcd has been stopped for longer than
        # the lease's TTL (the lease is surely gone on etcd by then).
        async def probe(i: int) -> tuple[float, float, TxbError | None]:
            sent = time.monotonic()
            try:
                await direct.send(TOPIC, b"probe", key=f"probe-{i}")
            except TxbError as e:
                return sent, time.monotonic(), e
            return sent, time.monotonic(), None

        def first_refusal() -> float | None:
            return min(
                (
                    t.result()[1]
                    for t in probes
                    if t.done() and isinstance(t.result()[2], NotMaster)
                ),
                default=None,
            )

        probes: list[asyncio.Task[tuple[float, float, TxbError | None]]] = []
        paused_at = time.monotonic()
        cluster.etcd.pause()
        try:
            while time.monotonic() - paused_at < STEP_DOWN_BOUND_S and (
                first_refusal() is None or time.monotonic() - paused_at < PAUSE_S
            ):
                probes.append(asyncio.create_task(probe(len(probes))))
                await asyncio.sleep(PROBE_EVERY_S)  # the poll's period
            async with asyncio.timeout(STEP_DOWN_BOUND_S):
                outcomes = [await t for t in probes]
            paused_s = time.monotonic() - paused_at
        finally:
            cluster.etcd.resume()
        resumed_at = time.monotonic()

    refused_at = first_refusal()
    assert refused_at is not None, "the master never refused a write with etcd stopped"
    step_down_s = refused_at - paused_at
    acked = [(sent, answered) for sent, answered, err in outcomes if err is None]
    last_ack_s = max((answered - paused_at for _, answered in acked), default=0.0)
    errors = collections.Counter(type(err).__name__ for _, _, err in outcomes if err is not None)
    print(
        f"\nstep-down: first refusal (NotMaster) answered {step_down_s:.3f} s after etcd was "
        f"stopped; last acknowledged write answered {last_ack_s:.3f} s after it; "
        f"{len(outcomes)} probes: {len(acked)} acknowledged, {dict(errors)}; etcd resumed "
        f"after {paused_s:.2f} s"
    )
    # The lease's last keep-alive was sent before the pause: it ends on etcd DEFAULT_TTL_S
    # after that at the latest, so the master must have stopped taking writes by then...
    assert step_down_s < DEFAULT_TTL_S
    assert last_ack_s < DEFAULT_TTL_S
    # ...and, once it refused, it took no write sent after that while etcd was stopped (a
    # probe in flight at the step-down may end in a replication timeout: not acknowledged).
    assert all(sent < refused_at for sent, _ in acked)
    assert set(errors) <= {"NotMaster", "ReplicationTimeout"}, errors

    # etcd back: a master again (any broker), found through the NameServer.
    async with await Client.connect(cluster.url, timeout_s=5) as routed:
        receipt = await _send_acked(routed, "after-resume")
    served_s = time.monotonic() - resumed_at
    await cluster.wait_members(GROUP, timeout_s=ELECTION_BOUND_S)
    elected = (await cluster.masters())[GROUP]
    print(
        f"after etcd resumed: {elected.broker_id} (epoch {elected.epoch}, was "
        f"{master.broker_id} epoch {master.epoch}) acknowledged a routed write after "
        f"{served_s:.2f} s"
    )
    assert receipt.topic == TOPIC
    assert elected.epoch > master.epoch


async def test_a_frozen_master_is_replaced_and_two_masters_never_take_writes(
    cluster: Cluster,
) -> None:
    n, m = 40, 40
    a_info = (await cluster.masters())[GROUP]
    a = cluster.member(a_info.broker_id)
    acked: list[str] = []
    async with Client(a_info.address, timeout_s=5) as to_a:
        for i in range(n):
            await to_a.send(TOPIC, f"a-{i}".encode(), key=f"a-{i}", idempotency_key=f"a-{i}")
            acked.append(f"a-{i}")

        pid = _pid(a)
        frozen_at = time.monotonic()
        with stopped(pid):
            b_info = await cluster.wait_master(
                GROUP, other_than=a.broker_id, timeout_s=ELECTION_BOUND_S
            )
            elected_s = time.monotonic() - frozen_at
            async with Client(b_info.address, timeout_s=5) as to_b:
                for i in range(m):
                    await _send_acked(to_b, f"b-{i}")
                    acked.append(f"b-{i}")
            served_s = time.monotonic() - frozen_at
            # A write reaches the frozen master: queued now, its frame leaves at the end of
            # this turn of the loop, before A is woken (call_soon runs in order).
            assert to_a.connected
            late = to_a.submit(
                Opcode.SEND,
                SendRequest(TOPIC, b"late", key="late", idempotency_key="late"),
                timeout_s=30,
                drained=False,
            )
            woken = asyncio.get_running_loop().create_future()

            def wake() -> None:
                os.kill(pid, signal.SIGCONT)
                woken.set_result(time.monotonic())

            asyncio.get_running_loop().call_soon(wake)
            await woken
        # Its lease lapsed while it was frozen: every append first checks the lease, so the
        # write is refused at once, before the lease's timer has even run.
        with pytest.raises(NotMaster) as refused:
            async with asyncio.timeout(40):
                await late
        late_s = time.monotonic() - woken.result()
    print(
        f"\n{b_info.broker_id} elected {elected_s:.2f} s after {a.broker_id} was frozen, "
        f"{m} writes through it done {served_s:.2f} s after; the late write to "
        f"{a.broker_id}: {type(refused.value).__name__} after {late_s:.2f} s "
        f"({refused.value})"
    )

    # A rejoins as a slave of B and catches up with B's log.
    caught_up = await _caught_up(cluster, a.broker_id, b_info.broker_id)
    print(f"{a.broker_id} caught up: {caught_up}")

    await cluster.stop()  # everything stopped: the logs are read offline
    logs = {x.broker_id: await _read_log(x.proc.data_dir) for x in cluster.members}
    b_log = logs[b_info.broker_id]
    in_b = collections.Counter(k for rec in b_log if rec.topic == TOPIC for k in _keys(rec))
    missing = [k for k in acked if in_b[k] == 0]
    twice = [k for k in acked if in_b[k] > 1]
    assert missing == [], f"acknowledged writes not in {b_info.broker_id}'s log: {missing}"
    assert twice == [], f"acknowledged writes more than once in {b_info.broker_id}'s log: {twice}"
    for broker_id, records in logs.items():
        assert records == b_log[: len(records)], (
            f"{broker_id}'s log is no prefix of {b_info.broker_id}'s: first difference at "
            f"record {_first_difference(records, b_log)}"
        )
    assert len(logs[a.broker_id]) == len(b_log)  # caught up

    divergent = {x.broker_id: _divergent_keys(x.proc.data_dir) for x in cluster.members}
    cut_acked = {b: sorted(set(keys) & set(acked)) for b, keys in divergent.items()}
    print(f"divergent tails (keys): {divergent}; 'late' in B's log: {in_b['late']}")
    assert all(not keys for keys in cut_acked.values()), f"acknowledged writes cut: {cut_acked}"
    assert in_b["late"] == 0 and not any("late" in keys for keys in divergent.values())


async def _caught_up(cluster: Cluster, old: str, new: str) -> str:
    """Until ``old`` is registered as a slave, ``new`` as the master, and ``old`` has flushed
    as much log as ``new`` with ``new``'s epoch (bounded; registrations are rewritten every
    second)."""

    def ready(bs: dict[str, BrokerInfo]) -> bool:
        by_id = {b.broker_id: b for b in bs.values() if b.group == GROUP}
        o, n = by_id.get(old), by_id.get(new)
        return (
            o is not None
            and n is not None
            and o.role is Role.SLAVE
            and n.role is Role.MASTER
            and o.flushed_offset == n.flushed_offset
            and o.log_epoch == n.epoch
        )

    await cluster.wait_members(GROUP, timeout_s=ELECTION_BOUND_S)
    got = await cluster.wait_brokers(ready, timeout_s=ELECTION_BOUND_S)
    by_id = {b.broker_id: b for b in got.values()}
    return f"offset {by_id[old].flushed_offset}, log epoch {by_id[old].log_epoch}"


async def _read_log(data_dir: Path) -> list[ScannedRecord]:
    """Every record of a stopped broker's log, read with the store's own code (recovery runs
    as at the broker's start, so a recorded tail cut is applied)."""
    store = await MessageStore.open(
        StoreConfig(
            data_dir / "store",
            segment_bytes=SEGMENT_MIB << 20,
            index_capacity=INDEX_CAPACITY,
            index_slots=INDEX_CAPACITY // 2,
        )
    )
    try:
        records: list[ScannedRecord] = []
        pos, end = store.log.min_offset, store.write_offset
        while pos < end:
            data, nxt = store.log.read_raw(pos, end, 4 << 20)
            records += parse_records(data, pos)
            assert nxt > pos
            pos = nxt
        return records
    finally:
        await store.close()


def _keys(rec: ScannedRecord) -> list[str]:
    return decode_properties(rec.props).get(PROP_KEYS, "").split()


def _divergent_keys(data_dir: Path) -> list[str]:
    keys = []
    for path in sorted((data_dir / DIVERGENT_DIR).glob("*/*.log")):
        for rec in parse_records(path.read_bytes(), int(path.stem)):
            keys += _keys(rec)
    return keys


def _first_difference(a: list[ScannedRecord], b: list[ScannedRecord]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"{i}: {x} against {y}"
    return f"{min(len(a), len(b))}: one log ends there"


async def test_a_request_to_a_silent_master_times_out_and_the_next_goes_to_the_new_one(
    cluster: Cluster,
) -> None:
    async with await Client.connect(cluster.url, timeout_s=SILENT_TIMEOUT_S) as c:
        assert isinstance(c, ClusterClient)
        await c.send(TOPIC, b"before", key="k")  # the route and the master's connection made
        old = (await cluster.masters())[GROUP]
        # Stopped, the master's kernel still takes the client's bytes and acknowledges them:
        # nothing breaks and nothing answers.
        with stopped(_pid(cluster.member(old.broker_id))):
            started = time.monotonic()
            with pytest.raises(RequestTimeout):
                async with asyncio.timeout(REROUTED_BOUND_S):
                    await c.send(TOPIC, b"w", key="k", idempotency_key="w")
            timed_out_s = time.monotonic() - started
            fetches = c.route_fetches
            # Sent again as a writer does, until acknowledged: by the new master.
            async with asyncio.timeout(REROUTED_BOUND_S):
                while True:
                    try:
                        await c.send(TOPIC, b"w", key="k", idempotency_key="w")
                        break
                    except TxbError:
                        await asyncio.sleep(PROBE_EVERY_S)  # the next attempt, not a sync
            rerouted_s = time.monotonic() - started
            new = (await cluster.masters())[GROUP]
            routed_to = (await c.route(TOPIC)).groups[0].master
    print(
        f"\nthe request to the silent master failed after {timed_out_s:.2f} s; the write was "
        f"acknowledged by {new.broker_id} {rerouted_s:.2f} s after the master went silent"
    )
    # The sweeper checks deadlines every 50 ms: the timeout fires that late at most.
    assert timed_out_s < SILENT_TIMEOUT_S + 0.5
    assert c.route_fetches > fetches  # the route was fetched again after the timeout
    assert new.broker_id != old.broker_id
    assert routed_to == new.address
