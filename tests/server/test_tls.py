"""TLS on a real broker's TCP and HTTP listeners, with a CA and certificates made here by the
``openssl`` command line: the SDK over ``txbs://``, a plain client told to use TLS, a client that
does not trust the broker, and mutual TLS refusing a client without a certificate."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import BrokerProcess, run_cli
from tests.pki import OPENSSL_MISSING, Pki, make_pki
from tests.server.rawclient import RawClient
from txbroker.errors import TlsRequired
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import Hello, decode_error
from txbroker_sdk import Client, Consumer
from txbroker_sdk.errors import BrokerUnreachable, TlsFailed

pytestmark = pytest.mark.skipif(OPENSSL_MISSING, reason="needs openssl")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_flags(pki: Pki, *, mutual: bool = False) -> list[str]:
    flags = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
    return flags + (["--tls-client-ca", str(pki.ca)] if mutual else [])


@pytest.fixture(scope="module")
def tls_broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("tls") / "broker", *_tls_flags(pki)).start()
    yield b
    assert b.stop() == 0


async def test_the_sdk_sends_and_consumes_over_tls(tls_broker: BrokerProcess, pki: Pki) -> None:
    assert tls_broker.url.startswith("txbs://127.0.0.1:")
    async with await Client.connect(tls_broker.url, tls_ca=pki.ca) as c:
        await c.create_topic("secure", queues=1)
        await c.send("secure", b"over tls", key="k")
        async with Consumer(c, "g", "secure") as consumer:
            [m] = await consumer.fetch(timeout_ms=5_000)
            assert m.body == b"over tls"
            m.ack()
    ca_ssl = ssl.create_default_context(cafile=pki.ca)
    async with httpx.AsyncClient(base_url=tls_broker.http, verify=ca_ssl) as h:
        assert tls_broker.http.startswith("https://")
        r = await h.get("/v1/topics")
        assert r.status_code == 200 and "secure" in r.text
        page = await h.get("/console/")
        assert page.status_code == 200 and "; secure" in page.headers["set-cookie"].lower()
    listed = run_cli("topic", "list", "--server", tls_broker.url, "--tls-ca", str(pki.ca))
    assert listed.returncode == 0 and "secure" in listed.stdout, listed.stderr


async def test_a_plain_client_is_told_to_use_tls(tls_broker: BrokerProcess, pki: Pki) -> None:
    plain = tls_broker.url.replace("txbs://", "txb://")
    with pytest.raises(TlsRequired, match="serves TLS on this port: connect with txbs://"):
        await Client.connect(plain, connect_deadline_s=0)
    raw = await RawClient.open(plain)  # the same, byte by byte: one plain error frame
    frame = await raw.request(Opcode.HELLO, Hello("raw", None))
    assert frame.opcode == Opcode.STREAM and decode_error(frame.body).code == "TLS_REQUIRED"
    # The broker serves TLS clients as before.
    async with await Client.connect(tls_broker.url, tls_ca=pki.ca) as c:
        await c.ping()


async def test_a_broker_the_client_does_not_trust_is_refused(
    tls_broker: BrokerProcess, pki: Pki, tmp_path: Path
) -> None:
    with pytest.raises(TlsFailed, match="did not prove who it is"):
        await Client.connect(tls_broker.url, tls_ca=pki.other_ca, connect_deadline_s=5)
    by_name = tls_broker.url.replace("127.0.0.1", "localhost")  # also in the certificate
    async with await Client.connect(by_name, tls_ca=pki.ca) as c:
        await c.ping()
    plain = BrokerProcess(tmp_path / "plain").start()
    try:
        with pytest.raises(TlsFailed, match="does the broker serve TLS"):
            await Client.connect(plain.url.replace("txb://", "txbs://"), tls_ca=pki.ca)
    finally:
        plain.stop()


async def test_mutual_tls_refuses_a_client_without_a_certificate(pki: Pki, tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "mtls", *_tls_flags(pki, mutual=True)).start()
    try:
        with pytest.raises((TlsFailed, BrokerUnreachable), match="client certificate"):
            await Client.connect(b.url, tls_ca=pki.ca, connect_deadline_s=0)
        async with await Client.connect(
            b.url, tls_ca=pki.ca, tls_cert=pki.client_cert, tls_key=pki.client_key
        ) as c:
            await c.ping()
        client_ssl = ssl.create_default_context(cafile=pki.ca)
        async with httpx.AsyncClient(base_url=b.http, verify=client_ssl) as h:
            with pytest.raises(httpx.TransportError):
                await h.get("/healthz")
        client_ssl.load_cert_chain(pki.client_cert, pki.client_key)
        async with httpx.AsyncClient(base_url=b.http, verify=client_ssl) as h:
            assert (await h.get("/healthz")).status_code == 200
    finally:
        assert b.stop() == 0
    assert "BEGIN" not in b.log_path.read_text()  # no key or certificate in the log
