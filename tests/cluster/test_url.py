"""``--coordinator`` addresses: parsed strictly, so a typo stops a process at start."""

from __future__ import annotations

import subprocess
import sys

import pytest

from txbroker.cluster.url import Endpoint, parse_coordinator_url
from txbroker.errors import InvalidArgument


def test_endpoints_in_order_with_the_default_port() -> None:
    url = parse_coordinator_url("etcd://10.0.0.1:2379, etcd-2 ,[::1]:22379,[fe80::1]")
    assert url.scheme == "etcd"
    assert url.endpoints == (
        Endpoint("10.0.0.1", 2379),
        Endpoint("etcd-2", 2379),
        Endpoint("::1", 22379),
        Endpoint("fe80::1", 2379),
    )
    assert str(url) == "etcd://10.0.0.1:2379,etcd-2:2379,[::1]:22379,[fe80::1]:2379"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("zk://127.0.0.1:2181", "expected etcd://"),
        ("127.0.0.1:2379", "expected etcd://"),
        ("etcd://127.0.0.1:2379/txb", "no path"),
        ("etcd://user:pw@127.0.0.1:2379", "no path, query, credentials"),
        ("etcd://127.0.0.1:0", "not in 1..65535"),
        ("etcd://127.0.0.1:http", "not in 1..65535"),
        ("etcd://::1:2379", "in brackets"),
        ("etcd://[::1", "bad IPv6"),
        ("etcd://:2379", "has no host"),
        ("etcd://a:1,a:1", "named twice"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        parse_coordinator_url(url)


def test_the_package_imports_without_the_etcd_client() -> None:
    """aetcd is the `cluster` extra: only connect_coordinator (through etcd.py) needs it."""
    code = "import sys, txbroker.cluster; assert 'aetcd' not in sys.modules, 'aetcd imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
