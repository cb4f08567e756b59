"""A send the broker answered STORE_FAILED is never counted or delivered; one it acknowledged
always is. A real broker whose key index cannot be created: its file size
limit (RLIMIT_FSIZE, lowered on the running process as a full quota would) is below the index
file's size, so every append that indexes fails, for a single send, a batch and a transaction's
commit alike (a batch with idempotency keys included), until the limit is raised; then a kill
-9 and a restart."""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess
from txbroker.errors import StoreFailed
from txbroker.protocol.messages import SendRequest
from txbroker_sdk import Client, Consumer

MiB = 1024 * 1024
# 1 Mi index entries make a 26 MiB index file: above the 16 MiB limit, while the 8 MiB log
# segments and the 6 MiB consume-queue files the broker also creates stay below it.
INDEX_ENTRIES = 1 << 20
FILE_LIMIT = 16 * MiB
NOWHERE = "http://127.0.0.1:9/check"

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="prlimit on another process is Linux's"
)


def _broker(data: Path, cfg: Path) -> BrokerProcess:
    b = BrokerProcess(data, "--config", str(cfg))
    b.env["TXB_INDEX_CAPACITY"] = str(INDEX_ENTRIES)
    return b.start()


def _limit_files(b: BrokerProcess, soft: int) -> None:
    assert b.proc is not None
    _, hard = resource.prlimit(b.proc.pid, resource.RLIMIT_FSIZE)
    resource.prlimit(b.proc.pid, resource.RLIMIT_FSIZE, (soft, hard))


async def _messages(c: Client, topic: str) -> int:
    return (await c.describe_topic(topic)).messages


async def test_what_failed_is_never_counted_or_delivered(tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text('tx_timeout_ms = 3600000\ntx_default_secret = "s3cret"\n')
    data = tmp_path / "broker"
    b = _broker(data, cfg)
    try:
        async with await Client.connect(b.url) as c:
            await c.create_topic("orders", queues=2)
            _limit_files(b, FILE_LIMIT)  # from now on the key index cannot be created
            with pytest.raises(StoreFailed):
                await c.send("orders", b"failed-single", key="f1")
            with pytest.raises(StoreFailed):
                await c.send_batch(
                    [SendRequest("orders", f"failed-b{i}".encode()) for i in range(3)]
                )
            keyed = [
                SendRequest("orders", b"ik-a", idempotency_key="a"),
                SendRequest("orders", b"ik-b", idempotency_key="b"),
            ]
            with pytest.raises(StoreFailed):
                await c.send_batch(keyed)  # none of it, although the first could be stored
            # A half message is not indexed, so PREPARE works; the commit's copy is.
            tx = await c.prepare("orders", b"tx", producer_group="shop", check_url=NOWHERE)
            with pytest.raises(StoreFailed):
                await c.end_transaction(tx.tx_id, "commit")
            assert await _messages(c, "orders") == 0  # nothing the client was told failed
            assert (await c.show_transaction(tx.tx_id)).state == "prepared"

            _limit_files(b, resource.RLIM_INFINITY)  # space comes back: appends resume
            acked = {b"ok-single", b"ok-b0", b"ok-b1", b"tx"}
            first = await c.send("orders", b"ok-single", key="f1")
            assert first.queue_offset == 0  # no hole where the failed one was
            await c.send_batch([SendRequest("orders", b"ok-b0"), SendRequest("orders", b"ok-b1")])
            assert (await c.end_transaction(tx.tx_id, "commit")).state == "committed"
            assert [r.duplicate for r in await c.send_batch(keyed)] == [False, False]
            assert [r.duplicate for r in await c.send_batch(keyed)] == [True, True]
            acked |= {b"ik-a", b"ik-b"}
            assert await _messages(c, "orders") == len(acked)
        b.kill()
        b = _broker(data, cfg)
        async with await Client.connect(b.url) as c:
            assert await _messages(c, "orders") == len(acked)
            async with Consumer(c, "audit", "orders") as consumer:
                seen: list[bytes] = []
                deadline = time.monotonic() + 20
                while len(seen) < len(acked):
                    assert time.monotonic() < deadline, seen
                    seen += [m.body for m in await consumer.fetch(timeout_ms=500)]
                assert await consumer.fetch(timeout_ms=500) == []
            assert sorted(seen) == sorted(acked)
    finally:
        b.stop()
