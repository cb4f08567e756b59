"""txbroker_sdk's curated surface: exactly the names a service author needs, each one there, the
database side unimported until asked for; every error a service catches in
txbroker_sdk.errors, under TxbError; one way to a client for NameServers."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import txbroker_sdk
import txbroker_sdk.errors
from tests.conftest import ROOT, BrokerProcess
from txbroker.errors import InvalidArgument, TxbError
from txbroker_sdk import Client
from txbroker_sdk.cluster import ClusterClient, client_for


def test_the_public_names() -> None:
    assert txbroker_sdk.__all__ == [
        "TxbService",
        "TxPublisher",
        "mount",
        "Subscribers",
        "Client",
        "Consumer",
        "ConsumedMessage",
        "create_engine",
        "upgrade",
        "Retention",
        "TxbError",
    ]
    missing = [name for name in txbroker_sdk.__all__ if getattr(txbroker_sdk, name, None) is None]
    assert missing == []


def test_a_name_that_is_not_public_says_where_errors_are() -> None:
    with pytest.raises(AttributeError, match=r"errors are in txbroker_sdk\.errors"):
        _ = txbroker_sdk.BrokerUnreachable  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match=r"has no attribute 'HttpServer'$"):
        _ = txbroker_sdk.HttpServer  # type: ignore[attr-defined]


def test_every_error_is_in_errors_under_one_root() -> None:
    e = txbroker_sdk.errors
    names = e.__all__
    assert len(set(names)) == len(names)
    classes = [getattr(e, name) for name in names]
    assert all(issubclass(cls, TxbError) for cls in classes)
    assert len({cls.code for cls in classes}) == len(classes)
    assert txbroker_sdk.TxbError is e.TxbError is TxbError
    for own in ("ConnectionClosed", "BrokerUnreachable", "RequestTimeout", "TlsFailed"):
        assert getattr(e, own).__module__ == "txbroker_sdk.errors"
    for own in ("TransactionFenced", "TablesMissing", "NotStarted"):
        assert getattr(e, own).__module__ == "txbroker_sdk.errors"  # no SQLAlchemy needed
    assert issubclass(e.BrokerUnreachable, e.ConnectionClosed)
    # The tree in the docstring names every error, and marks exactly the retriable ones.
    assert e.__doc__ is not None
    tree = e.__doc__.split("TxbError", 1)[1]
    assert set(names) - {"TxbError"} <= set(re.findall(r"\b[A-Z][A-Za-z]+\b", tree))
    retriable = {name for name, cls in zip(names, classes, strict=True) if cls.retriable}
    assert retriable == {n.rstrip("*") for n in re.findall(r"\b[A-Za-z]+\*", tree)}


def test_sending_needs_no_sqlalchemy() -> None:
    code = (
        "import sys, txbroker_sdk\n"
        "from txbroker_sdk import Client, Consumer, ConsumedMessage, TxbError\n"
        "from txbroker_sdk.errors import TablesMissing, BrokerUnreachable, TransactionFenced\n"
        "from txbroker_sdk.cluster import ClusterClient\n"
        "assert 'sqlalchemy' not in sys.modules, 'sqlalchemy imported'\n"
        "txbroker_sdk.TxPublisher\n"
        "assert 'sqlalchemy' in sys.modules, 'the database side is not lazy any more?'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr


def test_a_client_for_nameservers_is_not_made_by_client() -> None:
    with pytest.raises(InvalidArgument, match=r"names NameServers.*Client\.connect\(url\)"):
        Client("txbns://127.0.0.1:9878")
    # Not connected yet, on purpose: ClusterClient(url), or client_for(url) for any URL.
    assert type(ClusterClient("txbns://127.0.0.1:9878")) is ClusterClient
    assert type(client_for("txbns://127.0.0.1:9878", timeout_s=3)) is ClusterClient
    assert type(client_for("txb://127.0.0.1:9876", timeout_s=3)) is Client


async def test_connect_returns_a_client_for_a_broker(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as client:
        assert type(client) is Client


async def test_connect_returns_a_cluster_client_for_nameservers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def reached(self: ClusterClient, deadline_s: float) -> None:
        pass  # no NameServer here: tests/cluster connects to real ones

    monkeypatch.setattr(ClusterClient, "_dial", reached)
    client = await Client.connect("txbns://127.0.0.1:9878,127.0.0.1:9879", timeout_s=3)
    try:
        assert type(client) is ClusterClient
        assert client._timeout_s == 3  # the options reach it
    finally:
        await client.close()
