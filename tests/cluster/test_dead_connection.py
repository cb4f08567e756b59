"""A client's connection across a real partition (iptables DROP on a test host, so packets
vanish): after a request times out, the client probes the connection and closes it as dead, so
that once the link heals the next request goes over a new connection at once, instead of
waiting for TCP's next retransmission on the old one (its back-off doubles with every
retransmission: about 7 s after a 20 s cut, 13 s after a 40 s one)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Final

import pytest

from tests.cluster.conftest import TestNet
from txbroker.chaos.nemesis import Nemesis
from txbroker.errors import TxbError
from txbroker.protocol.messages import SendReceipt
from txbroker.runtime.brokerproc import BrokerProcess
from txbroker_sdk import Client
from txbroker_sdk.connection import PROBE_S
from txbroker_sdk.errors import ConnectionClosed, RequestTimeout

# The client's request timeout, a writer's in the partition scenarios: longer than the probe's
# PROBE_S, so a request sent after the probe ends with it.
TIMEOUT_S: Final = 2.0
# Long enough for the old connection's retransmission back-off to reach seconds (at 8 s its
# next retransmission is 4 to 5 s away), short for a test.
CUT_S: Final = 8.0
# After the heal: a connect attempt under way at the heal ends within its own limit (1 s, the
# reconnect_s below) and the next one connects at once; 3 s leaves room for a loaded
# machine, and is still under the old connection's wait for its next retransmission.
HEALED_BOUND_S: Final = 3.0
SLACK_S: Final = 0.5  # the sweeper's 50 ms and a loaded machine's scheduling
RETRY_PAUSE_S: Final = 0.05  # between a writer's attempts: no hot loop against a cut link


async def _send_until_acknowledged(c: Client, body: bytes) -> SendReceipt:
    """As a writer does: the same write (its idempotency key) again until acknowledged."""
    while True:
        try:
            return await c.send("t", body, idempotency_key=body.decode())
        except TxbError:
            await asyncio.sleep(RETRY_PAUSE_S)  # the next attempt, not a synchronisation


async def test_a_connection_cut_by_a_partition_is_closed_as_dead_and_replaced_after_the_heal(
    net: TestNet, tmp_path: Path
) -> None:
    host = net.host("broker")
    broker = BrokerProcess(
        tmp_path / "broker",
        *("--host", host.address, "--port", "9876", "--segment-mib", "8"),
        env={"TXB_INDEX_CAPACITY": "65536"},
        run_prefix=host.run_prefix,
    ).start()
    nemesis = Nemesis(net)
    try:
        async with await Client.connect(broker.url, timeout_s=TIMEOUT_S, reconnect_s=1.0) as c:
            await c.create_topic("t", queues=1)
            assert (await c.send("t", b"before")).queue_offset == 0
            nemesis.cut(nemesis.client, host)
            cut_at = time.monotonic()
            try:
                first = asyncio.create_task(c.send("t", b"w", idempotency_key="w"))
                with pytest.raises(RequestTimeout):
                    async with asyncio.timeout(TIMEOUT_S + SLACK_S):
                        await first
                # Sent on the suspect connection, behind the probe: it ends when the probe
                # gives up, not a whole timeout later, and says why.
                started = time.monotonic()
                with pytest.raises(ConnectionClosed, match="presumed dead"):
                    async with asyncio.timeout(TIMEOUT_S + SLACK_S):
                        await c.send("t", b"w", idempotency_key="w")
                assert time.monotonic() - started < PROBE_S + SLACK_S
                assert not c.connected
                # A writer goes on trying through the cut: each attempt fails to connect.
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(CUT_S - (time.monotonic() - cut_at)):
                        await _send_until_acknowledged(c, b"w")
            finally:
                nemesis.heal()
            healed_at = time.monotonic()
            async with asyncio.timeout(30):  # far past the old connection's retransmission
                receipt = await _send_until_acknowledged(c, b"w")
            healed_s = time.monotonic() - healed_at
            after = await c.send("t", b"after")
            print(f"\nacknowledged {healed_s:.2f} s after the heal, over reconnect {c.reconnects}")
            assert healed_s < HEALED_BOUND_S
            assert c.reconnects >= 1
            # Every attempt carried one idempotency key: stored once, between the two others.
            assert receipt.queue_offset == 1
            assert after.queue_offset == 2
    finally:
        broker.stop()
