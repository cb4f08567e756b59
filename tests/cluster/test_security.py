"""TLS and tokens between the processes of a cluster, all real: a sync group whose slave follows
its TLS master over TLS with the token, reached through a TLS NameServer that checks the token;
a slave that does not trust its master's certificate and says so; a NameServer refusing a
client without the token, or without TLS."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from tests.cluster.conftest import EtcdServer
from tests.cluster.groups import NameServerProcess, masters_of, wait_for_brokers
from tests.cluster.logs import keys_in_log
from tests.conftest import IN_CI, BrokerProcess, run_cli
from tests.pki import OPENSSL_MISSING, Pki, make_pki
from txbroker.cluster.routes import Role
from txbroker.errors import (
    InvalidArgument,
    NoRoute,
    ReplicationTimeout,
    TlsRequired,
    Unauthenticated,
)
from txbroker.nameserver import NameServer, NameServerConfig
from txbroker_sdk import Client
from txbroker_sdk.cluster import ClusterClient
from txbroker_sdk.errors import TlsFailed

if not IN_CI:
    pytest.importorskip("aetcd")

pytestmark = pytest.mark.skipif(OPENSSL_MISSING, reason="needs openssl")

TOKEN: Final = "cluster-secret-token"
LOG_WAIT_S: Final = 30.0  # a slave retries its master within 2 s; a loaded runner is slower
LOOK_S: Final = 0.1  # between looks at a log file that grows on its own schedule


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls(pki: Pki, ca: Path | None = None) -> tuple[str, ...]:
    """A listener's TLS flags, and the CA its slave checks a master against."""
    return ("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
            "--tls-ca", str(ca or pki.ca))  # fmt: skip


@pytest.fixture
def tls_group(etcd: EtcdServer, pki: Pki, tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    """Group g1: two --role auto brokers, sync replication, TLS and a token on both."""
    started: list[BrokerProcess] = []
    try:
        for name in ("a", "b"):
            b = BrokerProcess(
                tmp_path / f"g1-{name}",
                *("--group", "g1", "--coordinator", etcd.url, "--broker-id", f"g1-{name}"),
                *("--replication", "sync", "--auth-token", TOKEN, *_tls(pki)),
            )
            started.append(b)
            b.start()
        yield started
    finally:
        for b in started:
            b.stop()


@pytest.fixture
def tls_nameserver(etcd: EtcdServer, pki: Pki, tmp_path: Path) -> Iterator[NameServerProcess]:
    ns = NameServerProcess(
        etcd.url,
        tmp_path / "ns.log",
        extra=("--auth-token", TOKEN, *_tls(pki)[:4]),  # the listener's flags
    )
    try:
        yield ns.start()
    finally:
        ns.stop()


async def test_a_tls_group_with_a_token_replicates_and_serves_through_a_tls_nameserver(
    etcd: EtcdServer,
    pki: Pki,
    tls_group: list[BrokerProcess],
    tls_nameserver: NameServerProcess,
) -> None:
    brokers = await wait_for_brokers(etcd.url, lambda bs: len(bs) == 2 and masters_of("g1")(bs))
    by_role = {b.role: b for b in brokers.values()}
    master, slave = by_role[Role.MASTER], by_role[Role.SLAVE]
    assert master.address.startswith("txbs://127.0.0.1:")  # what the slave follows
    slave_dir = next(b.data_dir for b in tls_group if b.url == slave.address)

    done = run_cli(
        "topic", "create", "orders", "--queues", "2", "--groups", "g1",
        "--coordinator", etcd.url, "--auth-token", TOKEN, "--tls-ca", str(pki.ca),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    url = f"txbnss://{tls_nameserver.address}"
    async with await Client.connect(url, auth_token=TOKEN, tls_ca=pki.ca) as c:
        assert isinstance(c, ClusterClient)
        receipt = await c.send("orders", b"secured", key="k-sync")
        assert receipt.queue_offset == 0 and not receipt.duplicate
        # Sync replication answered only once the slave flushed it: it is there now.
        assert "k-sync" in keys_in_log(slave_dir, "orders")
        assert await c.masters() == {"g1": master.address}

    done = run_cli(
        "send", "orders", "--body", "by cli", "--key", "k-cli", "--server", url,
        "--auth-token", TOKEN, "--tls-ca", str(pki.ca),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "k-cli" in keys_in_log(slave_dir, "orders")


async def test_a_slave_that_does_not_trust_its_masters_certificate_says_why(
    pki: Pki, tmp_path: Path
) -> None:
    master = BrokerProcess(
        tmp_path / "master",
        *("--replication", "sync", "--replication-timeout-ms", "1000"),
        *("--auth-token", TOKEN, *_tls(pki)),
    ).start()
    try:
        assert master.url.startswith("txbs://")
        slave = BrokerProcess(
            tmp_path / "slave",
            *("--replica-of", master.url, "--auth-token", TOKEN, *_tls(pki, ca=pki.other_ca)),
        ).start()
        try:
            line = await _log_line(slave.log_path, "did not prove who it is")
            assert f"replication from {master.url}" in line
            assert "unable to get local issuer certificate" in line and "--tls-ca" in line
            async with await Client.connect(master.url, auth_token=TOKEN, tls_ca=pki.ca) as c:
                # Made and stored on the master, on no slave: sync replication says so.
                with pytest.raises(ReplicationTimeout, match="0 of the 1 slaves"):
                    await c.create_topic("t", queues=1)
                with pytest.raises(ReplicationTimeout, match="0 of the 1 slaves"):
                    await c.send("t", b"x", key="k-unreplicated")
            assert "k-unreplicated" not in keys_in_log(slave.data_dir, "t")
        finally:
            slave.stop()
    finally:
        master.stop()


async def test_a_nameserver_with_a_token_serves_only_clients_that_present_it_over_tls(
    pki: Pki, tls_nameserver: NameServerProcess
) -> None:
    url = f"txbnss://{tls_nameserver.address}"
    with pytest.raises(Unauthenticated, match="refused this client: wrong or missing auth token"):
        await Client.connect(url, tls_ca=pki.ca, connect_deadline_s=5)
    with pytest.raises(Unauthenticated):
        await Client.connect(url, auth_token="not-it", tls_ca=pki.ca, connect_deadline_s=5)
    with pytest.raises(TlsFailed, match="did not prove who it is"):
        await Client.connect(url, auth_token=TOKEN, tls_ca=pki.other_ca, connect_deadline_s=5)
    plain = f"txbns://{tls_nameserver.address}"
    with pytest.raises(TlsRequired, match=r"NameServer serves TLS.*txbnss://"):
        await Client.connect(plain, auth_token=TOKEN, connect_deadline_s=5)

    async with await Client.connect(url, auth_token=TOKEN, tls_ca=pki.ca) as c:
        assert await c.masters() == {}  # no broker registered: answered, not refused
        with pytest.raises(NoRoute):
            await c.send("nowhere", b"x")

    done = run_cli("send", "t", "--body", "x", "--server", url, "--tls-ca", str(pki.ca))
    assert done.returncode != 0
    assert "wrong or missing auth token" in done.stderr and "--auth-token" in done.stderr


async def _log_line(path: Path, text: str) -> str:
    """The first line of ``path`` holding ``text``, once it is there (bounded)."""
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        text_now = await asyncio.to_thread(path.read_text, errors="replace")
        for line in text_now.splitlines():
            if text in line:
                return line
        assert time.monotonic() < deadline, f"no {text!r} in {path} within {LOG_WAIT_S} s"
        await asyncio.sleep(LOOK_S)


async def test_a_nameserver_with_a_tls_file_it_cannot_load_names_the_flags(
    pki: Pki, tmp_path: Path
) -> None:
    missing = tmp_path / "missing-key.pem"
    config = NameServerConfig("etcd://127.0.0.1:1", tls_cert=pki.server_cert, tls_key=missing)
    # The files are loaded before etcd is reached: the unreachable coordinator is never asked.
    with pytest.raises(InvalidArgument, match=r"--tls-cert, --tls-key") as e:
        await NameServer(config).start()
    assert "broker" not in str(e.value)
