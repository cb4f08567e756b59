"""A lost or twice-applied effect explains itself: the campaign's line names the reference, the
broker group, topic, queue and offset on the final master, when it was stored and in which
round, and where its consumer group's committed offset stands on every broker. Read from a
real broker's files: its log while it runs, its offsets once stopped (saved once a second)."""

from __future__ import annotations

import asyncio
import time

from txbroker.chaos import diagnosis
from txbroker.chaos.diagnosis import Broker
from txbroker.runtime.brokerproc import BrokerProcess
from txbroker_sdk import Client
from txbroker_sdk.consumer import Consumer


async def test_a_lost_effect_is_placed_in_the_log_beside_its_groups_offset(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as c:
        await c.create_topic("plain", queues=1)
        for i in range(4):
            await c.send("plain", f"p{i}|pad".encode(), key=f"p{i}")
        fault_ms = [int(time.time() * 1000)]  # a fault struck after these four
        await asyncio.sleep(0.002)  # the clock moves on: the next is stored after the fault
        await c.send("plain", b"p4", key="p4")
        async with Consumer(c, "plainer", "plain", hold_ms=200) as cons:
            got = []
            while len(got) < 2:
                for m in await cons.fetch(200):
                    if len(got) < 2:  # p0 and p1 are applied, the rest not
                        got.append(m)
                        m.ack()
            await cons.commit()
    logs = {"": broker.data_dir}
    found = diagnosis.find(logs, {"plain:p3", "plain:p4", "plain:p9"}, ["plain"])
    assert [(p.queue_id, p.queue_offset) for p in found["plain:p3"]] == [(0, 3)]
    assert found["plain:p9"] == []
    assert broker.stop() == 0
    lines = diagnosis.explain(
        "lost",
        found,
        [Broker("b1", "", broker.data_dir)],
        {"": "b1"},
        {"plain": "plainer"},
        fault_ms,
        {},
    )
    assert len(lines) == 3
    p3, p4, p9 = lines
    assert p3.startswith("lost plain:p3: topic plain queue 0 offset 3 on b1 (message ")
    assert "in round 1" in p3 and "plainer's committed offset for that queue: b1 2" in p3
    assert "offset 4 on b1" in p4 and "in round 2" in p4
    assert p9 == "lost plain:p9: in no group's log as settled"
