"""Access control on the wire: a real broker with a token file, each role allowed and refused per
opcode family and topic pattern, the connection usable after a refusal, tokens never logged."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import BrokerProcess
from txbroker.errors import Forbidden, Unauthenticated
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import (
    AckRequest,
    DlqRequest,
    GroupsRequest,
    HeartbeatRequest,
    LeaveRequest,
    PullRequest,
    QueuePosition,
    SendRequest,
)
from txbroker_sdk import Client

ADMIN = "admin-token-6b1f0c3e9a"
PRODUCER = "producer-token-0d4e7a21"
CONSUMER = "consumer-token-9c2b5f18"
READER = "reader-token-a83e61d0"
ORDERS_ADMIN = "orders-admin-token-55e2"

TOKENS = f"""
[[tokens]]
name = "svc-orders"
token_sha256 = "{hashlib.sha256(PRODUCER.encode()).hexdigest()}"
roles = ["produce"]
topics = ["orders.*"]

[[tokens]]
name = "svc-billing"
token = "{CONSUMER}"
roles = ["consume"]
topics = ["orders.*"]

[[tokens]]
name = "dashboard"
token = "{READER}"
roles = ["read"]

[[tokens]]
name = "orders-ops"
token = "{ORDERS_ADMIN}"
roles = ["admin"]
topics = ["orders.*"]
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("access")
    token_file = root / "tokens.toml"
    token_file.write_text(TOKENS)
    b = BrokerProcess(
        root / "broker",
        "--auth-token",
        ADMIN,
        "--token-file",
        str(token_file),
        "--tx-secret",
        "orders-svc=s3cret",
    ).start()
    yield b
    assert b.stop() == 0


async def _setup(b: BrokerProcess) -> None:
    async with await Client.connect(b.url, auth_token=ADMIN) as admin:
        for topic in ("orders.eu", "billing"):
            await admin.create_topic(topic, queues=1, exist_ok=True)


async def _join_and_leave(b: BrokerProcess, group: str) -> None:
    """Make ``group`` known (and so its dead-letter topic), as a member that joins and leaves:
    each test starts from what it sets up itself, whichever ran before it on this broker."""
    async with await Client.connect(b.url, auth_token=CONSUMER) as c:
        await c.request(Opcode.HEARTBEAT, HeartbeatRequest(group, "orders.eu", "setup"))
        await c.request(Opcode.LEAVE, LeaveRequest(group, "orders.eu", "setup"))


async def test_producer_sends_only_to_its_topics(secured: BrokerProcess) -> None:
    await _setup(secured)
    async with await Client.connect(secured.url, auth_token=PRODUCER) as c:
        await c.send("orders.eu", b"ok")
        with pytest.raises(Forbidden) as e:
            await c.send("billing", b"no")
        assert "SEND needs the produce role on topic 'billing'" in str(e.value)
        assert "svc-orders" in str(e.value) and PRODUCER not in str(e.value)
        await c.send("orders.eu", b"still connected")  # the refusal kept the connection
        with pytest.raises(Forbidden, match="SEND_BATCH needs the produce role on topic 'billing'"):
            await c.send_batch([SendRequest("orders.eu", b"a"), SendRequest("billing", b"b")])
        with pytest.raises(Forbidden, match="TOPIC_CREATE needs the admin role"):
            await c.create_topic("orders.us")
        with pytest.raises(Forbidden, match="TOPIC_DELETE needs the admin role"):
            await c.delete_topic("orders.eu")
        with pytest.raises(Forbidden, match="HEARTBEAT needs the consume role"):
            await c.request(Opcode.HEARTBEAT, HeartbeatRequest("g", "orders.eu", "m1"))
        with pytest.raises(Forbidden, match="PULL needs the consume role"):
            await c.request(Opcode.PULL, PullRequest("g", "orders.eu", hold_ms=0))
        # Describing and listing: the topics it has a role on, only.
        assert (await c.describe_topic("orders.eu")).topic == "orders.eu"
        with pytest.raises(Forbidden):
            await c.describe_topic("billing")
        assert [t.topic for t in await c.list_topics()] == ["orders.eu"]
        with pytest.raises(Forbidden, match="TX_LIST needs the read role"):
            await c.list_transactions()
        await c.ping()


async def test_transactions_need_produce_on_their_topic(secured: BrokerProcess) -> None:
    await _setup(secured)
    url = "http://127.0.0.1:9/check"
    async with (
        await Client.connect(secured.url, auth_token=PRODUCER) as p,
        await Client.connect(secured.url, auth_token=CONSUMER) as other,
        await Client.connect(secured.url, auth_token=READER) as reader,
    ):
        with pytest.raises(Forbidden, match="TX_PREPARE needs the produce role on topic 'billing'"):
            await p.prepare("billing", b"x", producer_group="orders-svc", check_url=url)
        tx = await p.prepare("orders.eu", b"x", producer_group="orders-svc", check_url=url)
        # Another token may not end it, show it or resolve it.
        with pytest.raises(Forbidden, match=r"TX_END needs the produce role on topic 'orders\.eu'"):
            await other.end_transaction(tx.tx_id, "rollback")
        with pytest.raises(Forbidden, match="TX_RESOLVE needs the admin role"):
            await reader.resolve_transaction(tx.tx_id, "rollback")
        assert (await reader.show_transaction(tx.tx_id)).topic == "orders.eu"
        listed = await reader.list_transactions()
        assert tx.tx_id in [t.tx_id for t in listed.transactions]
        assert (await tx.commit()).state == "committed"


async def test_consumer_reads_and_commits_only_its_topics(secured: BrokerProcess) -> None:
    await _setup(secured)
    async with await Client.connect(secured.url, auth_token=PRODUCER) as p:
        await p.send("orders.eu", b"for billing")
    async with await Client.connect(secured.url, auth_token=CONSUMER) as c:
        hb = await c.request(Opcode.HEARTBEAT, HeartbeatRequest("billing-g", "orders.eu", "m1"))
        res = await c.request(
            Opcode.PULL, PullRequest("billing-g", "orders.eu", "m1", hb.generation, hold_ms=0)
        )
        assert res.messages
        last = res.messages[-1]
        await c.request(
            Opcode.ACK,
            AckRequest(
                "billing-g",
                "orders.eu",
                "m1",
                hb.generation,
                [QueuePosition(last.queue_id, last.queue_offset + 1)],
            ),
        )
        with pytest.raises(Forbidden, match="PULL needs the consume role on topic 'billing'"):
            await c.request(Opcode.PULL, PullRequest("billing-g", "billing", hold_ms=0))
        with pytest.raises(Forbidden, match="SEND needs the produce role"):
            await c.send("orders.eu", b"no")
        groups = await c.request(Opcode.OFFSETS, GroupsRequest())
        assert {g.topic for g in groups.groups} == {"orders.eu"}
        with pytest.raises(Forbidden, match="DLQ_REDRIVE needs the admin role on every topic"):
            await c.request(Opcode.DLQ_REDRIVE, DlqRequest("billing-g"))


async def test_reader_lists_everything_and_changes_nothing(secured: BrokerProcess) -> None:
    await _setup(secured)
    await _join_and_leave(secured, "billing-g")
    async with await Client.connect(secured.url, auth_token=READER) as c:
        assert {"orders.eu", "billing"} <= {t.topic for t in await c.list_topics()}
        await c.request(Opcode.OFFSETS, GroupsRequest())
        await c.request(Opcode.DLQ_LIST, DlqRequest("billing-g"))
        with pytest.raises(Forbidden, match="SEND needs the produce role on topic 'billing'"):
            await c.send("billing", b"no")
        with pytest.raises(Forbidden, match="TOPIC_DELETE needs the admin role"):
            await c.delete_topic("billing")
        with pytest.raises(Forbidden, match="DLQ_REDRIVE needs the admin role"):
            await c.request(Opcode.DLQ_REDRIVE, DlqRequest("billing-g"))


async def test_admin_of_a_pattern_administers_only_its_topics(secured: BrokerProcess) -> None:
    await _setup(secured)
    await _join_and_leave(secured, "billing-g")
    async with await Client.connect(secured.url, auth_token=ORDERS_ADMIN) as c:
        await c.create_topic("orders.tmp", queues=1)
        await c.send("orders.tmp", b"admin implies produce")
        await c.delete_topic("orders.tmp")
        with pytest.raises(Forbidden, match="TOPIC_CREATE needs the admin role on topic 'audit'"):
            await c.create_topic("audit")
        with pytest.raises(Forbidden, match=r"needs the admin role on every topic \(\*\)"):
            await c.request(Opcode.DLQ_REDRIVE, DlqRequest("billing-g"))
    # The single auth_token of earlier versions is still an admin of everything.
    async with await Client.connect(secured.url, auth_token=ADMIN) as a:
        await a.create_topic("audit", queues=1, exist_ok=True)
        await a.request(Opcode.DLQ_REDRIVE, DlqRequest("billing-g"))


async def test_unknown_tokens_are_refused_and_no_token_is_logged(secured: BrokerProcess) -> None:
    with pytest.raises(Unauthenticated):
        await Client.connect(secured.url, auth_token="not-a-token-of-this-broker")
    with pytest.raises(Unauthenticated):  # the digest itself is not a token
        await Client.connect(secured.url, auth_token=hashlib.sha256(PRODUCER.encode()).hexdigest())
    log = secured.log_path.read_text()
    for token in (ADMIN, PRODUCER, CONSUMER, READER, ORDERS_ADMIN, "not-a-token-of-this-broker"):
        assert token not in log
    assert hashlib.sha256(PRODUCER.encode()).hexdigest() not in log


def test_the_token_file_is_checked_at_start(tmp_path: Path) -> None:
    from txbroker.errors import InvalidArgument
    from txbroker.server.config import ServerConfig

    def build(text: str) -> ServerConfig:
        f = tmp_path / "t.toml"
        f.write_text(text)
        return ServerConfig.build({"tokens_file": str(f)}, {})

    secret = "very-secret-value-1"
    tok = f'token = "{secret}"'
    bad = {
        f'name = "a"\n{tok}\ntoken_sha256 = "{"0" * 64}"\nroles = ["admin"]': "exactly one of",
        f'name = "a"\n{tok}\nroles = ["root"]': "roles must be among",
        f'name = "a"\n{tok}\nroles = []': "roles must be a non-empty list",
        'name = "a"\ntoken_sha256 = "abc"\nroles = ["read"]': "64 hex digits",
        f'name = "a"\n{tok}\nroles = ["read"]\nsecret = 1': "unknown keys",
        f'{tok}\nroles = ["read"]': "name must be",
    }
    for body, why in bad.items():
        with pytest.raises(InvalidArgument, match=why) as e:
            build(f"[[tokens]]\n{body}\n")
        assert secret not in str(e.value)
    twice = f'[[tokens]]\nname = "a"\ntoken = "{secret}"\nroles = ["read"]\n' * 2
    with pytest.raises(InvalidArgument, match="unique"):
        build(twice)
    cfg = build(f'[[tokens]]\nname = "a"\ntoken = "{secret}"\nroles = ["read"]\n')
    table = cfg.token_table()
    assert secret not in repr(cfg) and secret not in repr(table) and secret not in repr(cfg.tokens)
    who = table.authenticate(secret)
    assert who is not None and who.name == "a" and table.authenticate("other") is None
    with pytest.raises(InvalidArgument, match="TOML file or in --token-file"):
        ServerConfig.build({}, {"TXB_TOKENS": "x"})
    by_env = ServerConfig.build({}, {"TXB_TOKENS_FILE": str(tmp_path / "t.toml")})
    assert [e.principal.name for e in by_env.tokens] == ["a"]


async def test_refusals_are_counted_on_metrics(secured: BrokerProcess) -> None:
    await _setup(secured)
    async with await Client.connect(secured.url, auth_token=READER) as c:
        with pytest.raises(Forbidden):
            await c.send("billing", b"no")
    async with httpx.AsyncClient(base_url=secured.http) as h:
        r = await h.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200
    lines = [x for x in r.text.splitlines() if x.startswith("txbroker_requests_forbidden")]
    assert any('txbroker_opcode="SEND"' in x for x in lines), lines
